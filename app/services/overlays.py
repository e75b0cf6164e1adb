"""Overlay CSVs: the best verified row per key, in the image's own header; optionally merged."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.db.models import Campaign, CampaignShape, Result
from app.domain import deploy
from app.domain.deploy import Shipped
from app.domain.families import AiterRelease, TableFamily
from app.domain.headers import Schema
from app.domain.keys import row_key
from app.domain.tables import Table, render_csv
from app.errors import Conflict
from app.services.captures import family_or_422
from app.services.schemas import release_of, schema_for, shipped_for


@dataclass
class Overlay:
    family: TableFamily  # the family as the image's AITER release reads it
    release: AiterRelease
    schema: Schema
    table: Table
    shipped: Shipped
    live_gfx: str

    def csv(self) -> str:
        return render_csv(self.table.header, self.table.rows)

    def artifacts(self) -> dict[str, deploy.Artifact]:
        return deploy.artifacts(self.release, self.family, self.shipped, self.table, self.live_gfx,
                                self.schema.key_columns)


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


def live_gfx(s: Session, digest: str, family: str) -> str:
    """The serving GPU's arch, for cells AITER fills from the live GPU (gfx_from_cu_num of an unknown cu_num)."""
    camp = s.scalars(select(Campaign).where(Campaign.image_digest == digest, Campaign.family == family)
                     .order_by(Campaign.id)).first()
    return camp.gfx if camp else ""


def build(s: Session, digest: str, family: str, gfx: str | None = None) -> Overlay:
    """The overlay, unchecked, with what the image ships and the release that will read it."""
    fam = family_or_422(family)
    release = release_of(s, digest)
    schema = schema_for(s, digest, fam.name)
    table = Table(schema.header, best_rows(s, digest, fam.name, schema), overlay_filename(fam, digest))
    return Overlay(release.family(fam.name), release, schema, table, shipped_for(s, digest, fam.name, release),
                   gfx or live_gfx(s, digest, fam.name))


def deployable(s: Session, digest: str, family: str, merged: bool = False, exclude_shipped: bool = False,
               form: str | None = None) -> Overlay:
    """An overlay AITER can load: as a layer it must not make AITER's merge raise (a repeated key makes it
    rewrite the shipped CSVs in place); the merged file must load (unique keys, kernels named). form: exactly
    the file the deploy plan deploys for that form."""
    ov = build(s, digest, family)
    if form is not None or merged:
        art = ov.artifacts()[form or "merged"]
        if art.refused:
            raise Conflict(f"{form or 'merged'}: {art.refused}", "form" if form else "merged")
        assert art.overlay is not None
        ov.table = art.overlay
        return ov
    layer = deploy.build(ov.release, ov.family, "layer", ov.shipped, ov.table, ov.live_gfx)
    if layer.refused is None:
        return ov
    if exclude_shipped:
        ov.table.rows = deploy.without_shipped_keys(ov.release, ov.family, ov.shipped, ov.table, ov.live_gfx)
        return ov
    raise Conflict(f"overlay: as a ':'-joined {ov.family.env_var} layer: {layer.refused}. Ask for merged=true (one "
                   f"file, lowest us wins) or exclude_shipped=true (the shipped row stays).", "overlay")


def deploy_plan(s: Session, digest: str, family: str) -> dict:
    from app.db.models import Image
    ov = build(s, digest, family)
    img = s.get(Image, digest)
    out = deploy.plan(ov.family, img.configs_dir if img else None, ov.artifacts(), ov.table.name)
    out["release"] = ov.release.name
    out["shipped_tables_known"] = ov.shipped.known
    if not ov.shipped.known:
        out["notes"].insert(0, "no shipped tables reported for this image yet (a worker reports them at start): "
                               "the layer value lists only the overlay, which would REPLACE the shipped table")
    return out


def overlay_filename(family: TableFamily, digest: str) -> str:
    # AITER globs model_configs/ for names that contain the tuned name and not 'untuned'
    return f"svc_{digest.split(':')[-1][:12]}_{family.tuned_file}"
