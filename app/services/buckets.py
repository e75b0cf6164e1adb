"""Bucket plans: tune the padded-M rows AITER will look up, one row serving many captured Ms."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.db.models import CampaignShape
from app.domain import buckets, lease_states
from app.domain.families import get_family
from app.domain.roofline import estimate_us
from app.domain.shapes import flops, make_shape
from app.services.lookups import campaign_or_404
from app.services.leasing import set_shape, shape_facts


def _plan(s: Session, campaign_id: int, states: tuple[str, ...]) -> tuple:
    camp = campaign_or_404(s, campaign_id)
    fam = get_family(camp.family)
    shapes = list(s.scalars(select(CampaignShape).where(CampaignShape.campaign_id == camp.id,
                                                        CampaignShape.state.in_(states))))
    return camp, fam, shapes, buckets.plan(fam, [(x.shape, x.priority) for x in shapes])


def report(s: Session, campaign_id: int) -> dict:
    camp, fam, shapes, rows = _plan(s, campaign_id, ("queued", "leased", "tuned", "failed", "covered"))
    total = sum(x.priority for x in shapes) or 1.0
    return {"campaign_id": camp.id, "family": fam.name, "m_column": fam.m_column, "captured_shapes": len(shapes),
            "rows_to_tune": len(rows), "served_time_covered": sum(r.served for r in rows) / total,
            "rows": [{"shape": r.shape(fam.m_column) if fam.m_column else dict(r.rest), "m": r.m, "covers_m": r.covers,
                      "served_share": r.served / total} for r in rows]}


def apply(s: Session, campaign_id: int) -> dict:
    """Queue the bucket rows for the shapes still queued; the Ms they serve are parked as 'covered'."""
    camp, fam, shapes, rows = _plan(s, campaign_id, ("queued",))
    if fam.m_column is None:
        return {"added": 0, "covered": 0}
    by_m = {(tuple((k, v) for k, v in x.shape.items() if k != fam.m_column), int(x.shape[fam.m_column])): x
            for x in shapes}
    added = covered = 0
    for r in rows:
        target = by_m.get((r.rest, r.m))
        if target is None:
            shape = make_shape(fam, r.shape(fam.m_column))
            target = CampaignShape(campaign_id=camp.id, shape_key=shape.key, shape=shape.as_dict(), calls=0,
                                   flops=flops(fam, shape.as_dict()), priority=r.served, state="queued",
                                   default_us=estimate_us(fam, shape.as_dict(), camp.gfx, camp.cu_num))
            s.add(target)
            added += 1
        else:
            target.priority = r.served
        for m in r.covers:
            x = by_m.get((r.rest, m))
            if x is not None and x is not target:
                set_shape(x, lease_states.cover(shape_facts(x), f"served by the row at {fam.m_column}={r.m}"))
                covered += 1
    return {"added": added, "covered": covered, "rows_to_tune": len(rows)}
