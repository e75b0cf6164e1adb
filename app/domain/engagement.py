"""Will AITER use the overlay? Rebuild the run-time key for each captured shape and look it up."""

from __future__ import annotations

from dataclasses import dataclass

from app.domain.families import TableFamily
from app.domain.keys import lookup_keys, row_key
from app.domain.tables import Table


@dataclass
class ShapeEngagement:
    shape: dict[str, str]
    hit: bool
    tried_m: list[int | None]
    matched_m: int | None = None
    row: dict[str, str] | None = None
    reason: str = ""


def _miss_reason(family: TableFamily, keys: tuple[str, ...], want: tuple, tried: list, index: dict) -> str:
    if not index:
        return "the overlay has no rows"
    mcol = family.m_column
    mi = keys.index(mcol) if mcol in keys else None
    if mi is not None:
        near = sorted({k[mi] for k in index if k[:mi] + k[mi + 1:] == want[:mi] + want[mi + 1:]},
                      key=lambda v: (v is None, v if isinstance(v, int) else 0))
        if near:
            return (f"rows exist for this shape only at {mcol}={near}; AITER looks up {mcol} in {tried} "
                    f"(raw, then padded)")
    best, best_diff = None, None
    for k in index:
        diff = [i for i, (a, b) in enumerate(zip(k, want)) if a != b and i != mi]
        if best_diff is None or len(diff) < len(best_diff):
            best, best_diff = k, diff
    assert best is not None and best_diff is not None
    parts = [f"{keys[i]}: overlay has {best[i]!r}, runtime uses {want[i]!r}" for i in best_diff]
    return "closest row differs in " + "; ".join(parts) if parts else "no row at any M tried"


def check(family: TableFamily, key_columns: tuple[str, ...], gfx: str, cu_num: int,
          shapes: list[dict[str, str]], table: Table) -> list[ShapeEngagement]:
    missing = [c for c in key_columns if c not in table.header]
    if missing:  # AITER's set_index raises, or (fmoe, CK) keys on something else: nothing in it engages
        why = (f"the table's header lacks key column(s) {', '.join(missing)} that this image's AITER indexes on; "
               f"header is {','.join(table.header)}")
        return [ShapeEngagement(shape, False, [m for m, _ in lookup_keys(family, key_columns, gfx, cu_num, shape)],
                                reason=why) for shape in shapes]
    index: dict[tuple, dict[str, str]] = {}
    for r in table.rows:
        index.setdefault(row_key(key_columns, r), r)
    out = []
    for shape in shapes:
        cands = lookup_keys(family, key_columns, gfx, cu_num, shape)
        tried = [m for m, _ in cands]
        for m, k in cands:
            if k in index:
                out.append(ShapeEngagement(shape, True, tried, m, index[k]))
                break
        else:
            out.append(ShapeEngagement(shape, False, tried,
                                       reason=_miss_reason(family, key_columns, cands[0][1], tried, index)))
    return out


def is_flydsl_row(row: dict[str, str]) -> bool:
    return row.get("libtype") == "flydsl" or any(str(row.get(c, "")).startswith("flydsl_")
                                                 for c in ("kernelName", "kernelName1", "kernelName2"))


def drop_flydsl_hits(family: TableFamily, checks: list[ShapeEngagement]) -> None:
    """Where flydsl is not importable a FlyDSL row does not engage: GEMM lookups skip it, MoE has no
    fallback and fails in the asm/CK stage (aiter-tuning.md section 6)."""
    for c in checks:
        if c.hit and c.row is not None and is_flydsl_row(c.row):
            c.hit = False
            c.reason = ("FlyDSL row, but flydsl is not importable in the serving image: "
                        + ("AITER raises in the MoE stage" if family.m_column == "token" else "AITER skips it"))
