"""An image's worker reports the tables its AITER ships (PUT /v1/images/{digest}/tables): each is checked against
its family's header and stored, and rows the image carried from its parent are triaged again against them."""

from __future__ import annotations

import csv
import hashlib
import io

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.db.models import ImageTable
from app.domain.families import family_for_file
from app.domain.headers import HeaderError, parse_header_line, tuned_schema
from app.errors import Invalid
from app.schemas import ImageTablesIn
from app.services import image_tables, upgrades
from app.services.lookups import ensure_image
from app.wire import formula_safe


def _kind(path: str, default_file: str) -> str:
    name = path.rsplit("/", 1)[-1]
    if "untuned" in name:
        return "untuned"
    return "default" if path == default_file else "model_config"


def check_cells(path: str, text: str) -> None:
    """Every column name and cell of a posted table is one a spreadsheet opening the merged overlay would not run
    as a formula (the overlay serves the image's own rows and header beside ours): 422 naming the table, nothing
    stored."""
    for n, row in enumerate(csv.reader(io.StringIO(text)), start=1):
        for i, cell in enumerate(row):
            try:
                formula_safe(cell.strip())
            except ValueError as e:
                what = "column name" if n == 1 else f"line {n}, column {i + 1}"
                raise Invalid(f"tables.{path}: {what}: {cell[:80]!r} {e}", f"tables.{path}") from None


def store_image_tables(s: Session, digest: str, body: ImageTablesIn) -> dict[str, int]:
    img = ensure_image(s, digest, body.aiter_version, body.aiter_commit)
    img.configs_dir = body.configs_dir or img.configs_dir
    if body.flydsl is not None:
        img.flydsl = body.flydsl
    if body.kernels is not None:
        img.kernel_catalog = {**(img.kernel_catalog or {}), **body.kernels}
    stored: dict[str, int] = {}
    for path, text in body.tables.items():
        fam = family_for_file(path)
        if fam is None or not text.strip():
            continue  # a table no family reads (asm_a8w8_gemm.csv) is not part of any deploy
        check_cells(path, text)
        header = parse_header_line(text.splitlines()[0])
        kind = _kind(path, fam.tuned_file)
        if kind != "untuned":
            try:
                tuned_schema(fam, header)
            except HeaderError as e:
                raise Invalid(f"tables.{path}: {e}", f"tables.{path}") from None
        old = s.scalars(select(ImageTable).where(ImageTable.image_digest == digest, ImageTable.path == path)).first()
        sha = hashlib.sha256(text.encode()).hexdigest()
        if old is None:
            s.add(ImageTable(image_digest=digest, family=fam.name, path=path, kind=kind, header=",".join(header),
                             content=text, sha256=sha))
        else:
            old.header, old.content, old.sha256, old.kind, old.family = ",".join(header), text, sha, kind, fam.name
        stored[fam.name] = stored.get(fam.name, 0) + 1
    image_tables.tables_changed(s)
    if img.parent_digest:  # rows carried from the parent meet the image's own tables and kernels now
        upgrades.retriage(s, digest)
    return stored
