"""A machine slower than its budget (a loaded CPU: one slow library call outlasted budget + grace three times in a
row, issue 27's quick start) does not park the shape: a lease that runs out of its own time makes the agent ask
for twice what that lease ran, so the next try has twice the room. Decided by the lease's state (lost past its hard deadline), not a
guess of the machine's speed."""

from __future__ import annotations

import sqlite3
import time

import pytest

from tests.conftest import ADMIN, DIGEST, start_server
from tests.e2e.test_agent_resilience import IDENT, Scripted, capture, states
from workers.agent import Agent, AgentConfig
from workers.client import ServiceClient

pytestmark = pytest.mark.e2e
NEEDS_S = 3.0  # the budget this machine needs for the shape: under it, the lease runs out first
GRACE_S = 0.5


class Slow(Scripted):
    """Finishes a shape only where the lease's budget is at least NEEDS_S; under it, works until the lease is lost
    (the service's hard deadline passed and a heartbeat said so), as an unfinished race does."""

    def __init__(self):
        super().__init__()
        self.budgets: list[float] = []

    def run(self, batch, emit):  # type: ignore[no-untyped-def]
        self.budgets.append(batch.lease["budget_s"])
        if batch.lease["budget_s"] < NEEDS_S:
            end = time.monotonic() + 120  # bounded: the lease is lost within budget + grace + a heartbeat
            while not batch.should_stop() and time.monotonic() < end:
                time.sleep(0.05)
            return
        super().run(batch, emit)


@pytest.fixture
def slow_server(tmp_path):
    srv = start_server(f"sqlite:///{tmp_path / 'tuner.db'}", tmp_path / "server.log",
                       {"TUNER_LEASE_TTL_S": "3", "TUNER_LEASE_GRACE_S": str(GRACE_S), "TUNER_MAX_ATTEMPTS": "2"})
    yield srv
    srv.proc.kill()
    srv.proc.wait()


def test_a_lease_that_runs_out_of_its_own_time_doubles_the_time_asked(slow_server, tmp_path):
    cid = capture(slow_server, [7])
    backend = Slow()
    client = ServiceClient(slow_server.url, token=ADMIN, backoff_cap_s=1.0)
    stats = Agent(client, backend, IDENT, AgentConfig("w1", DIGEST, budget_s=2.0, once=True, poll_s=0.1,
                                                      spool_dir=str(tmp_path / "spool"))).run()
    shape = states(slow_server, cid)[7]
    assert shape["state"] == "tuned", shape  # not parked after max_attempts=2 overruns
    first, second = backend.budgets
    assert first == 2.0 and second >= 2 * (2.0 + GRACE_S), backend.budgets  # twice budget + grace at least
    assert stats.overruns == 1 and stats.budget_s == second, stats
    with sqlite3.connect(slow_server.db_url.removeprefix("sqlite:///")) as db:
        ended = [(b, s) for b, s in db.execute("SELECT budget_s, state FROM leases ORDER BY created_at")]
    assert ended == [(first, "expired"), (second, "done")], ended
