"""How AITER reads a table's columns: each column's kind (int, bool, dtype, enum, ...), the values a dtype or enum
cell may hold, and the sane ranges of the size columns a capture carries."""

from __future__ import annotations

from typing import Final, Literal

# How a column's cells are read and written. AITER reads tables with pandas: ints stay ints, the
# words True/False become bools, everything else is compared as an exact string (no strip).
ColumnKind = Literal["int", "bool", "bool01", "dtype", "enum", "str", "float"]
INT: Final = "int"
BOOL: Final = "bool"
BOOL01: Final = "bool01"
DTYPE: Final = "dtype"
ENUM: Final = "enum"
STR: Final = "str"
FLOAT: Final = "float"

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


# Integer cells that may hold -1: an expert-parallel grouped MoE call is looked up with topk=-1, matching the
# EP-agnostic rows AITER ships (grouped_moe_gfx1250.py:1032-1033); every other integer cell is non-negative.
_MINUS_ONE_COLS = {"topk"}


def int_floor(col: str) -> int:
    """The smallest value an integer cell of this column takes in AITER's tables."""
    return -1 if col in _MINUS_ONE_COLS else 0


def column_kind(col: str) -> ColumnKind:
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


# Sane ranges of the size columns a capture carries (a column the family lacks is not checked). M/token: up to
# 1M rows in one call; N/K/model_dim/inter_dim: the largest hidden sizes served today (~30k) with room to
# spare; beyond these a value is a typo or an attack (2^31 makes a backend allocate exabytes), not a shape.
DIM_BOUNDS: tuple[tuple[str, int, int], ...] = (
    ("M", 1, 1 << 20), ("N", 1, 1 << 18), ("K", 1, 1 << 18), ("B", 1, 1 << 12),
    ("m", 1, 1 << 20), ("n", 1, 1 << 18), ("k", 1, 1 << 18), ("b", 1, 1 << 12),
    ("token", 1, 1 << 20), ("model_dim", 1, 1 << 18), ("inter_dim", 1, 1 << 18), ("expert", 1, 1 << 12),
    ("topk", 1, 1 << 8))

