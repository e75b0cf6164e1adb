"""Issue 36: engagement.check as an ordered chain of named rules (SHAPE_RULES, ROW_RULES, PASSES), each rule on its
own: what it answers where AITER's code it cites decides, and that it leaves the verdict to the next rule elsewhere.
Each test also checks the whole chain (check) gives that verdict: a rule left out of its chain fails its test.
tests/differential/test_engagement_vs_aiter.py stays the oracle: the same verdicts against AITER's own code."""

from __future__ import annotations

import re

from app.domain import engagement as eng
from app.domain.engagement import Ask, Found, ShapeEngagement, check, prepare, with_env
from app.domain.families import FAMILIES, TableFamily
from app.domain.tables import Table, read_table
from tests.conftest import CONFIGS

BF16, BPRE, FMOE, FHMOE = (FAMILIES[n] for n in ("bf16_gemm", "a8w8_bpreshuffle_gemm", "fmoe", "fhmoe"))
FP8, FP4 = "torch.float8_e4m3fn", "torch.float4_e2m1fn_x2"
# a kernel FlyDSL's catalog builds today (ops/flydsl/gemm_kernels.py:118-175)
FLY = ("flydsl_gemm2_abf16_wbf16_bf16_t16x64x64_split_k1_block_m_warp1_block_n_warp1_block_k_warp1_"
       "async_copyTrue_b_to_ldsTrue_b_preshuffleFalse_c_to_ldsFalse_gfx950")


def _table(family: TableFamily, base: dict[str, str], rows: list[dict[str, str]]) -> Table:
    return Table(family.tuned_header, [{c: {**base, **r}.get(c, "") for c in family.tuned_header} for r in rows])


def _ask(family: TableFamily, table: Table, flydsl: bool = True, gfx: str = "gfx950", cu_num: int = 256,
         cpp_at: tuple[str, int] | None = None) -> Ask:
    cpp_at = cpp_at or (gfx, cu_num)
    return Ask(family, prepare(family, family.key_columns, gfx, table, (cpp_at,)), gfx, cu_num, cpp_at, flydsl)


def _shape_rule(rule, c: Ask, raw: dict[str, str]) -> ShapeEngagement | None:
    return rule(c, raw, c.family.looked_up(with_env(c.family, raw, c.env), c.device, c.arch))


def _row_rule(rule, c: Ask, raw: dict[str, str], m: int | None, row: dict[str, str]):
    shape = c.family.looked_up(raw, c.device)
    return rule(c, Found(raw, shape, [m]), m, row)


def _one(c: Ask, raw: dict[str, str]) -> ShapeEngagement:
    (res,) = check(c.family, c.family.key_columns, c.gfx, c.cu_num, [raw], Table(c.family.tuned_header),
                   flydsl=c.flydsl, cpp_at=c.cpp_at, prepared=c.lk)
    return res


_BF16_BASE = dict(gfx="gfx950", cu_num="256", N="1280", K="8192", bias="False", dtype="torch.bfloat16",
                  outdtype="torch.bfloat16", scaleAB="False", bpreshuffle="False", solidx="0", splitK="0", us="5.0",
                  err_ratio="0", tflops="1", bw="1", libtype="hipblaslt", kernelName="k")


def _bf16(m: str, **cells: str) -> dict[str, str]:
    return {**{c: _BF16_BASE[c] for c in BF16.shape_columns if c != "M"}, "M": m, **cells}


_BPRE_ROW = dict(gfx="gfx950", cu_num="256", M="32", N="1024", K="7168", q_dtype_w=FP8, libtype="ck", kernelId="1",
                 splitK="0", us="5", kernelName="a8w8_bpreshuffle_ck_svc", tflops="1", bw="1", errRatio="0")
_BPRE_CALL = dict(M="32", N="1024", K="7168", q_dtype_w=FP8)


def _fmoe_call(token: str, q_dtype_a: str, act: str = "ActivationType.Silu", **cells: str) -> dict[str, str]:
    return dict(token=token, model_dim="4096", inter_dim="512", expert="128", topk="8", act_type=act,
                dtype="torch.bfloat16", q_dtype_a=q_dtype_a, q_dtype_w=FP4, q_type="QuantType.per_1x32",
                use_g1u1="1", doweight_stage1="0", **cells)


def _fmoe_table(call: dict[str, str], kernels: dict[str, str] | None) -> Table:
    row = {**call, "token": "128", "gfx": "gfx950", "cu_num": "256", "block_m": "32", "ksplit": "0", "us": "5",
           "run_1stage": "0"}  # looked up at the padded token
    return _table(FMOE, row, [] if kernels is None else [kernels])


_CK = {"kernelName1": "moe_ck2stages_gemm1_svc", "kernelName2": "moe_ck2stages_gemm2_svc"}
_FLY_STAGES = {"kernelName1": "flydsl_moe1_svc", "kernelName2": "flydsl_moe2_svc"}


def test_the_chain_runs_in_aiters_order_and_every_rule_cites_aiters_code():
    """The op's checks before its lookup, the lookup, then what it does with the row, then what runs whatever the
    table holds: each rule's docstring names the AITER file:line it follows."""
    assert [r.__name__ for r in eng.SHAPE_RULES] == ["_op_refuses", "_looked_up_elsewhere", "_tier_uncovered",
                                                     "_looked_up"]
    assert [r.__name__ for r in eng.ROW_RULES] == ["_flydsl_absent", "_row_unreadable", "_moe_route",
                                                   "_libtype_unrun", "_runs_row"]
    assert [r.__name__ for r in eng.PASSES] == ["_padded_weight_retry", "_default_stages_wrapped", "_op_paths",
                                                "_calls_a_capture_cannot_tell"]
    for rule in (*eng.SHAPE_RULES, *eng.ROW_RULES, eng._no_row, *eng.PASSES):
        assert re.search(r"\w+\.(py|cu):\s?\d+", rule.__doc__ or ""), rule.__name__


def test_op_refuses_a_call_the_moe_op_raises_on_before_its_lookup():
    """fused_moe.py:855-875: a16w4 SiTUv2 needs FlyDSL on gfx942/gfx950."""
    call = _fmoe_call("100", "torch.bfloat16", "ActivationType.Situv2")
    table = _fmoe_table(call, _CK)
    res = _shape_rule(eng._op_refuses, _ask(FMOE, table, flydsl=False), call)
    assert res is not None and res.verdict == "raises" and "fused_moe.py:855-875" in res.reason
    assert _one(_ask(FMOE, table, flydsl=False), call).reason == res.reason
    assert _shape_rule(eng._op_refuses, _ask(FMOE, table, flydsl=True), call) is None
    assert _shape_rule(eng._op_refuses, _ask(BF16, _table(BF16, _BF16_BASE, [])), _bf16("1")) is None  # no MoE op


def _fhmoe_rows() -> Table:
    return read_table((CONFIGS / FHMOE.tuned_file).read_text(), FHMOE.tuned_file)


def _fhmoe_call(token: str, **cells: str) -> dict[str, str]:
    row = next(r for r in _fhmoe_rows().rows if r["token"] == token)
    return {**{c: row[c] for c in FHMOE.shape_columns}, **cells}


def test_looked_up_elsewhere_leaves_a_call_of_another_table_unknown():
    """fhmoe.py:569-586: AITER_CONFIG_FHMOE is read for the DSV4 I384 contract only (its interleaved gate)."""
    c = _ask(FHMOE, _fhmoe_rows())
    other = _fhmoe_call("64", gate_mode="GateMode.SEPARATED", q_dtype_a=FP4)
    res = _shape_rule(eng._looked_up_elsewhere, c, other)
    assert res is not None and res.verdict == "unknown" and "another table" in res.reason
    assert _one(c, other).verdict == "unknown"
    assert _shape_rule(eng._looked_up_elsewhere, c, _fhmoe_call("64")) is None
    assert _one(c, _fhmoe_call("64")).hit


def test_tier_uncovered_raises_where_a_padded_token_tier_below_the_call_has_no_row():
    """fhmoe.py:345-385,579-583: a row the op runs at every tier 1, 2, 4, ... up to the call's token."""
    table = _fhmoe_rows()
    c = _ask(FHMOE, Table(table.header, [r for r in table.rows if r["token"] != "2"]))
    res = _shape_rule(eng._tier_uncovered, c, _fhmoe_call("64"))
    assert res is not None and res.verdict == "raises" and "fhmoe.py:345-385" in res.reason and res.tried_m == [2]
    assert _one(c, _fhmoe_call("64")).reason == res.reason
    assert _shape_rule(eng._tier_uncovered, c, _fhmoe_call("1")) is None  # tier 1 only: covered
    assert _shape_rule(eng._tier_uncovered, _ask(FHMOE, table), _fhmoe_call("64")) is None


def test_looked_up_takes_the_first_m_candidate_with_a_row_and_explains_a_miss():
    """tuned_gemm.py:145-162: raw M, then padded; the row found goes through ROW_RULES."""
    c = _ask(BF16, _table(BF16, _BF16_BASE, [dict(M="16", kernelName="k16")]))
    res = _shape_rule(eng._looked_up, c, _bf16("16"))
    assert res is not None and res.hit and res.matched_m == 16 and res.row is not None
    assert res.row["kernelName"] == "k16" and _one(c, _bf16("16")).hit
    miss = _shape_rule(eng._looked_up, c, _bf16("16", N="2560"))
    assert miss is not None and miss.verdict == "miss" and "N: table has 1280, runtime uses 2560" in miss.reason


def test_flydsl_absent_goes_on_to_the_next_m_or_runs_the_default():
    """bf16: tuned_gemm.py:163-177 (the next padded M); a8w8 bpreshuffle: its default ck kernel, no retry."""
    fly_row = {**_BF16_BASE, "M": "1", "libtype": "flydsl", "kernelName": FLY}
    c = _ask(BF16, _table(BF16, _BF16_BASE, [fly_row]), flydsl=False)
    assert _row_rule(eng._flydsl_absent, c, _bf16("1"), 1, fly_row) == eng.NEXT
    with_fly = _ask(BF16, _table(BF16, _BF16_BASE, [fly_row]), flydsl=True)
    assert _row_rule(eng._flydsl_absent, with_fly, _bf16("1"), 1, fly_row) is None  # its catalog knows the kernel
    res = _one(c, _bf16("1"))
    assert res.verdict == "miss" and "FlyDSL rows at M=[1] are skipped" in res.reason
    bpre_fly = dict(_BPRE_ROW, libtype="flydsl", kernelName="flydsl_bpreshuffle_svc")
    cb = _ask(BPRE, _table(BPRE, bpre_fly, [{}]), flydsl=False)
    got = _row_rule(eng._flydsl_absent, cb, _BPRE_CALL, 32, bpre_fly)
    assert isinstance(got, ShapeEngagement) and got.verdict == "miss" and "default kernel" in got.reason


def test_row_unreadable_raises_on_a_cell_the_op_cannot_parse():
    """tuned_gemm.py:327: solMap[libtype], a KeyError for a libtype it does not have."""
    bad = {**_BF16_BASE, "M": "1", "libtype": "nonesuch"}
    c = _ask(BF16, _table(BF16, _BF16_BASE, [bad]))
    res = _row_rule(eng._row_unreadable, c, _bf16("1"), 1, bad)
    assert res is not None and res.verdict == "raises" and "libtype" in res.reason
    assert _one(c, _bf16("1")).verdict == "raises"
    assert _row_rule(eng._row_unreadable, c, _bf16("1"), 1, {**bad, "libtype": "hipblaslt"}) is None


def test_moe_route_follows_the_stage_the_op_builds_for_the_row():
    """The op's stage choice after its 'using' line: with FlyDSL a CK row of this call gets the op's own FlyDSL
    stages (fused_moe.py:2696-2795), not the row's kernels: its default."""
    call = _fmoe_call("100", FP8)  # fp8 below the bound: a shared-expert call (fhmoe_'s INTERLEAVE derives it)
    c = _ask(FMOE, _fmoe_table(call, _CK), flydsl=True)
    (row,) = c.lk.rows
    res = _row_rule(eng._moe_route, c, call, 128, row)
    assert res is not None and res.verdict == "miss" and "heuristic" in res.reason, res
    assert _one(c, call).reason == res.reason
    fly = _ask(FMOE, _fmoe_table(call, _FLY_STAGES), flydsl=True)
    assert _row_rule(eng._moe_route, fly, call, 128, fly.lk.rows[0]) is None and _one(fly, call).hit
    assert _row_rule(eng._moe_route, _ask(BF16, _table(BF16, _BF16_BASE, [])), _bf16("1"), 1, _BF16_BASE) is None


def test_libtype_unrun_is_the_ops_libtype_dispatch():
    """ops/gemm_op_a8w8.py:749-753: ck, cktile and flydsl rows run; any other libtype falls to the default."""
    asm = dict(_BPRE_ROW, libtype="asm")
    c = _ask(BPRE, _table(BPRE, asm, [{}]))
    res = _row_rule(eng._libtype_unrun, c, _BPRE_CALL, 32, asm)
    assert res is not None and res.verdict == "miss" and "falls back to its default kernel" in res.reason
    assert _one(c, _BPRE_CALL).verdict == "miss"
    assert _row_rule(eng._libtype_unrun, c, _BPRE_CALL, 32, _BPRE_ROW) is None


def test_runs_row_is_a_hit_unless_the_compiled_table_runs_another_kernel():
    """chip_info.py:200 build_tune_dict: the compiled table is built for the device's (gfx, cu_num) only: a Python
    lookup on another cu_num (CU_NUM set) pairs its splitK with the compiled table's heuristic kernel."""
    table = _table(BPRE, _BPRE_ROW, [{}])
    (row,) = _ask(BPRE, table).lk.rows
    assert _row_rule(eng._runs_row, _ask(BPRE, table), _BPRE_CALL, 32, row).hit
    other = _ask(BPRE, table, cpp_at=("gfx950", 304))
    res = _row_rule(eng._runs_row, other, _BPRE_CALL, 32, row)
    assert not res.hit and "compiled C++ table" in res.reason and "no row (its heuristic kernel)" in res.reason
    assert not _one(other, _BPRE_CALL).hit


def test_no_row_raises_where_the_default_path_does():
    """tuned_gemm.py:208: bpreshuffle without a row off gfx942 needs the asm default (N, K multiples of 64)."""
    c = _ask(BF16, _table(BF16, _BF16_BASE, [{"M": "1"}]))
    shape = _bf16("8", bpreshuffle="True", N="1300")
    found = Found(shape, BF16.looked_up(shape, "gfx950"), [8])
    first = eng.lookup_keys(BF16, c.lk.key_columns, c.gfx, c.cu_num, shape)[0][1]
    res = eng._no_row(c, found, first, [])
    assert res.verdict == "raises" and "tuned_gemm.py:208" in res.reason
    assert _one(c, shape).reason == res.reason
    plain = _bf16("8")
    assert eng._no_row(c, Found(plain, plain, [8]), eng.lookup_keys(BF16, c.lk.key_columns, c.gfx, c.cu_num,
                                                                     plain)[0][1], []).verdict == "miss"


def test_padded_weight_retry_looks_a_miss_up_again_at_the_weights_k():
    """ops/gemm_op_a8w8.py:711-742: a weight padded past the activation's K is looked up again there."""
    c = _ask(BPRE, _table(BPRE, _BPRE_ROW, [{}]))
    call = dict(_BPRE_CALL, K="7040", weight_K="7168")
    miss = ShapeEngagement(call, False, [32], reason="no row")
    (res,) = eng._padded_weight_retry(c, [miss])
    assert res.hit and "looks the weight's K=7168 up" in res.reason
    assert _one(c, call).hit
    (smaller,) = eng._padded_weight_retry(c, [ShapeEngagement(dict(call, weight_K="6912"), False, [32])])
    assert smaller.verdict == "raises"
    (same,) = eng._padded_weight_retry(_ask(BF16, _table(BF16, _BF16_BASE, [])), [miss])
    assert same is miss  # no weight retry in this family


def test_default_stages_wrapped_raises_on_a_shared_expert_call_without_a_row():
    """fhmoe.py:304-317, :563-613: the default stages of a shared-expert call are CK's without FlyDSL: they raise."""
    call = _fmoe_call("100", FP8)  # fp8 below the bound: only fhmoe_'s INTERLEAVE derives it
    c = _ask(FMOE, _fmoe_table(call, None), flydsl=False)
    (res,) = eng._default_stages_wrapped(c, [ShapeEngagement(call, False, [128], reason="no row")])
    assert res.verdict == "raises" and "fhmoe.py:304-317" in res.reason
    assert _one(c, call).verdict == "raises"
    (elsewhere,) = eng._default_stages_wrapped(c, [ShapeEngagement(call, False, [], reason="another table")])
    assert elsewhere.verdict == "miss"  # looked up in another table: not this table's miss


def test_op_paths_raise_whatever_the_row():
    """tuned_gemm.py:371: a torch row with bpreshuffle asserts."""
    shape = _bf16("1", bpreshuffle="True")
    row = {**_BF16_BASE, "M": "1", "bpreshuffle": "True", "libtype": "torch"}
    c = _ask(BF16, _table(BF16, row, [{}]))
    (res,) = eng._op_paths(c, [ShapeEngagement(shape, True, [1], 1, row)])
    assert res.verdict == "raises" and "tuned_gemm.py:371" in res.reason
    assert _one(c, shape).verdict == "raises"
    (hit,) = eng._op_paths(c, [ShapeEngagement(_bf16("1"), True, [1], 1, dict(row, bpreshuffle="False"))])
    assert hit.hit


def test_calls_a_capture_cannot_tell_are_unknown_where_their_verdicts_differ():
    """fhmoe.py:563-613: an fp4 activation is fused_moe's own and fhmoe_'s SEPARATED one; the shared call's wrapper
    step raises on the CK row the plain call runs."""
    call = _fmoe_call("100", FP4)
    c = _ask(FMOE, _fmoe_table(call, _CK), flydsl=False)
    hit = _one(c, dict(call, entry="fused_moe"))
    assert hit.hit
    (res,) = eng._calls_a_capture_cannot_tell(c, [ShapeEngagement(call, True, hit.tried_m, hit.matched_m, hit.row)])
    assert res.verdict == "unknown" and "entry=shared" in res.reason
    assert _one(c, call).verdict == "unknown"
    told = dict(call, entry="fused_moe")
    (same,) = eng._calls_a_capture_cannot_tell(c, [ShapeEngagement(told, True, hit.tried_m, hit.matched_m, hit.row)])
    assert same.hit  # a shape that says its call gets that call's verdict
