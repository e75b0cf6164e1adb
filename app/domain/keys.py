"""AITER's run-time lookup keys: M padding, MoE token tiers, and cells as pandas reads them.

getPaddedM: csrc/py_itfs_cu/gemm_common.cu:13-41; GEMM lookups try [M, gl0, gl1] (tuned_gemm.py,
gemm_op_a8w8.py, gemm_op_a4w4.py). MoE token: fused_moe.py:1331-1346, tier retry 131072 -> 32768 at :2299-2312.
"""

from __future__ import annotations

from functools import lru_cache

from app.domain.families import BOOL, BOOL01, INT, TableFamily, column_kind


def next_pow2(m: int) -> int:
    return 1 if m <= 1 else 1 << (m - 1).bit_length()


def padded_m(m: int, n: int, gl: int) -> int:
    if gl == 0:
        for limit, step in ((256, 16), (1024, 32), (4096, 64)):
            if m <= limit:
                return (m + step - 1) // step * step
        return (m + 127) // 128 * 128
    return 8192 if (m > 8192 and n > 4096) else next_pow2(m)


def moe_token(m: int) -> int:
    if m < 32768:
        return next_pow2(m)
    return 32768 if m < 131072 else 131072


def m_candidates(family: TableFamily, shape: dict[str, str]) -> list[int]:
    """The M (or token) values AITER tries, in order, for a captured raw M."""
    if family.m_column is None:
        return []
    m = int(shape[family.m_column])
    if family.padding == "gemm":
        n = int(shape.get("N", shape.get("n", "0")))
        out = [m, padded_m(m, n, 0), padded_m(m, n, 1)]
    elif family.padding == "moe":
        t = moe_token(m)
        out = [t, 32768] if t == 131072 else [t]
    elif family.padding == "moe_exact":
        out = [moe_token(m)]
    elif family.padding == "moe_0_1_7":  # amd-aiter 0.1.7 fused_moe.py get_padded_M
        out = [16 if 1 <= m <= 16 else next_pow2(m) if m < 1024 else 1024]
    else:
        out = [m]
    return list(dict.fromkeys(out))


@lru_cache(maxsize=1 << 16, typed=True)  # pure, on few distinct cells (typed: 1 and True are not one key)
def runtime_value(col: str, raw: str) -> object:
    """A cell as pandas' read_csv leaves it for the lookup: ints parsed, True/False as bools, no strip."""
    kind = column_kind(col)
    if kind in (INT, BOOL, BOOL01):
        s = raw.strip()
        if s in ("True", "False"):
            return s == "True"
        try:
            return int(float(s)) if s else None
        except ValueError:
            return raw
    return raw


# a row's key as AITER's lookup compares it: its cells as runtime values (runtime_value)
Key = tuple[object, ...]


def row_key(key_columns: tuple[str, ...], row: dict[str, str]) -> Key:
    return tuple(runtime_value(c, row.get(c, "")) for c in key_columns)


def lookup_keys(family: TableFamily, key_columns: tuple[str, ...], gfx: str, cu_num: int,
                shape: dict[str, str]) -> list[tuple[int | None, Key]]:
    """(M tried, key tuple) for each candidate, in the order AITER tries them."""
    base = dict(shape, gfx=gfx, cu_num=str(cu_num))
    cands: list[int | None] = [*m_candidates(family, shape)] or [None]
    out: list[tuple[int | None, Key]] = []
    for m in cands:
        cells = dict(base)
        if m is not None:
            cells[family.m_column] = str(m)  # type: ignore[index]
        for col, src, off in family.lookup_derived:  # fhmoe keys shared_expert_id as expert - 1
            cells[col] = str(int(cells[src]) + off)
        out.append((m, row_key(key_columns, cells)))
    return out


def cpp_m_candidates(family: TableFamily, shape: dict[str, str]) -> list[int]:
    """The compiled CK table's M tries (family.cpp_padding). "ck": exact, then 16 / nextPow2<=16384 / 20480
    (csrc/ck_gemm_a8w8/gemm_a8w8.cu rowwise_dispatch, csrc/ck_batched_gemm_*/batched_gemm_*.cu:102-116); "gemm":
    exact, then getPaddedM gl0 and gl1 (csrc/ck_gemm_a8w8_bpreshuffle/gemm_a8w8_bpreshuffle.cu:137-159)."""
    m = int(shape[family.m_column or "M"])
    if family.cpp_padding == "gemm":
        n = int(shape.get("N", shape.get("n", "0")))
        return list(dict.fromkeys([m, padded_m(m, n, 0), padded_m(m, n, 1)]))
    if 1 < m <= 16:
        padded = 16
    elif m <= 16384:
        padded = next_pow2(m)
    elif m <= 20480:
        padded = 20480
    else:
        padded = m
    return list(dict.fromkeys([m, padded]))
