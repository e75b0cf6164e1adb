"""The serving process's background rounds (the sweep of dead workers' leases, SQLite's WAL checkpoints): a round
that fails is counted in /metrics and the next one runs, so one bad round never stops the sweep until a restart."""

from __future__ import annotations

import pytest
from sqlalchemy.exc import OperationalError

from tests.conftest import wait_for


@pytest.mark.parametrize("error, why", [(RuntimeError("boom"), "error"),
                                        (OperationalError("SELECT", None, Exception("database is locked")), "busy")])
def test_a_failing_sweep_round_is_counted_and_the_next_one_runs(settings, monkeypatch, error, why):
    from fastapi.testclient import TestClient

    from app import main
    rounds: list[int] = []

    def flaky(_db, _settings):  # type: ignore[no-untyped-def]
        rounds.append(1)
        if len(rounds) == 1:
            raise error

    monkeypatch.setattr(main, "_sweep", flaky)
    settings.lease_ttl_s = 3  # a round every second
    with TestClient(main.create_app(settings)) as c:
        wait_for(lambda: len(rounds) >= 2, timeout=30)  # the round after the failed one ran
        metrics = c.get("/metrics").text
    assert f'aiter_tuner_background_failures_total{{task="sweep",why="{why}"}} 1.0' in metrics
