"""Leases: turn-sized batches for workers, heartbeats, per-shape results, expiry and parking."""

from __future__ import annotations

import math
import statistics
import time
import uuid
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.schemas import HeartbeatOut, LeasedShape, LeaseIn, LeaseOut, ResultIn, ResultOut
from app.config import Settings
from app.db.dialect import (CampaignLeaseRow, CampaignRow, LeaseRow, Plain, Rows, Sent, ShapeFactsRow, Sql, Steps,
                            ask, change)
from app.db.models import CampaignShape, Result, utcnow
from app.db.session import Database
from app.domain import lease_states as ls, served, upgrade
from app.domain.families import get_family
from app.domain.improvement import row_helps
from app.domain.keys import runtime_value
from app.domain.roofline import ceiling_us, floor_us
from app.errors import Conflict, DomainError, Forbidden, Invalid, NotFound
from app.services import image_tables
from app.services.caches import caches_of
from app.wire import KERNEL_NAME_RE, MAX_BUDGET_S, formula_safe


def shape_facts(sh: CampaignShape) -> ls.ShapeFacts:
    return ls.ShapeFacts(ls.ShapeState(sh.state), sh.attempts, sh.attempts_base or 0, sh.lease_id, sh.last_error)


def set_shape(sh: CampaignShape, f: ls.ShapeFacts) -> None:
    sh.state, sh.attempts, sh.attempts_base = f.state.value, f.attempts, f.attempts_base
    sh.lease_id, sh.last_error = f.lease_id, f.last_error


AnyLease = LeaseRow | CampaignLeaseRow  # a lease as the sweeper reads it, or with its campaign's facts


def _lease_facts(lease: AnyLease) -> ls.LeaseFacts:
    """Of a lease row (Rows.as_leases)."""
    return ls.LeaseFacts(lease.state, lease.expires_at, lease.hard_deadline)


# The lease, heartbeat, release, result and sweep paths run the dialect module's plain statements on the
# driver's connection (Database.plain; Plain.of(session) where a session's use case shares one, such as the cost
# estimate): they read shape and lease facts as rows, apply lease_states' transitions, and write each back
# guarded by the state it read. No ORM object, unit of work or SQLAlchemy execution context is built on the
# fleet's hottest requests. The lease, heartbeat, release and sweep are steps (dialect.Steps: each batch of
# statements yielded, its answers sent back), so that on PostgreSQL the routes drive them on the event loop
# (AsyncPlain) and elsewhere on a thread (Plain.drive), one logic for both.

def _row_facts(r: ShapeFactsRow) -> ls.ShapeFacts:
    return ls.ShapeFacts(r.state, r.attempts, r.attempts_base or 0, r.lease_id, r.last_error)


def _shape_writes(p: Rows, changes: Sequence[tuple[ShapeFactsRow, ls.ShapeFacts]], now: datetime
                  ) -> list[tuple[Sql, dict[str, object]]]:
    """(shape row as read, its new facts) -> each shape's write, guarded by the state and the lease it was read in
    (a shape requeued and leased again meanwhile is not written)."""
    stamp = p.stamp(now)
    return [(Sql.WRITE_SHAPE, {"id": r.id, "was": r.state.value, "was_lease": r.lease_id,
                             "state": f.state.value, "attempts": f.attempts, "base": f.attempts_base,
                             "lease": f.lease_id, "error": f.last_error, "now": stamp}) for r, f in changes]


class ShapeMoved(Conflict):
    """A guarded shape write found the shape changed since it was read (a sweeper requeued it meanwhile)."""


def _all_written(sent: list[Sent]) -> None:
    """All or nothing: 409 (and the transaction rolled back) if a shape moved meanwhile."""
    if any(w.count != 1 for w in sent):
        raise ShapeMoved("shape_id: a shape changed state meanwhile; retry", "shape_id")


def _write_facts(p: Rows, changes: list[tuple[ShapeFactsRow, ls.ShapeFacts]], now: datetime) -> Steps[None]:
    _all_written((yield tuple(_shape_writes(p, changes, now))))


def _end_lease(p: Rows, lease: AnyLease, how: ls.LeaseState,
               changes: Sequence[tuple[ShapeFactsRow, ls.ShapeFacts]] = (), now: datetime | None = None,
               sweep: bool = False, why: str | None = None) -> Steps[str | None]:
    """An active lease row ends (released, expired, done), with its shapes' changes written in the same round
    trip; 409 if another request ended it meanwhile. The shapes are written before the lease row, the order a
    result post takes its row locks in (its shape, then _finish_if_empty's lease), so the two never deadlock.
    sweep: ending an expired lease is idempotent (replicas' sweepers and every request that sweeps may end the
    same one at once): a lease another sweeper ended meanwhile, or a shape whose result was taken meanwhile, is
    no longer there to end (each write is guarded by the state it read); None when this one ended nothing."""
    state = ls.end_lease(_lease_facts(lease), how).state.value
    *written, ended = yield (*_shape_writes(p, changes, now or utcnow()),
                             (Sql.END_LEASE, {"lid": lease.id, "state": state, "why": why}))
    if sweep:
        return state if ended.count else None
    if not ended.count:
        raise Conflict(f"lease_id: lease {lease.id} ended meanwhile; lease again", "lease_id")
    _all_written(written)
    return state


def sweep_expired(p: Rows, settings: Settings, now: datetime | None = None) -> Steps[int]:
    """The one sweeper: leases past their expiry end, their held shapes each count a try; in id order, so
    concurrent sweepers take their row locks in one order. Returns how many leases this sweep ended."""
    now = now or utcnow()
    dead = p.as_lease_rows((yield from ask(Sql.DEAD_LEASES, {"now": p.stamp(now)})))
    ended = 0
    for lease in dead:
        why = f"lease {lease.id} expired (worker {lease.worker_id} stopped heartbeating)"
        held = yield from p.shape_steps(Sql.HELD, {"lid": lease.id})
        ended += (yield from _end_lease(p, lease, ls.LeaseState.EXPIRED, [
            (r, ls.expire(_row_facts(r), lease.id, why, settings.max_attempts)) for r in held], now,
            sweep=True)) is not None
    return ended


def _seen(p: Rows, body: LeaseIn, now: datetime, token_id: int | None) -> tuple[Sql, dict[str, object]]:
    """The worker's row touched (last seen, what it reports). token_id: the worker token acting (None: an
    admin or auth off, which may act as any worker); a worker token acts only as the worker ids it registered
    (an id another token registered is not overwritten)."""
    seen = {"wid": body.worker_id, "image_digest": body.image_digest, "gfx": body.gfx, "cu_num": body.cu_num,
            "host": body.host, "backends": p.to_doc(body.backends), "aiter_commit": body.aiter_commit,
            "now": p.stamp(now), "tok": token_id}
    return (Sql.TOUCH_WORKER if token_id is None else Sql.TOUCH_OWN_WORKER), seen


def _add_worker(body: LeaseIn, touch: tuple[Sql, dict[str, object]]) -> Steps[None]:
    """A worker id the touch did not find: registered, unless another token's. Idempotent: when first leases of
    one new id race (replicas, a restarted agent), the later insert does nothing and that request touches the row
    the first one made, as any later lease would (the touch passes only where this token may act as the worker)."""
    name, seen = touch
    if not ((yield from change(Sql.ADD_WORKER, seen)) or (yield from change(name, seen))):
        raise Forbidden(f"worker_id: worker {body.worker_id!r} belongs to another token", "worker_id")


# Measured cost per (database, campaign, backend): a result posted here drops its entry; other processes'
# results show within the TTL.


def _sweep_due(p: Rows, settings: Settings) -> bool:
    """A lease request sweeps at most every TTL/10 (1 s at most) per database; the background sweeper covers
    an idle queue, so a busy one does not pay a sweep per lease."""
    key, t, last_sweep = p.key, time.monotonic(), caches_of(p).last_sweep
    if t - last_sweep.get(key, -math.inf) < min(1.0, settings.lease_ttl_s / 10):
        return False
    last_sweep[key] = t
    return True


def shape_cost(p: Rows, campaign_id: int, backend: str, default: float) -> Steps[float]:
    """Median measured seconds per shape in this campaign for this backend (successful results only: a try that
    failed at once says nothing of what a shape costs); the default until measured."""
    key, costs = (p.key, campaign_id, backend), caches_of(p).costs
    hit = costs.get(key)
    if hit is None:
        hit = costs.put(key, [c for c, in (yield from ask(Sql.COSTS, {"cid": campaign_id, "backend": backend}))
                               if c is not None])
    return statistics.median(hit) if hit else default


def est_shape_cost(s: Session | Plain, campaign_id: int, backend: str, default: float) -> float:
    p = Plain.of(s)
    return p.drive(shape_cost(p, campaign_id, backend, default))


def _best_campaign(campaigns: list[CampaignRow], body: LeaseIn) -> CampaignRow | None:
    """The identity's campaign whose top queued shape has the most served time ("campaigns": one ix_shapes_queue
    seek per campaign, an identity has a handful; never a scan of the queue)."""
    return max((r for r in campaigns if r.top is not None and (body.families is None or r.family in body.families)),
               key=lambda r: r.top or 0.0, default=None)  # top: not None, as filtered


def lease_batch(p: Rows, body: LeaseIn, settings: Settings, token_id: int | None = None,
                bind_worker: bool = False) -> Steps[LeaseOut | None]:
    """bind_worker: the token is a worker's, so the worker id must be its own (first come, bound)."""
    now = utcnow()
    if _sweep_due(p, settings):
        yield from sweep_expired(p, settings, now)
    touch = _seen(p, body, now, token_id if bind_worker else None)
    touched, campaigns = yield (touch, (Sql.CAMPAIGNS, {"digest": body.image_digest, "gfx": body.gfx,
                                                      "cu": body.cu_num}))
    if not touched.count:
        yield from _add_worker(body, touch)
    camp = _best_campaign(p.as_campaigns(campaigns.answer), body)
    if camp is None:
        return None
    backend = body.backends[0]
    cost = yield from shape_cost(p, camp.id, backend, settings.default_shape_cost_s)
    n = min(max(1, math.floor(body.budget_s / cost)) if cost > 0 else settings.max_lease_shapes,
            settings.max_lease_shapes, body.max_shapes or settings.max_lease_shapes)
    rows = yield from p.shape_steps(Sql.PICK, {"cid": camp.id, "n": n})
    if not rows:
        return None
    lf = ls.open_lease(now, body.budget_s, settings.lease_ttl_s, settings.lease_grace_s)
    lease_id = str(uuid.uuid4())
    leased = [(r, ls.lease(_row_facts(r), lease_id)) for r in rows]
    _added, *written = yield (
        (Sql.ADD_LEASE, {"id": lease_id, "wid": body.worker_id, "cid": camp.id, "backend": backend, "tok": token_id,
                       "budget_s": body.budget_s, "now": p.stamp(now), "hard": p.stamp(lf.hard_deadline),
                       "exp": p.stamp(lf.expires_at), "state": lf.state.value}),
        *_shape_writes(p, leased, now))
    _all_written(written)
    tuned, untuned = yield from image_tables.lease_headers(p, camp.image_digest, camp.family)
    # every value built here from typed rows: constructed without a second validation
    return LeaseOut.model_construct(
        lease_id=lease_id, campaign_id=camp.id, family=camp.family, image_digest=camp.image_digest, gfx=camp.gfx,
        cu_num=camp.cu_num, backend=backend, budget_s=body.budget_s, expires_at=lf.expires_at,
        hard_deadline=lf.hard_deadline, heartbeat_every_s=settings.lease_ttl_s / 3, est_shape_cost_s=cost,
        tuned_header=tuned, untuned_header=untuned,
        shapes=[LeasedShape.model_construct(shape_id=r.id, shape=r.shape, calls=r.calls,
                                            attempts=f.attempts - f.attempts_base + 1,
                                            incumbent=upgrade.incumbent(r.finalists), finalists=r.finalists or [])
                for r, f in leased])


@dataclass(frozen=True)
class Caller:
    """Who acts on a lease. token_id: the worker token that must hold it (None: an admin, or auth off);
    worker_id: the worker it must have been granted to (None: not said, which only an admin may leave out);
    digests: the images the token may act on (None: every image)."""
    token_id: int | None = None
    worker_id: str | None = None
    digests: tuple[str, ...] | None = None


ANYONE = Caller()


def _owned_lease(p: Rows, lease_id: str, caller: Caller, found: list[CampaignLeaseRow] | None = None
                 ) -> Steps[CampaignLeaseRow]:
    """The lease's row (with its campaign's facts; found: the row read already), if this caller may act on it."""
    if found is None:
        found = yield from p.lease_steps(Sql.LEASE, {"lid": lease_id})
    if not found:
        raise NotFound(f"lease_id: no lease {lease_id}", "lease_id")
    lease = found[0]
    if caller.token_id is not None and lease.token_id != caller.token_id:
        raise Forbidden(f"lease_id: lease {lease_id} belongs to another worker's token", "lease_id")
    if caller.worker_id is not None and lease.worker_id != caller.worker_id:
        raise Forbidden(f"worker_id: lease {lease_id} was granted to worker {lease.worker_id!r}, not to "
                        f"{caller.worker_id!r}", "worker_id")
    if caller.digests is not None and lease.image_digest not in caller.digests:
        raise Forbidden(f"image_digest: lease {lease_id} is for an image outside this token's images",
                        "image_digest")
    return lease


def _live_lease(p: Rows, lease_id: str, settings: Settings, caller: Caller = ANYONE,
                found: list[CampaignLeaseRow] | None = None) -> Steps[CampaignLeaseRow]:
    lease = yield from _owned_lease(p, lease_id, caller, found)
    now = utcnow()
    if ls.is_expired(_lease_facts(lease), now):
        yield from sweep_expired(p, settings, now)
        lease = yield from _owned_lease(p, lease_id, caller)
    if not ls.is_live(_lease_facts(lease), now):
        raise Conflict(f"lease_id: lease {lease_id} is {lease.state}; lease again", "lease_id")
    return lease


def heartbeat(p: Rows, lease_id: str, settings: Settings, caller: Caller = ANYONE) -> Steps[HeartbeatOut]:
    lease = yield from _live_lease(p, lease_id, settings, caller)
    now = utcnow()
    lf = ls.heartbeat(_lease_facts(lease), now, settings.lease_ttl_s)
    beat, _ = yield ((Sql.BEAT, {"lid": lease.id, "now": p.stamp(now), "exp": p.stamp(lf.expires_at)}),
                     (Sql.WORKER_SEEN, {"wid": lease.worker_id, "now": p.stamp(now)}))
    if not beat.count:  # the worker's row touched with it is rolled back with the 409
        raise Conflict(f"lease_id: lease {lease_id} ended meanwhile; lease again", "lease_id")
    return HeartbeatOut.model_construct(lease_id=lease.id, expires_at=lf.expires_at, hard_deadline=lf.hard_deadline)


def release(p: Rows, lease_id: str, settings: Settings, caller: Caller = ANYONE,
            started: Collection[int] = (), why: str | None = None) -> Steps[int]:
    """Untouched shapes go back to the queue uncounted; `started` ones count a try; `why` the worker gave (a busy
    GPU) is kept on the lease. The lease and the shapes it holds are read in one round trip, the lease ended and
    the shapes written in a second."""
    found, held = yield ((Sql.LEASE, {"lid": lease_id}), (Sql.HELD, {"lid": lease_id}))
    lease = yield from _live_lease(p, lease_id, settings, caller, p.as_leases(found.answer))
    back = p.as_shapes(held.answer)
    yield from _end_lease(p, lease, ls.LeaseState.RELEASED,
               [(r, ls.release(_row_facts(r), lease.id, r.id in started, settings.max_attempts)) for r in back],
               why=why)
    return len(back)


def _check_row(s: Session | Plain, lease: CampaignLeaseRow, shape: ShapeFactsRow, row: dict[str, Any]
               ) -> dict[str, str]:
    """The winner row must be in the image's schema and key exactly the leased shape."""
    fam = get_family(lease.family)
    schema = image_tables.schema_for(s, lease.image_digest, lease.family)
    cells = {k: "" if v is None else str(v) for k, v in row.items()}
    missing = [c for c in schema.header if c not in cells]
    if missing:
        raise Invalid(f"row.{missing[0]}: missing; the image's {fam.name} header is {','.join(schema.header)}",
                      f"row.{missing[0]}")
    for col in schema.header:
        try:
            formula_safe(cells[col])
        except ValueError as e:
            raise Invalid(f"row.{col}: {cells[col][:80]!r} {e}", f"row.{col}") from None
    for col in fam.kernel_columns:  # free text nowhere: a kernel is named as AITER names its kernels
        if cells.get(col) and not KERNEL_NAME_RE.fullmatch(cells[col]):
            raise Invalid(f"row.{col}: {cells[col][:80]!r} is not a kernel name (ASCII letters, digits and '_', as "
                          f"AITER names its kernels)", f"row.{col}")
    want = dict(shape.shape, gfx=lease.gfx, cu_num=str(lease.cu_num))
    for col in schema.key_columns:
        if col in want and runtime_value(col, cells[col]) != runtime_value(col, want[col]):
            raise Invalid(f"row.{col}: {cells[col]!r} does not match the leased shape's {want[col]!r}",
                          f"row.{col}")
    bad = fam.unreadable(cells)  # a cell AITER's op could not parse when it runs the row
    if bad is not None:
        raise Invalid(f"row.{bad[0]}: {bad[1]}", f"row.{bad[0]}")
    return {c: cells[c] for c in schema.header}


def _check_timing(lease: CampaignLeaseRow, shape: ShapeFactsRow, body: ResultIn) -> None:
    """A time below what the device can possibly do (peak matrix rate, operands at cache bandwidth) is not a
    measurement: refused, so it never becomes a winner nor lands in an overlay."""
    fam = get_family(lease.family)
    for field, us in (("us", body.us), ("default_us", body.default_us)):
        if us is not None and body.status != "failed":
            floor = floor_us(fam, shape.shape, lease.gfx, lease.cu_num)
            if us < floor:
                raise Invalid(f"{field}: {us} us is below the roofline floor of {floor:.3g} us for this shape on "
                              f"{lease.gfx} with {lease.cu_num} CUs", field)
    if body.default_us is not None and body.status != "failed":
        # the default's time is what every row's gain is measured against: timed by this worker in this race
        # (one of its candidates), and not past what any default path on the device costs
        if not any(c.us is not None and math.isclose(c.us, body.default_us, rel_tol=1e-6) for c in body.candidates):
            raise Invalid(f"default_us: {body.default_us} us is not the time of any posted candidate; the default "
                          f"must be timed in the same race", "default_us")
        ceiling = ceiling_us(fam, shape.shape, lease.gfx, lease.cu_num)
        if body.default_us > ceiling:
            raise Invalid(f"default_us: {body.default_us} us is above {ceiling:.3g} us, slower than any default "
                          f"path for this shape on {lease.gfx} with {lease.cu_num} CUs", "default_us")


CLOCK_SKEW = timedelta(minutes=5)  # a worker's clock may be this far off the service's


def _check_times(lease: CampaignLeaseRow, body: ResultIn, settings: Settings, now: datetime) -> None:
    """A result's times fall inside its lease's life: it began at most a budget and the grace before the hard
    deadline (MAX_BUDGET_S: the lease's budget is not on its row) and nothing finishes after the deadline or now,
    give or take a clock's skew; elapsed_s is no longer than that life."""
    life = timedelta(seconds=MAX_BUDGET_S + settings.lease_grace_s)
    first, last = lease.hard_deadline - life - CLOCK_SKEW, min(now, lease.hard_deadline) + CLOCK_SKEW
    for field, t in (("started_at", body.started_at), ("finished_at", body.finished_at)):
        if t is not None and not first <= t <= last:
            raise Invalid(f"{field}: {t.isoformat()} is outside lease {lease.id}'s life ({first.isoformat()} to "
                          f"{last.isoformat()})", field)
    if body.started_at and body.finished_at and body.started_at > body.finished_at:
        raise Invalid("finished_at: before started_at", "finished_at")
    if body.elapsed_s is not None and body.elapsed_s > (life + CLOCK_SKEW).total_seconds():
        raise Invalid(f"elapsed_s: {body.elapsed_s} s is longer than any lease lives", "elapsed_s")


def _one_kernel(lease: CampaignLeaseRow, body: ResultIn, row: dict[str, str] | None) -> ResultIn:
    """A result names one kernel: the confirmation is decided on kernel_name and the overlay serves the row's
    kernel column(s), so the two must agree (a result without kernel_name takes its row's)."""
    if row is None:
        return body
    theirs = get_family(lease.family).kernel_of(row)
    if body.kernel_name is None:
        return body.model_copy(update={"kernel_name": theirs or None})
    if body.kernel_name != theirs:
        raise Invalid(f"kernel_name: {body.kernel_name[:200]!r} is not the row's kernel {theirs[:200]!r}; a result "
                      f"names the kernel its row serves", "kernel_name")
    return body


def _check_kernel(p: Plain, lease: CampaignLeaseRow, body: ResultIn, row: dict[str, str] | None) -> None:
    """The winner must be a kernel the image's tuner races, where the image reported its catalog for the family."""
    catalog = image_tables.kernel_catalog(p, lease.image_digest, lease.family)
    if catalog is None or body.status == "failed":
        return
    for field, name in (("row.kernelName", (row or {}).get("kernelName")), ("kernel_name", body.kernel_name)):
        if name and name not in catalog:
            raise Invalid(f"{field}: {name[:200]!r} is not in the image's {lease.family} kernel catalog "
                          f"({len(catalog)} kernels, as its worker reported them)", field)


@dataclass
class Refused:
    """A result the service refused (its try counted) or kept as a superseded record, committed either way; the
    route answers the error."""
    error: DomainError
    shape_state: str
    outcome: str = "refused"  # or SUPERSEDED


SUPERSEDED = "superseded"  # the status of a late result kept as a record only


# TODO(#36, s36c): body.status as wire.ResultStatus once it lands (compared as strings here until then)
def _kind(body: ResultIn, row: dict | None, err_max: float, min_improvement_pct: float) -> ls.ResultKind:
    if body.status == "failed":
        return ls.ResultKind.FAILED
    timed = (body.us is not None and math.isfinite(body.us) and body.us > 0
             and body.err_ratio is not None and 0 <= body.err_ratio <= err_max)
    if body.status == "default_best" or (timed and row is not None and not row_helps(body.us, body.default_us,
                                                                                       min_improvement_pct)):
        # nothing beat the default path by AITER's margin: tuned, and no row (the overlay carries only rows
        # that help)
        return ls.ResultKind.DEFAULT_BEST if timed else ls.ResultKind.UNVERIFIED
    return ls.ResultKind.VERIFIED if timed and row is not None else ls.ResultKind.UNVERIFIED


def _lease_for_result(p: Rows, lease: CampaignLeaseRow, settings: Settings, caller: Caller
                      ) -> Steps[tuple[CampaignLeaseRow, bool]]:
    """The lease a result is posted to (its row as read), and whether it is late: a result finished before the
    lease expired (a database stall, a worker delivering its spool) is still taken while nobody else has the
    shape."""
    lease_id = lease.id
    now = utcnow()
    if ls.is_expired(_lease_facts(lease), now):
        yield from sweep_expired(p, settings, now)
        lease = yield from _owned_lease(p, lease_id, caller)
    if lease.state is ls.LeaseState.EXPIRED:
        return lease, True
    return (yield from _live_lease(p, lease_id, settings, caller, [lease])), False


def post_result(s: Session | Plain, lease_id: str, body: ResultIn, settings: Settings, caller: Caller = ANYONE
                ) -> ResultOut | Refused:
    p = Plain.of(s)
    read = p.batch((Sql.LEASE, {"lid": lease_id}), (Sql.RESULT_OF, {"lid": lease_id, "sid": body.shape_id}),
                   (Sql.SHAPE, {"sid": body.shape_id}))  # one round trip
    lease = p.drive(_owned_lease(p, lease_id, caller, p.as_leases(read[0].answer)))
    dup, found = p.as_posted(read[1].answer), p.as_shapes(read[2].answer)
    if dup:  # a retried POST: same answer, nothing stored twice
        return ResultOut(result_id=dup[0].id, shape_state=found[0].state.value if found else "?",
                         verified=bool(dup[0].verified), duplicate=True)
    lease, late = p.drive(_lease_for_result(p, lease, settings, caller))
    if late:  # the expiry (maybe this request's sweep) moved the shape: read it again
        found = p.shape_rows(Sql.SHAPE, {"sid": body.shape_id})
    shape = found[0] if found else None
    if shape is None or shape.campaign_id != lease.campaign_id or (not late and not _row_facts(shape).held_by(lease.id)):
        raise Conflict(f"shape_id: shape {body.shape_id} is not in lease {lease_id}", "shape_id")
    now = utcnow()
    if late and shape.state is not ls.ShapeState.QUEUED:
        return _superseded(p, shape, lease, body, now, f"shape {body.shape_id} is {shape.state} now")
    try:
        row, body = _checked(p, lease, shape, body, settings, now)
    except Invalid as e:  # the try counts, so a shape whose results are always refused ends up parked
        if late:
            return Refused(e, shape.state.value)
        f = ls.result_refused(_row_facts(shape), lease.id, e.detail, settings.max_attempts)
        p.drive(_write_facts(p, [(shape, f)], now))
        p.drive(_finish_if_empty(p, lease))
        return Refused(e, f.state.value)
    return _take(p, lease, shape, body, row, late, settings, now)


def _checked(p: Plain, lease: CampaignLeaseRow, shape: ShapeFactsRow, body: ResultIn, settings: Settings,
             now: datetime) -> tuple[dict[str, str] | None, ResultIn]:
    """A result's checks (Invalid on the first that fails): its winner row as the image's schema keeps it (None
    for no row) and the result naming its row's kernel."""
    row = _check_row(p, lease, shape, body.row) if body.status == "ok" and body.row is not None else None
    _check_timing(lease, shape, body)
    _check_times(lease, body, settings, now)
    body = _one_kernel(lease, body, row)
    _check_kernel(p, lease, body, row)
    return row, body


def _take(p: Plain, lease: CampaignLeaseRow, shape: ShapeFactsRow, body: ResultIn, row: dict[str, str] | None,
          late: bool, settings: Settings, now: datetime) -> ResultOut | Refused:
    """A result that passed its checks: stored, and its shape's transition (and an inherited shape's confirmation)
    written; a late one only if it tuned the shape."""
    err_max = get_family(lease.family).err_max
    kind = _kind(body, row, err_max, settings.min_improvement_pct)
    if late and kind not in ls.TUNED_BY:  # the expiry already counted this try
        return _superseded(p, shape, lease, body, now, "only a tuned result is still taken")
    conf = _confirmation(shape, kind, body)
    if conf is not None and conf.outcome is upgrade.Outcome.SHIPPED_KEPT:
        kind = ls.ResultKind.DEFAULT_BEST  # the image's shipped row stays: nothing of ours to deploy
    verified = kind is ls.ResultKind.VERIFIED
    if kind is ls.ResultKind.DEFAULT_BEST:
        row = None
    result_id = _add_result(p, shape, lease, body, now, row, verified,
                            "default_best" if kind is ls.ResultKind.DEFAULT_BEST else body.status)
    caches_of(p).costs.pop((p.key, lease.campaign_id, body.backend))
    _measured_default(p, shape, body)
    why = body.error or f"no verified winner (err_ratio {body.err_ratio} > {err_max} or bad us {body.us})"
    if late:
        f = ls.late_result(_row_facts(shape), kind)
    else:
        f = ls.result(_row_facts(shape), lease.id, kind, None if verified else why, settings.max_attempts)
    if conf is not None and conf.outcome is not None:
        if conf.full_race:  # the carried row lost: withdrawn (outcome set), the shape raced in full
            f = ls.reopen(f, f"the row carried from the parent image lost its confirmation race to "
                             f"{body.kernel_name or 'the default'}; racing in full")
        p.run(Sql.SET_OUTCOME, {"sid": shape.id, "outcome": conf.outcome.value,
                              "finalists": p.to_doc(None if conf.full_race else shape.finalists)})
    p.drive(_write_facts(p, [(shape, f)], now))
    if not late:
        p.drive(_finish_if_empty(p, lease))
    return ResultOut(result_id=result_id, shape_state=f.state.value, verified=verified)


def _measured_default(p: Plain, shape: ShapeFactsRow, body: ResultIn) -> None:
    """The default path measured on this identity replaces the roofline estimate in the served time."""
    if body.status != "failed" and body.default_us is not None and math.isfinite(body.default_us) and body.default_us > 0:
        p.run(Sql.MEASURED_DEFAULT, {"sid": shape.id, "us": body.default_us,
                                   "priority": served.priority(shape.calls, shape.steps, body.default_us)})


def _confirmation(shape: ShapeFactsRow, kind: ls.ResultKind, body: ResultIn) -> upgrade.Confirmation | None:
    """What this result decides for a shape inherited from the image's parent and not decided yet."""
    if not shape.triage or shape.outcome:
        return None
    return upgrade.confirm(upgrade.Triage(shape.triage), upgrade.incumbent(shape.finalists), kind,
                           body.kernel_name)


def take_result(db: Database, lease_id: str, body: ResultIn, settings: Settings, caller: Caller = ANYONE
                ) -> ResultOut | Refused:
    """post_result in a transaction of its own, once more if a sweeper (any replica's) expired the lease and
    requeued the shape between this post's read and its write: read again, the lease is expired and the result
    is taken late or kept as a record, never rolled back into a 409 that the worker would drop from its spool."""
    try:
        with db.plain() as p:
            return post_result(p, lease_id, body, settings, caller)
    except ShapeMoved:
        with db.plain() as p:
            return post_result(p, lease_id, body, settings, caller)


def _add_result(p: Plain, shape: ShapeFactsRow, lease: CampaignLeaseRow, body: ResultIn, now: datetime,
                row: dict[str, Any] | None, verified: bool, status: str) -> int:
    return p.rows(Sql.ADD_RESULT, {
        "sid": shape.id, "lid": lease.id, "wid": lease.worker_id, "backend": body.backend,
        "digest": lease.image_digest, "aiter_commit": body.aiter_commit, "status": status, "us": body.us,
        "err_ratio": body.err_ratio, "verified": verified, "kernel_name": body.kernel_name,
        "default_us": body.default_us, "row": p.to_doc(row), "candidates": p.to_doc([c.model_dump() for c in body.candidates]),
        "error": body.error, "confidence": body.confidence, "spread": body.spread,
        "timing": p.to_doc(body.timing.model_dump() if body.timing else None),
        "elapsed_s": body.elapsed_s, "started_at": p.stamp(body.started_at),
        "finished_at": p.stamp(body.finished_at or now), "now": p.stamp(now)})[0][0]


def _superseded(p: Plain, shape: ShapeFactsRow, lease: CampaignLeaseRow, body: ResultIn, now: datetime,
                why: str) -> Refused:
    """A late result the shape can no longer take (another lease has or tuned it, or it does not tune): kept as a
    record, never verified and no transition, so no finished measurement is lost; the worker still gets its 409."""
    rid = _add_result(p, shape, lease, body, now, body.row, False, SUPERSEDED)
    return Refused(Conflict(f"lease_id: lease {lease.id} expired and {why}; result {rid} kept as a record only",
                            "lease_id"), shape.state.value, SUPERSEDED)


def _finish_if_empty(p: Rows, lease: AnyLease) -> Steps[None]:
    if not (yield from ask(Sql.HELD, {"lid": lease.id})):
        yield from _end_lease(p, lease, ls.LeaseState.DONE)


def requeue_campaign_failures(s: Session, campaign_id: int) -> int:
    """Admin: give parked shapes another round of attempts (their attempt counts stay)."""
    parked = list(s.scalars(select(CampaignShape).where(CampaignShape.campaign_id == campaign_id,
                                                        CampaignShape.state == ls.ShapeState.FAILED.value)))
    for sh in parked:
        set_shape(sh, ls.requeue(shape_facts(sh)))
    return len(parked)
