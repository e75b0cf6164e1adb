"""Engagement: before deploy, rebuild AITER's lookup key per captured shape; after, count log hits."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.db.models import Campaign, CampaignShape
from app.domain import engagement as eng
from app.domain.log_lines import parse_log
from app.domain.shapes import ShapeError, make_shape
from app.domain.tables import read_table
from app.errors import Invalid, NotFound
from app.services import overlays
from app.services.captures import family_or_422


def campaign_or_404(s: Session, campaign_id: int) -> Campaign:
    camp = s.get(Campaign, campaign_id)
    if camp is None:
        raise NotFound(f"campaign_id: no campaign {campaign_id}", "campaign_id")
    return camp


def pre_deploy(s: Session, campaign_id: int, merged: bool = False, table_csv: str | None = None) -> dict:
    """table_csv: check a table as written (e.g. a hand-made or older overlay) instead of ours."""
    camp = campaign_or_404(s, campaign_id)
    ov = overlays.build(s, camp.image_digest, camp.family, merged=merged)
    warnings: list[str] = []
    if table_csv is not None:
        try:
            ov.table = read_table(table_csv, "supplied")
        except ValueError as e:
            raise Invalid(f"body: {e}", "body") from None
        warnings = ov.schema.header_problems(ov.table.header)
    shapes = list(s.scalars(select(CampaignShape).where(CampaignShape.campaign_id == camp.id)
                            .order_by(CampaignShape.priority.desc(), CampaignShape.id)))
    checks = eng.check(ov.family, ov.schema.key_columns, camp.gfx, camp.cu_num, [x.shape for x in shapes], ov.table)
    total = sum(x.priority for x in shapes) or 1.0
    covered = sum(x.priority for x, c in zip(shapes, checks) if c.hit)
    return {
        "campaign_id": camp.id, "image_digest": camp.image_digest, "family": camp.family, "gfx": camp.gfx,
        "cu_num": camp.cu_num, "env_var": ov.family.env_var,
        "table": "supplied" if table_csv is not None else ("merged" if merged else "overlay"), "warnings": warnings,
        "header": list(ov.schema.header), "shapes": len(shapes), "hits": sum(c.hit for c in checks),
        "misses": sum(not c.hit for c in checks), "served_time_covered": covered / total,
        "report": [{"shape_id": x.id, "shape": x.shape, "state": x.state, "hit": c.hit, "tried_m": c.tried_m,
                    "matched_m": c.matched_m, "reason": c.reason,
                    "kernel": (c.row or {}).get("kernelName") or (c.row or {}).get("kernelName1")}
                   for x, c in zip(shapes, checks)],
    }


def post_deploy(s: Session, digest: str, gfx: str, cu_num: int, family: str, log: str) -> dict:
    """Per-shape counts of AITER's hit and miss lines in a server log taken after deploy."""
    fam = family_or_422(family)
    counts: dict[str, dict] = {}
    skipped = 0
    for ev in parse_log(log).events:
        if ev.family != fam.name:
            continue
        try:
            shape = make_shape(fam, ev.shape, "log")
        except ShapeError:
            skipped += 1
            continue
        c = counts.setdefault(shape.key, {"shape": shape.as_dict(), "hits": 0, "misses": 0, "files": set()})
        c["hits" if ev.hit else "misses"] += 1
        if ev.file:
            c["files"].add(ev.file)
    camp = s.scalars(select(Campaign).where(Campaign.image_digest == digest, Campaign.gfx == gfx,
                                            Campaign.cu_num == cu_num, Campaign.family == fam.name)).first()
    captured = {}
    if camp is not None:
        captured = {x.shape_key: x for x in s.scalars(select(CampaignShape).where(
            CampaignShape.campaign_id == camp.id, CampaignShape.shape_key.in_(list(counts) or [""])))}
    report = [{"shape": c["shape"], "hits": c["hits"], "misses": c["misses"], "files": sorted(c["files"]),
               "shape_id": captured[k].id if k in captured else None,
               "state": captured[k].state if k in captured else None} for k, c in counts.items()]
    return {"family": fam.name, "env_var": fam.env_var, "campaign_id": camp.id if camp else None,
            "shapes": len(report), "hit_lines": sum(r["hits"] for r in report),
            "miss_lines": sum(r["misses"] for r in report), "unparsable_lines": skipped, "report": report,
            "note": "hit lines appear only with AITER_LOG_TUNED_CONFIG=1 set before `import aiter`"}
