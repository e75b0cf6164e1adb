"""Campaign views: counts by state, served-time coverage, GPU time spent and left."""

from __future__ import annotations

from typing import Any, NamedTuple

from sqlalchemy import Select, func, select
from sqlalchemy.orm import Session

from app.db.models import Campaign, CampaignShape, Capture, Image, Lease, Result, Worker, utcnow
from app.domain.ab_gate import default_lengths
from app.domain.lease_states import ShapeState
from app.domain.served import rule as priority_rule
from app.services import pages
from app.services import builds
from app.services.leasing import SUPERSEDED, est_shape_cost

STATES = tuple(st.value for st in ShapeState)
# what a listed shape shows: plain rows, not ORM objects
_LISTED = tuple(getattr(CampaignShape, c) for c in ("id", "shape", "calls", "flops", "steps", "default_measured",
                                                     "default_us", "priority", "state", "attempts", "last_error"))
_SHOWN = tuple(c for c in _LISTED if c.key != "shape")  # the rest of what it shows: a shape never changes


class StateCounts(NamedTuple):
    """One state's shapes of a campaign."""
    n: int
    served: float  # their served time (sum of priority)
    placed: float  # sum of priority x id: moves when served time moves between shapes at the same total


def shape_counts(s: Session, campaign_id: int | None = None) -> dict[int, dict[str, StateCounts]]:
    """Per campaign (every one, or campaign_id's) and state: its shapes' counts. One pass over ix_shapes_queue
    (index-only): a campaign page's summary and its totals' version (engagement.shapes_version) share it."""
    q = (select(CampaignShape.campaign_id, CampaignShape.state, func.count(), func.sum(CampaignShape.priority),
                func.sum(CampaignShape.priority * CampaignShape.id))
         .group_by(CampaignShape.campaign_id, CampaignShape.state))
    if campaign_id is not None:
        q = q.where(CampaignShape.campaign_id == campaign_id)
    out: dict[int, dict[str, StateCounts]] = {}
    for cid, state, n, served, placed in s.execute(q):
        out.setdefault(cid, {})[state] = StateCounts(n, served or 0.0, placed or 0.0)
    return out


def _by_campaign(s: Session, q: Select, campaign_id: int | None) -> dict[int, Any]:
    """q's (campaign, value) rows over the campaigns' results, found from their leases (a result's lease is of its
    shape's campaign: leasing.post_result refuses any other), so a campaign's few results are a few index seeks
    however many shapes it has, where a join from its shapes probed results once per shape (~10 ms at 100k)."""
    q = q.join(Lease, Lease.id == Result.lease_id).group_by(Lease.campaign_id)
    return dict(s.execute(q.where(Lease.campaign_id == campaign_id) if campaign_id is not None else q).all())


def summaries(s: Session, default_cost: float, campaign_id: int | None = None,
              counts: dict[int, dict[str, StateCounts]] | None = None) -> list[dict]:
    """Every campaign's counts and coverage, or one campaign's (campaign_id); counts: shape_counts(s,
    campaign_id) when the caller has it."""
    if counts is None:
        counts = shape_counts(s, campaign_id)
    camps = select(Campaign, Image).join(Image, Image.digest == Campaign.image_digest)
    if campaign_id is not None:
        camps = camps.where(Campaign.id == campaign_id)
    # tuned shapes whose answer was "default is best": tuned, no row (the rest of the tuned have a row)
    default_best = _by_campaign(s, select(Lease.campaign_id, func.count(func.distinct(CampaignShape.id)))
                                .select_from(Result).join(CampaignShape, CampaignShape.id == Result.shape_id)
                                .where(CampaignShape.state == "tuned", Result.status == "default_best"),
                                campaign_id)
    spent = _by_campaign(s, select(Lease.campaign_id, func.sum(Result.elapsed_s)).select_from(Result), campaign_id)
    out = []
    for camp, img in s.execute(camps.order_by(Campaign.image_digest, Campaign.gfx, Campaign.family)):
        by_state = counts.get(camp.id, {})
        c = {st: by_state[st].n if st in by_state else 0 for st in STATES}
        total = sum(c.values())
        tot = [sum(x.served for x in by_state.values()), by_state["tuned"].served if "tuned" in by_state else 0.0]
        cost = _cost_any(s, camp.id, default_cost)
        out.append({"campaign_id": camp.id, "image_digest": camp.image_digest, "gfx": camp.gfx,
                    "cu_num": camp.cu_num, "family": camp.family, "aiter_version": img.aiter_version,
                    "aiter_commit": img.aiter_commit, "shapes": total, **c,
                    "default_best": default_best.get(camp.id, 0),
                    "tuned_with_row": c["tuned"] - default_best.get(camp.id, 0),
                    "progress": (c["tuned"] + c["failed"] + c["covered"]) / total if total else 0.0,
                    "served_time_covered": tot[1] / tot[0] if tot[0] else 0.0,
                    "gpu_s_spent": float(spent.get(camp.id) or 0.0),  # race time: results' elapsed_s
                    "build_s": builds.seconds(s, camp.image_digest, camp.family)[0],  # compile lane, apart
                    "gpu_s_left_est": (c["queued"] + c["leased"]) * cost, "est_shape_cost_s": cost,
                    "priority_rule": priority_rule(camp.step_hist),
                    "steps_seen": sum((camp.step_hist or {}).values()),
                    # the served request lengths (their medians: the serving A/B's default input/output lengths)
                    "requests_seen": sum(((camp.length_hist or {}).get("generation") or {}).values()),
                    "served_lengths": dict(zip(("prompt_median", "generation_median"),
                                               default_lengths(camp.length_hist)))})
    return out


def summary(s: Session, default_cost: float, campaign_id: int,
            counts: dict[int, dict[str, StateCounts]] | None = None) -> dict:
    (one,) = summaries(s, default_cost, campaign_id, counts)
    return one


def _cost_any(s: Session, campaign_id: int, default: float) -> float:
    backend = s.scalar(select(Result.backend).join(Lease, Lease.id == Result.lease_id)  # _by_campaign says why
                       .where(Lease.campaign_id == campaign_id).order_by(Result.id.desc()).limit(1))
    return est_shape_cost(s, campaign_id, backend, default) if backend else default


def shapes(s: Session, campaign_id: int, limit: int = pages.DEFAULT_LIMIT, after: str | None = None
           ) -> tuple[list[dict], str | None]:
    """One page of the campaign's shapes by served time, and the next page's cursor (pages.keyset)."""
    rows, nxt = pages.keyset(s, select(*_LISTED).where(CampaignShape.campaign_id == campaign_id), limit, after)
    best = _best_shown(s, [x.id for x in rows])
    out = []
    for x in rows:
        out.append({"shape_id": x.id, "shape": x.shape, "calls": x.calls, "flops": x.flops,
                    "steps": x.steps, "default_us_est": None if x.default_measured else x.default_us,
                    "served": x.priority, "state": x.state, "attempts": x.attempts, "last_error": x.last_error,
                    **_result_cells(best.get(x.id))})
    return out, nxt


def _best_shown(s: Session, shape_ids: list[int]) -> dict[int, Result]:
    """Each shape's result the page shows: its fastest verified one, else its first."""
    best: dict[int, Result] = {}
    for r in s.scalars(select(Result).where(Result.shape_id.in_(shape_ids or [-1])).order_by(Result.id)):
        if r.status == SUPERSEDED:  # a dead lease's late record: never the shape's result
            continue
        if r.shape_id not in best or (r.verified and (not best[r.shape_id].verified or
                                                      (r.us or 1e30) < (best[r.shape_id].us or 1e30))):
            best[r.shape_id] = r
    return best


def _result_cells(got: Result | None) -> dict[str, Any]:
    """A shape's result as the page shows it (all None without one)."""
    if got is None:
        return dict.fromkeys(("kernel", "us", "default_us", "backend", "gpu_s", "confidence", "spread", "timing"))
    return {"kernel": got.kernel_name, "us": got.us, "default_us": got.default_us, "backend": got.backend,
            "gpu_s": got.elapsed_s, "confidence": got.confidence, "spread": got.spread, "timing": got.timing}


def listed_version(s: Session, campaign_id: int, limit: int = pages.DEFAULT_LIMIT, after: str | None = None
                   ) -> tuple[list[tuple], str | None]:
    """What the same page of shapes() shows, read without the shapes (they never change) or their results: a
    result counts a try on its shape (app/domain/lease_states.py result), so its row moves with each one."""
    rows, nxt = pages.keyset(s, select(*_SHOWN).where(CampaignShape.campaign_id == campaign_id), limit, after)
    return [tuple(x) for x in rows], nxt


def workers(s: Session, stale_s: float) -> list[dict]:
    now = utcnow()
    posted = {w: n for w, n in s.execute(select(Result.worker_id, func.count()).group_by(Result.worker_id))}
    given_back = {w: n for w, n in s.execute(select(Lease.worker_id, func.count()).where(Lease.end_reason.is_not(None))
                                             .group_by(Lease.worker_id))}
    out = []
    for w in s.scalars(select(Worker).order_by(Worker.last_seen_at.desc())):
        lease = s.scalars(select(Lease).where(Lease.worker_id == w.id, Lease.state == "active")
                          .order_by(Lease.created_at.desc())).first()
        used = (now - lease.created_at).total_seconds() if lease else None
        out.append({"worker_id": w.id, "image_digest": w.image_digest, "gfx": w.gfx, "cu_num": w.cu_num,
                    "host": w.host, "backends": w.backends, "last_seen_at": w.last_seen_at.isoformat(),
                    "stale": (now - w.last_seen_at).total_seconds() > stale_s,
                    "lease_id": lease.id if lease else None, "budget_s": lease.budget_s if lease else None,
                    "budget_used_s": used, "results_posted": posted.get(w.id, 0),
                    "handed_back": given_back.get(w.id, 0), "handed_back_why": _last_reason(s, w.id)
                    if given_back.get(w.id) else None})
    return out


def _last_reason(s: Session, worker_id: str) -> str | None:
    """Why the worker last handed a lease back early (ReleaseIn.reason), as it said."""
    return s.scalar(select(Lease.end_reason).where(Lease.worker_id == worker_id, Lease.end_reason.is_not(None))
                    .order_by(Lease.created_at.desc()).limit(1))


def coverage_points(s: Session, campaign_id: int) -> list[tuple[float, float]]:
    """(GPU seconds spent so far, share of served time tuned) after each result, in the order they landed. A shape
    counts once a verified row or a "default is best" answer lands: the shapes the page counts as tuned."""
    total = s.scalar(select(func.sum(CampaignShape.priority)).where(CampaignShape.campaign_id == campaign_id)) or 0
    q = (select(Result.elapsed_s, Result.verified | (Result.status == "default_best"), CampaignShape.priority,
                CampaignShape.id)
         .join(CampaignShape, CampaignShape.id == Result.shape_id)
         .where(CampaignShape.campaign_id == campaign_id).order_by(Result.id))
    spent = covered = 0.0
    seen: set[int] = set()
    out = []
    for elapsed, verified, priority, sid in s.execute(q):
        spent += elapsed or 0.0
        if verified and sid not in seen:
            seen.add(sid)
            covered += priority
        out.append((spent, covered / total if total else 0.0))
    return out


def aiter_claims(s: Session) -> dict[str, list[str]]:
    """Per image, the AITER versions its servers' captures claimed (apart from what its workers reported)."""
    out: dict[str, list[str]] = {}
    q = (select(Campaign.image_digest, Capture.aiter_version).join(Capture, Capture.campaign_id == Campaign.id)
         .where(Capture.aiter_version.is_not(None)).distinct().order_by(Campaign.image_digest, Capture.aiter_version))
    for digest, version in s.execute(q):
        out.setdefault(digest, []).append(version)  # type: ignore[arg-type]  # not null: the query's where
    return out
