"""Demand for autoscalers: the work queued per worker identity (image digest, gfx, cu_num), in shapes and in
estimated device seconds, so a KEDA ScaledJob or any HPA-style scaler sizes the worker Job by what is waiting.

A shape's estimated cost is the campaign's own figure, the one its lease sizing uses (leasing.est_shape_cost:
the median race seconds of its successful results with its last backend), else TUNER_DEFAULT_SHAPE_COST_S until a
worker has measured one. Leased shapes are reported apart: workers already hold them, so a scaler that counts
running jobs itself (KEDA's "accurate" strategy) sizes new jobs by the queued ones alone.
"""

from __future__ import annotations

from collections.abc import Collection

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.db.models import Campaign, Lease, Result
from app.services.campaigns import shape_counts
from app.services.leasing import est_shape_cost

BASIS_RESULTS = "median race seconds of the campaign's results"
BASIS_DEFAULT = "TUNER_DEFAULT_SHAPE_COST_S (no result yet)"


def _cost(s: Session, campaign_id: int, default: float) -> tuple[float, bool]:
    """(seconds per shape, measured): the campaign's last backend's median, as leases are sized."""
    backend = s.scalar(select(Result.backend).join(Lease, Lease.id == Result.lease_id)
                       .where(Lease.campaign_id == campaign_id).order_by(Result.id.desc()).limit(1))
    if backend is None:
        return default, False
    # what est_shape_cost takes a median of (dialect's "costs"): a failed try's seconds say nothing
    measured = s.scalar(select(Result.id).join(Lease, Lease.id == Result.lease_id)
                        .where(Lease.campaign_id == campaign_id, Result.backend == backend,
                               Result.elapsed_s.is_not(None), Result.status.in_(("ok", "default_best"))).limit(1))
    return est_shape_cost(s, campaign_id, backend, default), measured is not None


def demand(s: Session, default_cost: float, digests: Collection[str] | None = None, image_digest: str | None = None,
           gfx: str | None = None, cu_num: int | None = None) -> dict:
    """Per identity (every campaign's, zeros included, so a gauge falls to 0 instead of vanishing): shapes queued
    and leased and the queued shapes' estimated seconds, with each family's part; and the total over them.
    digests: the caller's scope (None: every image); image_digest, gfx, cu_num: filters."""
    counts = shape_counts(s)
    q = select(Campaign.id, Campaign.image_digest, Campaign.gfx, Campaign.cu_num, Campaign.family)
    if image_digest is not None:
        q = q.where(Campaign.image_digest == image_digest)
    if gfx is not None:
        q = q.where(Campaign.gfx == gfx)
    if cu_num is not None:
        q = q.where(Campaign.cu_num == cu_num)
    rows: dict[tuple[str, str, int], dict] = {}
    for cid, digest, g, cu, family in s.execute(q.order_by(Campaign.image_digest, Campaign.gfx, Campaign.cu_num,
                                                           Campaign.family)):
        if digests is not None and digest not in digests:
            continue
        by_state = counts.get(cid, {})
        queued = by_state["queued"].n if "queued" in by_state else 0
        leased = by_state["leased"].n if "leased" in by_state else 0
        cost, measured = _cost(s, cid, default_cost) if queued or leased else (default_cost, False)
        row = rows.setdefault((digest, g, cu), {"image_digest": digest, "gfx": g, "cu_num": cu, "queued_shapes": 0,
                                                "leased_shapes": 0, "gpu_s_queued_est": 0.0, "families": []})
        row["queued_shapes"] += queued
        row["leased_shapes"] += leased
        row["gpu_s_queued_est"] += queued * cost
        row["families"].append({"campaign_id": cid, "family": family, "queued_shapes": queued,
                                "leased_shapes": leased, "est_shape_cost_s": cost,
                                "cost_basis": BASIS_RESULTS if measured else BASIS_DEFAULT})
    out = list(rows.values())
    total = {k: sum(r[k] for r in out) for k in ("queued_shapes", "leased_shapes", "gpu_s_queued_est")}
    return {"identities": out, "total": total}
