"""Each image's own tables, as its worker read them, and the schema they imply per family."""

from __future__ import annotations

from sqlalchemy import event, select
from sqlalchemy.orm import Session

from app.db.models import Image, ImageTable
from app.db.dialect import Plain, Rows, Sql, Steps, ask
from app.domain.deploy import Shipped
from app.domain.families import FAMILIES, AiterRelease, TableFamily, get_family, release_for
from app.domain.headers import Schema, current_schema, parse_header_line, tuned_schema
from app.domain.tables import read_table
from app.services.caches import caches_of


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


def tables_changed(s: Session) -> None:
    """The image's tables were written in s: the headers read of them are forgotten now and once others can read
    them (s committed)."""
    headers = caches_of(s).headers
    headers.clear()
    event.listen(s, "after_commit", lambda _s: headers.clear(), once=True)


# Headers every lease and result reads: kept per (database, image, family, kind) in the app's caches
# (app/services/caches.py); a PUT of the image's tables clears them here, and another process's PUT shows within
# the TTL.
def _header_steps(p: Rows, digest: str, family: str, kind: str) -> Steps[list[tuple[str, str]]]:
    """(path, header line) of the image's tables of one kind, without their contents."""
    key = (p.key, digest, family, kind)
    headers = caches_of(p).headers
    hit = headers.get(key)
    if hit is None:
        hit = headers.put(key, [tuple(r) for r in (yield from ask(Sql.HEADERS, {"digest": digest, "family": family,
                                                                               "kind": kind}))])
    return hit  # type: ignore[no-any-return]


def kernel_catalog(p: Plain, digest: str, family: str) -> frozenset[str] | None:
    """The kernel names the image's tuner may race for the family, as its worker reported them (None: not
    reported); cached with the headers (a PUT of the image's tables clears both)."""
    key = (p.key, digest, "catalog")
    headers = caches_of(p).headers
    hit = headers.get(key)
    if hit is None:
        found = p.rows(Sql.CATALOG, {"digest": digest})
        doc = p.doc(found[0][0]) if found else None
        hit = headers.put(key, {f: frozenset(names) for f, names in (doc or {}).items()})
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
    headers = caches_of(p).headers
    hit = headers.get(key)
    if hit is None:
        fam = get_family(family)
        defaults = yield from _header_steps(p, digest, family, "default")
        untuned = yield from _header_steps(p, digest, family, "untuned")
        hit = headers.put(key, (list(_schema(fam, defaults).header), list(_untuned(fam, untuned))))
    return hit  # type: ignore[no-any-return]


def schemas_of(s: Session, digest: str) -> list[dict]:
    out = []
    for name in FAMILIES:
        sch = schema_for(s, digest, name)
        stored = bool(image_tables(s, digest, name, ("default",)))
        out.append({"family": name, "header": list(sch.header), "key_columns": list(sch.key_columns),
                    "known_release_header": sch.known, "from_image": stored,
                    "untuned_header": list(untuned_header_for(s, digest, name))})
    return out
