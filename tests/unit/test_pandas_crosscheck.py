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
    except ShapeError:  # both readings must refuse the same cells too (an empty cu_num, grouped fmoe's topk=-1)
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
