"""After deploy (issue 49): a server log read per rank against the campaign's prediction, kept so the campaign
page can alert when a rank misses the overlay's shapes or builds kernels while serving."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.db.models import DeployCheck
from app.schemas import LogIn
from app.services import engagement


def record(s: Session, body: LogIn) -> dict[str, Any]:
    """engagement.post_deploy of the log; kept (its per-rank view and alerts) where a campaign matches."""
    out = engagement.post_deploy(s, body.image_digest, body.gfx, body.cu_num, body.family, body.log,
                                 deploy_form=body.form, ranks=body.ranks)
    if out["campaign_id"] is not None:
        s.add(DeployCheck(campaign_id=out["campaign_id"], form=out["form"], hit_lines=out["hit_lines"],
                          miss_lines=out["miss_lines"], ranks=out["ranks"], alerts=out["alerts"]))
        s.flush()
    return out


def latest(s: Session, campaign_id: int) -> dict[str, Any] | None:
    c = s.scalars(select(DeployCheck).where(DeployCheck.campaign_id == campaign_id)
                  .order_by(DeployCheck.id.desc())).first()
    if c is None:
        return None
    return {"id": c.id, "form": c.form, "hit_lines": c.hit_lines, "miss_lines": c.miss_lines, "ranks": c.ranks,
            "alerts": c.alerts, "created_at": c.created_at.isoformat() if c.created_at else None}
