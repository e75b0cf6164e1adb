"""The MoE ops as data (MoeOpPath): fused_moe (FMOE_OP, and amd-aiter 0.1.7's), fhmoe_ (FHMOE_OP), the grouped
gfx1250 entry (GROUPED_OP), and the serving environment's variables the MoE op reads (MOE_ENV)."""

from __future__ import annotations

from app.domain.families.conditions import Cond, CondOp, Conds
from app.domain.families.gpus import GPU_FP8
from app.domain.families.moe_paths import MoeADtype, MoeLauncher, MoeOpPath, MoeRoute
from app.domain.families.ops import MissRaises

# _fused_moe_impl reads these on every call (fused_moe.py:768, :781-784, :799-800; GPTOSS_SWIGLU_MXFP4_BF16_BOUND at
# import, :76), as (name, the value unset); a capture's env carries the server's (app/capture/identity.py)
MOE_ENV = (("AITER_BF16_FP8_MOE_BOUND", "256"), ("GPTOSS_SWIGLU_MXFP4_BF16_BOUND", "256"), ("AITER_SITUV2_A8W4", "0"),
           ("AITER_SITUV2_A4W4", "0"), ("AITER_FORCE_A8W4", "0"))
# int() of a bound that is no integer raises ValueError: at import (:76, the whole module), or on every call (:768)
MOE_ENV_RAISES = tuple(MissRaises(w, f"ValueError: int() of {v} (the serving environment's) is not an integer",
                                  when=((v, "!int", ""),))
                       for w, v in (("fused_moe.py:76", "GPTOSS_SWIGLU_MXFP4_BF16_BOUND"),
                                    ("fused_moe.py:768", "AITER_BF16_FP8_MOE_BOUND")))
# --- end issue 35 (w35b) MoE environment -------------------------------------------------------------------------

_P1X32: Cond = ("q_type", "==", "QuantType.per_1x32")
_SWIGLU: Cond = ("act_type", "==", "ActivationType.Swiglu")
_BF16, _FP4X2 = "torch.bfloat16", "torch.float4_e2m1fn_x2"
# fused_moe.py:759-806 (_fused_moe_impl), env unset (AITER_BF16_FP8_MOE_BOUND and GPTOSS_SWIGLU_MXFP4_BF16_BOUND
# 256, no AITER_SITUV2_A8W4/A4W4, no AITER_FORCE_A8W4); M is the raw token count; the per_1x128 fp8-input branch
# (:762-767) needs an fp8 hidden_states with a1_scale, which a bf16/fp16 `dtype` call never is
_SHARED: Cond = ("entry", "==", "shared")
# fhmoe_'s contract and its activation dtype by gate mode (the shared-expert branches below)
_FHMOE_CONTRACT: Conds = (_SHARED, ("gfx", "==", "gfx950"), _P1X32, ("act_type", "==", "ActivationType.Silu"),
                          ("q_dtype_w", "==", _FP4X2))
_FHMOE_GATE: tuple[tuple[Conds, str], ...] = (((("gate_mode", "==", "GateMode.INTERLEAVE"),), GPU_FP8), ((), _FP4X2))
# per_1x32 SiTUv2 and the environment variables that pick its activation dtype
_SITUV2: Conds = (_P1X32, ("act_type", "==", "ActivationType.Situv2"))
_SITUV2_ENV: tuple[tuple[Conds, str], ...] = (((("AITER_SITUV2_A8W4", "==", "1"),), GPU_FP8),
                                              ((("AITER_SITUV2_A4W4", "==", "1"),), _FP4X2), ((), _BF16))
_FMOE_A_DTYPE = (
    # fused_moe with shared experts goes to fhmoe_ (fused_moe.py:495-536), which calls _fused_moe_impl with
    # _q_dtype_a fp8 for interleaved gate/up weights, else fp4x2 (aiter/fhmoe.py:563, :611 at e4048607a5); its
    # contract (fhmoe.py _validate_fhmoe_contract) is gfx950, per_1x32, Silu and fp4x2 weights
    *(MoeADtype(_FHMOE_CONTRACT + g, a) for g, a in _FHMOE_GATE),
    MoeADtype((_SHARED,), ""),
    # :799-803: AITER_FORCE_A8W4 `in ("1")` is a substring test of "1": set empty, it forces fp8 too
    MoeADtype((("gfx", "==", "gfx1250"), ("AITER_FORCE_A8W4", "in", "|1")), GPU_FP8),
    MoeADtype((("gfx", "==", "gfx1250"),), _FP4X2),
    MoeADtype((_P1X32, ("q_dtype_w", "==", "torch.int4")), _BF16),  # :769-771
    MoeADtype((_P1X32, ("q_dtype_w", "==", GPU_FP8)), GPU_FP8),  # :772-774
    *(MoeADtype(_SITUV2 + c, a) for c, a in _SITUV2_ENV),  # :776-788
    MoeADtype((_P1X32, _SWIGLU, ("gate_mode", "==", "GateMode.SEPARATED"),
               ("token", "<", "$GPTOSS_SWIGLU_MXFP4_BF16_BOUND")), _BF16),  # :789-790
    MoeADtype((_P1X32, _SWIGLU, ("gate_mode", "==", "GateMode.SEPARATED")), _FP4X2),
    *(b for cond in (_SWIGLU, ("gate_mode", "==", "GateMode.INTERLEAVE")) for b in (  # :791-795
        MoeADtype((_P1X32, cond, ("gfx", "!=", "gfx950")), _BF16),
        MoeADtype((_P1X32, cond, ("token", "<", "$AITER_BF16_FP8_MOE_BOUND")), _BF16),
        MoeADtype((_P1X32, cond), GPU_FP8))),
    MoeADtype((_P1X32,), _FP4X2),  # :796-797
    MoeADtype((("q_dtype_w", "==", "torch.uint32"),), GPU_FP8),  # :759
    MoeADtype((), "@w"))
# the stage launchers get_2stage_cfgs builds (fused_moe.py:2471-2975) and the kernel names each runs
_FMOE_LAUNCHERS = (
    MoeLauncher("fused_moe_1stage", "kernelName", r"_ZN"), MoeLauncher("asm_stage1", "kernelName", r"_ZN"),
    MoeLauncher("ck_moe_stage1", "kernelName", r"moe_ck2stages"),
    MoeLauncher("ck_moe_stage1_fwd", "kernelName", r"moe_ck2stages"),  # 0.1.7's stage 1
    MoeLauncher("ck_moe_stage2_fwd", "kernelName", r"moe_ck2stages"),
    MoeLauncher("_flydsl_stage1_wrapper", "kernelName", r"flydsl_"),
    MoeLauncher("_flydsl_stage2_wrapper", "kernelName", r"flydsl_"),
    MoeLauncher("_flydsl_v2_stage2_wrapper", "kernelName", r"flydsl_moe2_layout_"),
    MoeLauncher("opus_a8w4_stage1_wrapper", "kernelName", r"opus_"),
    MoeLauncher("opus_a8w4_stage2_wrapper", "kernelName", r"opus_"),
    MoeLauncher("_mxfp4_a4w4_stage1_fw", "kernelName1", r"flydsl_mxmoe_g1"),
    MoeLauncher("_mxfp4_a4w4_stage2_fw", "kernelName2", r"flydsl_mxmoe_g2"),
    MoeLauncher("cktile_moe_stage1", "", r".*cktile"), MoeLauncher("cktile_moe_stage2", "", r".*cktile"))
_G1U1: Cond = ("use_g1u1", "in", "1|True")
_NO_DOWEIGHT: Cond = ("doweight_stage1", "in", "0|False")
_HALF: Cond = ("dtype", "in", "torch.bfloat16|torch.float16")
_FLYDSL: Cond = ("flydsl", "==", "True")
_W_FP4: Cond = ("q_dtype_w", "==", _FP4X2)
_CKTILE = ("cktile_moe_stage1", "cktile_moe_stage2")
_S2_TAIL = ((r"opus_moe2", "opus_a8w4_stage2_wrapper"), (r"cktile_", "cktile_moe_stage2"), (r"", "ck_moe_stage2_fwd"))
_S2_FLYDSL = ((r"flydsl_", "_flydsl_stage2_wrapper"),) + _S2_TAIL
_CK_KN1: Cond = ("kernelName1", "~", r".*ck2stages")
# issue 35 (w35b): the stages _use_fhmoe_wrappers accepts (fhmoe.py:304-317), and what it raises on any other
_FLYDSL_STAGES = ("_flydsl_stage1_wrapper", "_flydsl_stage2_wrapper")
# fhmoe.py _is_dsv4_i384_fhmoe_contract (:569-586): the calls that read AITER_CONFIG_FHMOE's table; _PADLESS: of a
# tuned_fmoe capture, which carries no pads (fhmoe_'s defaults are 0)
_DSV4_I384: Conds = (("model_dim", "==", "7168"), ("inter_dim", "==", "384"), ("expert", "==", "385"), ("topk", "==", "7"),
              ("hidden_pad", "==", "0"), ("intermediate_pad", "==", "0"), ("gate_mode", "==", "GateMode.INTERLEAVE"),
              ("doweight_stage1", "in", "0|False"))
_DSV4_I384_PADLESS: Conds = tuple(c if c[0] not in ("hidden_pad", "intermediate_pad") else (c[0], "in", "|0")
                           for c in _DSV4_I384)
_FHMOE_STAGES_RAISE = ("NotImplementedError: Heterogeneous MXFP4/FP8 experts require the two-stage FlyDSL path "
                       "(fhmoe.py:304-317)")
# get_2stage_cfgs' stage choice for a row found (fused_moe.py:2328-2975), the weights marked is_shuffled as the
# serving frameworks prepare them, AITER_FLYDSL_FORCE unset (its default "1"); first that fits
_FMOE_ROUTES = (
    MoeRoute("fused_moe.py:2341-2351", (("kernelName1", "~", r"opus_"),
                                        ("act_type", "in", "ActivationType.Gelu|ActivationType.No")), None,
             own_names=True),  # an Opus row for another activation is discarded
    *(MoeRoute("fused_moe.py:2471-2491", (c,), "_mxfp4_a4w4_stage1_fw", "_mxfp4_a4w4_stage2_fw") for c in (
        ("kernelName1", "~", r"flydsl_mxmoe_g"), ("kernelName2", "~", r"flydsl_mxmoe_g"))),
    MoeRoute("fused_moe.py:2493-2517", (("run_1stage", "nonzero", ""),), "fused_moe_1stage"),
    *(MoeRoute("fused_moe.py:2523-2614", c, ((r"opus_moe1_", "opus_a8w4_stage1_wrapper"),
                                             (r"flydsl_", "_flydsl_stage1_wrapper"), (r"", "ck_moe_stage1")),
               ((r"flydsl_moe2_layout_", "_flydsl_v2_stage2_wrapper"), *_S2_FLYDSL))
      for c in ((("kernelName1", "~", r"opus_moe1_"),), (("kernelName1", "~", r"flydsl_"), _FLYDSL),
                (("kernelName2", "~", r"flydsl_"), _FLYDSL))),
    MoeRoute("fused_moe.py:2617-2645", (("gate_mode", "!=", "GateMode.SEPARATED"), _HALF, _P1X32, _SWIGLU,
                                        ("q_dtype_w", "!=", GPU_FP8)), *_CKTILE),
    MoeRoute("fused_moe.py:2652-2690", (_P1X32, ("q_dtype_w", "==", "torch.int4"), _FLYDSL), None, own_names=True),
    MoeRoute("fused_moe.py:2696-2795", (_HALF, _P1X32, ("act_type", "==", "ActivationType.Situv2"),
                                        ("q_dtype_a", "==", _BF16), _W_FP4, _G1U1, _NO_DOWEIGHT, _FLYDSL), None,
             own_names=True, builds=_FLYDSL_STAGES),
    MoeRoute("fused_moe.py:2696-2795", (_HALF, _P1X32, ("q_dtype_a", "in", f"{_FP4X2}|{GPU_FP8}"),
                                        ("q_dtype_w", "in", f"{_FP4X2}|{GPU_FP8}"), _G1U1, _NO_DOWEIGHT, _FLYDSL),
             None, own_names=True, builds=_FLYDSL_STAGES),
    *(MoeRoute("fused_moe.py:2798-2837", (_HALF, _P1X32, _W_FP4) + c, *_CKTILE) for c in (
        (("act_type", "!=", "ActivationType.Swiglu"), ("ksplit", ">", "1")),
        (_SWIGLU, ("q_dtype_a", "!=", _FP4X2), ("ksplit", ">", "1")),
        (_SWIGLU, ("q_dtype_a", "in", "torch.bfloat16|torch.float16")))),
    MoeRoute("fused_moe.py:2839-2872", (_SWIGLU, _W_FP4, _P1X32, _HALF, ("kernelName1", "~", "$")), *_CKTILE),
    *(MoeRoute("fused_moe.py:2874-2933", c + f, "ck_moe_stage1", s2)
      for c in ((_CK_KN1,), (("kernelName1", "~", "$"), ("q_type", "==", "QuantType.per_1x128"),
                             ("doweight_stage1", "in", "1|True")),
                (("kernelName1", "~", "$"), ("q_dtype_w", "in", f"{_BF16}|torch.float16|torch.uint32|{_FP4X2}|"
                                                                f"{GPU_FP8}")))
      for f, s2 in (((_FLYDSL,), _S2_FLYDSL), ((), _S2_TAIL))),
    MoeRoute("fused_moe.py:2935-2975", (), "asm_stage1", _S2_TAIL))
# amd-aiter 0.1.7 fused_moe.py:642-729
_FMOE_ROUTES_0_1_7 = (
    MoeRoute("fused_moe.py:642-654 (0.1.7)", (("run_1stage", "nonzero", ""),), "fused_moe_1stage"),
    MoeRoute("fused_moe.py:655-676 (0.1.7)", (_HALF, _P1X32, _SWIGLU), *_CKTILE),
    *(MoeRoute("fused_moe.py:677-704 (0.1.7)", c, "ck_moe_stage1_fwd", "ck_moe_stage2_fwd") for c in (
        (_CK_KN1,), (("q_type", "==", "QuantType.per_1x128"), ("doweight_stage1", "in", "1|True")),
        (("q_dtype_w", "in", f"{_BF16}|torch.float16|torch.uint32|{_FP4X2}"),))),
    MoeRoute("fused_moe.py:706-729 (0.1.7)", (), "asm_stage1", "ck_moe_stage2_fwd"))
FMOE_OP = MoeOpPath("fused_moe.py:759-806", _FMOE_A_DTYPE,
                    call_defaults=(("gate_mode", "GateMode.SEPARATED"),) + MOE_ENV, env=tuple(n for n, _ in MOE_ENV),
                    call_variants=tuple(((("gate_mode", g), ("entry", e))) for e in ("fused_moe", "shared")
                                        for g in ("GateMode.SEPARATED", "GateMode.INTERLEAVE")),
                    launchers=_FMOE_LAUNCHERS, needs=("_is_mxfp4_kname", "parse_flydsl_v2_gemm2_kernel"),
                    # issue 35 (w35b): aiter/fhmoe.py, where a shared-expert call goes (fused_moe.py:495-536)
                    sources=("aiter/ops/flydsl/mxfp4_kname.py", "aiter/ops/flydsl/grouped_moe_gfx1250.py",
                             "aiter/fhmoe.py"),
                    calls_get_gfx=True, routes=_FMOE_ROUTES,
                    # issue 35 (w35b): fhmoe_ applies its wrapper step to the stages of a shared-expert call whatever
                    # table it read (fhmoe.py:563-613 passes _metadata_transform=_use_fhmoe_wrappers, :304-317)
                    stages=_FLYDSL_STAGES, stages_raise=_FHMOE_STAGES_RAISE, stages_when=(_SHARED,),
                    other_table=(MissRaises("fhmoe.py:569-586", "a shared-expert call in the DSV4 I384 contract "
                                            "reads AITER_CONFIG_FHMOE's table", when=(_SHARED,) + _DSV4_I384_PADLESS),),
                    raises=MOE_ENV_RAISES + (MissRaises(
                        "fused_moe.py:855-875", "NotImplementedError: a16w4 (bf16 A x MXFP4 W) SiTUv2 needs FlyDSL on "
                        "gfx942/gfx950, g1u1 weights and no doweight_stage1",
                        when=(_P1X32, ("q_dtype_w", "==", _FP4X2), ("q_dtype_a", "==", _BF16),
                              ("act_type", "==", "ActivationType.Situv2")),
                        unless=(("gfx", "in", "gfx942|gfx950"), ("flydsl", "==", "True"), ("use_g1u1", "in", "1|True"),
                                ("doweight_stage1", "in", "0|False"))),))
# fused_moe with shared experts (fused_moe.py:495-536) -> fhmoe_ (aiter/fhmoe.py:509-625): its contract
# (_validate_fhmoe_contract, :48-85, get_gfx() first), _q_dtype_a (:563), the dedicated table for the DSV4 I384
# contract only (:569-586; else tuned_fmoe), a row at every padded tier up to M (:345-385, :579-583) and the
# two-stage FlyDSL launchers (_use_fhmoe_wrappers, :304-317)
_FHMOE_RAISES: tuple[tuple[str, CondOp, str, str], ...] = (("gfx", "!=", "gfx950", "NotImplementedError: Heterogeneous MXFP4/FP8 experts currently require "
                                         "gfx950"),
                 ("q_type", "!=", "QuantType.per_1x32", "ValueError: Heterogeneous MXFP4/FP8 experts require per_1x32"),
                 ("act_type", "!=", "ActivationType.Silu", "ValueError: Heterogeneous MXFP4/FP8 experts require SiLU"),
                 ("q_dtype_w", "!=", _FP4X2, "ValueError: Heterogeneous routed weights must use MXFP4"),
                 ("use_g1u1", "!in", "1|True", "ValueError: Heterogeneous MXFP4/FP8 experts require gate and up"))
FHMOE_OP = MoeOpPath(
    "fhmoe.py:563-586", (MoeADtype((("gate_mode", "==", "GateMode.INTERLEAVE"),), GPU_FP8), MoeADtype((), _FP4X2)),
    call_variants=((("entry", "fhmoe"),),), launchers=_FMOE_LAUNCHERS, routes=_FMOE_ROUTES, calls_get_gfx=True,
    needs=FMOE_OP.needs, sources=FMOE_OP.sources,
    call_defaults=MOE_ENV, env=FMOE_OP.env,  # issue 35 (w35b): _fused_moe_impl still int()s its bound (:768)
    raises=MOE_ENV_RAISES[:1] + tuple(MissRaises("fhmoe.py:48-85", why, when=((c, op, v),))
                                      for c, op, v, why in _FHMOE_RAISES) + MOE_ENV_RAISES[1:],
    table_when=_DSV4_I384,
    tiers_cover=MissRaises("fhmoe.py:345-385,579-583", "NotImplementedError: The active FHMoE config does not cover "
                                                       "this DSV4 I384 token shape"),
    tier_cells=(("dtype", _BF16), ("q_dtype_a", GPU_FP8)),
    stages=_FLYDSL_STAGES, stages_raise=_FHMOE_STAGES_RAISE)
# amd-aiter 0.1.7 fused_moe.py:218-221: the weight's dtype (uint32: fp8), fp4x2 for per_1x32
FMOE_OP_0_1_7 = MoeOpPath("fused_moe.py:218-221 (0.1.7)", (
    MoeADtype((_P1X32,), _FP4X2), MoeADtype((("q_dtype_w", "==", "torch.uint32"),), GPU_FP8), MoeADtype((), "@w")),
    launchers=_FMOE_LAUNCHERS, routes=_FMOE_ROUTES_0_1_7)

# grouped_gemm_gfx1250_a8w4 (grouped_moe_gfx1250.py:874-1170), env unset (AITER_USE_GROUPED_GEMM,
# AITER_DISABLE_GROUPED_A8W4, AITER_FORCE_GFX1250, GPU_ARCHS naming gfx1250 on another GPU): the calls it returns
# None for, which fused_moe then runs on its generic path; "gfx" is get_gfx()
GROUPED_OP = MoeOpPath("grouped_moe_gfx1250.py:874-1039", (), declines=(
    MissRaises("grouped_moe_gfx1250.py:963-1011", "the grouped path serves gfx1250 g1u1 per_1x32 Silu/Swiglu/Situv2 "
               "calls with fp4 weights and fp4 or fp8 activations only",
               unless=(("gfx", "==", "gfx1250"), ("use_g1u1", "in", "1|True"), _P1X32,
                       ("act_type", "in", "ActivationType.Silu|ActivationType.Swiglu|ActivationType.Situv2"),
                       ("a_w", "in", f"{_FP4X2}/{_FP4X2}|torch.float8_e4m3fn/{_FP4X2}|"
                                     "torch.float8_e4m3fn/torch.uint8"))),),
    declines_after=(MissRaises("grouped_moe_gfx1250.py:1072", "an expert-parallel call with doweight_stage1 goes to "
                               "the generic MoE", when=(("topk", "==", "-1"), ("doweight_stage1", "in", "1|True"))),))
