"""The lease/shape state machine under random event sequences (hypothesis): its invariants always hold."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from app.domain import lease_states as ls

MAX_ATTEMPTS = 3
TTL, GRACE = 10.0, 5.0
COUNTED = [ls.ResultKind.FAILED, ls.ResultKind.REFUSED, ls.ResultKind.UNVERIFIED]


class Queue(RuleBasedStateMachine):
    """A model of the service: shapes, leases and a clock, driven only through lease_states' functions."""

    @initialize(n=st.integers(1, 6))
    def start(self, n: int) -> None:
        self.now = datetime(2026, 1, 1, tzinfo=timezone.utc)
        self.shapes = [ls.ShapeFacts() for _ in range(n)]
        self.leases: dict[str, tuple[ls.LeaseFacts, list[int]]] = {}
        self.verified = [0] * n  # results that tuned the shape
        self.tries = [0] * n  # tries that should have counted since the last requeue (the model's own count)
        self.seen_attempts = [0] * n

    def _live(self) -> list[str]:
        return sorted(lid for lid, (lf, _) in self.leases.items() if ls.is_live(lf, self.now))

    def _held(self) -> list[tuple[str, int]]:
        return [(lid, i) for lid in self._live() for i in self.leases[lid][1] if self.shapes[i].held_by(lid)]

    @rule(k=st.integers(1, 4), budget=st.floats(1, 100))
    def take_lease(self, k: int, budget: float) -> None:
        queued = [i for i, s in enumerate(self.shapes) if s.state is ls.ShapeState.QUEUED][:k]
        if not queued:
            return
        lid = f"L{len(self.leases)}"
        self.leases[lid] = (ls.open_lease(self.now, budget, TTL, GRACE), queued)
        for i in queued:
            self.shapes[i] = ls.lease(self.shapes[i], lid)

    @precondition(lambda self: self._held())
    @rule(data=st.data(), kind=st.sampled_from(list(ls.ResultKind)))
    def post_result(self, data: st.DataObject, kind: ls.ResultKind) -> None:
        lid, i = data.draw(st.sampled_from(self._held()))
        self.shapes[i] = ls.result(self.shapes[i], lid, kind, f"{kind} error", MAX_ATTEMPTS)
        if kind in ls.TUNED_BY:
            self.verified[i] += 1
        else:
            self.tries[i] += 1

    @rule(data=st.data())
    def late_or_foreign_post(self, data: st.DataObject) -> None:
        """A post from a dead lease or for a shape the lease does not hold is refused."""
        if not self.leases:
            return
        lid = data.draw(st.sampled_from(sorted(self.leases)))
        i = data.draw(st.integers(0, len(self.shapes) - 1))
        if (lid, i) in self._held():
            return
        with pytest.raises(ls.TransitionError):
            ls.result(self.shapes[i], lid, ls.ResultKind.VERIFIED, None, MAX_ATTEMPTS)

    @rule(data=st.data(), kind=st.sampled_from(list(ls.ResultKind)))
    def late_post_from_a_spool(self, data: st.DataObject, kind: ls.ResultKind) -> None:
        """A result finished under a lease that expired meanwhile: taken only if it tunes a shape nobody has."""
        dead = [(lid, i) for lid, (lf, ids) in sorted(self.leases.items()) if lf.state is ls.LeaseState.EXPIRED
                for i in ids]
        if not dead:
            return
        _, i = data.draw(st.sampled_from(dead))
        if kind in ls.TUNED_BY and self.shapes[i].state is ls.ShapeState.QUEUED:
            self.shapes[i] = ls.late_result(self.shapes[i], kind)
            self.verified[i] += 1
        else:
            with pytest.raises(ls.TransitionError):
                ls.late_result(self.shapes[i], kind)

    @precondition(lambda self: self._live())
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        lid = data.draw(st.sampled_from(self._live()))
        lf, ids = self.leases[lid]
        started = data.draw(st.sets(st.sampled_from(ids)))
        self.leases[lid] = (ls.end_lease(lf, ls.LeaseState.RELEASED), ids)
        for i in ids:
            if self.shapes[i].held_by(lid):
                self.shapes[i] = ls.release(self.shapes[i], lid, i in started, MAX_ATTEMPTS)
                self.tries[i] += i in started

    @precondition(lambda self: self._live())
    @rule(data=st.data())
    def heartbeat(self, data: st.DataObject) -> None:
        lid = data.draw(st.sampled_from(self._live()))
        lf, ids = self.leases[lid]
        new = ls.heartbeat(lf, self.now, TTL)
        assert lf.expires_at <= new.expires_at <= lf.hard_deadline
        self.leases[lid] = (new, ids)

    @rule(dt=st.floats(0, 3 * TTL))
    def time_passes_and_sweeper_runs(self, dt: float) -> None:
        self.now += timedelta(seconds=dt)
        for lid, (lf, ids) in list(self.leases.items()):
            if ls.is_expired(lf, self.now):
                self.leases[lid] = (ls.end_lease(lf, ls.LeaseState.EXPIRED), ids)
                for i in ids:
                    if self.shapes[i].held_by(lid):
                        self.shapes[i] = ls.expire(self.shapes[i], lid, "expired", MAX_ATTEMPTS)
                        self.tries[i] += 1
                with pytest.raises(ls.TransitionError):
                    ls.heartbeat(self.leases[lid][0], self.now, TTL)

    @rule(i=st.integers(0, 5))
    def admin_requeue(self, i: int) -> None:
        if i < len(self.shapes) and self.shapes[i].state is ls.ShapeState.FAILED:
            self.shapes[i] = ls.requeue(self.shapes[i])
            self.tries[i] = 0

    @invariant()
    def a_shape_is_in_at_most_one_live_lease(self) -> None:
        for i, s in enumerate(self.shapes):
            holders = [lid for lid in self._live() if i in self.leases[lid][1] and s.held_by(lid)]
            assert len(holders) <= 1
            assert (s.state is ls.ShapeState.LEASED) == (s.lease_id is not None)

    @invariant()
    def a_tuned_shape_has_exactly_one_verified_result(self) -> None:
        for i, s in enumerate(self.shapes):
            assert self.verified[i] == (1 if s.state is ls.ShapeState.TUNED else 0)

    @invariant()
    def attempts_never_decrease(self) -> None:
        for i, s in enumerate(self.shapes):
            assert s.attempts >= self.seen_attempts[i]
            self.seen_attempts[i] = s.attempts

    @invariant()
    def every_failed_try_counts_and_no_shape_loops_forever(self) -> None:
        for i, s in enumerate(self.shapes):
            if s.state is not ls.ShapeState.TUNED:
                assert s.attempts - s.attempts_base == self.tries[i]
                assert self.tries[i] <= MAX_ATTEMPTS
                if self.tries[i] == MAX_ATTEMPTS:
                    assert s.state is ls.ShapeState.FAILED and s.last_error


TestQueue = Queue.TestCase
TestQueue.settings = hsettings(max_examples=300, stateful_step_count=40, deadline=None)


def test_a_refused_result_counts_and_parks_with_the_last_error() -> None:
    s = ls.ShapeFacts()
    for n in range(MAX_ATTEMPTS):
        s = ls.result_refused(ls.lease(s, f"L{n}"), f"L{n}", f"row.M bad {n}", MAX_ATTEMPTS)
    assert s.state is ls.ShapeState.FAILED and s.attempts == MAX_ATTEMPTS and s.last_error.endswith("bad 2")
    with pytest.raises(ls.TransitionError):
        ls.lease(s, "again")
    s = ls.requeue(s)
    assert s.state is ls.ShapeState.QUEUED and s.attempts == MAX_ATTEMPTS  # another round; attempts kept


def test_release_gives_back_untouched_shapes_and_counts_a_started_one() -> None:
    s = ls.lease(ls.ShapeFacts(), "L")
    assert ls.release(s, "L", started=False, max_attempts=1) == ls.ShapeFacts()
    assert ls.release(s, "L", started=True, max_attempts=1).state is ls.ShapeState.FAILED


def test_an_upgrade_carries_only_a_queued_untried_shape():
    """A leased, tuned or tried shape keeps its own race (issue 35: an inherit carried hundreds of leased shapes,
    whose full races were then taken for lost confirmations)."""
    fresh = ls.ShapeFacts()
    assert ls.carry(fresh) == fresh
    leased = ls.lease(fresh, "L1")
    for shape in (leased, ls.result_ok(leased, "L1"), ls.expire(leased, "L1", "gone", 5),
                  ls.park(fresh, "bad")):
        with pytest.raises(ls.TransitionError):
            ls.carry(shape)
