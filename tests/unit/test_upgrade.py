"""The pure rules of an image upgrade (app/domain/upgrade.py)."""

from __future__ import annotations

import pytest

from app.domain import upgrade as up
from app.domain.families import get_family
from app.domain.lease_states import ResultKind

HEADER = ("gfx", "cu_num", "M", "N", "K", "kernelName", "us")
ROW = {"gfx": "gfx942", "cu_num": "304", "M": "1", "N": "8", "K": "8", "kernelName": "a", "us": "3"}


@pytest.mark.parametrize("kernel, header, shipped, catalog, verdict", [
    ("a", HEADER, False, None, up.Triage.CARRIED),  # no catalog reported: nothing known gone
    ("a", HEADER, False, {"a", "b"}, up.Triage.CARRIED),
    ("a", HEADER, False, {"b"}, up.Triage.KERNEL_GONE),
    ("a+b", HEADER, False, {"a"}, up.Triage.KERNEL_GONE),  # fmoe's two kernels: both must be there
    ("a", HEADER + ("bpreshuffle",), False, {"a"}, up.Triage.HEADER_CHANGED),
    ("a", HEADER, True, {"b"}, up.Triage.NOW_SHIPPED),  # shipped first: never served twice, whatever else
])
def test_triage(kernel, header, shipped, catalog, verdict):
    assert up.triage(kernel, ROW, header, shipped, catalog) is verdict


def test_finalists_are_the_incumbent_then_the_fastest_others_that_ran_and_still_exist():
    cands = [{"name": "c", "us": 3.0}, {"name": "a", "us": 1.0}, {"name": "b", "us": 2.0},
             {"name": "x", "us": None, "error": "boom"}, {"name": "d", "us": 2.5}, {"name": "e", "us": 4.0}]
    assert up.finalists("a", cands) == ["a", "b", "d", "c"]
    assert up.finalists("a", cands, catalog={"a", "c", "e"}) == ["a", "c", "e"]
    assert up.finalists("a", []) == ["a"]


@pytest.mark.parametrize("verdict, kind, kernel, outcome, full", [
    (up.Triage.CARRIED, ResultKind.VERIFIED, "inc", up.Outcome.CONFIRMED, False),
    (up.Triage.CARRIED, ResultKind.VERIFIED, "other", up.Outcome.OVERTURNED, True),
    (up.Triage.CARRIED, ResultKind.DEFAULT_BEST, None, up.Outcome.OVERTURNED, True),
    (up.Triage.CARRIED, ResultKind.FAILED, None, None, False),  # a failed try decides nothing
    (up.Triage.NOW_SHIPPED, ResultKind.VERIFIED, "inc", up.Outcome.SHIPPED_KEPT, False),
    (up.Triage.NOW_SHIPPED, ResultKind.DEFAULT_BEST, None, up.Outcome.SHIPPED_KEPT, False),
    (up.Triage.NOW_SHIPPED, ResultKind.VERIFIED, "ours", up.Outcome.OURS_KEPT, False),
    (up.Triage.KERNEL_GONE, ResultKind.VERIFIED, "x", up.Outcome.RE_RACED, False),
])
def test_what_a_result_decides(verdict, kind, kernel, outcome, full):
    c = up.confirm(verdict, "inc", kind, kernel)
    assert (c.outcome, c.full_race) == (outcome, full)


def test_lineage_refuses_itself_a_second_parent_and_cycles():
    parents = {"a": None, "b": "a", "c": "b", "d": None}
    up.check_lineage("d", "c", parents)
    with pytest.raises(up.LineageError, match="itself") as e:
        up.check_lineage("a", "a", parents)
    assert (e.value.field, e.value.conflict) == ("from", False)
    with pytest.raises(up.LineageError) as e:
        up.check_lineage("b", "d", parents)
    assert e.value.field == "image_digest"
    with pytest.raises(up.LineageError, match="cycle"):
        up.check_lineage("a", "c", parents)


def test_a_familys_kernel_cells():
    assert get_family("bf16_gemm").kernel_of({"kernelName": "k"}) == "k"
    assert get_family("fmoe").kernel_of({"kernelName1": "s1", "kernelName2": "s2"}) == "s1+s2"
    assert get_family("fmoe").kernel_of({"kernelName1": "s1", "kernelName2": ""}) == "s1"


def test_fmoe_v016_rename_writes_the_rows_quant_type_and_dtypes_into_the_name_and_guesses_nothing_without_them():
    """v0.1.6's CK MoE names (tuned_fmoe.csv v0.1.5 -> v0.1.6, real rows): the quant type by its QuantType number
    and the A/B/output dtypes come from the row; without the row, or with a cell the rule does not know, the name
    is left as written (no guess)."""
    fam = get_family("fmoe")
    row = {"q_type": "QuantType.per_Token", "q_dtype_a": "torch.float8_e4m3fnuz",
           "q_dtype_w": "torch.float8_e4m3fnuz", "dtype": "torch.bfloat16"}
    old = "moe_ck2stages_gemm2_256x64x128x256_1x4_MulABScaleExpertWeight_v3_Nswizzle0_per_token_MulRoutedWeight1"
    new = ("moe_ck2stages_gemm2_256x64x128x256_1x4_MulABScaleExpertWeight_v3_Nswizzle0_Quant2_MulRoutedWeight1"
           "_F8_F8_B16")
    assert fam.kernel_forms(old, row) == [old, new]
    assert fam.kernel_forms(new, row) == [new]  # already new: left as it is
    assert fam.kernel_forms(old) == [old]
    assert fam.kernel_forms(old, dict(row, dtype="torch.float32")) == [old]
    s1 = "moe_ck2stages_gemm1_256x64x64x64_1x4_TypeCast_v1_Nswizzle0_no_MulRoutedWeight0_silu"
    bf16 = {"q_type": "QuantType.No", "q_dtype_a": "torch.bfloat16", "q_dtype_w": "torch.bfloat16",
            "dtype": "torch.bfloat16"}
    assert fam.catalog_name(f"{s1}+{old}", {f"{s1.replace('_no_', '_Quant0_')}_B16_B16_B16"}, bf16) == (
        f"{s1.replace('_no_', '_Quant0_')}_B16_B16_B16+{old}")  # each stage its own newest form the catalog has
