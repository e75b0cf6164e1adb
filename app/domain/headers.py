"""Table schemas: the headers AITER releases write, and how an unseen header is understood.

A family's definition (families.py) is the header ROCm/aiter writes today plus the other headers of released
tables (TableFamily.tuned_variants: the fmoe default has no gfx and ends in _tag; a late-2025 bf16 table had no
gfx and no bpreshuffle). A schema is the header of one image's own table: column order for output, plus the key
columns the family's loader indexes on that are present in it.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.domain.families import TableFamily


class HeaderError(ValueError):
    def __init__(self, family: str, missing: list[str], header: tuple[str, ...]):
        self.family, self.missing, self.header = family, missing, header
        super().__init__(f"{family} table header lacks key column(s) {', '.join(missing)} "
                         f"that AITER's loader indexes on; header was: {','.join(header)}")


@dataclass(frozen=True)
class Schema:
    family: str
    header: tuple[str, ...]
    key_columns: tuple[str, ...]  # the family's key columns present in this header, in key order
    known: bool  # header seen in a released table

    def header_problems(self, other_header: tuple[str, ...]) -> list[str]:
        """Why a table written in other_header would not load or key in this schema's AITER."""
        out = [f"lacks key column {c!r} that this image's AITER indexes on" for c in self.key_columns
               if c not in other_header]
        if not out and tuple(c for c in other_header if c in self.header) != tuple(
                c for c in self.header if c in other_header):
            out.append("columns are not in this image's order (a merge keeps the first file's order)")
        return out


def parse_header_line(line: str) -> tuple[str, ...]:
    # AITER's runtime pd.read_csv keeps whitespace; a tab after the last name is a real shipped quirk
    return tuple(c.strip() for c in line.strip("\r\n").rstrip("\t").split(","))


def known_tuned_headers(family: TableFamily) -> list[tuple[str, ...]]:
    return [family.tuned_header] + [tuple(h.split(",")) for h, _ in family.tuned_variants]


def _known_keys(family: TableFamily, header: tuple[str, ...]) -> tuple[str, ...] | None:
    for h, keys in family.tuned_variants:
        if tuple(h.split(",")) == header and keys:
            return tuple(keys.split(","))
    return None


def known_untuned_headers(family: TableFamily) -> list[tuple[str, ...]]:
    return [family.untuned_header] + [tuple(h.split(",")) for h in family.untuned_variants]


def tuned_schema(family: TableFamily, header: tuple[str, ...]) -> Schema:
    """A known release's header keys as that release's loader does; an unseen one is understood by its
    columns (the current loader's key columns it has), and refused if it lacks a key column."""
    old_keys = _known_keys(family, header)
    if old_keys is not None:
        return Schema(family.name, header, old_keys, True)
    missing = [c for c in family.key_columns if c not in header and not (c == "gfx" and family.gfx_optional)]
    if missing:
        raise HeaderError(family.name, missing, header)
    keys = tuple(c for c in family.key_columns if c in header)
    return Schema(family.name, header, keys, header in known_tuned_headers(family))


def untuned_header_ok(family: TableFamily, header: tuple[str, ...]) -> list[str]:
    """Problems with an untuned (tuner input) header: unknown columns, or missing dimension columns."""
    allowed = set(family.shape_columns) | set(family.tuned_header) | {"gfx", "cu_num"}
    allowed |= {c for h in known_untuned_headers(family) for c in h}
    problems = [f"unknown column {c!r}" for c in header if c not in allowed]
    dims = [c for c in family.shape_columns if c == family.m_column or c in ("N", "K", "B", "b", "n", "k")]
    problems += [f"missing column {c!r}" for c in dims if c not in header]
    return problems


def current_schema(family: TableFamily) -> Schema:
    return tuned_schema(family, family.tuned_header)
