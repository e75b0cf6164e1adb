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
