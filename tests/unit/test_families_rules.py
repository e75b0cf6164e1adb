"""The family records as grouped rules (issue 36): every rule reads flat as before the grouping, the behaviour
switches hold only the values their readers branch on, a release changes a family through its typed override, and
lookup_identity reads GPU_ARCHS and CU_NUM as chip_info.py does (tests/differential runs AITER's own on the same
environments; these are the cases by hand, without AITER)."""

from __future__ import annotations

import dataclasses
from typing import get_args

import pytest

from app.domain.families import (CURRENT, FAMILIES, RELEASE_0_1_7, RELEASES, CaptureRules, CellParse, CondOp,
                                 CppPadding, DeployRules, DuplicateKeys, FlydslMiss, GfxSource, KeyMatch, LoaderRules,
                                 LookupRules, Math, MergeOnDuplicate, OpDispatch, Padding, PathRuns, RowUse,
                                 TableFamily, TunerRules, get_family, lookup_identity)

RECORDS = {"lookup": LookupRules, "loader": LoaderRules, "op": OpDispatch, "deploy": DeployRules,
           "tuner": TunerRules, "capture": CaptureRules}
EVERY = [(r, n) for r in RELEASES for n in FAMILIES]


COND_FIELDS = {"when", "unless", "row_when", "table_when", "stages_when"}


def _conds(obj: object) -> list[tuple[str, str, str]]:
    """Every (column, op, value) condition in a family's records, however deep (ops, MoE routes, raises...)."""
    if isinstance(obj, tuple):
        return [c for x in obj for c in _conds(x)]
    if not dataclasses.is_dataclass(obj) or isinstance(obj, type):
        return []
    out = []
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        out += list(value) if f.name in COND_FIELDS else _conds(value)
    return out


def _ids(case: tuple[object, str]) -> str:
    return f"{case[0].name}-{case[1]}" if hasattr(case[0], "name") else str(case)


def test_no_rule_is_in_two_records_and_each_reads_flat():
    core = {f.name for f in dataclasses.fields(TableFamily)} - set(RECORDS)
    names = [f.name for rec in RECORDS.values() for f in dataclasses.fields(rec)]
    assert len(names) == len(set(names)) and not core & set(names)
    assert len(core) + len(names) == 66  # every field TableFamily had before the grouping
    for release, name in EVERY:
        fam = release.family(name)
        for attr, rec in RECORDS.items():
            sub = getattr(fam, attr)
            assert type(sub) is rec
            for f in dataclasses.fields(rec):
                assert getattr(fam, f.name) is getattr(sub, f.name), (release.name, name, f.name)


@pytest.mark.parametrize("case", EVERY, ids=_ids)
def test_the_behaviour_switches_hold_only_values_their_readers_know(case):
    release, name = case
    fam = release.family(name)
    lk, ld, op = fam.lookup, fam.loader, fam.op
    assert lk.padding in get_args(Padding) and lk.gfx_source in get_args(GfxSource)
    assert lk.key_match in get_args(KeyMatch) and lk.flydsl_miss in get_args(FlydslMiss)
    assert lk.cpp_padding in get_args(CppPadding) and ld.duplicate_keys in get_args(DuplicateKeys)
    assert fam.tuner.math in get_args(Math)
    assert {u for _, u in op.libtype_use} | {op.libtype_other} <= set(get_args(RowUse))
    assert {p.runs for p in op.op_paths} <= set(get_args(PathRuns))
    assert {c.parse for c in op.read_cells} <= set(get_args(CellParse))
    assert release.merge_on_duplicate in get_args(MergeOnDuplicate)
    conds = _conds(fam)
    assert {op for _, op, _ in conds} <= set(get_args(CondOp))
    if fam.moe_op is not None:
        assert conds, "the MoE op's routes and branches are conditions"


def test_a_release_changes_a_familys_rules_not_its_table():
    """0.1.7's overrides (amd-aiter 0.1.7.post2) touch the records of the mechanisms that differ there; the table's
    name, files, headers and key stay the current family's, and a family without an override is the current one."""
    changed = {"bf16_gemm": {"lookup", "op"}, "a8w8_gemm": {"lookup", "op"}, "a8w8_batched_gemm": {"lookup"},
               "bf16_batched_gemm": {"lookup"}, "a4w4_blockscale_gemm": {"op"},
               "a8w8_bpreshuffle_gemm": {"lookup", "op"}, "fmoe": {"lookup", "loader", "deploy", "op"}}
    core = [f.name for f in dataclasses.fields(TableFamily) if f.name not in RECORDS]
    for name in FAMILIES:
        cur, old = get_family(name), RELEASE_0_1_7.family(name)
        assert CURRENT.family(name) is cur
        if name not in changed:
            assert old is cur
            continue
        assert [getattr(old, c) for c in core] == [getattr(cur, c) for c in core]
        assert {r for r in RECORDS if getattr(old, r) != getattr(cur, r)} == changed[name], name
    fmoe = RELEASE_0_1_7.family("fmoe")
    assert (fmoe.padding, fmoe.duplicate_keys, fmoe.backfill_gfx, fmoe.overlay_first) == ("moe_0_1_7", "raise", False,
                                                                                          False)
    assert fmoe.moe_op is not None and not fmoe.moe_op.calls_get_gfx


GPU = ("gfx950", 256)
KEY_ERR = "KeyError: Unknown GPU architecture: "
CU_ERR = "ValueError: CU_NUM='x' is not an integer"
NO_GPU = "RuntimeError: No GPU detected and GPU_ARCHS is not set to an explicit target ({})"


# (env, family, (gfx, cu_num, build_targets, error, miss_error, build_error, arch)) on a gfx950 with 256 CUs
@pytest.mark.parametrize("env,family,want", [
    ({}, "bf16_gemm", ("gfx950", 256, (("gfx950", 256),), None, None, None, "gfx950")),
    ({"GPU_ARCHS": "native", "CU_NUM": "80"}, "bf16_gemm", ("gfx950", 80, (("gfx950", 80),), None, None, None,
                                                            "gfx950")),
    ({"CU_NUM": "0"}, "bf16_gemm", ("gfx950", 256, (("gfx950", 256),), None, None, None, "gfx950")),
    # get_gfx(): the last entry; the build targets: every entry with its default cu_num
    ({"GPU_ARCHS": "gfx950;gfx942"}, "bf16_gemm",
     ("gfx942", 256, (("gfx950", 256), ("gfx942", 304)), None, None, None, "gfx942")),
    ({"GPU_ARCHS": "gfx950;gfx942"}, "a8w8_gemm",  # get_gfx_runtime(): the GPU
     ("gfx950", 256, (("gfx950", 256), ("gfx942", 304)), None, None, None, "gfx942")),
    # the last entry unstripped is no arch get_gfx() knows; the build targets strip it
    ({"GPU_ARCHS": "gfx942; gfx950"}, "bf16_gemm",
     (" gfx950", 256, (("gfx942", 304), ("gfx950", 256)), KEY_ERR + " gfx950", None, None, " gfx950")),
    ({"GPU_ARCHS": "gfx942; gfx950"}, "a8w8_gemm",  # a lookup on get_gfx_runtime() never calls get_gfx()
     ("gfx950", 256, (("gfx942", 304), ("gfx950", 256)), None, None, None, " gfx950")),
    ({"GPU_ARCHS": "gfx942; gfx950"}, "fmoe",  # the MoE op calls get_gfx() on every call (fused_moe.py:799)
     ("gfx950", 256, (("gfx942", 304), ("gfx950", 256)), KEY_ERR + " gfx950", None, None, " gfx950")),
    ({"GPU_ARCHS": "gfx999"}, "bf16_gemm",
     ("gfx999", 256, (), KEY_ERR + "gfx999", None, "RuntimeError: Unknown gfx 'gfx999' in GPU_ARCHS", "gfx999")),
    ({"GPU_ARCHS": ""}, "bf16_gemm", ("", 256, (), KEY_ERR, None, NO_GPU.format(KEY_ERR), "")),
    ({"CU_NUM": "x"}, "a8w8_gemm", ("gfx950", 256, (), CU_ERR, None, NO_GPU.format(CU_ERR), "gfx950")),
    ({"GPU_ARCHS": "gfx942", "CU_NUM": "x"}, "bf16_gemm", ("gfx942", 256, (), CU_ERR, None, CU_ERR, "gfx942")),
    ({"GPU_ARCHS": "gfx999", "CU_NUM": "x"}, "bf16_gemm",  # get_gfx() raises first; the unknown arch's build error
     ("gfx999", 256, (), KEY_ERR + "gfx999", None, "RuntimeError: Unknown gfx 'gfx999' in GPU_ARCHS", "gfx999")),
])
def test_lookup_identity_reads_the_serving_environment_as_chip_info_does(env, family, want):
    got = lookup_identity(get_family(family), *GPU, env)
    assert (got.gfx, got.cu_num, got.build_targets, got.error, got.miss_error, got.build_error, got.arch) == want


def test_a_lookup_that_calls_get_gfx_only_on_a_miss_raises_only_there():
    """amd-aiter 0.1.7's fused_moe keys on get_gfx_runtime() and calls get_gfx() only for a shape without a row
    (gfx_on_miss); its MoE op does not call get_gfx() on every call."""
    got = lookup_identity(RELEASE_0_1_7.family("fmoe"), *GPU, {"GPU_ARCHS": "gfx942; gfx950"})
    assert (got.gfx, got.error, got.miss_error) == ("gfx950", None, KEY_ERR + " gfx950")
