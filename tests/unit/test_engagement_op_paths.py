"""Issue 35, engagement at the op: four paths AITER's op takes that the model has to follow (each rule cites AITER's
file:line; tests/differential/test_engagement_vs_aiter.py checks the same against AITER's own code)."""

from __future__ import annotations

from app.domain.engagement import check, with_env
from app.domain.families import FAMILIES
from app.domain.tables import Table

BF16 = FAMILIES["bf16_gemm"]
# a name FlyDSL's catalog builds today (ops/flydsl/gemm_kernels.py:118-175), and the same kernel as AITER named it
# before ROCm/aiter#3469 added _block_k_warp<n>
FLY_NOW = ("flydsl_gemm2_abf16_wbf16_bf16_t16x64x64_split_k1_block_m_warp1_block_n_warp1_block_k_warp1_"
           "async_copyTrue_b_to_ldsTrue_b_preshuffleFalse_c_to_ldsFalse_gfx950")
FLY_OLD = FLY_NOW.replace("_block_k_warp1", "")


def _bf16_table(rows: list[dict[str, str]]) -> Table:
    header = BF16.tuned_header
    base = dict(gfx="gfx950", cu_num="256", N="1280", K="8192", bias="False", dtype="torch.bfloat16",
                outdtype="torch.bfloat16", scaleAB="False", bpreshuffle="False", solidx="0", splitK="0", us="5.0",
                err_ratio="0", tflops="1", bw="1")
    return Table(header, [{c: {**base, **r}.get(c, "") for c in header} for r in rows])


def _bf16_shape(m: str) -> dict[str, str]:
    return dict(M=m, N="1280", K="8192", bias="False", dtype="torch.bfloat16", outdtype="torch.bfloat16",
                scaleAB="False", bpreshuffle="False")


def test_a_flydsl_row_engages_only_where_aiters_catalog_reads_its_kernel_name():
    """tuned_gemm.py:163-177 asks get_flydsl_splitk_hgemm_kernel_params (gemm_kernels.py:579-586) for a FlyDSL row's
    kernel: a name its regex (:45-65) does not read, an old-format one included, is skipped for the next padded M,
    then the default; a flydsl_ prefix alone is no kernel."""
    kinds = {"1": FLY_NOW, "2": FLY_OLD, "3": FLY_NOW.replace("wbf16", "wf16"), "4": "flydsl_svc"}
    table = _bf16_table([dict(M=m, libtype="flydsl", kernelName=k) for m, k in kinds.items()])
    got = {s["M"]: c for s, c in zip([_bf16_shape(m) for m in kinds],
                                     check(BF16, BF16.key_columns, "gfx950", 256, [_bf16_shape(m) for m in kinds],
                                           table, flydsl=True))}
    assert got["1"].hit and got["1"].row["kernelName"] == FLY_NOW
    for m in ("2", "3", "4"):
        assert not got[m].hit and got[m].verdict == "miss", (m, got[m])
        assert "catalog" in got[m].reason


FMOE = FAMILIES["fmoe"]
_FP4 = "torch.float4_e2m1fn_x2"


def _fmoe_call(token: str, q_dtype_a: str, act: str = "ActivationType.Swiglu") -> dict[str, str]:
    return dict(token=token, model_dim="4096", inter_dim="512", expert="128", topk="8", act_type=act,
                dtype="torch.bfloat16", q_dtype_a=q_dtype_a, q_dtype_w=_FP4, q_type="QuantType.per_1x32",
                use_g1u1="1", doweight_stage1="0")


def test_fmoe_derives_the_activation_dtype_from_the_captured_environment():
    """_fused_moe_impl reads AITER_BF16_FP8_MOE_BOUND per call (fused_moe.py:768), GPTOSS_SWIGLU_MXFP4_BF16_BOUND at
    import (:76), AITER_SITUV2_A8W4/A4W4 (:781-784) and AITER_FORCE_A8W4 (:799-800): the lookup is keyed on what it
    derives under the server's environment (the capture's env), and an int() it cannot make raises on every call."""
    fp8 = "torch.float8_e4m3fn"
    derived = lambda shape, env: FMOE.looked_up(with_env(FMOE, shape, env), "gfx950")["q_dtype_a"]  # noqa: E731
    interleave = dict(_fmoe_call("100", fp8), gate_mode="GateMode.INTERLEAVE")
    assert derived(_fmoe_call("100", _FP4), {}) == "torch.bfloat16"  # Swiglu, separated: 100 < 256
    assert derived(_fmoe_call("100", _FP4), {"GPTOSS_SWIGLU_MXFP4_BF16_BOUND": "64"}) == _FP4
    assert derived(interleave, {"AITER_BF16_FP8_MOE_BOUND": "64"}) == fp8
    situ = _fmoe_call("100", fp8, "ActivationType.Situv2")
    assert derived(situ, {}) == "torch.bfloat16" and derived(situ, {"AITER_SITUV2_A8W4": "1"}) == fp8
    assert derived(situ, {"AITER_SITUV2_A4W4": "1"}) == _FP4
    assert FMOE.moe_op.q_dtype_a(with_env(FMOE, situ, {"AITER_FORCE_A8W4": ""}), "gfx950", "gfx1250") == fp8
    (res,) = check(FMOE, FMOE.key_columns, "gfx950", 256, [_fmoe_call("100", _FP4)], Table(FMOE.tuned_header, []),
                   env={"AITER_BF16_FP8_MOE_BOUND": "x"})
    assert res.verdict == "raises" and "fused_moe.py:768" in res.reason


def test_a_shared_expert_call_outside_the_dsv4_contract_raises_unless_both_stages_are_flydsl():
    """fused_moe with shared experts goes to fhmoe_, which reads tuned_fmoe outside the DSV4 I384 contract and puts
    the stages through _use_fhmoe_wrappers (fhmoe.py:304-317, :563-613): two FlyDSL stages run, anything else raises,
    a call without a row included where FlyDSL is absent (its default stages are CK's)."""
    fp8 = "torch.float8_e4m3fn"
    call = _fmoe_call("100", fp8, "ActivationType.Silu")  # fp8 below the bound: only fhmoe_'s INTERLEAVE derives it
    header = FMOE.tuned_header
    base = {**call, "token": "128", "gfx": "gfx950", "cu_num": "256", "block_m": "32", "ksplit": "0", "us": "5",
            "run_1stage": "0"}  # looked up at the padded token

    def verdict(kernels: dict[str, str] | None, flydsl: bool):
        rows = [] if kernels is None else [{c: {**base, **kernels}.get(c, "") for c in header}]
        (res,) = check(FMOE, FMOE.key_columns, "gfx950", 256, [call], Table(header, rows), flydsl=flydsl)
        return res
    fly = {"kernelName1": "flydsl_moe1_svc", "kernelName2": "flydsl_moe2_svc"}
    ck = {"kernelName1": "moe_ck2stages_gemm1_svc", "kernelName2": "moe_ck2stages_gemm2_svc"}
    assert verdict(fly, True).hit
    for kernels, flydsl in ((ck, False), (fly, False), (None, False)):
        res = verdict(kernels, flydsl)
        assert res.verdict == "raises" and "fhmoe.py:304-317" in res.reason, (kernels, flydsl, res)
    # with FlyDSL, a CK row or none gets the op's own FlyDSL stages (fused_moe.py:2696-2795), which pass: a default
    assert verdict(ck, True).verdict == "miss" and verdict(None, True).verdict == "miss"


BPRE = FAMILIES["a8w8_bpreshuffle_gemm"]


def test_bpreshuffle_looks_a_miss_up_again_at_the_padded_weights_k_and_a_capture_without_it_is_unknown():
    """gemm_a8w8_bpreshuffle (ops/gemm_op_a8w8.py:711-742) misses at the activation's K, looks the weight's K up
    when the weight is padded past it and runs that row; a smaller weight raises. A captured shape has only the
    activation's K (AITER logs the first lookup): where a row at a larger K would run, the verdict is unknown."""
    fp8 = "torch.float8_e4m3fn"
    header = BPRE.tuned_header
    row = dict(gfx="gfx950", cu_num="256", M="32", N="1024", K="7168", q_dtype_w=fp8, libtype="cktile", kernelId="1",
               splitK="0", us="5", kernelName="a8w8_bpreshuffle_cktile_svc", tflops="1", bw="1", errRatio="0")
    table = Table(header, [{c: row.get(c, "") for c in header}])
    call = dict(M="32", N="1024", K="7040", q_dtype_w=fp8)

    def one(shape):
        (res,) = check(BPRE, BPRE.key_columns, "gfx950", 256, [shape], table, cpp_at=("gfx950", 256))
        return res
    assert one(dict(call, weight_K="7168")).hit  # the retry at the weight's K runs the row
    assert one(dict(call, weight_K="7040")).verdict == "miss"
    smaller = one(dict(call, weight_K="6912"))
    assert smaller.verdict == "raises" and "WQ K >= XQ K" in smaller.reason
    unknown = one(call)
    assert unknown.verdict == "unknown" and not unknown.hit and "weight's K" in unknown.reason
    assert one(dict(call, K="7424")).verdict == "miss"  # no row at a larger K: a miss whatever the weight


def test_a_moe_call_a_capture_cannot_tell_from_a_shared_expert_one_is_unknown_where_their_verdicts_differ():
    """A MoE lookup's log line does not say whether fused_moe was called with shared experts: where both calls
    derive the captured q_dtype_a (an fp4 activation: fused_moe's own, and fhmoe_'s SEPARATED one, fhmoe.py:563) and
    fhmoe_'s wrapper step (:304-317) raises on what the plain call runs, the verdict says it depends on the call;
    a shape that says its call gets that call's verdict."""
    call = _fmoe_call("100", _FP4, "ActivationType.Silu")
    header = FMOE.tuned_header
    row = {**call, "token": "128", "gfx": "gfx950", "cu_num": "256", "block_m": "32", "ksplit": "0", "us": "5",
           "run_1stage": "0", "kernelName1": "moe_ck2stages_gemm1_svc", "kernelName2": "moe_ck2stages_gemm2_svc"}
    table = Table(header, [{c: row.get(c, "") for c in header}])

    def one(shape):
        (res,) = check(FMOE, FMOE.key_columns, "gfx950", 256, [shape], table, flydsl=False)
        return res
    res = one(call)
    assert res.verdict == "unknown" and not res.hit and "entry=shared" in res.reason and "raises" in res.reason
    assert one(dict(call, entry="fused_moe")).hit
    assert one(dict(call, entry="shared")).verdict == "raises"
