"""AITER table families as data: one definition each.

Headers, key columns and env var names come from ROCm/aiter at e4048607a5 (aiter/jit/core.py:90-166,
aiter/tuned_gemm.py, aiter/ops/gemm_op_*.py, aiter/fused_moe.py, the csrc/*/*_tune.py scripts); see
../shared/reference/aiter-tuning.md sections 1-2.
"""

from __future__ import annotations

from dataclasses import dataclass

# How a column's cells are read and written. AITER reads tables with pandas: ints stay ints, the
# words True/False become bools, everything else is compared as an exact string (no strip).
INT, BOOL, BOOL01, DTYPE, ENUM, STR, FLOAT = "int", "bool", "bool01", "dtype", "enum", "str", "float"

_INT_COLS = {
    "M", "N", "K", "B", "b", "m", "n", "k", "cu_num", "token", "model_dim", "inter_dim", "expert", "topk",
    "shared_expert_id", "hidden_pad", "intermediate_pad", "H", "Hg", "V", "BT", "total_chunks",
    "max_seq_chunks", "T_flat", "splitK", "kernelId", "solidx", "block_m", "ksplit", "BV", "run_1stage",
    "xbf16", "flat",
}
_BOOL_COLS = {"bias", "scaleAB", "bpreshuffle", "is_varlen", "use_h0", "store_fs", "snapshot_bf16",
              "state_bf16"}
_BOOL01_COLS = {"use_g1u1", "doweight_stage1"}  # fmoe writes these as 1/0
_DTYPE_COLS = {"dtype", "outdtype", "q_dtype_w", "q_dtype_a"}
_ENUM_PREFIX = {"act_type": "ActivationType", "q_type": "QuantType", "gate_mode": "GateMode"}
_FLOAT_COLS = {"us", "us1", "us2", "tflops", "bw", "err_ratio", "errRatio"}

DTYPES = {
    "torch.bfloat16", "torch.float16", "torch.float32", "torch.int8", "torch.float8_e4m3fnuz",
    "torch.float8_e4m3fn", "torch.float4_e2m1fn_x2", "torch.int4", "torch.uint8", "torch.uint32",
}
ENUM_VALUES = {
    "ActivationType": {"No", "Silu", "Gelu", "Swiglu", "Situv2"},
    "QuantType": {"No", "per_Tensor", "per_Token", "per_1x32", "per_1x128", "per_128x128", "per_256x128",
                  "per_1024x128"},
    "GateMode": {"SEPARATED", "INTERLEAVE"},
}


def column_kind(col: str) -> str:
    if col in _INT_COLS:
        return INT
    if col in _BOOL_COLS:
        return BOOL
    if col in _BOOL01_COLS:
        return BOOL01
    if col in _DTYPE_COLS:
        return DTYPE
    if col in _ENUM_PREFIX:
        return ENUM
    if col in _FLOAT_COLS:
        return FLOAT
    return STR


def enum_prefix(col: str) -> str:
    return _ENUM_PREFIX[col]


@dataclass(frozen=True)
class TableFamily:
    name: str
    env_var: str
    tuned_file: str  # default table under aiter/configs/
    untuned_file: str
    tuned_header: tuple[str, ...]
    untuned_header: tuple[str, ...]
    key_columns: tuple[str, ...]  # what the runtime lookup indexes on
    shape_columns: tuple[str, ...]  # what a capture carries (the key less gfx and cu_num)
    m_column: str | None = "M"
    padding: str = "gemm"  # gemm: [M, gl0, gl1]; moe: nextPow2 tiers; exact: no padding
    time_column: str | None = "us"
    err_columns: tuple[str, ...] = ("errRatio",)
    compiled: bool = False  # kernels picked from a table compiled into a CK JIT module
    tuner_script: str | None = None
    tuner_args: tuple[str, ...] = ()
    # the matrix-core precision the kernels run at: picks the peak FLOP/s and operand bytes in roofline.py
    math: str = "bf16"

    @property
    def merge_name(self) -> str:
        """The substring AITER globs model_configs/ with (core.py get_config_file)."""
        return self.tuned_file.removesuffix(".csv")

    def merge_key(self, header: tuple[str, ...], untuned_header: tuple[str, ...] | None = None
                  ) -> tuple[str, ...]:
        """AITER's merge-time dedup key for a table with this header: the image's untuned header + cu_num +
        gfx, as far as the table has them (core.py:320-338)."""
        keys = list(untuned_header or self.untuned_header)
        for extra in ("cu_num", "gfx"):
            if extra not in keys:
                keys.append(extra)
        return tuple(k for k in keys if k in header)


def _h(s: str) -> tuple[str, ...]:
    return tuple(s.split(","))


_GEMM_KEY = _h("gfx,cu_num,M,N,K")
_CK_RESULT = "kernelId,splitK,us,kernelName,tflops,bw,errRatio"
_FMOE_SHAPE = _h("token,model_dim,inter_dim,expert,topk,act_type,dtype,q_dtype_a,q_dtype_w,q_type,use_g1u1,"
                 "doweight_stage1")
_FMOE_KEY = ("gfx", "cu_num") + _FMOE_SHAPE

FAMILIES: dict[str, TableFamily] = {f.name: f for f in [
    TableFamily(
        name="bf16_gemm", env_var="AITER_CONFIG_GEMM_BF16",
        tuned_file="bf16_tuned_gemm.csv", untuned_file="bf16_untuned_gemm.csv",
        tuned_header=_h("gfx,cu_num,M,N,K,bias,dtype,outdtype,scaleAB,bpreshuffle,libtype,solidx,splitK,us,"
                        "kernelName,err_ratio,tflops,bw"),
        untuned_header=_h("M,N,K,bias,dtype,outdtype,scaleAB,bpreshuffle"),
        key_columns=_h("gfx,cu_num,M,N,K,bias,dtype,outdtype,scaleAB,bpreshuffle"),
        shape_columns=_h("M,N,K,bias,dtype,outdtype,scaleAB,bpreshuffle"),
        err_columns=("err_ratio",), tuner_script="csrc/gemm_a16w16/gemm_a16w16_tune.py"),
    TableFamily(
        name="a8w8_gemm", env_var="AITER_CONFIG_GEMM_A8W8",
        tuned_file="a8w8_tuned_gemm.csv", untuned_file="a8w8_untuned_gemm.csv",
        tuned_header=_h("gfx,cu_num,M,N,K,q_dtype_w," + _CK_RESULT),
        untuned_header=_h("M,N,K,q_dtype_w"), key_columns=_GEMM_KEY + ("q_dtype_w",),
        shape_columns=_h("M,N,K,q_dtype_w"), compiled=True,
        math="fp8", tuner_script="csrc/ck_gemm_a8w8/gemm_a8w8_tune.py"),
    TableFamily(
        name="a8w8_bpreshuffle_gemm", env_var="AITER_CONFIG_GEMM_A8W8_BPRESHUFFLE",
        tuned_file="a8w8_bpreshuffle_tuned_gemm.csv", untuned_file="a8w8_bpreshuffle_untuned_gemm.csv",
        tuned_header=_h("gfx,cu_num,M,N,K,q_dtype_w,libtype," + _CK_RESULT),
        untuned_header=_h("M,N,K,q_dtype_w"), key_columns=_GEMM_KEY + ("q_dtype_w",),
        shape_columns=_h("M,N,K,q_dtype_w"), compiled=True,
        math="fp8", tuner_script="csrc/ck_gemm_a8w8_bpreshuffle/gemm_a8w8_bpreshuffle_tune.py"),
    TableFamily(
        name="a8w8_blockscale_gemm", env_var="AITER_CONFIG_GEMM_A8W8_BLOCKSCALE",
        tuned_file="a8w8_blockscale_tuned_gemm.csv", untuned_file="a8w8_blockscale_untuned_gemm.csv",
        tuned_header=_h("gfx,cu_num,M,N,K,libtype," + _CK_RESULT),
        untuned_header=_h("M,N,K"), key_columns=_GEMM_KEY, shape_columns=_h("M,N,K"), compiled=True,
        math="fp8", tuner_script="csrc/ck_gemm_a8w8_blockscale/gemm_a8w8_blockscale_tune.py"),
    TableFamily(
        name="a8w8_blockscale_bpreshuffle_gemm", env_var="AITER_CONFIG_GEMM_A8W8_BLOCKSCALE_BPRESHUFFLE",
        tuned_file="a8w8_blockscale_bpreshuffle_tuned_gemm.csv",
        untuned_file="a8w8_blockscale_bpreshuffle_untuned_gemm.csv",
        tuned_header=_h("gfx,cu_num,M,N,K,libtype," + _CK_RESULT),
        untuned_header=_h("M,N,K"), key_columns=_GEMM_KEY, shape_columns=_h("M,N,K"), compiled=True,
        # --preshuffle swaps the output default inside run(): always pass -o (aiter-tuning.md 5.1)
        math="fp8", tuner_script="csrc/ck_gemm_a8w8_blockscale/gemm_a8w8_blockscale_tune.py",
        tuner_args=("--preshuffle",)),
    TableFamily(
        name="a4w4_blockscale_gemm", env_var="AITER_CONFIG_GEMM_A4W4",
        tuned_file="a4w4_blockscale_tuned_gemm.csv", untuned_file="a4w4_blockscale_untuned_gemm.csv",
        tuned_header=_h("gfx,cu_num,M,N,K," + _CK_RESULT),
        untuned_header=_h("M,N,K"), key_columns=_GEMM_KEY, shape_columns=_h("M,N,K"), compiled=True,
        math="fp4", tuner_script="csrc/ck_gemm_a4w4_blockscale/gemm_a4w4_blockscale_tune.py"),
    TableFamily(
        name="a8w8_batched_gemm", env_var="AITER_CONFIG_A8W8_BATCHED_GEMM",
        tuned_file="a8w8_tuned_batched_gemm.csv", untuned_file="a8w8_untuned_batched_gemm.csv",
        tuned_header=_h("gfx,cu_num,B,M,N,K," + _CK_RESULT),
        untuned_header=_h("B,M,N,K"), key_columns=_h("gfx,cu_num,B,M,N,K"), shape_columns=_h("B,M,N,K"),
        padding="exact", compiled=True, math="fp8",
        tuner_script="csrc/ck_batched_gemm_a8w8/batched_gemm_a8w8_tune.py"),
    TableFamily(
        name="bf16_batched_gemm", env_var="AITER_CONFIG_BF16_BATCHED_GEMM",
        tuned_file="bf16_tuned_batched_gemm.csv", untuned_file="bf16_untuned_batched_gemm.csv",
        tuned_header=_h("gfx,cu_num,B,M,N,K," + _CK_RESULT),
        untuned_header=_h("B,M,N,K"), key_columns=_h("gfx,cu_num,B,M,N,K"), shape_columns=_h("B,M,N,K"),
        padding="exact", compiled=True, tuner_script="csrc/ck_batched_gemm_bf16/batched_gemm_bf16_tune.py"),
    TableFamily(
        # fp8 e8m0 mxscale BMM: lowercase columns, no cu_num, no shipped default or untuned file
        name="a8w8_blockscale_mxscale_batched_gemm", env_var="AITER_CONFIG_BATCHED_GEMM_A8W8_BLOCKSCALE_MXSCALE",
        tuned_file="batched_gemm_a8w8_blockscale_mxscale_tuned.csv",
        untuned_file="batched_gemm_a8w8_blockscale_mxscale_untuned.csv",
        tuned_header=_h("gfx,b,m,n,k,libtype," + _CK_RESULT), untuned_header=_h("b,m,n,k"),
        key_columns=_h("gfx,b,m,n,k"), shape_columns=_h("b,m,n,k"), m_column="m", compiled=True,
        math="fp8", tuner_script="csrc/opus_gemm/opus_bmm_mxscale_tune.py"),
    TableFamily(
        name="fmoe", env_var="AITER_CONFIG_FMOE",
        tuned_file="tuned_fmoe.csv", untuned_file="untuned_fmoe.csv",
        # what gemm_moe_tune.py writes today; the shipped default lacks gfx and has _tag (see headers.py)
        tuned_header=_FMOE_KEY + _h("block_m,ksplit,us1,kernelName1,err1,us2,kernelName2,err2,us,run_1stage,"
                                    "xbf16,flat,tflops,bw"),
        untuned_header=_FMOE_SHAPE, key_columns=_FMOE_KEY, shape_columns=_FMOE_SHAPE,
        m_column="token", padding="moe", err_columns=("err1", "err2"),
        tuner_script="csrc/ck_gemm_moe_2stages_codegen/gemm_moe_tune.py"),
    TableFamily(
        name="fhmoe", env_var="AITER_CONFIG_FHMOE",
        tuned_file="tuned_fhmoe.csv", untuned_file="untuned_fhmoe.csv",
        tuned_header=_h("gfx,cu_num,token,model_dim,inter_dim,expert,topk,shared_expert_id,act_type,dtype,"
                        "q_dtype_a,q_dtype_w,q_type,use_g1u1,doweight_stage1,hidden_pad,intermediate_pad,"
                        "gate_mode,block_m,ksplit,kernelName1,kernelName2"),
        untuned_header=("gfx", "cu_num") + _FMOE_SHAPE,
        key_columns=_FMOE_KEY + _h("shared_expert_id,hidden_pad,intermediate_pad,gate_mode"),
        shape_columns=_FMOE_SHAPE + _h("shared_expert_id,hidden_pad,intermediate_pad,gate_mode"),
        m_column="token", padding="moe_exact", time_column=None, err_columns=()),  # no us, no tuner
    TableFamily(
        name="grouped_fmoe", env_var="AITER_CONFIG_GROUPED_FMOE",
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
        shape_columns=_FMOE_SHAPE + ("gate_mode",), m_column="token", padding="moe", err_columns=(),
        tuner_script="csrc/ck_gemm_moe_2stages_codegen/gemm_moe_tune.py", tuner_args=("--grouped-gemm",)),
    TableFamily(
        name="gdn_k5_opt", env_var="AITER_CONFIG_GDN_K5_OPT",
        tuned_file="chunk_gdn_h_opt_tuned.csv", untuned_file="chunk_gdn_h_opt_untuned.csv",
        tuned_header=_h("gfx,cu_num,dtype,K,V,BT,H,Hg,is_varlen,use_h0,store_fs,snapshot_bf16,state_bf16,T_flat,"
                        "N,total_chunks,max_seq_chunks,BV,us"),
        untuned_header=_h("gfx,cu_num,H,Hg,V,is_varlen,use_h0,store_fs,snapshot_bf16,state_bf16,total_chunks,"
                          "max_seq_chunks"),
        key_columns=_h("gfx,cu_num,H,Hg,V,is_varlen,use_h0,store_fs,snapshot_bf16,state_bf16,total_chunks,"
                       "max_seq_chunks"),
        shape_columns=_h("H,Hg,V,is_varlen,use_h0,store_fs,snapshot_bf16,state_bf16,total_chunks,max_seq_chunks"),
        m_column=None, padding="exact", err_columns=(), tuner_script="csrc/gdn_k5/chunk_gdn_h_opt_tune.py"),
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
