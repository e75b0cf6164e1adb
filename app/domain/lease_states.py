"""Shape and lease states and every transition between them: pure functions, no SQL, no clock of their own.

One home for the queue's rules (procrastinate's pattern: closed enums, one module of transitions). The service
(app/services/leasing.py) reads rows into these facts, applies one event, and writes the facts back.

Rules that keep one bad shape from stopping the fleet:
- a try that ends without a tuned shape counts an attempt: a failed or refused result, an unverified winner,
  an expired lease, and a release of a shape the worker had started; only untouched shapes go back uncounted;
- attempts never decrease; after `max_attempts` counted tries (since the last admin requeue) the shape is parked
  as failed with the last error, so no shape is leased forever.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from enum import StrEnum


class ShapeState(StrEnum):
    QUEUED = "queued"
    LEASED = "leased"
    TUNED = "tuned"
    FAILED = "failed"  # parked: no more leases until an admin requeues it
    COVERED = "covered"  # served by a bucket row tuned in its place (app/services/buckets.py)


class LeaseState(StrEnum):
    ACTIVE = "active"
    RELEASED = "released"
    EXPIRED = "expired"
    DONE = "done"


class ResultKind(StrEnum):
    VERIFIED = "verified"  # a winner row that passed every check
    DEFAULT_BEST = "default_best"  # nothing beat the default: tuned, and no row to deploy
    UNVERIFIED = "unverified"  # a row whose error or timing did not pass the check
    FAILED = "failed"  # the backend could not tune the shape
    REFUSED = "refused"  # the service refused the posted result (a 4xx naming the field)


TUNED_BY = frozenset({ResultKind.VERIFIED, ResultKind.DEFAULT_BEST})


class TransitionError(Exception):
    """An event that this state does not allow (the service answers 409)."""


@dataclass(frozen=True)
class ShapeFacts:
    state: ShapeState = ShapeState.QUEUED
    attempts: int = 0  # counted tries, ever (never decreases)
    attempts_base: int = 0  # attempts at the last admin requeue: parking counts tries from here
    lease_id: str | None = None
    last_error: str | None = None

    def held_by(self, lease_id: str) -> bool:
        return self.state is ShapeState.LEASED and self.lease_id == lease_id


def lease(shape: ShapeFacts, lease_id: str) -> ShapeFacts:
    if shape.state is not ShapeState.QUEUED:
        raise TransitionError(f"a {shape.state} shape cannot be leased")
    return replace(shape, state=ShapeState.LEASED, lease_id=lease_id)


def _held(shape: ShapeFacts, lease_id: str) -> None:
    if not shape.held_by(lease_id):
        raise TransitionError(f"the shape is not held by lease {lease_id} (it is {shape.state})")


def _count_try(shape: ShapeFacts, error: str, max_attempts: int) -> ShapeFacts:
    attempts = shape.attempts + 1
    parked = attempts - shape.attempts_base >= max_attempts
    return replace(shape, state=ShapeState.FAILED if parked else ShapeState.QUEUED, attempts=attempts,
                   lease_id=None, last_error=error)


def result(shape: ShapeFacts, lease_id: str, kind: ResultKind, error: str | None, max_attempts: int) -> ShapeFacts:
    """A result posted for a shape the lease holds: tuned, or one counted try."""
    _held(shape, lease_id)
    if kind in TUNED_BY:
        return replace(shape, state=ShapeState.TUNED, attempts=shape.attempts + 1, lease_id=None, last_error=None)
    return _count_try(shape, error or f"result {kind}", max_attempts)


def reopen(shape: ShapeFacts, why: str) -> ShapeFacts:
    """A tuned shape whose result overturned the row it carried from its image's parent (app/domain/upgrade.py)
    goes back to the queue for a full race: its try was counted by the result, and it is not parked."""
    if shape.state is not ShapeState.TUNED:
        raise TransitionError(f"only a tuned shape is reopened, not a {shape.state} one")
    return replace(shape, state=ShapeState.QUEUED, lease_id=None, last_error=why)


def late_result(shape: ShapeFacts, kind: ResultKind) -> ShapeFacts:
    """A result finished under a lease that expired meanwhile (the expiry counted the try): taken only if it
    tunes the shape and nobody holds it now, so no finished winner is lost and none is taken twice."""
    if kind not in TUNED_BY or shape.state is not ShapeState.QUEUED:
        raise TransitionError(f"a late {kind} result is not taken for a {shape.state} shape")
    return replace(shape, state=ShapeState.TUNED, attempts=shape.attempts + 1, lease_id=None, last_error=None)


def result_ok(shape: ShapeFacts, lease_id: str) -> ShapeFacts:
    return result(shape, lease_id, ResultKind.VERIFIED, None, 1)


def result_refused(shape: ShapeFacts, lease_id: str, error: str, max_attempts: int) -> ShapeFacts:
    return result(shape, lease_id, ResultKind.REFUSED, f"refused: {error}", max_attempts)


def backend_failure(shape: ShapeFacts, lease_id: str, error: str, max_attempts: int) -> ShapeFacts:
    return result(shape, lease_id, ResultKind.FAILED, error, max_attempts)


def expire(shape: ShapeFacts, lease_id: str, why: str, max_attempts: int) -> ShapeFacts:
    """The lease died (no heartbeat): the worker may have crashed on this shape, so the try counts."""
    _held(shape, lease_id)
    return _count_try(shape, why, max_attempts)


def release(shape: ShapeFacts, lease_id: str, started: bool, max_attempts: int) -> ShapeFacts:
    """A clean stop: an untouched shape goes back uncounted; one the worker had started counts a try (else a
    shape that makes every worker give up would be given back forever)."""
    _held(shape, lease_id)
    if started:
        return _count_try(shape, f"released by lease {lease_id} while being worked on", max_attempts)
    return replace(shape, state=ShapeState.QUEUED, lease_id=None)


def park(shape: ShapeFacts, error: str) -> ShapeFacts:
    if shape.state is ShapeState.TUNED:
        raise TransitionError("a tuned shape is not parked")
    return replace(shape, state=ShapeState.FAILED, lease_id=None, last_error=error)


def cover(shape: ShapeFacts, note: str) -> ShapeFacts:
    """A queued shape whose padded-M bucket row is tuned in its place."""
    if shape.state is not ShapeState.QUEUED:
        raise TransitionError(f"only a queued shape is covered by a bucket row, not a {shape.state} one")
    return replace(shape, state=ShapeState.COVERED, last_error=note)


def carry(shape: ShapeFacts) -> ShapeFacts:
    """An image upgrade hands its parent's row to a shape (app/services/upgrades.py) only while nobody has worked on
    it here: queued and never tried. A leased, tuned, failed or tried shape keeps its own race: carrying it would
    turn its full race's result into a lost confirmation and race it again."""
    if shape.state is not ShapeState.QUEUED or shape.attempts or shape.lease_id:
        raise TransitionError(f"a {shape.state} shape (tried {shape.attempts} times) is not carried")
    return shape


def requeue(shape: ShapeFacts) -> ShapeFacts:
    """Admin: a parked shape gets another `max_attempts` tries (attempts stay; the base moves up)."""
    if shape.state is not ShapeState.FAILED:
        raise TransitionError(f"only a failed shape is requeued, not a {shape.state} one")
    return replace(shape, state=ShapeState.QUEUED, attempts_base=shape.attempts)


@dataclass(frozen=True)
class LeaseFacts:
    state: LeaseState
    expires_at: datetime
    hard_deadline: datetime  # created + budget + grace: no heartbeat extends a lease past it


def open_lease(now: datetime, budget_s: float, ttl_s: float, grace_s: float) -> LeaseFacts:
    hard = now + timedelta(seconds=budget_s + grace_s)
    return LeaseFacts(LeaseState.ACTIVE, min(now + timedelta(seconds=ttl_s), hard), hard)


def is_live(lease_: LeaseFacts, now: datetime) -> bool:
    return lease_.state is LeaseState.ACTIVE and lease_.expires_at >= now


def is_expired(lease_: LeaseFacts, now: datetime) -> bool:
    """An active lease past its expiry: the sweeper ends it."""
    return lease_.state is LeaseState.ACTIVE and lease_.expires_at < now


def heartbeat(lease_: LeaseFacts, now: datetime, ttl_s: float) -> LeaseFacts:
    if not is_live(lease_, now):
        raise TransitionError(f"lease is {'expired' if is_expired(lease_, now) else lease_.state}; lease again")
    return replace(lease_, expires_at=min(now + timedelta(seconds=ttl_s), lease_.hard_deadline))


def end_lease(lease_: LeaseFacts, how: LeaseState) -> LeaseFacts:
    """released / expired / done: an ended lease never becomes active again."""
    if how is LeaseState.ACTIVE or lease_.state is not LeaseState.ACTIVE:
        raise TransitionError(f"a {lease_.state} lease cannot become {how}")
    return replace(lease_, state=how)
