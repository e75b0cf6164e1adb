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
from app.services.caches import caches_of
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
    caches_of(db).last_sweep.clear()  # this lease request sweeps (the app's throttle: app/services/caches.py)
    with db.plain() as p:
        request = leasing.lease_batch(p, LeaseIn(**BODY, worker_id="alive"), settings)
        pending = upto(request, p, "end_lease")
        with db.plain() as sweeper:
            sweep = leasing.sweep_expired(sweeper, settings)
            assert finish(sweep, sweeper, upto(sweep, sweeper, "end_lease")) == 1
        out = finish(request, p, pending)  # was a 409 "lease ... ended meanwhile"
    assert out is not None and len(out.shapes) == 3 and {s.attempts for s in out.shapes} == {2}
    assert _after(db, lease_id)[0] == "expired"


def test_a_result_whose_lease_a_sweeper_ends_between_its_read_and_its_write_is_not_lost(settings, monkeypatch):
    """The lease read live, then (another replica's sweeper) expired and its shape requeued before the result's
    write: the post is taken again in a new transaction, late, not answered 409 and rolled back (the worker drops a
    409'd result from its spool: it was lost)."""
    if settings.database_url.startswith("sqlite"):
        pytest.skip("SQLite has one writer: a sweep never runs inside a result's transaction")
    from app.db import session as db_session
    c = TestClient(create_app(settings))  # no lifespan: no background sweeper
    capture(c, [{"M": 1, "N": 64, "K": 64}])
    lease = c.post("/v1/leases", json={**BODY, "worker_id": "slow"}).json()
    db, swept = c.app.state.db, []

    class SweptBeforeTheWrite(db_session.Plain):
        def batch(self, *stmts):  # type: ignore[no-untyped-def]
            if not swept and any(n == "write_shape" for n, _ in stmts):
                swept.append(1)
                with db.session() as s:  # the lease's expiry comes, and a sweeper ends it
                    s.execute(update(Lease).values(expires_at=utcnow() - timedelta(seconds=1)))
                with db.plain() as other:
                    swept.append(other.drive(leasing.sweep_expired(other, settings)))
            return super().batch(*stmts)
    monkeypatch.setattr(db_session, "Plain", SweptBeforeTheWrite)
    item = lease["shapes"][0]
    row = dict(item["shape"], gfx="gfx942", cu_num=304, libtype="torch", solidx=0, splitK=0, us=10.0,
               kernelName="k", err_ratio=0.0, tflops=1, bw=1)
    out = leasing.take_result(db, lease["lease_id"], leasing.ResultIn(
        shape_id=item["shape_id"], backend="torch", status="ok", row=row, us=10.0, err_ratio=0.0), settings)
    assert swept == [1, 1] and isinstance(out, leasing.ResultOut) and out.shape_state == "tuned"
    db.dispose()
