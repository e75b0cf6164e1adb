"""The GEMM ops the servers call, as data the probe calls them by (OpEntry: the entry point, its arguments as meta
tensors of a shape, its kernel launchers by the row libtype each runs), and what they know of FlyDSL kernels."""

from __future__ import annotations

from app.domain.families.ops import OpArg, OpEntry, WeightRetry

# a CK GEMM lookup (gemm_op_a8w8.py get_CKGEMM_config, gemm_op_a4w4.py get_GEMM_config): M,N,K and the table
MNK_FILE = ("M", "N", "K", "@file")


def tensor(*dims: str, dtype: str = "torch.float32", keyword: str | None = None, if_true: str | None = None,
           attrs: tuple[tuple[str, str], ...] = ()) -> OpArg:
    return OpArg(dims, dtype, keyword, if_true, attrs)


_t = tensor

# --- the ops the servers call, as the probe calls them (OpEntry)
# tuned_gemm.py:290-354 gemm_a16w16 -> solMap[libtype] (:605-613); each solfunc's GPU call is its launcher, so its
# own asserts (torch_gemm/skinny/triton/opus: no bpreshuffle; flydsl/triton/opus: no scales) run
_BF16_ARGS = (_t("M", "K", dtype="@dtype"), _t("N", "K", dtype="@dtype", attrs=(("is_shuffled", "bpreshuffle"),)),
              _t("N", dtype="@dtype", keyword="bias", if_true="bias"), OpArg(dtype="@outdtype", keyword="otype"),
              _t("1", keyword="scale_a", if_true="scaleAB"), _t("1", keyword="scale_b", if_true="scaleAB"))
_BF16_LAUNCHERS = (("F.linear", "torch"), ("torch._scaled_mm", "torch"), ("hipb_create_extension", "hipblaslt"),
                   ("hipb_mm", "hipblaslt"), ("aiter:wvSpltK", "skinny"), ("aiter:LLMM1", "skinny"),
                   ("aiter:wv_splitk_small_fp16_bf16", "skinny"), ("gemm_a16w16_asm", "asm"),
                   ("aiter.ops.flydsl.gemm_kernels:flydsl_hgemm", "flydsl"), ("_opus_tune", "opus"),
                   ("aiter.ops.triton.gemm.basic.gemm_a16w16:gemm_a16w16", "triton"))
BF16_OP = OpEntry("gemm_a16w16", "tuned_gemm.py:290-354", _BF16_ARGS, _BF16_LAUNCHERS)
# int8/fp8 XQ [M,K] and WQ [N,K] of the captured weight dtype, fp32 per-token/per-channel scales
_A8W8_XW = (_t("M", "K", dtype="@q_dtype_w"), _t("N", "K", dtype="@q_dtype_w"), _t("M", "1"), _t("1", "N"))
A8W8_OP = OpEntry("gemm_a8w8_CK", "ops/gemm_op_a8w8.py:646-679", _A8W8_XW, (("gemm_a8w8_ck", "*"),))
# --- issue 35 (w35b): bpreshuffle's padded-weight retry -------------------------------------------------------------
# gemm_a8w8_bpreshuffle keys its first lookup on XQ's K; a weight padded past it (w_k > k) is looked up again at w_k
# on a miss, and that row runs (flydsl pads XQ; the compiled table is keyed on WQ's K, gemm_a8w8_bpreshuffle.cu);
# w_k < k raises (:711-714). int8 weights are gemm_a8w8_ASM's, which does not retry.
BPRESHUFFLE_RETRY = WeightRetry("ops/gemm_op_a8w8.py:711-742", "K", "weight_K",
                                when=(("q_dtype_w", "!=", "torch.int8"),),
                                raises="RuntimeError: gemm_a8w8_bpreshuffle requires WQ K >= XQ K")
_A8W8_XW_PADDED = (_t("M", "K", dtype="@q_dtype_w"), _t("N", "weight_K", dtype="@q_dtype_w"), _t("M", "1"),
                   _t("1", "N"))  # WQ [N, the weight's K]: the shape's weight_K (the probe fills in K)
# --- end issue 35 (w35b) padded-weight retry ------------------------------------------------------------------------
# int8 weights: gemm_a8w8_ASM (:592-643, bias required) runs any row it finds as an asm kernel name; other weights:
# gemm_a8w8_bpreshuffle (:695-787), ck/cktile by libtype, flydsl by kernel name (:161-207)
BPRESHUFFLE_OPS = (
    OpEntry("gemm_a8w8_ASM", "ops/gemm_op_a8w8.py:592-643", _A8W8_XW + (_t("1", "N"),), (("_gemm_a8w8_asm", "*"),),
            when=(("q_dtype_w", "==", "torch.int8"),)),
    OpEntry("gemm_a8w8_bpreshuffle", "ops/gemm_op_a8w8.py:695-787", _A8W8_XW_PADDED,
            (("gemm_a8w8_bpreshuffle_ck", "ck"), ("gemm_a8w8_bpreshuffle_cktile", "cktile"),
             ("aiter.ops.flydsl.gemm_kernels:flydsl_preshuffle_gemm_a8", "flydsl"),
             ("aiter.ops.flydsl.gemm_a8w8_bpreshuffle_8wave:run_gemm_a8w8_bpreshuffle_8wave", "flydsl"),
             ("aiter.ops.flydsl.bpreshuffle_gemm_gfx1250:run_gemm_a8w8_bpreshuffle_gfx1250", "flydsl"))))
# fp8 XQ [M,K], WQ [N,K] with fp32 block scales (1x128 per token, 128x128 per weight block)
_BLOCKSCALE_XW = (_t("M", "K", dtype="dtypes.fp8"), _t("N", "K", dtype="dtypes.fp8"), _t("M", "(K+127)//128"),
                  _t("(N+127)//128", "(K+127)//128"))
BLOCKSCALE_OP = OpEntry("gemm_a8w8_blockscale", "ops/gemm_op_a8w8.py:805-872", _BLOCKSCALE_XW,
                        (("gemm_a8w8_blockscale_ck", "ck"), ("gemm_a8w8_blockscale_cktile", "cktile"),
                         ("aiter.ops.triton.gemm.basic.gemm_a8w8_blockscale:gemm_a8w8_blockscale", "triton")))
BLOCKSCALE_BPRESHUFFLE_OP = OpEntry(
    "gemm_a8w8_blockscale_bpreshuffle", "ops/gemm_op_a8w8.py:909-1087", _BLOCKSCALE_XW,
    (("gemm_a8w8_blockscale_bpreshuffle_ck", "ck"), ("gemm_a8w8_blockscale_bpreshuffle_cktile", "cktile"),
     ("gemm_a8w8_blockscale_bpreshuffle_asm", "asm"),
     ("aiter.ops.triton.gemm.basic.gemm_a8w8_blockscale:gemm_a8w8_blockscale_preshuffle", "triton"),
     ("aiter.ops.opus.gemm_op_a8w8:opus_gemm_a8w8_blockscale_bpreshuffle_tune", "opus"),
     ("aiter.ops.flydsl.mxfp8_128_bpreshuffle_gemm_gfx1250:run_gemm_a8w8_mxfp8_128_bpreshuffle_gfx1250", "flydsl")))
# fp4x2 A [M,K/2], B [N,K/2] with e8m0 scales per 32 (gemm_op_a4w4.py:148-238): a CK row (a kernel name without
# "_ZN") runs gemm_a4w4_blockscale, an asm one (and no row) gemm_a4w4_asm with the row's name
A4W4_XW = (_t("M", "K//2", dtype="dtypes.fp4x2"), _t("N", "K//2", dtype="dtypes.fp4x2"),
           _t("M", "(K+31)//32", dtype="dtypes.fp8_e8m0"), _t("N", "(K+31)//32", dtype="dtypes.fp8_e8m0"))
_A4W4_LAUNCHERS = (("gemm_a4w4_blockscale", "*"), ("_gemm_a4w4_asm", "*"), ("gemm_a4w4_asm", "*"))
A4W4_OP = OpEntry("gemm_a4w4", "ops/gemm_op_a4w4.py:148-238", A4W4_XW, _A4W4_LAUNCHERS)
# batched: XQ [B,M,K], WQ [B,N,K] (batched_gemm_op_a8w8.py:124-149, batched_gemm_op_bf16.py:107-130)
A8W8_BATCHED_OP = OpEntry(
    "batched_gemm_a8w8_CK", "ops/batched_gemm_op_a8w8.py:124-149",
    (_t("B", "M", "K", dtype="torch.int8"), _t("B", "N", "K", dtype="torch.int8"), _t("B", "M", "1"),
     _t("B", "1", "N")), (("batched_gemm_a8w8", "*"),))
BF16_BATCHED_OP = OpEntry(
    "batched_gemm_bf16_CK", "ops/batched_gemm_op_bf16.py:107-130",
    (_t("B", "M", "K", dtype="torch.bfloat16"), _t("B", "N", "K", dtype="torch.bfloat16")),
    (("batched_gemm_bf16", "*"),))
# a flydsl bpreshuffle kernel name the op runs: gemm_op_a8w8.py:148-151 (its spelling), or the 8-wave runner's (:178)
FLYDSL_A8W8_NAME = (r"(?:flydsl_bpreshuffle_8w_|flydsl_bpreshuflle_(\d+)x(\d+)x(\d+)_\w+_\w+_\w+_(\d+)x(\d+)"
                    r"(?:x(\d+))?(?:x(\d+))?(?:_([A-Za-z][A-Za-z0-9]*))?$)")
# x [M,G,K] fp8, wo_a [G,N,K] fp8, e8m0 scales (batched_gemm_op_a8w8.py:257-297: the unguarded impl of
# batched_gemm_a8w8_mxscale; the table's b is G)
MXSCALE_OP = OpEntry(
    "_batched_gemm_a8w8_mxscale_impl", "ops/batched_gemm_op_a8w8.py:257-297",
    (_t("m", "b", "k", dtype="dtypes.fp8"), _t("b", "n", "k", dtype="dtypes.fp8"),
     _t("m", "b", "(k+127)//128", dtype="torch.uint8"), _t("b", "(n+127)//128", "(k+127)//128", dtype="torch.uint8")),
    (("aiter.ops.opus.bmm_op:bmm_a8w8_mxscale_opus", "opus"),))

# --- issue 35 (w35b): engagement at the op, the FlyDSL GEMM catalog --------------------------------------------
# get_flydsl_splitk_hgemm_kernel_params (ops/flydsl/gemm_kernels.py:579-586) knows a name that is in its catalog
# (_SPLITK_HGEMM_KERNELS, :689-697: every name flydsl_kernel_name builds, :118-175) or that _parse_hgemm_kernel_params
# reads (:539-576): _HGEMM_KERNEL_RE (:45-65) fullmatched, a_dtype equal to w_dtype (here a backreference). Every
# catalog name is one the regex reads, so the regex decides. Names of the format before ROCm/aiter#3469 (no
# _block_k_warp<n>) are not read: tuned_gemm.py:163-177 falls back to the next padded M, then its default.
FLYDSL_HGEMM_NAME = (
    r"flydsl_gemm(?P<stages>\d+)_a(?P<a_dtype>[a-z0-9]+)_w(?P=a_dtype)_(?P<out_dtype>[a-z0-9]+)_"
    r"t(?P<tile_m>\d+)x(?P<tile_n>\d+)x(?P<tile_k>\d+)_split_k(?P<split_k>\d+)_block_m_warp(?P<block_m_warps>\d+)_"
    r"block_n_warp(?P<block_n_warps>\d+)_block_k_warp(?P<block_k_warps>\d+)_async_copy(?P<async_copy>True|False)_"
    r"b_to_lds(?P<b_to_lds>True|False)_b_preshuffle(?P<b_preshuffle>True|False)_c_to_lds(?P<c_to_lds>True|False)"
    r"(?P<small_m_suffix>(?:_small_m)(?:_nr(?P<n_tile_repeat>\d+))?(?:_pn(?P<persistent_n_tiles>\d+))?"
    r"(?:_wpe(?P<waves_per_eu>\d+))?(?:_ur(?P<b_to_lds_unroll>\d+))?)?_(?P<target_gfx>gfx[0-9a-z]+)")
FLYDSL_HGEMM_SOURCES = ("aiter/ops/flydsl/gemm_kernels.py",)  # what the differential harness runs the catalog from
# --- end issue 35 (w35b) FlyDSL catalog ------------------------------------------------------------------------

