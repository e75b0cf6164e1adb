"""Shapes: a family's shape columns, validated and written in the spelling AITER's tables use."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property, lru_cache

from app.domain.families import (BOOL, BOOL01, DTYPE, DTYPES, ENUM, ENUM_VALUES, INT, TableFamily, column_kind,
                                 enum_prefix, int_floor)

MAX_DIM = 1 << 31  # a dimension past int32 is a typo, not a shape


class ShapeError(ValueError):
    def __init__(self, field: str, message: str):
        self.field = field
        super().__init__(f"{field}: {message}")


@dataclass(frozen=True)
class Shape:
    values: tuple[tuple[str, str], ...]  # (column, cell) in the family's shape-column order

    @cached_property
    def key(self) -> str:
        return "|".join(map("=".join, self.values))  # col=cell|col=cell...

    def as_dict(self) -> dict[str, str]:
        return dict(self.values)


class _Bad(ValueError):
    """A cell's problem, before the field it sits in is known (so the answer can be cached per value)."""


def _truthy(raw: object) -> bool:
    if isinstance(raw, bool):
        return raw
    s = str(raw).strip()
    # pandas.read_csv, which AITER reads its tables with, takes TRUE/FALSE too (qwen3_5_397b_untuned_gemm.csv)
    if s in ("True", "true", "TRUE", "1"):
        return True
    if s in ("False", "false", "FALSE", "0"):
        return False
    raise _Bad(f"expected True/False, got {raw!r}")


def cell(col: str, raw: object, field: str) -> str:
    """One cell in AITER's spelling, or ShapeError naming the field."""
    try:
        return _cell(col, raw)
    except _Bad as e:
        raise ShapeError(field, str(e)) from None
    except TypeError:  # unhashable (a list or object where a cell belongs): no cache, same rules
        try:
            return _cell.__wrapped__(col, raw)
        except _Bad as e:
            raise ShapeError(field, str(e)) from None


@lru_cache(maxsize=1 << 16, typed=True)  # a capture repeats few distinct cells: most rows cost dict look-ups
def _cell(col: str, raw: object) -> str:
    kind = column_kind(col)
    if kind == INT:
        return _int_cell(col, raw)
    if kind == BOOL:
        return "True" if _truthy(raw) else "False"
    if kind == BOOL01:
        return "1" if _truthy(raw) else "0"
    s = str(raw).strip()
    if kind == DTYPE:
        s = s if s.startswith("torch.") else f"torch.{s}"
        if s not in DTYPES:
            raise _Bad(f"unknown dtype {raw!r}; expected one of {sorted(DTYPES)}")
        return s
    if kind == ENUM:
        return _enum_cell(col, raw, s)
    if not s or any(ch.isspace() for ch in s) or "," in s:
        raise _Bad(f"expected a non-empty value without spaces or commas, got {raw!r}")
    return s


def _int_cell(col: str, raw: object) -> str:
    if isinstance(raw, bool) or (isinstance(raw, float) and not raw.is_integer()):
        raise _Bad(f"expected a non-negative integer, got {raw!r}")
    try:
        v = int(str(raw).strip()) if not isinstance(raw, float) else int(raw)
    except ValueError:
        raise _Bad(f"expected a non-negative integer, got {raw!r}") from None
    if v < int_floor(col) or v > MAX_DIM:
        raise _Bad(f"expected an integer in [{int_floor(col)}, {MAX_DIM}], got {v}")
    return str(v)


def _enum_cell(col: str, raw: object, s: str) -> str:
    """An enum cell as AITER writes it (prefix.NAME); the bare name is taken too."""
    prefix = enum_prefix(col)
    name = s.split(".", 1)[1] if s.startswith(prefix + ".") else s
    if name not in ENUM_VALUES[prefix]:
        raise _Bad(f"unknown {prefix} {raw!r}; expected one of {sorted(ENUM_VALUES[prefix])}")
    return f"{prefix}.{name}"


def make_shape(family: TableFamily, raw: Mapping[str, object], where: str = "shape") -> Shape:
    cols = family.shape_columns
    for k in raw:
        if k not in cols:
            raise ShapeError(f"{where}.{k}", f"not a {family.name} shape column; expected {','.join(cols)}")
    filled = raw
    if family.shape_defaults and len(raw) < len(cols):
        filled = dict(raw)
        for col, default in family.shape_defaults:  # a default may name another column: outdtype <- dtype
            filled.setdefault(col, filled.get(default, default))
    values = []
    for col in cols:
        v = filled.get(col)
        if v is None or v == "":
            raise ShapeError(f"{where}.{col}", "missing")
        try:
            values.append((col, _cell(col, v)))
        except (_Bad, TypeError):  # again through cell(): the same rules, raising with the field's name
            values.append((col, cell(col, v, f"{where}.{col}")))
    got = dict(values)
    for col, lo, hi in family.dim_bounds:
        if col in got and not lo <= int(got[col]) <= hi and (col, got[col]) not in family.sentinels:
            raise ShapeError(f"{where}.{col}", f"{got[col]} is outside {family.name}'s range [{lo}, {hi}]")
    if family.remaps:  # stored as AITER looks it up (and as its tuner writes it)
        values = list(family.remap(dict(values)).items())
    return Shape(tuple(values))


def flops(family: TableFamily, shape: dict[str, str]) -> float:
    """Work of one call, to rank shapes by served time (count x flops)."""
    m, n, k, b = shape.get("M"), shape.get("N"), shape.get("K"), shape.get("B", "1")
    if m and n and k and m.isdigit() and n.isdigit() and k.isdigit():  # the GEMMs, without a dict per shape
        return 2.0 * (int(b) if b.isdigit() else 1) * int(m) * int(n) * int(k)
    g = {k: int(v) for k, v in shape.items() if v.isdigit()}
    if "M" in g and "N" in g and "K" in g:
        return 2.0 * g.get("B", 1) * g["M"] * g["N"] * g["K"]
    if {"m", "n", "k"} <= g.keys():
        return 2.0 * g.get("b", 1) * g["m"] * g["n"] * g["k"]
    if "token" in g:
        mats = 3 if g.get("use_g1u1", 1) else 2  # gate+up then down
        return 2.0 * g["token"] * g.get("topk", 1) * g["model_dim"] * g["inter_dim"] * mats  # EP topk=-1: 1
    return float(math.prod(v for v in g.values() if v > 0) or 1)
