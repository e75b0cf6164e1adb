"""Each image's own tables, as its worker read them, and the schema they imply per family."""

from __future__ import annotations

import csv
import hashlib
import io

from sqlalchemy import event, select
from sqlalchemy.orm import Session

from app.api.schemas import ImageTablesIn
from app.db.models import Image, ImageTable
from app.db.dialect import Plain, Rows, Steps, ask
from app.domain.deploy import Shipped
from app.domain.families import AiterRelease, TableFamily, family_for_file, get_family, release_for
from app.domain.headers import HeaderError, Schema, current_schema, parse_header_line, tuned_schema
from app.domain.tables import read_table
from app.errors import Invalid
from app.ttl_cache import TTLCache
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
    from app.services.captures import ensure_image
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
    _HEADERS.clear()
    event.listen(s, "after_commit", lambda _s: _HEADERS.clear(), once=True)  # and once others can read them
    if img.parent_digest:  # rows carried from the parent meet the image's own tables and kernels now
        from app.services.upgrades import retriage
        retriage(s, digest)
    return stored


def image_tables(s: Session, digest: str, family: str, kinds: tuple[str, ...] = ("default", "model_config")
                 ) -> list[ImageTable]:
    # report order within a kind: the worker lists model_configs in AITER's own glob order
    q = (select(ImageTable).where(ImageTable.image_digest == digest, ImageTable.family == family,
                                  ImageTable.kind.in_(kinds)).order_by(ImageTable.kind, ImageTable.id))
    return list(s.scalars(q))


def release_of(s: Session, digest: str) -> AiterRelease:
    img = s.get(Image, digest)
    return release_for(img.aiter_version if img else None)


def shipped_for(s: Session, digest: str, family: str, release: AiterRelease | None = None) -> Shipped:
    """What the image's AITER reads for the family with its env var unset: the release's default file and every
    model_configs file its glob matches, in the order the worker listed them (AITER's glob order), plus the
    untuned header its merge dedups on."""
    fam = get_family(family)
    release = release or release_of(s, digest)
    tables = image_tables(s, digest, family, ("default", "model_config", "untuned"))
    default_name = release.default_file(fam)
    default = next((read_table(t.content, t.path, fam.comment_prefix) for t in tables if t.path == default_name),
                   None)
    mcs = []
    for t in tables:
        name = t.path.rsplit("/", 1)[-1]
        if (t.path.startswith("model_configs/") and fam.merge_name in name and "untuned" not in name
                and name.endswith(release.model_configs_suffix)):
            mcs.append(read_table(t.content, t.path, fam.comment_prefix))
    # a family without a shipped untuned file (mxscale BMM) is merged without dedup; one not reported is
    # taken to have the family's header, so a repeated key is still refused
    untuned = next((parse_header_line(t.header) for t in tables if t.path == fam.untuned_file),
                   None if fam.name in release.no_untuned_file else fam.untuned_header)
    return Shipped(default, mcs, untuned, bool(tables))


# Headers every lease and result reads: kept per (database, image, family, kind); a PUT of the image's tables
# clears it here, and another process's PUT shows within the TTL.
_HEADERS = TTLCache(30.0)


def _header_steps(p: Rows, digest: str, family: str, kind: str) -> Steps[list[tuple[str, str]]]:
    """(path, header line) of the image's tables of one kind, without their contents."""
    key = (p.key, digest, family, kind)
    hit = _HEADERS.get(key)
    if hit is None:
        hit = _HEADERS.put(key, [tuple(r) for r in (yield from ask("headers", {"digest": digest, "family": family,
                                                                               "kind": kind}))])
    return hit  # type: ignore[no-any-return]


def kernel_catalog(p: Plain, digest: str, family: str) -> frozenset[str] | None:
    """The kernel names the image's tuner may race for the family, as its worker reported them (None: not
    reported); cached with the headers (a PUT of the image's tables clears both)."""
    key = (p.key, digest, "catalog")
    hit = _HEADERS.get(key)
    if hit is None:
        found = p.rows("catalog", {"digest": digest})
        doc = p.doc(found[0][0]) if found else None
        hit = _HEADERS.put(key, {f: frozenset(names) for f, names in (doc or {}).items()})
    return hit.get(family)  # type: ignore[no-any-return]


def _headers(s: Session | Plain, digest: str, family: str, kind: str) -> list[tuple[str, str]]:
    p = Plain.of(s)
    return p.drive(_header_steps(p, digest, family, kind))


def _schema(fam: TableFamily, defaults: list[tuple[str, str]]) -> Schema:
    for _, header in defaults:
        return tuned_schema(fam, parse_header_line(header))
    return current_schema(fam)


def _untuned(fam: TableFamily, untuned: list[tuple[str, str]]) -> tuple[str, ...]:
    for path, header in untuned:
        if path == fam.untuned_file:
            return parse_header_line(header)
    return fam.untuned_header


def schema_for(s: Session | Plain, digest: str, family: str) -> Schema:
    """The image's own header for the family (its default table), else the family's current one."""
    return _schema(get_family(family), _headers(s, digest, family, "default"))


def untuned_header_for(s: Session | Plain, digest: str, family: str) -> tuple[str, ...]:
    """The image's own untuned header for the family's tuner input, else the family's."""
    return _untuned(get_family(family), _headers(s, digest, family, "untuned"))


def lease_headers(p: Rows, digest: str, family: str) -> Steps[tuple[list[str], list[str]]]:
    """The tuned and untuned headers a lease carries, parsed once per TTL (the lease route's share of the above)."""
    key = (p.key, digest, family, "lease")
    hit = _HEADERS.get(key)
    if hit is None:
        fam = get_family(family)
        defaults = yield from _header_steps(p, digest, family, "default")
        untuned = yield from _header_steps(p, digest, family, "untuned")
        hit = _HEADERS.put(key, (list(_schema(fam, defaults).header), list(_untuned(fam, untuned))))
    return hit  # type: ignore[no-any-return]


def schemas_of(s: Session, digest: str) -> list[dict]:
    from app.domain.families import FAMILIES
    out = []
    for name in FAMILIES:
        sch = schema_for(s, digest, name)
        stored = bool(image_tables(s, digest, name, ("default",)))
        out.append({"family": name, "header": list(sch.header), "key_columns": list(sch.key_columns),
                    "known_release_header": sch.known, "from_image": stored,
                    "untuned_header": list(untuned_header_for(s, digest, name))})
    return out
