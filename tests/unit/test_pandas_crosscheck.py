"""The service reads AITER's tables with the csv module; AITER reads them with pandas.read_csv
(aiter/jit/core.py:280, tuned_gemm.py:87, fused_moe.py:2175). On every shipped table, both readings must give
the same rows and, through the service's cell parser, the same key cells."""

from __future__ import annotations

import pandas as pd
import pytest

from app.domain.families import FAMILIES, family_for_file
from app.domain.headers import known_untuned_headers, parse_header_line
from app.domain.shapes import ShapeError, cell
from app.domain.tables import read_table
from tests.conftest import CONFIGS

TABLES = sorted(p for p in CONFIGS.rglob("*.csv") if p.name != "asm_a8w8_gemm.csv")  # no family reads that one


def _family(path):
    fam = family_for_file(path.name)
    if fam is None:  # an off-pattern untuned name, e.g. llama70B_untuned_gemm_bf16.csv
        header = parse_header_line(path.read_text().splitlines()[0])
        fam = next(f for f in FAMILIES.values() if header in known_untuned_headers(f))
    return fam


def _cell(col, raw):
    try:
        return cell(col, raw, col)
    except ShapeError:  # both readings must refuse the same cells too (an empty cu_num)
        return "refused"


def test_there_are_tables_to_check():
    assert len(TABLES) > 150


@pytest.mark.parametrize("path", TABLES, ids=lambda p: str(p.relative_to(CONFIGS)))
def test_csv_and_pandas_read_the_same_rows_and_key_cells(path):
    fam = _family(path)
    ours = read_table(path.read_text(), path.name)
    df = pd.read_csv(path)
    assert len(ours.rows) == len(df), "row count"
    cols = [c for c in (fam.key_columns if "untuned" not in path.name else fam.shape_columns) if c in df.columns]
    assert cols
    for i, (mine, theirs) in enumerate(zip(ours.rows, df[cols].itertuples(index=False))):
        for col, v in zip(cols, theirs):
            a = _cell(col, mine[col])
            b = _cell(col, "" if pd.isna(v) else v)
            assert a == b, (path.name, i + 2, col, mine[col], v)


def test_grouped_fmoe_ep_rows_parse_as_aiter_keys_them():
    """AITER looks an expert-parallel grouped MoE call up with topk=-1 (grouped_moe_gfx1250.py:1032-1033): its
    shipped EP rows are keys, and a captured EP shape is one; an fmoe shape has no such topk."""
    from app.domain.families import get_family
    from app.domain.shapes import make_shape
    rows = read_table((CONFIGS / "tuned_grouped_fmoe.csv").read_text()).rows
    assert any(r["topk"] == "-1" for r in rows), "the fixture keeps AITER's EP rows"
    assert cell("topk", "-1", "topk") == "-1"
    fam = get_family("grouped_fmoe")
    shape = {c: rows[0][c] for c in fam.shape_columns if c in rows[0]} | {"topk": "-1", "gate_mode": "GateMode.SEPARATED"}
    assert make_shape(fam, shape).as_dict()["topk"] == "-1"
    fmoe = get_family("fmoe")
    with pytest.raises(ShapeError):
        make_shape(fmoe, {c: v for c, v in shape.items() if c in fmoe.shape_columns})
    with pytest.raises(ShapeError):
        cell("topk", "-2", "topk")
