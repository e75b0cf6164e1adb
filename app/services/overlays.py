"""Overlay CSVs: the best verified row per key, in the image's own header; optionally merged."""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app.db.dialect import Plain
from app.db.models import Campaign, CampaignShape, Image, ImageTable, Result
from app.domain import deploy
from app.domain import engagement as eng
from app.domain import upgrade
from app.domain.deploy import Shipped
from app.domain.families import AiterRelease, TableFamily
from app.domain.headers import Schema
from app.domain.keys import row_key
from app.domain.tables import Table, render_csv, rows_digest
from app.errors import Conflict, NotFound
from app.services.caches import caches_of
from app.services.lookups import family_or_422
from app.slot_cache import SlotCache
from app.services.image_tables import release_of, schema_for, shipped_for


@dataclass
class Overlay:
    """Read-only once built: build() hands the same one to every request until an input changes (a changed
    overlay is a new one: dataclasses.replace), and what is derived from it is made once (memo)."""
    family: TableFamily  # the family as the image's AITER release reads it
    release: AiterRelease
    schema: Schema
    table: Table
    shipped: Shipped
    live_gfx: str
    tables: Hashable = None  # (release, the image's tables by id, path, kind, sha256) shipped was read at: the
                             # next build of the slot keeps shipped (and its memo) while they are the same
    provisional: int = 0  # rows carried from the parent image, served until their confirmation races decide
    carried_from: str | None = None  # that parent
    raced: tuple[tuple[str, str, int], ...] = ()  # (backend, libtype, rows): who raced the overlay's rows
    _memo: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    _lock: Any = field(default_factory=threading.Lock, init=False, repr=False, compare=False)

    def csv(self) -> str:
        """The overlay file (made once: a merged file of a big image's tables is ~40k rows)."""
        return self.memo("csv", lambda: render_csv(self.table.header, self.table.rows))

    def memo(self, key: Hashable, make: Callable[[], Any]) -> Any:
        """make(), once per key for this overlay: concurrent askers of a key wait for the first, askers of
        another key do not (one form's lookup is not held up by another's). A make that raises is not kept."""
        with self._lock:
            kept: Future | None = self._memo.get(key)
            mine = kept is None
            if kept is None:
                kept = self._memo[key] = Future()
        if not mine:
            return kept.result()  # the first asker's value, or its exception
        try:
            kept.set_result(make())
        except BaseException as e:
            with self._lock:
                del self._memo[key]
            kept.set_exception(e)
            raise
        return kept.result()

    def artifacts(self) -> dict[str, deploy.Artifact]:
        """What AITER builds from each deploy form (seconds for big shipped tables): made once per overlay."""
        return self.memo("artifacts", lambda: deploy.artifacts(self.release, self.family, self.shipped, self.table,
                                                               self.live_gfx, self.schema.key_columns))

    def digest(self, form: str) -> str:
        """rows_digest of the table AITER reads for form (empty where it builds none)."""
        return self.memo(("digest", form), lambda: rows_digest(self.artifacts()[form].table or Table(()),
                                                               self.shipped.memo))

    def lookup(self, form: str, gfx: str, cpp_targets: tuple[tuple[str, int], ...]) -> eng.Lookup:
        """eng.prepare of the table AITER reads for form, looked up on gfx (the compiled table built for
        cpp_targets)."""
        def make() -> eng.Lookup:
            art = self.artifacts()[form]
            return eng.prepare(self.family, self.schema.key_columns, gfx,
                               art.table if art.table is not None else Table(self.table.header), cpp_targets,
                               self.shipped.memo)
        return self.memo(("lookup", form, gfx, cpp_targets), make)

    def weight_kb(self) -> int:
        """About what it holds once its artifacts are built: the shipped tables and the overlay, and a table as
        long for each form built from them, at ROW_KB per row."""
        shipped = sum(len(t.rows) for t in [self.shipped.default, *self.shipped.model_configs] if t is not None)
        return int(ROW_KB * (1 + len(deploy.FORMS)) * (shipped + len(self.table.rows))) + 1


def best_rows(s: Session, digest: str, family: str, schema: Schema
              ) -> tuple[list[dict[str, str]], tuple[tuple[str, str, int], ...], int]:
    """The lowest-us verified row per key measured in this image, keyed as the op looks it up on the GPU it was
    tuned on (a weight dtype the op remaps before its lookup: TableFamily.op_remaps), so a served call finds it;
    then the rows carried from its parent image (app/domain/upgrade.py) for keys it has none of yet, while their
    confirmation races run. Also how many measured rows each backend raced, by libtype, and how many carried."""
    best = _measured(s, digest, family, schema)
    raced = Counter((backend, str(row.get("libtype", ""))) for _, row, backend in best.values())
    measured = len(best)
    for row in carried_rows(s, digest, family, schema):
        best.setdefault(row_key(schema.key_columns, row), (float("inf"), row, "carried"))
    rows = [row for _, row, _ in best.values()]
    rows.sort(key=lambda row: tuple(str(x) for x in row_key(schema.key_columns, row)))
    return rows, tuple((b, lt, n) for (b, lt), n in sorted(raced.items())), len(best) - measured


def carried_rows(s: Session, digest: str, family: str, schema: Schema) -> list[dict[str, str]]:
    """The parent image's rows this image serves provisionally, in this image's header."""
    fam = family_or_422(family)
    q = (select(Result.row, Campaign.gfx, CampaignShape.finalists)
         .join(CampaignShape, CampaignShape.carried_result_id == Result.id)
         .join(Campaign, Campaign.id == CampaignShape.campaign_id)
         .where(Campaign.image_digest == digest, Campaign.family == family,
                CampaignShape.triage == upgrade.Triage.CARRIED.value, CampaignShape.outcome.is_(None))
         .order_by(CampaignShape.id))
    out = []
    for r, gfx, finalists in s.execute(q):
        row = fam.looked_up(r, gfx) if fam.op_remaps and r else r
        if not row or not all(c in row for c in schema.header):
            continue
        row = {c: str(row[c]) for c in schema.header}
        named = upgrade.incumbent(finalists)
        if named and named != fam.kernel_of(row):  # a kernel the new image renamed: served under its new name
            cols = [c for c in fam.kernel_columns if str(row.get(c) or "").strip()]
            parts = named.split("+")
            if len(parts) == len(cols):
                row.update(zip(cols, parts))
        out.append(row)
    return out


def _measured(s: Session, digest: str, family: str, schema: Schema
              ) -> dict[tuple, tuple[float, dict[str, str], str]]:
    q = (select(Result, Campaign.gfx).join(CampaignShape, CampaignShape.id == Result.shape_id)
         .join(Campaign, Campaign.id == CampaignShape.campaign_id)
         .where(Campaign.image_digest == digest, Campaign.family == family, Result.verified.is_(True))
         .order_by(Result.id))
    fam = family_or_422(family)
    best: dict[tuple, tuple[float, dict[str, str], str]] = {}
    for r, gfx in s.execute(q):
        if r.row is None or r.us is None:
            continue
        row = fam.looked_up(r.row, gfx) if fam.op_remaps else r.row
        k = row_key(schema.key_columns, row)
        if k not in best or r.us < best[k][0]:
            best[k] = (r.us, row, r.backend)
    return best


def live_gfx(s: Session, digest: str, family: str) -> str:
    """The serving GPU's arch, for cells AITER fills from the live GPU (gfx_from_cu_num of an unknown cu_num)."""
    camp = s.scalars(select(Campaign).where(Campaign.image_digest == digest, Campaign.family == family)
                     .order_by(Campaign.id)).first()
    return camp.gfx if camp else ""


# Overlays as built, kept in the app's caches (app/services/caches.py: built): for an image with big shipped tables (a blockscale image: 39k rows) building
# one from scratch takes seconds, and every engagement view, deploy plan and campaign page reads one. Kept per
# (database, image, family, serving gfx), rebuilt when what determines it changes (_inputs): a new result's build
# starts from the slot's kept Shipped (its parsed tables and what is made of each row: deploy.Shipped.memo), so it
# costs about the overlay's share (0.3-0.5 s for that image against 9-11 s from scratch); the least recently used
# go first past caches.OVERLAYS_MAX_MB. ROW_KB: that image held 148 MB after a rebuild with every form built, its lookups and
# digests and the kept memo, 0.95 kB per row counted by weight_kb (benchmarks/overlay_build.py, 2026-12-03).
ROW_KB = 0.95


def _inputs(s: Session, digest: str, family: str) -> tuple:
    """What build() reads of the database, cheaply: the image's tables of the family by id, path, kind and
    content hash (a table reported again is replaced in place), and its results (only ever added, so their
    count moves with each one, also where a lower id commits after a higher one). Every result of the image,
    not only the family's verified ones, which only rebuilds more often: a count over ix_results_image_digest
    alone (15 ms at 100k results on SQLite, against 47-90 ms reading each row's verified)."""
    tables = s.execute(select(ImageTable.id, ImageTable.path, ImageTable.kind, ImageTable.sha256)
                       .where(ImageTable.image_digest == digest, ImageTable.family == family)
                       .order_by(ImageTable.id)).all()
    results = s.execute(select(func.count(), func.max(Result.id)).where(Result.image_digest == digest)).one()
    # an inherit (the image's parent set) or a new triage (its tables or kernel catalog reported) moves the rows
    # carried from the parent
    parent, catalog = s.execute(select(Image.parent_digest, Image.kernel_catalog)
                                .where(Image.digest == digest)).one_or_none() or (None, None)
    return tuple(map(tuple, tables)), tuple(results), parent, json.dumps(catalog, sort_keys=True) if parent else None


def build(s: Session, digest: str, family: str, gfx: str | None = None) -> Overlay:
    """The overlay, unchecked, with what the image ships and the release that will read it: the same object
    (read-only) while none of that changes."""
    fam = family_or_422(family)
    if s.get(Image, digest) is None:  # release_of reads it too: one lookup
        # a header-only table deployed as the only file would REPLACE the shipped one (AITER reads the env var's
        # files instead of its default): never answer one for an image nobody named
        raise NotFound(f"image_digest: the service has never seen {digest} (no capture, worker report or inherit "
                       "named it): no overlay for it", "image_digest")
    release = release_of(s, digest)
    schema = schema_for(s, digest, fam.name)
    gfx = gfx or live_gfx(s, digest, fam.name)
    inputs = _inputs(s, digest, fam.name)
    version = (release.name, schema, inputs)  # read before what it versions
    slot = (Plain.of(s).key, digest, fam.name, gfx)
    built: SlotCache[Overlay] = caches_of(s).built

    def make() -> Overlay:
        rows, raced, carried = best_rows(s, digest, fam.name, schema)
        table = Table(schema.header, rows, overlay_filename(fam, digest))
        # a new result leaves what shipped_for reads as it was: the slot's last build keeps it, with what is
        # made of it (Shipped.memo)
        tables, old = (release.name, inputs[0]), built.kept(slot)
        shipped = (old.shipped if old is not None and old.tables == tables
                   else shipped_for(s, digest, fam.name, release))
        return Overlay(release.family(fam.name), release, schema, table, shipped, gfx, tables, carried, inputs[2],
                       raced)
    return built.get(slot, version, make)


def deployable(s: Session, digest: str, family: str, merged: bool = False, exclude_shipped: bool = False,
               form: str | None = None) -> Overlay:
    """An overlay AITER can load: as a layer it must not make AITER's merge raise (a repeated key makes it
    rewrite the shipped CSVs in place); the merged file must load (unique keys, kernels named). form: exactly
    the file the deploy plan deploys for that form."""
    return deployable_of(build(s, digest, family), merged, exclude_shipped, form)


def without_rows(ov: Overlay) -> Overlay:
    """The overlay with no row of ours: what each form deploys is then what the image ships alone."""
    return replace(ov, table=replace(ov.table, rows=[]), provisional=0, raced=())


def deployable_of(ov: Overlay, merged: bool = False, exclude_shipped: bool = False, form: str | None = None
                  ) -> Overlay:
    """deployable() of an overlay built already."""
    if form is not None or merged:
        art = ov.artifacts()[form or "merged"]
        if art.refused:
            raise Conflict(f"{form or 'merged'}: {art.refused}", "form" if form else "merged")
        table = art.overlay
        assert table is not None
        return ov.memo(("deployable", form or "merged"), lambda: replace(ov, table=table))
    layer = ov.memo("layer", lambda: deploy.build(ov.release, ov.family, "layer", ov.shipped, ov.table, ov.live_gfx))
    if layer.refused is None:
        return ov
    if exclude_shipped:
        return ov.memo(("deployable", "exclude_shipped"), lambda: replace(ov, table=replace(
            ov.table, rows=deploy.without_shipped_keys(ov.release, ov.family, ov.shipped, ov.table, ov.live_gfx))))
    raise Conflict(f"overlay: as a ':'-joined {ov.family.env_var} layer: {layer.refused}. Ask for merged=true (one "
                   f"file, lowest us wins) or exclude_shipped=true (the shipped row stays).", "overlay")


def deploy_plan(s: Session, digest: str, family: str) -> dict:
    ov = build(s, digest, family)
    img = s.get(Image, digest)
    out = deploy.plan(ov.family, img.configs_dir if img else None, ov.artifacts(), ov.table.name, raced=ov.raced,
                      shipped_known=ov.shipped.known)
    out["release"] = ov.release.name
    return out


def overlay_filename(family: TableFamily, digest: str) -> str:
    # AITER globs model_configs/ for names that contain the tuned name and not 'untuned'
    return f"svc_{digest.split(':')[-1][:12]}_{family.tuned_file}"
