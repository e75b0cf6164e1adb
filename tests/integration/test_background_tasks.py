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


def test_every_pooled_connection_in_use_answers_503_with_retry_after(settings):
    """The pool's own timeout (QueuePool: all pool_size + max_overflow connections checked out) is the database
    being busy, as a lock is: 503 and Retry-After, never a 500 (the agent retries a 503)."""
    from fastapi.testclient import TestClient

    from app import main
    with TestClient(main.create_app(settings)) as c:
        db = c.app.state.db
        held = []
        try:
            for engine in {id(e): e for e in (db.engine, db.read_engine)}.values():
                pool = engine.pool
                pool._timeout = 0.05  # the real pool, waiting a moment instead of 30 s
                held += [pool.connect() for _ in range(pool.size() + pool._max_overflow)]
            r = c.get("/v1/campaigns")
        finally:
            for conn in held:
                conn.close()
        assert r.status_code == 503, r.text
        assert r.headers["Retry-After"] and r.json()["title"] == "database unavailable"
        assert c.get("/v1/campaigns").status_code == 200  # the connections back: served again
