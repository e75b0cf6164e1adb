"""Leases: turn-sized batches for workers, heartbeats, per-shape results, expiry and parking."""

from __future__ import annotations

import math
import statistics
import time
import uuid
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import bindparam, insert, or_, select, update
from sqlalchemy.orm import Session

from app.api.schemas import LeasedShape, LeaseIn, LeaseOut, ResultIn, ResultOut
from app.config import Settings
from app.db.dialect import lock_for_lease
from app.db.models import Campaign, CampaignShape, Lease, Result, Worker, utcnow
from app.domain import lease_states as ls, served
from app.domain.families import get_family
from app.domain.improvement import row_helps
from app.domain.keys import runtime_value
from app.domain.roofline import floor_us
from app.errors import Conflict, Forbidden, Invalid, NotFound
from app.services import schemas as table_schemas
from app.ttl_cache import TTLCache


def shape_facts(sh: CampaignShape) -> ls.ShapeFacts:
    return ls.ShapeFacts(ls.ShapeState(sh.state), sh.attempts, sh.attempts_base or 0, sh.lease_id, sh.last_error)


def set_shape(sh: CampaignShape, f: ls.ShapeFacts) -> None:
    sh.state, sh.attempts, sh.attempts_base = f.state.value, f.attempts, f.attempts_base
    sh.lease_id, sh.last_error = f.lease_id, f.last_error


def _lease_facts(lease: Lease) -> ls.LeaseFacts:
    return ls.LeaseFacts(ls.LeaseState(lease.state), lease.expires_at, lease.hard_deadline)


# The lease path reads shape facts as plain rows and writes each transition back with one executemany
# UPDATE (guarded by the state it read): no ORM unit of work per shape on the hottest requests.
_FACTS = (CampaignShape.id, CampaignShape.shape, CampaignShape.calls, CampaignShape.state, CampaignShape.attempts,
          CampaignShape.attempts_base, CampaignShape.lease_id, CampaignShape.last_error)
_T = CampaignShape.__table__
_WRITE = (update(_T).where(_T.c.id == bindparam("b_id"), _T.c.state == bindparam("b_was"))
          .values(state=bindparam("b_state"), attempts=bindparam("b_attempts"), attempts_base=bindparam("b_base"),
                  lease_id=bindparam("b_lease"), last_error=bindparam("b_error")))


# Built once: the hot statements skip construction and cache-key work on every request.
_W = Worker.__table__
_TOUCH = update(_W).where(_W.c.id == bindparam("b_wid"))
# a worker token acts only as the worker ids it registered (an id another token registered is not overwritten)
_TOUCH_OWN = _TOUCH.where(or_(_W.c.token_id.is_(None), _W.c.token_id == bindparam("b_tok")))
_TOP = (select(CampaignShape.priority)
        .where(CampaignShape.campaign_id == Campaign.id, CampaignShape.state == ls.ShapeState.QUEUED.value)
        .order_by(CampaignShape.priority.desc()).limit(1).correlate(Campaign).scalar_subquery())
_CAMPAIGNS = select(Campaign, _TOP).where(Campaign.image_digest == bindparam("b_digest"),
                                          Campaign.gfx == bindparam("b_gfx"), Campaign.cu_num == bindparam("b_cu"))
# the next n of a campaign's queue: one ix_shapes_queue range (SKIP LOCKED on PostgreSQL)
_PICK = lock_for_lease(select(*_FACTS).where(CampaignShape.campaign_id == bindparam("b_cid"),
                                             CampaignShape.state == ls.ShapeState.QUEUED.value)
                       .order_by(CampaignShape.priority.desc(), CampaignShape.id).limit(bindparam("b_n")))
_HELD = select(*_FACTS).where(CampaignShape.lease_id == bindparam("b_lid"),
                              CampaignShape.state == ls.ShapeState.LEASED.value)


def _row_facts(r) -> ls.ShapeFacts:  # type: ignore[no-untyped-def]
    return ls.ShapeFacts(ls.ShapeState(r.state), r.attempts, r.attempts_base or 0, r.lease_id, r.last_error)


def _write_facts(s: Session, changes: list[tuple[int, str, ls.ShapeFacts]]) -> None:
    """(shape id, the state it was read in, its new facts): all or nothing (409 if a row moved meanwhile)."""
    if not changes:
        return
    done = s.execute(_WRITE, [{"b_id": sid, "b_was": was, "b_state": f.state.value, "b_attempts": f.attempts,
                               "b_base": f.attempts_base, "b_lease": f.lease_id, "b_error": f.last_error}
                              for sid, was, f in changes]).rowcount
    if done != len(changes):
        raise Conflict("shape_id: a shape changed state meanwhile; retry", "shape_id")


def _held(s: Session, lease_id: str) -> list[CampaignShape]:
    return list(s.scalars(select(CampaignShape).where(CampaignShape.lease_id == lease_id,
                                                      CampaignShape.state == ls.ShapeState.LEASED.value)))


def sweep_expired(s: Session, settings: Settings, now: datetime | None = None) -> int:
    """The one sweeper: leases past their expiry end, their held shapes each count a try."""
    now = now or utcnow()
    dead = list(s.scalars(select(Lease).where(Lease.state == ls.LeaseState.ACTIVE.value, Lease.expires_at < now)))
    for lease in dead:
        lease.state = ls.end_lease(_lease_facts(lease), ls.LeaseState.EXPIRED).state.value
        why = f"lease {lease.id} expired (worker {lease.worker_id} stopped heartbeating)"
        for sh in _held(s, lease.id):
            set_shape(sh, ls.expire(shape_facts(sh), lease.id, why, settings.max_attempts))
    return len(dead)


def _touch_worker(s: Session, body: LeaseIn, now: datetime, token_id: int | None = None) -> None:
    """token_id: the worker token acting (None: an admin or auth off, which may act as any worker)."""
    seen = {"image_digest": body.image_digest, "gfx": body.gfx, "cu_num": body.cu_num, "host": body.host,
            "backends": body.backends, "aiter_commit": body.aiter_commit, "last_seen_at": now}
    stmt, params = (_TOUCH, {}) if token_id is None else (_TOUCH_OWN, {"b_tok": token_id})
    if not s.execute(stmt, {"b_wid": body.worker_id, **params, **seen}).rowcount:
        if token_id is not None and s.get(Worker, body.worker_id) is not None:
            raise Forbidden(f"worker_id: worker {body.worker_id!r} belongs to another token", "worker_id")
        s.execute(insert(Worker.__table__), {"id": body.worker_id, "first_seen_at": now, "token_id": token_id,
                                             **seen})


# Measured cost per (database, campaign, backend): a result posted here drops its entry; other processes'
# results show within the TTL.
_COSTS = TTLCache(10.0)
_LAST_SWEEP: dict[object, float] = {}  # per database: when a lease request last swept


def _sweep_due(s: Session, settings: Settings) -> bool:
    """A lease request sweeps at most every TTL/10 (1 s at most) per database; the background sweeper covers
    an idle queue, so a busy one does not pay a sweep per lease."""
    key, t = s.get_bind(), time.monotonic()
    if t - _LAST_SWEEP.get(key, -math.inf) < min(1.0, settings.lease_ttl_s / 10):
        return False
    _LAST_SWEEP[key] = t
    return True


def est_shape_cost(s: Session, campaign_id: int, backend: str, default: float) -> float:
    """Median measured seconds per shape in this campaign for this backend; the default until measured."""
    key = (s.get_bind(), campaign_id, backend)
    hit = _COSTS.get(key)
    if hit is None:
        q = (select(Result.elapsed_s).join(CampaignShape, CampaignShape.id == Result.shape_id)
             .where(CampaignShape.campaign_id == campaign_id, Result.backend == backend,
                    Result.elapsed_s.is_not(None))
             .order_by(Result.id.desc()).limit(200))
        hit = _COSTS.put(key, [c for c in s.scalars(q) if c is not None])
    return statistics.median(hit) if hit else default


def _pick_campaign(s: Session, body: LeaseIn) -> Campaign | None:
    """The identity's campaign whose top queued shape has the most served time: one ix_shapes_queue seek per
    campaign (an identity has a handful), never a scan of the queue."""
    rows = s.execute(_CAMPAIGNS, {"b_digest": body.image_digest, "b_gfx": body.gfx, "b_cu": body.cu_num})
    best = max(((c, p) for c, p in rows if p is not None and (body.families is None or c.family in body.families)),
               key=lambda cp: cp[1], default=None)
    return best[0] if best else None


def lease_batch(s: Session, body: LeaseIn, settings: Settings, token_id: int | None = None,
                bind_worker: bool = False) -> LeaseOut | None:
    """bind_worker: the token is a worker's, so the worker id must be its own (first come, bound)."""
    now = utcnow()
    if _sweep_due(s, settings):
        sweep_expired(s, settings, now)
    _touch_worker(s, body, now, token_id if bind_worker else None)
    camp = _pick_campaign(s, body)
    if camp is None:
        return None
    backend = body.backends[0]
    cost = est_shape_cost(s, camp.id, backend, settings.default_shape_cost_s)
    n = max(1, math.floor(body.budget_s / cost)) if cost > 0 else 10_000
    if body.max_shapes:
        n = min(n, body.max_shapes)
    rows = s.execute(_PICK, {"b_cid": camp.id, "b_n": n}).all()
    if not rows:
        return None
    lf = ls.open_lease(now, body.budget_s, settings.lease_ttl_s, settings.lease_grace_s)
    lease_id = str(uuid.uuid4())
    s.execute(insert(Lease.__table__), {
        "id": lease_id, "worker_id": body.worker_id, "campaign_id": camp.id, "backend": backend,
        "token_id": token_id, "budget_s": body.budget_s, "created_at": now, "heartbeat_at": now,
        "hard_deadline": lf.hard_deadline, "expires_at": lf.expires_at, "state": lf.state.value})
    leased = [(r, ls.lease(_row_facts(r), lease_id)) for r in rows]
    _write_facts(s, [(r.id, r.state, f) for r, f in leased])
    return LeaseOut(lease_id=lease_id, campaign_id=camp.id, family=camp.family, image_digest=camp.image_digest,
                    gfx=camp.gfx, cu_num=camp.cu_num, backend=backend, budget_s=body.budget_s,
                    expires_at=lf.expires_at, hard_deadline=lf.hard_deadline,
                    heartbeat_every_s=settings.lease_ttl_s / 3, est_shape_cost_s=cost,
                    tuned_header=list(table_schemas.schema_for(s, camp.image_digest, camp.family).header),
                    untuned_header=list(table_schemas.untuned_header_for(s, camp.image_digest, camp.family)),
                    shapes=[LeasedShape(shape_id=r.id, shape=r.shape, calls=r.calls,
                                        attempts=f.attempts - f.attempts_base + 1) for r, f in leased])


def _owned_lease(s: Session, lease_id: str, owner: int | None) -> Lease:
    """owner: the token that must hold the lease (None: no check: auth off, or an admin)."""
    lease = s.get(Lease, lease_id)
    if lease is None:
        raise NotFound(f"lease_id: no lease {lease_id}", "lease_id")
    if owner is not None and lease.token_id != owner:
        raise Forbidden(f"lease_id: lease {lease_id} belongs to another worker's token", "lease_id")
    return lease


def _live_lease(s: Session, lease_id: str, settings: Settings, owner: int | None = None) -> Lease:
    lease = _owned_lease(s, lease_id, owner)
    now = utcnow()
    if ls.is_expired(_lease_facts(lease), now):
        sweep_expired(s, settings, now)
    if not ls.is_live(_lease_facts(lease), now):
        raise Conflict(f"lease_id: lease {lease_id} is {lease.state}; lease again", "lease_id")
    return lease


def heartbeat(s: Session, lease_id: str, settings: Settings, owner: int | None = None) -> Lease:
    lease = _live_lease(s, lease_id, settings, owner)
    now = utcnow()
    lease.heartbeat_at = now
    lease.expires_at = ls.heartbeat(_lease_facts(lease), now, settings.lease_ttl_s).expires_at
    w = s.get(Worker, lease.worker_id)
    if w is not None:
        w.last_seen_at = now
    return lease


def release(s: Session, lease_id: str, settings: Settings, owner: int | None = None,
            started: Collection[int] = ()) -> int:
    """A clean stop: untouched shapes go back to the queue uncounted; `started` ones count a try."""
    lease = _live_lease(s, lease_id, settings, owner)
    lease.state = ls.end_lease(_lease_facts(lease), ls.LeaseState.RELEASED).state.value
    back = s.execute(_HELD, {"b_lid": lease.id}).all()
    _write_facts(s, [(r.id, r.state, ls.release(_row_facts(r), lease.id, r.id in started, settings.max_attempts))
                     for r in back])
    return len(back)


def _check_row(s: Session, camp: Campaign, shape: CampaignShape, row: dict) -> dict[str, str]:
    """The winner row must be in the image's schema and key exactly the leased shape."""
    fam = get_family(camp.family)
    schema = table_schemas.schema_for(s, camp.image_digest, camp.family)
    cells = {k: "" if v is None else str(v) for k, v in row.items()}
    missing = [c for c in schema.header if c not in cells]
    if missing:
        raise Invalid(f"row.{missing[0]}: missing; the image's {fam.name} header is {','.join(schema.header)}",
                      f"row.{missing[0]}")
    want = dict(shape.shape, gfx=camp.gfx, cu_num=str(camp.cu_num))
    for col in schema.key_columns:
        if col in want and runtime_value(col, cells[col]) != runtime_value(col, want[col]):
            raise Invalid(f"row.{col}: {cells[col]!r} does not match the leased shape's {want[col]!r}",
                          f"row.{col}")
    return {c: cells[c] for c in schema.header}


def _check_timing(camp: Campaign, shape: CampaignShape, body: ResultIn) -> None:
    """A time below what the device can possibly do (peak matrix rate, operands at cache bandwidth) is not a
    measurement: refused, so it never becomes a winner nor lands in an overlay."""
    fam = get_family(camp.family)
    for field, us in (("us", body.us), ("default_us", body.default_us)):
        if us is not None and body.status != "failed":
            floor = floor_us(fam, shape.shape, camp.gfx, camp.cu_num)
            if us < floor:
                raise Invalid(f"{field}: {us} us is below the roofline floor of {floor:.3g} us for this shape on "
                              f"{camp.gfx} with {camp.cu_num} CUs", field)


@dataclass
class Refused:
    """A result the service refused: the shape's try is counted (and committed); the route answers the error."""
    error: Invalid
    shape_state: str


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


def _lease_for_result(s: Session, lease_id: str, settings: Settings, owner: int | None) -> tuple[Lease, bool]:
    """The lease a result is posted to, and whether it is late: a result finished before the lease expired
    (a database stall, a worker delivering its spool) is still taken while nobody else has the shape."""
    lease = _owned_lease(s, lease_id, owner)
    now = utcnow()
    if ls.is_expired(_lease_facts(lease), now):
        sweep_expired(s, settings, now)
    if lease.state == ls.LeaseState.EXPIRED.value:
        return lease, True
    return _live_lease(s, lease_id, settings, owner), False


def post_result(s: Session, lease_id: str, body: ResultIn, settings: Settings, owner: int | None = None
                ) -> ResultOut | Refused:
    _owned_lease(s, lease_id, owner)
    dup = s.scalars(select(Result).where(Result.lease_id == lease_id, Result.shape_id == body.shape_id)).first()
    if dup is not None:  # a retried POST: same answer, nothing stored twice
        shape = s.get(CampaignShape, body.shape_id)
        return ResultOut(result_id=dup.id, shape_state=shape.state if shape else "?", verified=dup.verified,
                         duplicate=True)
    lease, late = _lease_for_result(s, lease_id, settings, owner)
    shape = s.get(CampaignShape, body.shape_id)
    if shape is None or shape.campaign_id != lease.campaign_id or (not late and not shape_facts(shape).held_by(lease.id)):
        raise Conflict(f"shape_id: shape {body.shape_id} is not in lease {lease_id}", "shape_id")
    if late and shape.state != ls.ShapeState.QUEUED.value:
        raise Conflict(f"lease_id: lease {lease_id} expired and shape {body.shape_id} is {shape.state} now",
                       "lease_id")
    camp = s.get(Campaign, lease.campaign_id)
    assert camp is not None
    try:
        row = _check_row(s, camp, shape, body.row) if body.status == "ok" and body.row is not None else None
        _check_timing(camp, shape, body)
    except Invalid as e:  # the try counts, so a shape whose results are always refused ends up parked
        if not late:
            set_shape(shape, ls.result_refused(shape_facts(shape), lease.id, e.detail, settings.max_attempts))
            _finish_if_empty(s, lease)
        return Refused(e, shape.state)
    err_max = get_family(camp.family).err_max
    kind = _kind(body, row, err_max, settings.min_improvement_pct)
    if late and kind not in ls.TUNED_BY:  # the expiry already counted this try
        raise Conflict(f"lease_id: lease {lease_id} expired; only a tuned result is still taken", "lease_id")
    verified = kind is ls.ResultKind.VERIFIED
    if kind is ls.ResultKind.DEFAULT_BEST:
        row = None
    res = Result(shape_id=shape.id, lease_id=lease.id, worker_id=lease.worker_id, backend=body.backend,
                 image_digest=camp.image_digest, aiter_commit=body.aiter_commit,
                 status="default_best" if kind is ls.ResultKind.DEFAULT_BEST else body.status, us=body.us,
                 err_ratio=body.err_ratio, verified=verified, kernel_name=body.kernel_name,
                 default_us=body.default_us, row=row, candidates=[c.model_dump() for c in body.candidates],
                 error=body.error, elapsed_s=body.elapsed_s, started_at=body.started_at,
                 finished_at=body.finished_at or utcnow())
    s.add(res)
    _COSTS.pop((s.get_bind(), camp.id, body.backend))
    if body.status != "failed" and body.default_us is not None and math.isfinite(body.default_us) and body.default_us > 0:
        # the default path measured on this identity replaces the roofline estimate in the served time
        shape.default_us, shape.default_measured = body.default_us, True
        shape.priority = served.priority(shape.calls, shape.steps, body.default_us)
    why = body.error or f"no verified winner (err_ratio {body.err_ratio} > {err_max} or bad us {body.us})"
    if late:
        set_shape(shape, ls.late_result(shape_facts(shape), kind))
    else:
        set_shape(shape, ls.result(shape_facts(shape), lease.id, kind, None if verified else why,
                                   settings.max_attempts))
        _finish_if_empty(s, lease)
    s.flush()
    return ResultOut(result_id=res.id, shape_state=shape.state, verified=verified)


def _finish_if_empty(s: Session, lease: Lease) -> None:
    s.flush()
    if not _held(s, lease.id):
        lease.state = ls.end_lease(_lease_facts(lease), ls.LeaseState.DONE).state.value


def requeue_campaign_failures(s: Session, campaign_id: int) -> int:
    """Admin: give parked shapes another round of attempts (their attempt counts stay)."""
    parked = list(s.scalars(select(CampaignShape).where(CampaignShape.campaign_id == campaign_id,
                                                        CampaignShape.state == ls.ShapeState.FAILED.value)))
    for sh in parked:
        set_shape(sh, ls.requeue(shape_facts(sh)))
    return len(parked)
