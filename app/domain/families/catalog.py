"""The catalogue of AITER table families: one definition each, and how a family is found by name or by file.

Headers, key columns and env var names come from ROCm/aiter at e4048607a5 (aiter/jit/core.py:90-166,
aiter/tuned_gemm.py, aiter/ops/gemm_op_*.py, aiter/fused_moe.py, the csrc/*/*_tune.py scripts); see
../shared/reference/aiter-tuning.md sections 1-2.
"""

from __future__ import annotations

from app.domain.families.gemm_ops import (A4W4_OP, A8W8_BATCHED_OP, A8W8_OP, BF16_BATCHED_OP, BF16_OP,
                                          BLOCKSCALE_BPRESHUFFLE_OP, BLOCKSCALE_OP, BPRESHUFFLE_OPS,
                                          BPRESHUFFLE_RETRY, FLYDSL_A8W8_NAME, FLYDSL_HGEMM_NAME,
                                          FLYDSL_HGEMM_SOURCES, MNK_FILE, MXSCALE_OP)
from app.domain.families.gpus import GPU_FP8
from app.domain.families.log_formats import LOG_A8W8, LOG_A8W8_BATCHED, LOG_BF16, LOG_BF16_BATCHED, LOG_CK, LOG_MOE
from app.domain.families.moe_ops import FHMOE_OP, FMOE_OP, GROUPED_OP
from app.domain.families.ops import MissRaises, OpPath, OpRemap, ReadCell
from app.domain.families.record import TableFamily
from app.domain.families.renames import BLOCKSCALE_1X1, FLYDSL_BPRESHUFFLE_X0, FMOE_CK_QUANT
from app.domain.families.rules import (CaptureRules, DeployRules, LoaderRules, LookupRules, OpDispatch, ReplaySpec,
                                       TunerRules)


def _h(s: str) -> tuple[str, ...]:
    return tuple(s.split(","))


_GEMM_KEY = _h("gfx,cu_num,M,N,K")
_CK_RESULT = "kernelId,splitK,us,kernelName,tflops,bw,errRatio"
_FMOE_SHAPE = _h("token,model_dim,inter_dim,expert,topk,act_type,dtype,q_dtype_a,q_dtype_w,q_type,use_g1u1,"
                 "doweight_stage1")
_FMOE_KEY = ("gfx", "cu_num") + _FMOE_SHAPE
# Headers of released tables other than a family's tuned_header. "0.1.7" is the amd-aiter 0.1.7.post2 wheel (Nov
# 2025): no gfx column anywhere, bf16 with cu_num after scaleAB and no bpreshuffle, a8w8 keyed without q_dtype_w
# (its tuned_gemm.py:62, ops/gemm_op_a8w8.py:220/:254, ops/gemm_op_a4w4.py:40, ops/batched_gemm_op_*.py,
# fused_moe.py:527).
_CK_OLD = "cu_num,M,N,K,kernelId,splitK,us,kernelName,tflops,bw,errRatio"
_CK_OLD_VARIANT = ((_CK_OLD, "cu_num,M,N,K"),)
_BATCHED_OLD_VARIANT = (("cu_num,B,M,N,K,kernelId,splitK,us,kernelName,tflops,bw,errRatio", "cu_num,B,M,N,K"),)
_FMOE_OLD_KEYS = ("cu_num,token,model_dim,inter_dim,expert,topk,act_type,dtype,q_dtype_a,q_dtype_w,q_type,"
                  "use_g1u1,doweight_stage1")
_FMOE_HEAD = _FMOE_OLD_KEYS + ",block_m,ksplit,us1,kernelName1,err1,us2,kernelName2,err2,us,run_1stage"


FAMILIES: dict[str, TableFamily] = {f.name: f for f in [
    TableFamily(
        name="bf16_gemm", env_var="AITER_CONFIG_GEMM_BF16", tuned_file="bf16_tuned_gemm.csv",
        untuned_file="bf16_untuned_gemm.csv",
        tuned_header=_h("gfx,cu_num,M,N,K,bias,dtype,outdtype,scaleAB,bpreshuffle,libtype,solidx,splitK,us,"
                        "kernelName,err_ratio,tflops,bw"),
        untuned_header=_h("M,N,K,bias,dtype,outdtype,scaleAB,bpreshuffle"),
        key_columns=_h("gfx,cu_num,M,N,K,bias,dtype,outdtype,scaleAB,bpreshuffle"),
        shape_columns=_h("M,N,K,bias,dtype,outdtype,scaleAB,bpreshuffle"), err_columns=("err_ratio",),
        lookup=LookupRules(
            gfx_source="get_gfx", aiter_lookup="aiter/tuned_gemm.py:get_GEMM_A16W16_config", flydsl_miss="skip",
            # tuned_gemm.py:163-177: a flydsl row runs only where get_flydsl_splitk_hgemm_kernel_params knows its
            # kernel
            flydsl_catalog=FLYDSL_HGEMM_NAME, aiter_file_attr="AITER_CONFIG_GEMM_BF16_FILE",
            # tuned_gemm.py:191-210: no row, bpreshuffle, a gfx other than gfx942: the asm default needs a bf16
            # input, N and K multiples of 64 and a bf16/fp32 output, else `assert False, "no solution ..."`
            miss_raises=(MissRaises(
                "tuned_gemm.py:208", "AssertionError: no solution (bpreshuffle without a row, and no default asm "
                "kernel for this dtype/N/K/otype)", when=(("bpreshuffle", "==", "True"), ("gfx", "!=", "gfx942")),
                unless=(("dtype", "==", "torch.bfloat16"), ("N", "%", "64"), ("K", "%", "64"),
                        ("outdtype", "in", "torch.bfloat16|torch.float32"))),),
        ),
        loader=LoaderRules(
            tuned_variants=(("M,N,K,bias,dtype,outdtype,scaleAB,cu_num,libtype,solidx,splitK,us,kernelName,err_ratio,"
                             "tflops,bw", "cu_num,M,N,K,bias,dtype,outdtype,scaleAB"),),
            untuned_variants=("M,N,K,bias,dtype,outdtype,scaleAB", "M,N,K"),
        ),
        op=OpDispatch(
            # gemm_a16w16 runs solMap[config["libtype"]] (tuned_gemm.py:327, :605-613): any other libtype is a
            # KeyError skinny_gemm sets its output only for solidx 0-2 (:372-389: any other is an UnboundLocalError);
            # opus_gemm int()s solidx and splitK (:562, :573)
            read_cells=(ReadCell("libtype", "enum", "tuned_gemm.py:327",
                                 ("torch", "hipblaslt", "skinny", "asm", "triton", "flydsl", "opus")),
                        ReadCell("solidx", "enum", "tuned_gemm.py:372-389", ("0", "1", "2"),
                                 when=(("libtype", "==", "skinny"),)),
                        ReadCell("solidx", "int", "tuned_gemm.py:573", when=(("libtype", "==", "opus"),)),
                        ReadCell("splitK", "int", "tuned_gemm.py:562", when=(("libtype", "==", "opus"),))),
            # the solfunc a row's libtype picks asserts on what it does not support (opus without its module falls
            # back to torch_gemm, which asserts too)
            op_paths=(OpPath("tuned_gemm.py:371, :427, :561, :601", "AssertionError: bpreshuffle is not supported in "
                             "the torch, skinny, opus and Triton GEMMs", when=(("bpreshuffle", "==", "True"),),
                             row_when=(("libtype", "in", "torch|skinny|triton|opus"),)),
                      OpPath("tuned_gemm.py:486-488, :558-560, :598-600", "AssertionError: the FlyDSL, opus and Triton "
                             "GEMMs do not support scaling", when=(("scaleAB", "==", "True"),),
                             row_when=(("libtype", "in", "flydsl|triton|opus"),))),
            op_entries=(BF16_OP,), op_sources=FLYDSL_HGEMM_SOURCES,
        ),
        deploy=DeployRules(
            served_as=(("torch", "plain F.linear(inp, weights, bias) (tuned_gemm.py:415-451, solMap['torch'])"),
                       ("triton", "AITER's own gemm_a16w16 Triton kernel with AITER's own configs "
                                  "(tuned_gemm.py:584-602)")),
        ),
        tuner=TunerRules(tuner_script="csrc/gemm_a16w16/gemm_a16w16_tune.py"),
        capture=CaptureRules(
            log_lines=LOG_BF16,
            # AITER's own defaults for an unflagged call (tuned_gemm.py:290-324): outdtype is the input dtype
            shape_defaults=(("bias", "False"), ("scaleAB", "False"), ("bpreshuffle", "False"),
                            ("dtype", "torch.bfloat16"), ("outdtype", "dtype")),
        ),
    ),
    TableFamily(
        name="a8w8_gemm", env_var="AITER_CONFIG_GEMM_A8W8", tuned_file="a8w8_tuned_gemm.csv",
        untuned_file="a8w8_untuned_gemm.csv", tuned_header=_h("gfx,cu_num,M,N,K,q_dtype_w," + _CK_RESULT),
        untuned_header=_h("M,N,K,q_dtype_w"), key_columns=_GEMM_KEY + ("q_dtype_w",),
        shape_columns=_h("M,N,K,q_dtype_w"),
        lookup=LookupRules(
            compiled=True,
            # gemm_a8w8.cu:94-136: the kernel comes from a (gfx,cu_num,M,N,K) table, no q_dtype_w, own padding
            cpp_key=_GEMM_KEY, aiter_lookup="aiter/ops/gemm_op_a8w8.py:get_GEMM_config_with_quant_type",
            aiter_file_attr="AITER_CONFIG_GEMM_A8W8_FILE", aiter_args=("M", "N", "K", "q_dtype_w", "@file"),
        ),
        loader=LoaderRules(gfx_optional=True, tuned_variants=_CK_OLD_VARIANT),
        op=OpDispatch(
            # gemm_a8w8_CK looks up any weight dtype but the GPU's own fp8 and int8 as torch.int8
            # (gemm_op_a8w8.py:663): a float8_e4m3fn weight on gfx942, a fnuz one on gfx950
            op_remaps=(OpRemap("ops/gemm_op_a8w8.py:663", "q_dtype_w", (GPU_FP8, "torch.int8"), "torch.int8"),),
            op_entries=(A8W8_OP,),
        ),
        deploy=DeployRules(filled=("kernelName",)),
        tuner=TunerRules(
            math="fp8", tuner_script="csrc/ck_gemm_a8w8/gemm_a8w8_tune.py",
            # the tuner races kernels_list only and names a row by kernels_list[kernelId].name (gemm_a8w8_tune.py:
            # 121-124, 223-228)
            catalog_lists=(("csrc/ck_gemm_a8w8/gemm_a8w8_common.py", "kernels_list"),),
            # gemm_a8w8_tune.py:74-108 (generate_data, gemm_a8w8_ref, run_gemm_a8w8) and :139-180 (run_config: the
            # data with seed 0, bf16 and eval(q_dtype_w); gemm_a8w8 is the production op)
            replay=ReplaySpec(data="generate_data", data_args=("q_dtype_w",), ref="gemm_a8w8_ref",
                              inputs=("x", "weight", "x_scale", "w_scale"), kernel="run_gemm_a8w8",
                              op="aiter.ops.gemm_op_a8w8:gemm_a8w8"),
        ),
        capture=CaptureRules(log_lines=LOG_A8W8),
    ),
    TableFamily(
        name="a8w8_bpreshuffle_gemm", env_var="AITER_CONFIG_GEMM_A8W8_BPRESHUFFLE",
        tuned_file="a8w8_bpreshuffle_tuned_gemm.csv", untuned_file="a8w8_bpreshuffle_untuned_gemm.csv",
        tuned_header=_h("gfx,cu_num,M,N,K,q_dtype_w,libtype," + _CK_RESULT), untuned_header=_h("M,N,K,q_dtype_w"),
        key_columns=_GEMM_KEY + ("q_dtype_w",), shape_columns=_h("M,N,K,q_dtype_w"),
        kernel_renames=(FLYDSL_BPRESHUFFLE_X0,),
        lookup=LookupRules(
            compiled=True, aiter_lookup="aiter/ops/gemm_op_a8w8.py:get_GEMM_config_with_quant_type",
            aiter_file_attr="AITER_CONFIG_GEMM_A8W8_BPRESHUFFLE_FILE",
            aiter_args=("M", "N", "K", "q_dtype_w", "@file"), flydsl_miss="default",
            # ck rows also pick the kernel in the compiled (gfx,cu_num,M,N,K) table, padded as Python pads
            cpp_key=_GEMM_KEY, cpp_padding="gemm", cpp_libtype="ck",
        ),
        loader=LoaderRules(
            gfx_optional=True,
            tuned_variants=(("cu_num,M,N,K,q_dtype_w,kernelId,splitK,us,kernelName,tflops,bw,errRatio",
                             "cu_num,M,N,K,q_dtype_w"),),
        ),
        op=OpDispatch(
            # gemm_a8w8_bpreshuffle (fp8, :739-750): ck, cktile and (FlyDSL importable) flydsl rows run; any other
            # libtype, or flydsl without FlyDSL, falls through to the default ck kernel, no next-M retry. int8 rows
            # are gemm_a8w8_ASM's (:621-640), which runs any row it finds.
            aiter_op="gemm_a8w8_bpreshuffle", op_entries=BPRESHUFFLE_OPS, weight_retry=BPRESHUFFLE_RETRY,
            read_cells=(ReadCell("splitK", "int", "ops/gemm_op_a8w8.py:738",
                                 when=(("q_dtype_w", "!=", "torch.int8"),)),),
            libtype_use=(("ck", "hit"), ("cktile", "hit"), ("flydsl", "hit")), libtype_other="default",
            op_paths=(
                # a weight neither int8 (gemm_a8w8_ASM's) nor the GPU's own fp8: `assert WQ.dtype == dtypes.fp8`
                OpPath("ops/gemm_op_a8w8.py:726", "AssertionError: gemm_a8w8_bpreshuffle only support fp8 now (the "
                       "weight is not the GPU's own fp8)", when=(("q_dtype_w", "!in", GPU_FP8 + "|torch.int8"),)),
                # issue 35 (w35b): a flydsl row (FlyDSL importable) off gfx1250 imports ops/flydsl/gemm_kernels.py (or
                # its 8-wave module) to run; its catalog registration names kernels with get_gfx() (:174, :689-697),
                # which raises on a GPU_ARCHS entry it does not know: every such call raises
                OpPath("ops/flydsl/gemm_kernels.py:174, :697", "KeyError: Unknown GPU architecture (get_gfx() of "
                       "GPU_ARCHS, in FlyDSL's GEMM catalog the flydsl row's kernel is run from)",
                       when=(("q_dtype_w", "!=", "torch.int8"), ("gfx", "!=", "gfx1250"), ("flydsl", "==", "True"),
                             ("arch", "!in", "@gfx_names")),
                       row_when=(("libtype", "==", "flydsl"), ("kernelName", "!~", "flydsl_bpreshuffle_8w_"))),
                # a flydsl row whose kernel name _parse_flydsl_kernel_name cannot read runs the default ck kernel
                OpPath("ops/gemm_op_a8w8.py:148-189", "a flydsl row whose kernel name does not parse",
                       runs="default", when=(("q_dtype_w", "!=", "torch.int8"),),
                       row_when=(("libtype", "==", "flydsl"), ("kernelName", "!~", FLYDSL_A8W8_NAME)))),
            libtype_use_unless=(("q_dtype_w", "torch.int8"),),
        ),
        tuner=TunerRules(math="fp8", tuner_script="csrc/ck_gemm_a8w8_bpreshuffle/gemm_a8w8_bpreshuffle_tune.py"),
        capture=CaptureRules(log_lines=LOG_A8W8),
    ),
    TableFamily(
        name="a8w8_blockscale_gemm", env_var="AITER_CONFIG_GEMM_A8W8_BLOCKSCALE",
        tuned_file="a8w8_blockscale_tuned_gemm.csv", untuned_file="a8w8_blockscale_untuned_gemm.csv",
        tuned_header=_h("gfx,cu_num,M,N,K,libtype," + _CK_RESULT), untuned_header=_h("M,N,K"), key_columns=_GEMM_KEY,
        shape_columns=_h("M,N,K"), kernel_renames=(BLOCKSCALE_1X1,),
        lookup=LookupRules(
            compiled=True, aiter_lookup="aiter/ops/gemm_op_a8w8.py:get_CKGEMM_config", aiter_args=MNK_FILE,
            aiter_file_attr="AITER_CONFIG_GEMM_A8W8_BLOCKSCALE_FILE",
        ),
        loader=LoaderRules(gfx_optional=True, tuned_variants=_CK_OLD_VARIANT),
        op=OpDispatch(
            # gemm_a8w8_blockscale (:839-866): ck and cktile rows run (by kernelName); any other libtype asserts
            aiter_op="gemm_a8w8_blockscale", op_entries=(BLOCKSCALE_OP,),
            libtype_use=(("ck", "hit"), ("cktile", "hit")), libtype_other="fails",
        ),
        tuner=TunerRules(math="fp8", tuner_script="csrc/ck_gemm_a8w8_blockscale/gemm_a8w8_blockscale_tune.py"),
        capture=CaptureRules(log_lines=LOG_CK),
    ),
    TableFamily(
        name="a8w8_blockscale_bpreshuffle_gemm", env_var="AITER_CONFIG_GEMM_A8W8_BLOCKSCALE_BPRESHUFFLE",
        tuned_file="a8w8_blockscale_bpreshuffle_tuned_gemm.csv",
        untuned_file="a8w8_blockscale_bpreshuffle_untuned_gemm.csv",
        tuned_header=_h("gfx,cu_num,M,N,K,libtype," + _CK_RESULT), untuned_header=_h("M,N,K"), key_columns=_GEMM_KEY,
        shape_columns=_h("M,N,K"),
        lookup=LookupRules(
            compiled=True, aiter_lookup="aiter/ops/gemm_op_a8w8.py:get_CKGEMM_config", aiter_args=MNK_FILE,
            aiter_file_attr="AITER_CONFIG_GEMM_A8W8_BLOCKSCALE_BPRESHUFFLE_FILE", flydsl_miss="default",
        ),
        loader=LoaderRules(gfx_optional=True, tuned_variants=_CK_OLD_VARIANT, untuned_variants=("M,N,K,q_dtype_w",)),
        op=OpDispatch(
            # gemm_a8w8_blockscale_bpreshuffle (:1021-1081): triton, cktile, ck, asm, opus and (FlyDSL importable)
            # flydsl rows run; anything else falls through to the default ck kernel
            aiter_op="gemm_a8w8_blockscale_bpreshuffle", op_entries=(BLOCKSCALE_BPRESHUFFLE_OP,),
            # a flydsl row runs gemm_a8w8_mxfp8_128_bpreshuffle_flydsl, which raises on any gfx but gfx1250 (:219-222;
            # on gfx1250 every row goes to triton, :1026)
            libtype_use=tuple((t, "hit") for t in ("triton", "cktile", "ck", "asm", "opus")) + (("flydsl", "fails"),),
            libtype_other="default",
        ),
        tuner=TunerRules(
            # --preshuffle swaps the output default inside run(): always pass -o (aiter-tuning.md 5.1)
            math="fp8", tuner_script="csrc/ck_gemm_a8w8_blockscale/gemm_a8w8_blockscale_tune.py",
            tuner_args=("--preshuffle",),
        ),
        capture=CaptureRules(log_lines=LOG_CK),
    ),
    TableFamily(
        name="a4w4_blockscale_gemm", env_var="AITER_CONFIG_GEMM_A4W4", tuned_file="a4w4_blockscale_tuned_gemm.csv",
        untuned_file="a4w4_blockscale_untuned_gemm.csv", tuned_header=_h("gfx,cu_num,M,N,K," + _CK_RESULT),
        untuned_header=_h("M,N,K"), key_columns=_GEMM_KEY, shape_columns=_h("M,N,K"),
        lookup=LookupRules(
            compiled=True, aiter_lookup="aiter/ops/gemm_op_a4w4.py:get_GEMM_config", aiter_args=("M", "N", "K"),
            aiter_file_attr="AITER_CONFIG_GEMM_A4W4_FILE",
        ),
        loader=LoaderRules(gfx_optional=True, tuned_variants=_CK_OLD_VARIANT),
        op=OpDispatch(
            op_entries=(A4W4_OP,),
            op_paths=(OpPath("ops/gemm_op_a4w4.py:196-199", "RuntimeError: A4W4 GEMM kernel is not supported on gfx942",
                             when=(("gfx", "==", "gfx942"),)),),
        ),
        tuner=TunerRules(math="fp4", tuner_script="csrc/ck_gemm_a4w4_blockscale/gemm_a4w4_blockscale_tune.py"),
        capture=CaptureRules(log_lines=LOG_CK),
    ),
    TableFamily(
        name="a8w8_batched_gemm", env_var="AITER_CONFIG_A8W8_BATCHED_GEMM", tuned_file="a8w8_tuned_batched_gemm.csv",
        untuned_file="a8w8_untuned_batched_gemm.csv", tuned_header=_h("gfx,cu_num,B,M,N,K," + _CK_RESULT),
        untuned_header=_h("B,M,N,K"), key_columns=_h("gfx,cu_num,B,M,N,K"), shape_columns=_h("B,M,N,K"),
        lookup=LookupRules(
            padding="exact", compiled=True, cpp_key=_h("gfx,cu_num,B,M,N,K"),
            aiter_lookup="aiter/ops/batched_gemm_op_a8w8.py:get_CKBatchedGEMM_config",
            aiter_args=("B", "M", "N", "K"), aiter_file_attr="AITER_CONFIG_A8W8_BATCHED_GEMM_FILE",
        ),
        loader=LoaderRules(gfx_optional=True, tuned_variants=_BATCHED_OLD_VARIANT),
        op=OpDispatch(op_entries=(A8W8_BATCHED_OP,)),
        deploy=DeployRules(filled=("kernelName",)),
        tuner=TunerRules(math="fp8", tuner_script="csrc/ck_batched_gemm_a8w8/batched_gemm_a8w8_tune.py"),
        capture=CaptureRules(log_lines=LOG_A8W8_BATCHED),
    ),
    TableFamily(
        name="bf16_batched_gemm", env_var="AITER_CONFIG_BF16_BATCHED_GEMM", tuned_file="bf16_tuned_batched_gemm.csv",
        untuned_file="bf16_untuned_batched_gemm.csv", tuned_header=_h("gfx,cu_num,B,M,N,K," + _CK_RESULT),
        untuned_header=_h("B,M,N,K"), key_columns=_h("gfx,cu_num,B,M,N,K"), shape_columns=_h("B,M,N,K"),
        lookup=LookupRules(
            padding="exact", compiled=True, cpp_key=_h("gfx,cu_num,B,M,N,K"),
            aiter_lookup="aiter/ops/batched_gemm_op_bf16.py:get_CKBatchedGEMM_config",
            aiter_args=("B", "M", "N", "K"), aiter_file_attr="AITER_CONFIG_BF16_BATCHED_GEMM_FILE",
        ),
        loader=LoaderRules(gfx_optional=True, tuned_variants=_BATCHED_OLD_VARIANT),
        op=OpDispatch(op_entries=(BF16_BATCHED_OP,)),
        deploy=DeployRules(filled=("kernelName",)),
        tuner=TunerRules(tuner_script="csrc/ck_batched_gemm_bf16/batched_gemm_bf16_tune.py"),
        capture=CaptureRules(log_lines=LOG_BF16_BATCHED),
    ),
    TableFamily(
        # fp8 e8m0 mxscale BMM: lowercase columns, no cu_num, no shipped default or untuned file
        name="a8w8_blockscale_mxscale_batched_gemm", env_var="AITER_CONFIG_BATCHED_GEMM_A8W8_BLOCKSCALE_MXSCALE",
        tuned_file="batched_gemm_a8w8_blockscale_mxscale_tuned.csv",
        untuned_file="batched_gemm_a8w8_blockscale_mxscale_untuned.csv",
        tuned_header=_h("gfx,b,m,n,k,libtype," + _CK_RESULT), untuned_header=_h("b,m,n,k"),
        key_columns=_h("gfx,b,m,n,k"), shape_columns=_h("b,m,n,k"), m_column="m",
        lookup=LookupRules(
            compiled=True, aiter_lookup="aiter/ops/batched_gemm_op_a8w8.py:lookup_mxscale_bmm_config",
            aiter_args=("b", "m", "n", "k"), aiter_file_attr="AITER_CONFIG_BATCHED_GEMM_A8W8_BLOCKSCALE_MXSCALE_FILE",
        ),
        op=OpDispatch(
            op_entries=(MXSCALE_OP,),
            # _batched_gemm_a8w8_mxscale_impl (batched_gemm_op_a8w8.py:279-297): an opus row runs (int() of its
            # kernelId and splitK), any other libtype raises NotImplementedError; no row: opus' own heuristic
            libtype_use=(("opus", "hit"),), libtype_other="fails",
            read_cells=(ReadCell("kernelId", "int", "ops/batched_gemm_op_a8w8.py:295",
                                 when=(("libtype", "==", "opus"),)),
                        ReadCell("splitK", "int", "ops/batched_gemm_op_a8w8.py:296",
                                 when=(("libtype", "==", "opus"),))),
        ),
        tuner=TunerRules(
            err_max=0.02,  # opus_bmm_mxscale_tune.py:32
            # OpusBmmMxscaleTuner (opus_bmm_mxscale_tune.py:245) has no run_config of its own: nothing to confirm with
            math="fp8", tuner_script="csrc/opus_gemm/opus_bmm_mxscale_tune.py", tuner_races=False,
        ),
    ),
    TableFamily(
        name="fmoe", kernel_columns=("kernelName1", "kernelName2"), kernel_renames=(FMOE_CK_QUANT,),
        env_var="AITER_CONFIG_FMOE", tuned_file="tuned_fmoe.csv", untuned_file="untuned_fmoe.csv",
        # what gemm_moe_tune.py writes today; the shipped default lacks gfx and has _tag (see headers.py)
        tuned_header=_FMOE_KEY + _h("block_m,ksplit,us1,kernelName1,err1,us2,kernelName2,err2,us,run_1stage,"
                                    "xbf16,flat,tflops,bw"),
        untuned_header=_FMOE_SHAPE, key_columns=_FMOE_KEY, shape_columns=_FMOE_SHAPE, m_column="token",
        err_columns=("err1", "err2"),
        lookup=LookupRules(
            padding="moe",
            # the lookup keys on the pybind enum, which never equals the CSV string: every hit comes from the
            # act_type-wildcarded fallback, first row in file order (fused_moe.py:2290-2297, aiter-tuning.md 2.7)
            lookup_ignores=("act_type",),
            gfx_on_miss=True,  # fused_moe.py:2393: fused_moe_1stage_dict.get(get_gfx(), {}) when no row is found
            flydsl_miss="fails", aiter_lookup="aiter/fused_moe.py:get_2stage_cfgs",
            aiter_file_attr="AITER_CONFIG_FMOE_FILE",
        ),
        loader=LoaderRules(
            gfx_optional=True, duplicate_keys="first", backfill_gfx=True, dropped_rows=(("_tag", "flydsl_fallback"),),
            tuned_variants=(
                (_FMOE_HEAD + ",tflops,bw", _FMOE_OLD_KEYS),
                # the current release's own default and model_configs files (gfx backfilled from cu_num)
                (_FMOE_HEAD + ",tflops,bw,_tag", ""), (_FMOE_HEAD + ",tflops,bw,xbf16,_tag", ""),
                (_FMOE_HEAD + ",xbf16,tflops,bw,_tag", ""), (_FMOE_HEAD + ",xbf16,flat,tflops,bw,_tag", ""),
                ("gfx," + _FMOE_HEAD + ",xbf16,flat,tflops,bw,_tag", "")),
        ),
        op=OpDispatch(
            remaps=(("q_type", "QuantType.per_128x128", "QuantType.per_1x128"),),
            # fused_moe.py:2437-2449: run_1stage = cfg.get("run_1stage") (NaN is true), then int(cfg["xbf16"]) and
            # int(cfg["flat"]) of a 1-stage row (where the columns exist); block_m sizes the sort (:2430)
            read_cells=(ReadCell("block_m", "int", "fused_moe.py:2430"),
                        ReadCell("run_1stage", "int", "fused_moe.py:2437"),
                        ReadCell("xbf16", "int", "fused_moe.py:2445", when=(("run_1stage", "nonzero", ""),)),
                        ReadCell("flat", "int", "fused_moe.py:2449", when=(("run_1stage", "nonzero", ""),))),
            moe_op=FMOE_OP,
        ),
        deploy=DeployRules(
            overlay_first=True, filled=("kernelName1", "kernelName2"),
            filled_unless=(("kernelName2", "run_1stage", "1"),),
            deploy_notes=("fused_moe_dp_shared_expert.py reads aiter/configs/tuned_fmoe.csv directly and ignores the "
                          "env var; rows that differ from a shipped row only in act_type are matched first-wins.",),
        ),
        tuner=TunerRules(err_max=0.1, tuner_script="csrc/ck_gemm_moe_2stages_codegen/gemm_moe_tune.py"),
        capture=CaptureRules(log_lines=LOG_MOE),
    ),
    TableFamily(
        name="fhmoe", kernel_columns=("kernelName1", "kernelName2"), env_var="AITER_CONFIG_FHMOE",
        tuned_file="tuned_fhmoe.csv", untuned_file="untuned_fhmoe.csv",
        tuned_header=_h("gfx,cu_num,token,model_dim,inter_dim,expert,topk,shared_expert_id,act_type,dtype,"
                        "q_dtype_a,q_dtype_w,q_type,use_g1u1,doweight_stage1,hidden_pad,intermediate_pad,"
                        "gate_mode,block_m,ksplit,kernelName1,kernelName2"),
        untuned_header=("gfx", "cu_num") + _FMOE_SHAPE,
        key_columns=_FMOE_KEY + _h("shared_expert_id,hidden_pad,intermediate_pad,gate_mode"),
        shape_columns=_FMOE_SHAPE + _h("shared_expert_id,hidden_pad,intermediate_pad,gate_mode"), m_column="token",
        time_column=None,
        err_columns=(),  # no us, no tuner
        lookup=LookupRules(
            padding="moe_exact", lookup_derived=(("shared_expert_id", "expert", -1),), flydsl_miss="fails",
            aiter_lookup="aiter/fused_moe.py:get_2stage_cfgs", aiter_args=("@file",),
            aiter_file_attr="AITER_CONFIG_FHMOE_FILE",
            miss_raises=(MissRaises("fused_moe.py:2369-2374", "NotImplementedError: the dedicated FHMoE path requires "
                                    "an exact tuned config row"),),
        ),
        loader=LoaderRules(
            # fused_moe.py:2153-2185,2271-2275: get_2stage_cfgs(config_file=AITER_CONFIG_FHMOE's table) keys also on
            # (expert - 1, hidden_pad, intermediate_pad, gate_mode), str(activation) exactly, no token tier retry; any
            # repeated key raises (duplicated(subset=...), identical rows included); FlyDSL kernels only
            duplicate_keys="raise_any", backfill_gfx=True, dropped_rows=(("_tag", "flydsl_fallback"),),
        ),
        op=OpDispatch(moe_op=FHMOE_OP),
        deploy=DeployRules(
            filled=("kernelName1", "kernelName2"),
            deploy_notes=("fhmoe has no us column: any duplicate key in a multi-file merge raises RuntimeError.",),
        ),
        tuner=TunerRules(err_max=0.1),
        capture=CaptureRules(log_lines=LOG_MOE),
    ),
    TableFamily(
        # no kernel_renames across v0.1.19 -> v0.1.20: v0.1.19's kernelName1 followed gate_mode (SEPARATED: *_gguu,
        # 64 rows; INTERLEAVE: *_gugu, 20; grouped_moe_gfx1250.py:415 at v0.1.19); v0.1.20 dropped gate_mode and
        # reads gate/up interleaved only (grouped_moe_gfx1250.py:778-780: w1 MUST be GUGU), so a gguu kernel is gone,
        # not renamed; the 19 gugu rows at keys both ship keep their names
        name="grouped_fmoe", kernel_columns=("kernelName1", "kernelName2"), env_var="AITER_CONFIG_GROUPED_FMOE",
        tuned_file="tuned_grouped_fmoe.csv", untuned_file="untuned_grouped_fmoe.csv",
        tuned_header=_FMOE_KEY + _h(
            "max_m,tile_m,tile_n,tile_k,tile_m2,tile_n2,tile_k2,m_warp,n_warp,m_warp2,n_warp2,num_buffers,"
            "num_buffer_stage2,split_k1,split_k2,grouped_persistent_m,persistent_workers,wave_specialized_tdm,"
            "tdm_as_in_prologue,cluster_n,waves_per_tensor_tdm,next_stage_prefetch,kernelName1,kernelName2,us,"
            "tflops,bw"),
        untuned_header=("cu_num",) + _FMOE_SHAPE + ("gate_mode",),
        # grouped_moe_gfx1250.py matches by string and ignores use_g1u1, doweight_stage1 and gate_mode
        key_columns=_h("gfx,cu_num,token,model_dim,inter_dim,expert,topk,act_type,dtype,q_dtype_a,q_dtype_w,"
                       "q_type"),
        shape_columns=_FMOE_SHAPE + ("gate_mode",), m_column="token", err_columns=(),
        lookup=LookupRules(
            padding="moe", gfx_source="get_gfx",
            aiter_lookup="aiter/ops/flydsl/grouped_moe_gfx1250.py:_find_grouped_config", key_match="wildcard",
            aiter_file_attr="AITER_CONFIG_GROUPED_FMOE_FILE",
        ),
        loader=LoaderRules(duplicate_keys="first", env_concat=True),
        op=OpDispatch(moe_op=GROUPED_OP),
        deploy=DeployRules(
            filled=("kernelName1", "kernelName2"),
            deploy_notes=("AITER_CONFIG_GROUPED_FMOE bypasses merge and dedup: empty cells are wildcards, lowest us "
                          "wins.",),
        ),
        tuner=TunerRules(
            err_max=0.1,
            # GroupedFmoeTuner.post_process (gemm_moe_tune.py:6047-6049) writes no --profile_file: nothing to screen
            tuner_script="csrc/ck_gemm_moe_2stages_codegen/gemm_moe_tune.py", tuner_args=("--grouped-gemm",),
            tuner_races=False,
        ),
        capture=CaptureRules(
            sentinels=(("topk", "-1"),),  # an expert-parallel call (grouped_moe_gfx1250.py:1032-1033)
        ),
    ),
    TableFamily(
        name="gdn_k5_opt", kernel_columns=("BV",), env_var="AITER_CONFIG_GDN_K5_OPT",
        tuned_file="chunk_gdn_h_opt_tuned.csv", untuned_file="chunk_gdn_h_opt_untuned.csv",
        tuned_header=_h("gfx,cu_num,dtype,K,V,BT,H,Hg,is_varlen,use_h0,store_fs,snapshot_bf16,state_bf16,T_flat,"
                        "N,total_chunks,max_seq_chunks,BV,us"),
        untuned_header=_h("gfx,cu_num,H,Hg,V,is_varlen,use_h0,store_fs,snapshot_bf16,state_bf16,total_chunks,"
                          "max_seq_chunks"),
        key_columns=_h("gfx,cu_num,H,Hg,V,is_varlen,use_h0,store_fs,snapshot_bf16,state_bf16,total_chunks,"
                       "max_seq_chunks"),
        shape_columns=_h("H,Hg,V,is_varlen,use_h0,store_fs,snapshot_bf16,state_bf16,total_chunks,max_seq_chunks"),
        m_column=None, err_columns=(),
        lookup=LookupRules(
            padding="exact",
            # linear_attention_prefill_kernels.py:658-753: read at import from AITER_CONFIGS' file (a read error
            # leaves it empty), rows without BV skipped, the first BV of a key kept, exact (gfx_runtime, cu_num,
            # shape) lookup
            aiter_lookup="aiter/ops/flydsl/linear_attention_prefill_kernels.py:_tuned_bv",
            aiter_file_attr="AITER_CONFIG_GDN_K5_OPT_FILE",
        ),
        loader=LoaderRules(
            duplicate_keys="first", dropped_rows=(("BV", ""),),
            # _load_tuned_bv_table (:659-705): csv.DictReader over the lines not starting with '#' (after lstrip);
            # per kept row int(cu_num) unless blank, int() of H, Hg, V, total_chunks, max_seq_chunks and BV; a
            # ValueError or KeyError returns {} (no row at all)
            comment_prefix="#",
            loader_ints=(("cu_num", True), ("H", False), ("Hg", False), ("V", False),
                                             ("total_chunks", False), ("max_seq_chunks", False), ("BV", False)),
            untuned_variants=("dtype,K,V,BT,H,Hg,is_varlen,use_h0,store_fs",),
        ),
        op=OpDispatch(
            # chunk_gated_delta_rule_fwd_h_flydsl_opt runs the BV its lookup returns only where it is 16, 32 or 64
            # (V is 128), and raises ValueError on any other
            read_cells=(ReadCell("BV", "enum", "ops/flydsl/linear_attention_prefill_kernels.py:1270",
                                 ("16", "32", "64")),),
        ),
        deploy=DeployRules(filled=("BV",)),
        tuner=TunerRules(
            tuner_script="csrc/gdn_k5/chunk_gdn_h_opt_tune.py",
            tuner_races=False,  # K5BvTuner.post_process (chunk_gdn_h_opt_tune.py:512-524) writes no --profile_file
        ),
    ),
]}


class UnknownFamily(LookupError):
    pass


def get_family(name: str) -> TableFamily:
    try:
        return FAMILIES[name]
    except KeyError:
        raise UnknownFamily(name) from None


def family_for_file(filename: str) -> TableFamily | None:
    """Which family a shipped CSV belongs to, by AITER's own naming (merge name substring)."""
    stem = filename.rsplit("/", 1)[-1]
    untuned = "untuned" in stem
    # longest merge name first: 'a8w8_blockscale_bpreshuffle_tuned_gemm' before 'a8w8_blockscale_tuned_gemm'
    for fam in sorted(FAMILIES.values(), key=lambda f: -len(f.merge_name)):
        tuned_stem = fam.merge_name
        untuned_stem = fam.untuned_file.removesuffix(".csv")
        if (untuned and untuned_stem in stem) or (not untuned and tuned_stem in stem):
            return fam
    return None
