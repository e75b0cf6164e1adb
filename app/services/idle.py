"""Why a lease request got no work: which campaigns have queued shapes, for whom, so an idle worker can say so."""

from __future__ import annotations

from collections.abc import Collection

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app.schemas import LeaseIn
from app.db.models import Campaign, CampaignShape
from app.domain.lease_states import ShapeState

MAX_LISTED = 5


def idle_reason(s: Session, body: LeaseIn, digests: Collection[str] | None = None) -> str:
    """e.g. 'no queued shapes for gfx=cpu cu_num=2 (image sha256:0000..0001, families bf16_gemm); queued shapes
    exist for gfx942/304 bf16_gemm (3 queued, image sha256:0000..0001)'. digests: the token's images (None: every
    image); a scoped token hears of its own images' queues only."""
    fams = f", families {','.join(body.families)}" if body.families is not None else ""
    head = (f"no queued shapes for gfx={body.gfx} cu_num={body.cu_num} "
            f"(image {_short(body.image_digest)}{fams})")
    q = (select(Campaign.image_digest, Campaign.gfx, Campaign.cu_num, Campaign.family, func.count())
         .join(CampaignShape, CampaignShape.campaign_id == Campaign.id).where(CampaignShape.state == "queued")
         .group_by(Campaign.image_digest, Campaign.gfx, Campaign.cu_num, Campaign.family)
         .order_by(func.count().desc()))
    if digests is not None:
        q = q.where(Campaign.image_digest.in_(list(digests)))
    elsewhere = list(s.execute(q.limit(MAX_LISTED + 1)))
    if not elsewhere:
        return head + "; no campaign has queued shapes: post a capture for this identity (POST /v1/captures)"
    listed = ", ".join(f"{g}/{cu} {fam} ({n} queued, image {_short(d)})"
                       for d, g, cu, fam, n in elsewhere[:MAX_LISTED])
    more = ", ..." if len(elsewhere) > MAX_LISTED else ""
    return f"{head}; queued shapes exist for {listed}{more}"


def in_flight(s: Session, body: LeaseIn, digests: Collection[str] | None = None) -> int:
    """Shapes of this identity's campaigns leased now (to any worker): work that may yet come back to the queue."""
    q = (select(func.count()).select_from(CampaignShape).join(Campaign, CampaignShape.campaign_id == Campaign.id)
         .where(CampaignShape.state == ShapeState.LEASED, Campaign.image_digest == body.image_digest,
                Campaign.gfx == body.gfx, Campaign.cu_num == body.cu_num))
    if body.families is not None:
        q = q.where(Campaign.family.in_(list(body.families)))
    if digests is not None and body.image_digest not in digests:
        return 0
    return int(s.execute(q).scalar_one())


def _short(digest: str) -> str:
    return f"{digest[:11]}..{digest[-4:]}"
