"""The lines AITER logs on a lookup (a hit with AITER_LOG_TUNED_CONFIG=1, a miss always), as patterns
app/domain/log_lines.py reads a capture's log with."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LogLine:
    """A line AITER logs on a lookup, as a pattern matched from its first occurrence of `start` on: a hit (a
    row found; needs AITER_LOG_TUNED_CONFIG=1 before `import aiter`) or a miss (always logged, INFO). Named
    groups: shape columns as printed (a printed None is a cell not given: shape_defaults fill it), padded (the M
    a row was found at), cu (the cu_num looked up), gfx, file, libtype, kernel; keys: the lookup key tuple, in
    the family's key_columns order (the family is the one whose key has as many items)."""
    where: str  # AITER's f-string, file:line at ROCm/aiter e4048607a5
    hit: bool
    start: str
    pattern: str


_LOG_PAD = r"found padded_M: (?P<padded>\d+), N:\d+, K:\d+"
_LOG_MNK = r"shape is M:(?P<M>\d+), N:(?P<N>\d+), K:(?P<K>\d+)"
_LOG_BMNK = r"shape is B:(?P<B>\d+), M:(?P<M>\d+), N:(?P<N>\d+), K:(?P<K>\d+)"
# {dtype=} renders dtype='torch.bfloat16' for a str, torch.bfloat16 for a dtype; otype=None: the input dtype
_LOG_BF16 = (_LOG_MNK + r" dtype='?(?P<dtype>[\w.]+)'? otype='?(?P<outdtype>[\w.]+)'? bias=(?P<bias>\w+), "
             r"scaleAB=(?P<scaleAB>\w+), bpreshuffle=(?P<bpreshuffle>\w+)")
LOG_BF16 = (
    LogLine("tuned_gemm.py:232", False, "shape is M:",
            _LOG_BF16 + r", not found tuned config in (?P<file>\S+), will use default"),
    LogLine("tuned_gemm.py:183", True, "shape is M:",
            _LOG_BF16 + rf" {_LOG_PAD} is tuned on cu_num = (?P<cu>\d+) in (?P<file>\S+), libtype is "
                        r"(?P<libtype>\S+), kernel name is (?P<kernel>\S*)"))
LOG_A8W8 = (  # get_GEMM_config_with_quant_type: a8w8 and bpreshuffle
    LogLine("ops/gemm_op_a8w8.py:551", False, "shape is M:",
            _LOG_MNK + r", q_dtype_w:(?P<q_dtype_w>[\w.]+), not found tuned config in (?P<file>\S+), will use default"),
    LogLine("ops/gemm_op_a8w8.py:542-546", True, "shape M:",
            rf"shape M:(?P<M>\d+), N:(?P<N>\d+), K:(?P<K>\d+) q_dtype_w:(?P<q_dtype_w>[\w.]+), {_LOG_PAD} is tuned, "
            r"in (?P<file>\S+?)!(?: libtype is (?P<libtype>\S+?)!)?(?: kernelName is (?P<kernel>\S+))?"))
LOG_CK = (  # get_CKGEMM_config (blockscale, blockscale bpreshuffle) and gemm_op_a4w4.py:71/:76 print the same
    LogLine("ops/gemm_op_a8w8.py:488", False, "shape is M:",
            _LOG_MNK + r", not found tuned config in (?P<file>\S+), will use default"),
    LogLine("ops/gemm_op_a8w8.py:483", True, "shape is M:",
            _LOG_MNK + rf", {_LOG_PAD} is tuned on cu_num = (?P<cu>\d+) in (?P<file>\S+?) ?, kernel name is "
                       r"(?P<kernel>[^,!\s]+)"))
LOG_BF16_BATCHED = (
    LogLine("ops/batched_gemm_op_bf16.py:102", False, "shape is B:",
            _LOG_BMNK + r" dtype is bf16, not found tuned config"),
    LogLine("ops/batched_gemm_op_bf16.py:94", True, "shape is B:",
            _LOG_BMNK + r" dtype is bf16, is tuned on cu_num = (?P<cu>\d+) in (?P<file>\S+), kernel name is "
                        r"(?P<kernel>[^,\s]+)"))
LOG_A8W8_BATCHED = (
    LogLine("ops/batched_gemm_op_a8w8.py:119", False, "shape is B:", _LOG_BMNK + r", not found tuned config"),
    LogLine("ops/batched_gemm_op_a8w8.py:111", True, "shape is B:",
            _LOG_BMNK + r", is tuned on cu_num = (?P<cu>\d+) in (?P<file>\S+), kernel name is (?P<kernel>[^,\s]+)"))
# fused_moe.py:2461-2463 (fmoe, and fhmoe's longer key); one anchored match at the last marker keeps the lazy
# `.*?` linear on a hostile line
_LOG_MOE = r"\[fused_moe\] using (?:1stage|2stage)(?: xbf16)? "
LOG_MOE = (
    LogLine("fused_moe.py:2462", False, "[fused_moe] using", _LOG_MOE + r"default for (?P<keys>\(.*\))"),
    LogLine("fused_moe.py:2462", True, "[fused_moe] using",
            _LOG_MOE + r"\(kernelName1=(?:'(?P<kernel>[^']*)')?.*?\) for (?P<keys>\(.*\))"))

