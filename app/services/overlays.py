"""Overlay CSVs: the best verified row per key, in the image's own header; optionally merged."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.db.models import Campaign, CampaignShape, Result
from app.domain import deploy
from app.domain.families import TableFamily
from app.domain.headers import Schema
from app.domain.keys import row_key
from app.domain.tables import Table, merge, render_csv
from app.services.captures import family_or_422
from app.errors import Conflict
from app.services.schemas import schema_for, shipped_tables, untuned_header_for


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
    """The overlay, unchecked; merged: one file over the image's shipped tables, unique keys, lowest us wins
    (AITER's own rule), so the env var can name that file alone."""
    fam = family_or_422(family)
    schema = schema_for(s, digest, fam.name)
    table = Table(schema.header, best_rows(s, digest, fam.name, schema), f"overlay_{fam.tuned_file}")
    shipped = shipped_tables(s, digest, fam.name)
    if merged and shipped:
        # fmoe hits are first-in-file-order across act_type, so the overlay's rows go first there
        table = merge(fam, [table] + shipped if fam.name == "fmoe" else shipped + [table])
    return Overlay(fam, schema, table, shipped)


def deployable(s: Session, digest: str, family: str, merged: bool = False, exclude_shipped: bool = False
               ) -> Overlay:
    """An overlay AITER can load: a layer never repeats a key of the image's shipped tables (AITER would
    rewrite them in place and raise); a merged file has unique keys and every kernel column filled."""
    ov = build(s, digest, family, merged)
    if merged:
        bad = deploy.unfilled(ov.table)
        if bad:
            i, col = bad[0]
            raise Conflict(f"merged: row {i + 2} has an empty {col}; AITER would read it as 0", col)
        return ov
    hits = deploy.collisions(ov.family, untuned_header_for(s, digest, ov.family.name), ov.shipped, ov.table)
    if hits and exclude_shipped:
        clash = {tuple(sorted(k.items())) for k, _ in hits}
        keys = deploy.collision_key(ov.family, untuned_header_for(s, digest, ov.family.name), ov.table.header)
        ov.table.rows = [r for r in ov.table.rows if tuple(sorted((k, r.get(k, "")) for k in keys)) not in clash]
    elif hits:
        key, where = hits[0]
        raise Conflict(f"overlay: {len(hits)} row(s) repeat a key the image already ships, first "
                       f"{','.join(f'{k}={v}' for k, v in key.items())} in {where}; a ':'-joined {ov.family.env_var} "
                       f"with it makes AITER rewrite the shipped CSVs and raise. Ask for merged=true (one file, "
                       f"lowest us wins) or exclude_shipped=true (the shipped row stays).", "overlay")
    return ov


def deploy_plan(s: Session, digest: str, family: str) -> dict:
    from app.db.models import Image
    ov = build(s, digest, family)
    img = s.get(Image, digest)
    name = overlay_filename(ov.family, digest)
    paths = [t.name for t in ov.shipped]
    out = deploy.plan(ov.family, img.configs_dir if img else None, paths, name)
    out["shipped_tables_known"] = bool(paths)
    if not paths:
        out["notes"].insert(0, "no shipped tables reported for this image yet (a worker reports them at start): "
                               "the layer value lists only the overlay, which would REPLACE the shipped table")
    return out


def overlay_filename(family: TableFamily, digest: str) -> str:
    # AITER globs model_configs/ for names that contain the tuned name and not 'untuned'
    return f"svc_{digest.split(':')[-1][:12]}_{family.tuned_file}"
