"""Will AITER use the overlay? Rebuild the run-time key for each captured shape and look it up."""

from __future__ import annotations

from dataclasses import dataclass

from app.domain.families import TableFamily
from app.domain.keys import CPP_PADDED, cpp_m_candidates, lookup_keys, row_key
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
    if family.name == "fmoe":
        # the fmoe lookup keys on a pybind enum that never equals the CSV string, so every hit comes from the
        # act_type-wildcarded fallback: the first row in file order wins (aiter-tuning.md 2.7)
        key_columns = tuple(c for c in key_columns if c != "act_type")
    index: dict[tuple, dict[str, str]] = {}
    for r in table.rows:
        index.setdefault(row_key(key_columns, r), r)
    cpp = _cpp_index(family, key_columns, table)
    out = []
    for shape in shapes:
        cands = lookup_keys(family, key_columns, gfx, cu_num, shape)
        tried = [m for m, _ in cands]
        for m, k in cands:
            if k in index:
                res = ShapeEngagement(shape, True, tried, m, index[k])
                if cpp is not None:
                    _check_cpp(family, cpp, gfx, cu_num, res)
                out.append(res)
                break
        else:
            out.append(ShapeEngagement(shape, False, tried,
                                       reason=_miss_reason(family, key_columns, cands[0][1], tried, index)))
    return out


def _cpp_index(family: TableFamily, key_columns: tuple[str, ...], table: Table) -> tuple | None:
    if family.name not in CPP_PADDED:
        return None
    keys = tuple(c for c in key_columns if c != "q_dtype_w")
    index = {row_key(keys, r): r for r in table.rows}  # build_tune_dict: plain dict, the last row wins
    return keys, index


def _check_cpp(family: TableFamily, cpp: tuple, gfx: str, cu_num: int, res: ShapeEngagement) -> None:
    """Python takes splitK from its row; the compiled C++ table must resolve to that same row."""
    keys, index = cpp
    mcol = family.m_column or "M"
    raw = int(res.shape[mcol])
    for m in cpp_m_candidates(raw):
        row = index.get(row_key(keys, dict(res.shape, gfx=gfx, cu_num=str(cu_num), **{mcol: str(m)})))
        if row is not None:
            break
    if row is res.row:
        return
    res.hit = False
    where = f"the row at {mcol}={row[mcol]}" if row is not None else "no row (its heuristic kernel)"
    res.reason = (f"Python takes splitK from the row at {mcol}={res.matched_m}, but the compiled C++ table "
                  f"(padding {cpp_m_candidates(raw)}, no q_dtype_w) picks the kernel from {where}: a mismatched "
                  f"pair; tune the row at the M both sides look up")


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
