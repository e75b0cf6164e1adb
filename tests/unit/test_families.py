"""Every CSV AITER ships, checked against the family definitions."""

from __future__ import annotations

import pytest

from app.domain.families import FAMILIES, family_for_file
from app.domain.headers import (HeaderError, known_tuned_headers, known_untuned_headers, parse_header_line,
                                tuned_schema, untuned_header_ok)
from app.domain.tables import read_table
from tests.conftest import CONFIGS

ALL_CSV = sorted(CONFIGS.rglob("*.csv"))
# Referenced by no AITER code path (aiter-tuning.md 1.1), so no family reads it.
UNREAD = {"asm_a8w8_gemm.csv"}


def _family(path):
    fam = family_for_file(path.name)
    if fam is None and "untuned" in path.name:  # e.g. llama70B_untuned_gemm_bf16.csv: named off-pattern
        header = parse_header_line(path.read_text().splitlines()[0])
        fam = next((f for f in FAMILIES.values() if header in known_untuned_headers(f)), None)
    return fam


def test_the_shipped_tables_are_there():
    assert len(ALL_CSV) > 150, f"expected AITER's shipped tables under {CONFIGS}"


@pytest.mark.parametrize("path", ALL_CSV, ids=lambda p: str(p.relative_to(CONFIGS)))
def test_every_shipped_header_matches_its_family(path):
    if path.name in UNREAD:
        assert family_for_file(path.name) is None
        return
    fam = _family(path)
    assert fam is not None, f"no family for {path.name}"
    header = parse_header_line(path.read_text().splitlines()[0])
    if "untuned" in path.name:
        assert header in known_untuned_headers(fam), header
        assert untuned_header_ok(fam, header) == []
    else:
        assert header in known_tuned_headers(fam), header
        schema = tuned_schema(fam, header)
        assert schema.known
        table = read_table(path.read_text(), path.name)
        for row in table.rows[:50]:
            for col in schema.key_columns:
                assert row[col] != "" or col == "cu_num", (path.name, col, row)


def test_every_default_table_is_a_family_definition():
    for fam in FAMILIES.values():
        default = CONFIGS / fam.tuned_file
        if fam.name in ("fmoe",):  # shipped default predates the tuner's current header (no gfx, has _tag)
            assert parse_header_line(default.read_text().splitlines()[0]) != fam.tuned_header
            continue
        if not default.exists():
            assert fam.name == "a8w8_blockscale_mxscale_batched_gemm"  # lives only in model_configs
            continue
        assert parse_header_line(default.read_text().splitlines()[0]) == fam.tuned_header, fam.name


def test_family_definitions_are_consistent():
    for fam in FAMILIES.values():
        assert set(fam.key_columns) <= set(fam.tuned_header), fam.name
        extra = set(fam.shape_columns) - set(fam.key_columns)
        # grouped fmoe's untuned input carries fields its string matcher ignores
        assert extra == ({"use_g1u1", "doweight_stage1", "gate_mode"} if fam.name == "grouped_fmoe" else set())
        assert fam.env_var.startswith("AITER_CONFIG_")
    assert len({f.env_var for f in FAMILIES.values()}) == len(FAMILIES)


def test_a_header_missing_a_key_column_is_refused_by_name():
    fam = FAMILIES["bf16_gemm"]
    header = tuple(c for c in fam.tuned_header if c != "gfx")  # the bf16 loader has no cu_num-only fallback
    with pytest.raises(HeaderError, match="gfx"):
        tuned_schema(fam, header)


def test_an_unseen_header_is_understood_by_its_columns():
    fam = FAMILIES["a8w8_gemm"]
    header = fam.tuned_header + ("new_col",)
    schema = tuned_schema(fam, header)
    assert not schema.known and schema.key_columns == fam.key_columns


def test_fhmoe_rows_engage_only_for_the_calls_that_read_its_table():
    """aiter/fhmoe.py:569-586 reads AITER_CONFIG_FHMOE only for the DSV4 I384 contract (interleaved gate, no pads,
    7168/384/385/7); any other shared-expert call looks up tuned_fmoe, so a row of this table for it never runs
    (FHMOE_OP.table_when). The same row keyed on the contract's gate mode engages."""
    from app.domain import engagement as eng
    from app.domain.tables import Table
    family = FAMILIES["fhmoe"]
    table = read_table((CONFIGS / family.tuned_file).read_text(), family.tuned_file)
    row = next(r for r in table.rows if r["token"] == "64")
    separated = dict(row, gate_mode="GateMode.SEPARATED", q_dtype_a="torch.float4_e2m1fn_x2")
    shapes = [{c: r[c] for c in family.shape_columns} for r in (row, separated)]
    mine = eng.check(family, family.key_columns, "gfx950", 256, shapes,
                     Table(table.header, table.rows + [separated], table.name))
    assert [m.hit for m in mine] == [True, False], [m.reason for m in mine]
    assert "another table" in mine[1].reason and not mine[1].fails
