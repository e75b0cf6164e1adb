"""Sweepers colliding (replicas' background sweeps, and lease requests that sweep): two transactions read the same
expired lease and both end it. The second finds it ended and moves on: no 409 for a lease request, no shape
counted twice. The interleaving is driven step by step (the lease steps are generators, app/db/dialect.Steps), on
PostgreSQL, where two transactions run at once (SQLite has one writer: its sweeps never interleave)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select, update

from app.db.models import CampaignShape, Lease, utcnow
from app.main import create_app
from app.services import leasing
from app.wire import LeaseIn
from tests.conftest import DIGEST, capture

BODY = {"image_digest": DIGEST, "gfx": "gfx942", "cu_num": 304, "backends": ["torch"], "budget_s": 600}


def upto(steps, p, name: str):  # type: ignore[no-untyped-def]
    """Runs the steps until the batch holding the statement `name`, which it returns unsent."""
    stmts = next(steps)
    while not any(n == name for n, _ in stmts):
        stmts = steps.send(p.batch(*stmts))
    return stmts


def finish(steps, p, stmts):  # type: ignore[no-untyped-def]
    try:
        while True:
            stmts = steps.send(p.batch(*stmts))
    except StopIteration as done:
        return done.value


@pytest.fixture
def expired(settings):  # type: ignore[no-untyped-def]
    """A lease of 3 shapes whose worker died: past its expiry, not swept yet (no background sweeper runs here)."""
    if settings.database_url.startswith("sqlite"):
        pytest.skip("SQLite has one writer: two sweeps never interleave there")
    c = TestClient(create_app(settings))  # no lifespan: no background sweeper
    capture(c, [{"M": m, "N": 64, "K": 64} for m in (1, 2, 3)])
    dead = c.post("/v1/leases", json={**BODY, "worker_id": "dead"}).json()
    db = c.app.state.db
    with db.session() as s:
        s.execute(update(Lease).values(expires_at=utcnow() - timedelta(hours=1)))
    yield db, dead["lease_id"]
    db.dispose()


def _after(db, lease_id: str) -> tuple[str, list[tuple[str, int]]]:  # type: ignore[no-untyped-def]
    with db.session() as s:
        return (s.get(Lease, lease_id).state,
                [(sh.state, sh.attempts) for sh in s.scalars(select(CampaignShape).order_by(CampaignShape.id))])


def test_two_sweepers_ending_one_expired_lease(expired, settings):
    db, lease_id = expired
    with db.plain() as second:
        late = leasing.sweep_expired(second, settings)
        late_writes = upto(late, second, "end_lease")  # read the dead lease and its shapes, then ...
        with db.plain() as first:
            early = leasing.sweep_expired(first, settings)
            writes = upto(early, first, "end_lease")
            assert sum(n == "write_shape" for n, _ in writes) == 3
            assert finish(early, first, writes) == 1  # ... the other sweeper ended it first
        assert finish(late, second, late_writes) == 0  # nothing left to end: no 409, no second count
    assert _after(db, lease_id) == ("expired", [("queued", 1)] * 3)


def test_a_lease_request_whose_sweep_collides_with_a_sweeper_gets_its_lease(expired, settings):
    db, lease_id = expired
    leasing._LAST_SWEEP.clear()  # this lease request sweeps
    with db.plain() as p:
        request = leasing.lease_batch(p, LeaseIn(**BODY, worker_id="alive"), settings)
        pending = upto(request, p, "end_lease")
        with db.plain() as sweeper:
            sweep = leasing.sweep_expired(sweeper, settings)
            assert finish(sweep, sweeper, upto(sweep, sweeper, "end_lease")) == 1
        out = finish(request, p, pending)  # was a 409 "lease ... ended meanwhile"
    assert out is not None and len(out.shapes) == 3 and {s.attempts for s in out.shapes} == {2}
    assert _after(db, lease_id)[0] == "expired"
