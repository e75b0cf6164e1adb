"""Overlay CSVs: the best verified row per key, in the image's own header; optionally merged."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.db.models import Campaign, CampaignShape, Result
from app.domain.families import TableFamily
from app.domain.headers import Schema
from app.domain.keys import row_key
from app.domain.tables import Table, merge, render_csv
from app.services.captures import family_or_422
from app.services.schemas import schema_for, shipped_tables


@dataclass
class Overlay:
    family: TableFamily
    schema: Schema
    table: Table
    shipped: list[Table]

    def csv(self) -> str:
        return render_csv(self.table.header, self.table.rows)


def best_rows(s: Session, digest: str, family: str, schema: Schema) -> list[dict[str, str]]:
    q = (select(Result).join(CampaignShape, CampaignShape.id == Result.shape_id)
         .join(Campaign, Campaign.id == CampaignShape.campaign_id)
         .where(Campaign.image_digest == digest, Campaign.family == family, Result.verified.is_(True))
         .order_by(Result.id))
    best: dict[tuple, tuple[float, dict[str, str]]] = {}
    for r in s.scalars(q):
        if r.row is None or r.us is None:
            continue
        k = row_key(schema.key_columns, r.row)
        if k not in best or r.us < best[k][0]:
            best[k] = (r.us, r.row)
    rows = [row for _, row in best.values()]
    rows.sort(key=lambda row: tuple(str(x) for x in row_key(schema.key_columns, row)))
    return rows


def build(s: Session, digest: str, family: str, merged: bool = False) -> Overlay:
    fam = family_or_422(family)
    schema = schema_for(s, digest, fam.name)
    table = Table(schema.header, best_rows(s, digest, fam.name, schema), f"overlay_{fam.tuned_file}")
    shipped = shipped_tables(s, digest, fam.name)
    if merged and shipped:
        table = merge(fam, shipped + [table], prefer_last=True)
    return Overlay(fam, schema, table, shipped)


def overlay_filename(family: TableFamily, digest: str) -> str:
    # AITER globs model_configs/ for names that contain the tuned name and not 'untuned'
    return f"svc_{digest.split(':')[-1][:12]}_{family.tuned_file}"
