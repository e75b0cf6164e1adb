"""AITER table families as data: one definition each.

Headers, key columns and env var names come from ROCm/aiter at e4048607a5 (aiter/jit/core.py:90-166,
aiter/tuned_gemm.py, aiter/ops/gemm_op_*.py, aiter/fused_moe.py, the csrc/*/*_tune.py scripts); see
../shared/reference/aiter-tuning.md sections 1-2.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace

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


# The GPU's own fp8 (aiter/utility/dtypes.py:11-21 defaultDtypes, read by get_gfx_runtime(): the device, never
# GPU_ARCHS); any other gfx gets torch.uint8 (:24 _8bit_fallback)
FP8_OF_GFX = {"gfx942": "torch.float8_e4m3fnuz", **{g: "torch.float8_e4m3fn" for g in (
    "gfx950", "gfx1100", "gfx1101", "gfx1102", "gfx1151", "gfx1200", "gfx1201", "gfx1250")}}
GPU_FP8 = "@fp8"  # in an OpRemap: the running GPU's own fp8

# The last-level cache a timing scrub must evict, by gfx: the 256 MiB AMD Infinity Cache (MALL) of MI300X/MI325X
# (gfx942, CDNA3 white paper) and MI350X/MI355X (gfx950, CDNA4 white paper); a 2x-L2 scrub (4 MiB L2 per XCD)
# left it warm (issue 34). A gfx not listed: the L2 torch reports is the last level (NVIDIA: 50 MiB on an H200).
LLC_BYTES_OF_GFX = {"gfx942": 256 << 20, "gfx950": 256 << 20}


# An fp8 family's output is gated on its SNR against the reference, 20 * log10(||ref|| / ||out - ref||) (issue 34),
# beside AITER's error ratio. 20 dB (a 10% relative RMS error): e4m3's 3-bit mantissa rounds an input by at most
# 2^-4 (~29 dB RMS against an unquantized reference), and AITER's references are computed from the same
# quantized inputs (gemm_a8w8_tune.py:100 gemm_a8w8_ref), so a right kernel sits far above it (its bf16 output's
# own rounding: ~50 dB) and a wrong one (index, scale or layout bugs: 0 dB and below) far under. PyTorch's own
# quantization tests ask 30 dB of int8 models (test/test_quantized_models.py).
SNR_MIN_DB_OF_MATH = {"fp8": 20.0}


@dataclass(frozen=True)
class ReplaySpec:
    """How the aiter backend's graph-captured replay (workers/backends/aiter_replay.py) runs one tuned kernel and
    the default op of a family, with the tuner script's own functions (TableFamily.tuner_script)."""

    data: str  # tuner-module function(M, N, K, seed, dtype, q_dtype_w) -> dict of named tensors
    data_args: tuple[str, ...]  # the shape cells after M, N, K, each eval'd as AITER's run_config does
    ref: str  # tuner-module function(*inputs) -> the reference output
    inputs: tuple[str, ...]  # the data dict's tensors passed to the kernel, the op and the reference
    kernel: str  # tuner-module function(*inputs, out, kernelId, splitK) -> out: one tuned kernel
    op: str  # "module:function" the image runs with no row (the default path): op(*inputs) -> out


def llc_bytes(gfx: str, l2_bytes: int | None = None) -> int | None:
    """The device's last-level cache in bytes: the gfx's Infinity Cache where it has one, else its L2."""
    return LLC_BYTES_OF_GFX.get(gfx, l2_bytes or None)


def gpu_fp8(gfx: str) -> str:
    return FP8_OF_GFX.get(gfx, "torch.uint8")


@dataclass(frozen=True)
class OpRemap:
    """An argument the op rewrites before it calls its lookup, on the GPU it runs on: the column's value is kept
    where it is one of `keep` (GPU_FP8: the GPU's own fp8), else looked up as `to`."""
    where: str  # AITER's line, file:line at ROCm/aiter e4048607a5
    column: str
    keep: tuple[str, ...]
    to: str

    def value(self, cell: str, gfx: str) -> str:
        kept = {gpu_fp8(gfx) if k == GPU_FP8 else k for k in self.keep}
        return cell if cell in kept else self.to


def holds(cells: dict[str, str], cond: tuple[str, str, str]) -> bool:
    """(column, op, value) on a row's or shape's cells: "==", "!=", "in" / "!in" (value '|'-separated), "%" (the cell
    is a multiple of value), "~" / "!~" (re.match), "nonzero" (pandas' truth of the cell: an empty cell is NaN, which
    is true)."""
    col, op, val = cond
    cell = str(cells.get(col, "")).strip()
    if op == "%":
        return cell.isdigit() and int(cell) % int(val) == 0
    if op in ("~", "!~"):  # the cell matches the regular expression value (re.match, as AITER parses names)
        return (re.match(val, cell) is not None) == (op == "~")
    if op == "nonzero":
        try:
            return float(cell) != 0 if cell else True
        except ValueError:
            return True
    if op == "!int":  # issue 35 (w35b): int() of the cell raises (an environment variable AITER int()s)
        try:
            int(cell)
            return False
        except ValueError:
            return True
    return {"==": cell == val, "!=": cell != val, "in": cell in val.split("|"), "!in": cell not in val.split("|")}[op]


@dataclass(frozen=True)
class ReadCell:
    """A cell of the row the op found, as AITER parses it when it runs the row: "int" (int() of what pandas read: an
    empty cell is NaN and int(NaN) raises, as does a word), "enum" (one of values: any other is a KeyError).
    Checked where every `when` condition (holds) is true of the row."""
    column: str
    parse: str
    where: str  # AITER's file:line at ROCm/aiter e4048607a5
    values: tuple[str, ...] = ()
    when: tuple[tuple[str, str, str], ...] = ()

    def problem(self, row: dict[str, str]) -> str | None:
        if self.column not in row or not all(holds(row, c) for c in self.when):
            return None
        cell = str(row[self.column] if row[self.column] is not None else "").strip()
        if self.parse == "enum":
            return None if cell in self.values else (
                f"{cell!r} is not one AITER runs ({self.where}: one of {', '.join(self.values)})")
        try:
            ok = float(cell).is_integer()
        except ValueError:
            ok = False
        return None if ok else f"{cell!r} is not an integer, as AITER reads it ({self.where})"


@dataclass(frozen=True)
class MissRaises:
    """A shape the lookup finds no row for takes a default path that raises, where every `when` condition holds
    and not every `unless` one does: conditions (holds) on the shape's cells and "gfx" (the gfx the lookup keys
    on)."""
    where: str  # AITER's file:line at ROCm/aiter e4048607a5
    reason: str
    when: tuple[tuple[str, str, str], ...] = ()
    unless: tuple[tuple[str, str, str], ...] = ()

    def raises(self, cells: dict[str, str]) -> bool:
        return (all(holds(cells, c) for c in self.when)
                and not (self.unless and all(holds(cells, c) for c in self.unless)))


@dataclass(frozen=True)
class WeightRetry:
    """issue 35 (w35b): an op that looks a miss up again at its weight's size of a column, where the weight is padded
    past the activation's (gemm_a8w8_bpreshuffle: K, ops/gemm_op_a8w8.py:711-742), and raises where the weight's is
    smaller. A capture's shape has the activation's size only (AITER's log line prints it); `cell` names the weight's
    where a shape carries it, else the verdict of a miss that a padded weight could turn into a hit is unknown."""
    where: str  # AITER's file:line at ROCm/aiter e4048607a5
    column: str
    cell: str
    when: tuple[tuple[str, str, str], ...] = ()  # the calls of the op that does this (holds on the shape's cells)
    raises: str = ""  # what the op raises where the weight's is smaller

    def applies(self, shape: dict[str, str]) -> bool:
        return all(holds(shape, c) for c in self.when)

    def weight(self, shape: dict[str, str]) -> int | None:
        """The weight's size where the shape says it (an integer cell), else None."""
        cell = str(shape.get(self.cell) or "").strip()
        return int(cell) if cell.isdigit() else None


@dataclass(frozen=True)
class OpArg:
    """An argument the probe calls the op with, built from a shape: a meta tensor (nothing allocated) of `dims`
    (integer expressions over the shape's integer cells) and `dtype` ("torch.<name>", "dtypes.<name>": AITER's own
    dtypes module as the op module imports it, "@<column>": the dtype the shape's cell names), with `attrs`
    ((attribute, column): set to True where that cell is "True"); without dims, the dtype itself (an otype).
    keyword: passed by that name, else positionally; if_true: passed only where that column's cell is "True"."""
    dims: tuple[str, ...] = ()
    dtype: str = "torch.float32"
    keyword: str | None = None
    if_true: str | None = None
    attrs: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class OpEntry:
    """The op a server calls for shapes of this family (the function vLLM/SGLang call, in the lookup's file), as the
    probe calls it: `args` from the shape, only its GPU kernel launchers replaced. launchers: (target, the row
    libtype that launcher runs, "*": any row); a target is a name in the op module ("F.linear": an attribute of
    one) or "package.module:name" (a module the op imports in its body). A call is a hit where the lookup returned
    a tuned row and the launcher reached runs that row's libtype; when: the shapes this op serves (holds), the
    first entry whose conditions hold is called."""
    function: str
    where: str  # AITER's file:line at ROCm/aiter e4048607a5
    args: tuple[OpArg, ...]
    launchers: tuple[tuple[str, str], ...]
    when: tuple[tuple[str, str, str], ...] = ()

    def serves(self, shape: dict[str, str]) -> bool:
        return all(holds(shape, c) for c in self.when)


@dataclass(frozen=True)
class OpPath:
    """A path the op takes whatever the table holds: it raises ("raises": an assert before its lookup or in the
    branch that runs the row) or runs its default kernel ("default"), where every `when` condition (holds) is true of
    the shape's cells and "gfx" (the GPU's: get_gfx_runtime), and every `row_when` one of the row the lookup found
    (none found: the rule does not apply); a value "@fp8" is the GPU's own fp8."""
    where: str  # AITER's file:line at ROCm/aiter e4048607a5
    reason: str
    runs: str = "raises"
    when: tuple[tuple[str, str, str], ...] = ()
    row_when: tuple[tuple[str, str, str], ...] = ()

    def applies(self, shape: dict[str, str], row: dict[str, str] | None, gfx: str, arch: str | None = None) -> bool:
        """arch: what get_gfx() answers (GPU_ARCHS' last entry, unstripped; default the GPU's), the "arch" cell a
        condition reads; a value "@gfx_names" is the archs get_gfx() accepts (GFX_NAMES)."""
        def at(cond: tuple[str, str, str]) -> tuple[str, str, str]:
            col, op, val = cond
            val = val.replace("@gfx_names", "|".join(sorted(GFX_NAMES)))
            return col, op, "|".join(gpu_fp8(gfx) if v == GPU_FP8 else v for v in val.split("|"))
        if self.row_when and row is None:
            return False
        cells = dict(shape, gfx=gfx, arch=arch if arch is not None else gfx)
        return (all(holds(cells, at(c)) if c[0] != "arch" else _arch_holds(cells["arch"], at(c)) for c in self.when)
                and all(holds(row or {}, at(c)) for c in self.row_when))


def _arch_holds(arch: str, cond: tuple[str, str, str]) -> bool:
    """issue 35 (w35b): "in" / "!in" of get_gfx()'s answer as it is (unstripped: ' gfx950' is no arch)."""
    _, op, val = cond
    return (arch in val.split("|")) == (op == "in")


# Integer cells that may hold -1: an expert-parallel grouped MoE call is looked up with topk=-1, matching the
# EP-agnostic rows AITER ships (grouped_moe_gfx1250.py:1032-1033); every other integer cell is non-negative.
_MINUS_ONE_COLS = {"topk"}


def int_floor(col: str) -> int:
    """The smallest value an integer cell of this column takes in AITER's tables."""
    return -1 if col in _MINUS_ONE_COLS else 0


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


# Sane ranges of the size columns a capture carries (a column the family lacks is not checked). M/token: up to
# 1M rows in one call; N/K/model_dim/inter_dim: the largest hidden sizes served today (~30k) with room to
# spare; beyond these a value is a typo or an attack (2^31 makes a backend allocate exabytes), not a shape.
DIM_BOUNDS: tuple[tuple[str, int, int], ...] = (
    ("M", 1, 1 << 20), ("N", 1, 1 << 18), ("K", 1, 1 << 18), ("B", 1, 1 << 12),
    ("m", 1, 1 << 20), ("n", 1, 1 << 18), ("k", 1, 1 << 18), ("b", 1, 1 << 12),
    ("token", 1, 1 << 20), ("model_dim", 1, 1 << 18), ("inter_dim", 1, 1 << 18), ("expert", 1, 1 << 12),
    ("topk", 1, 1 << 8))


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


def moe_holds(cells: dict[str, str], cond: tuple[str, str, str], gfx: str) -> bool:
    """holds, where GPU_FP8 in a value is the GPU's own fp8, plus "~" (re.match of the cell), "<" and ">" (an
    integer cell below / above the value, or the cell a value "$<column>" names)."""
    col, op, val = cond
    val = val.replace(GPU_FP8, gpu_fp8(gfx))
    if op in ("<", ">") and val.startswith("$"):  # issue 35 (w35b): a bound in another cell of the call (an
        val = str(cells.get(val[1:], "")).strip()  # environment variable the op reads)
    cell = str(cells.get(col, "") if cells.get(col) is not None else "").strip()
    if op == "~":
        return re.match(val, cell) is not None
    if op in ("<", ">"):
        try:
            n = float(cell)
        except ValueError:
            return False
        try:
            bound = int(val)
        except ValueError:
            return False  # a bound int() rejects: the op raises first (MoeOpPath.raises)
        return n < bound if op == "<" else n > bound
    return holds(cells, (col, op, val))


@dataclass(frozen=True)
class MoeADtype:
    """One branch of the MoE op's activation-dtype choice: where every `when` condition holds (moe_holds) of the
    call's cells (the captured shape after remaps, "gfx": get_gfx(), and the op arguments a capture does not
    carry, MoeOpPath.call_defaults), q_dtype_a becomes `to`: a dtype, "@w" (the weight's dtype) or GPU_FP8."""
    when: tuple[tuple[str, str, str], ...]
    to: str


@dataclass(frozen=True)
class MoeLauncher:
    """A stage launcher the MoE op's metadata may hold (the function a stage partial wraps): the keyword it takes
    the kernel name in ("" where it takes none and runs its own config), and the kernel names it runs (a regex,
    re.match): a name it is handed and does not run makes AITER raise at launch ('not find kernel'); a launcher
    without a name runs a row whose kernel name it matches."""
    name: str
    kernel_arg: str
    runs: str


# a stage of a route: one launcher, or the first (regex on the row's kernel name, launcher) that matches
MoeStage = str | tuple[tuple[str, str], ...] | None


@dataclass(frozen=True)
class KernelRename:
    """AITER renamed a family's kernels in `release` without changing them: a name in the old format, rewritten by
    pattern -> repl (re.sub on the whole name), is the same kernel's name from that release on. The pattern
    matches the old format only, so a name already new is left as it is. seen: where the rename shows.
    fields: where the new name holds row cells the old one did not: (placeholder, column, {cell: text}); each
    "{placeholder}" in repl is the text of the row's cell; without the row, or for a cell not in the map, the name is
    left as it is (no guess)."""
    release: str
    pattern: str
    repl: str
    seen: str
    fields: tuple[tuple[str, str, tuple[tuple[str, str], ...]], ...] = ()

    def apply(self, name: str, row: Mapping[str, object] | None = None) -> str:
        repl = self.repl
        for placeholder, column, texts in self.fields:
            text = dict(texts).get(str((row or {}).get(column) or "").strip())
            if text is None:
                return name
            repl = repl.replace("{" + placeholder + "}", text)
        return re.sub(f"^(?:{self.pattern})$", repl, name)


# v0.1.10's CK blockscale instance names gained a field before the A/B transfer thread clusters, holding the value
# of the CShuffle field near the end (…_16x16_16x16_16x16x1_…_4_1x1_intrawave_v1 -> …_16x16_16x16_1x1_16x16x1_…):
# 43 of the 78 keys aiter/configs/a8w8_blockscale_tuned_gemm.csv ships in both v0.1.9 and v0.1.10 name the same
# kernel once rewritten (0 before), the others a different tile
_BLOCKSCALE_1X1 = KernelRename(
    "v0.1.10", r"(a8w8_blockscale_\d+x\d+x\d+_\d+x\d+x\d+x\d+_\d+x\d+_\d+x\d+_)"
               r"(\d+x\d+x\d+_\d+x\d+x\d+_\d+x\d+x\d+x\d+_\d+_(\d+x\d+)_.*)",
    r"\g<1>\g<3>_\g<2>", "aiter/configs/a8w8_blockscale_tuned_gemm.csv v0.1.9 -> v0.1.10")
# v0.1.15's FlyDSL bpreshuffle names gained a fifth tiling field, 0 for every kernel v0.1.14 had
# (…_F8_F8_B16_2x0x1x2_default -> …_2x0x1x2x0_default): all 550 keys aiter/configs/a8w8_bpreshuffle_tuned_gemm.csv
# ships in both releases name the same kernel once rewritten (359 before)
_FLYDSL_BPRESHUFFLE_X0 = KernelRename(
    "v0.1.15", r"(flydsl_bpreshuflle_\d+x\d+x\d+_[A-Z0-9]+_[A-Z0-9]+_[A-Z0-9]+_\d+x\d+x\d+x\d+)(_[a-z]+)",
    r"\g<1>x0\g<2>", "aiter/configs/a8w8_bpreshuffle_tuned_gemm.csv v0.1.14 -> v0.1.15")
# v0.1.6's CK 2-stage MoE instance names (csrc/ck_gemm_moe_2stages_codegen/gemm_moe_ck2stages_common.py:40-66 and
# :84-108 at v0.1.6) name the quant type by its QuantType number (csrc/include/aiter_enum.h:11) where v0.1.5's
# shipped names spelt it, and end with the A, B and output dtypes (aiter/ops/moe_op.py:310 dtype2str_dict,
# upper-cased): …_Nswizzle0_per_token_MulRoutedWeight1 -> …_Nswizzle0_Quant2_MulRoutedWeight1_F8_F8_B16. Those are
# the row's q_type, q_dtype_a, q_dtype_w and dtype. Of the 342 keys aiter/configs/tuned_fmoe.csv ships in both
# releases, every stage name whose tile and pipeline stayed (163 kernelName1, 291 kernelName2) is the old one
# rewritten (0 before); 189 keys name the same kernel pair once rewritten (0 before)
_FMOE_DTYPE = (("torch.bfloat16", "B16"), ("torch.float16", "F16"), ("torch.float8_e4m3fnuz", "F8"),
               ("torch.float8_e4m3fn", "F8"), ("torch.int8", "I8"))
_FMOE_CK_QUANT = KernelRename(
    "v0.1.6", r"(moe_ck2stages_gemm[12]_\d+x\d+x\d+x\d+_\d+x\d+_[A-Za-z0-9]+_v\d+_Nswizzle\d)"
              r"_(?:no|per_tensor|per_token|per_1x32|per_1x128)_(MulRoutedWeight\d(?:_silu|_gelu)?)",
    r"\g<1>_Quant{q}_\g<2>_{a}_{w}_{c}", "aiter/configs/tuned_fmoe.csv v0.1.5 -> v0.1.6",
    fields=(("q", "q_type", (("QuantType.No", "0"), ("QuantType.per_Tensor", "1"), ("QuantType.per_Token", "2"),
                             ("QuantType.per_1x32", "3"), ("QuantType.per_1x128", "4"))),
            ("a", "q_dtype_a", _FMOE_DTYPE), ("w", "q_dtype_w", _FMOE_DTYPE), ("c", "dtype", _FMOE_DTYPE)))


@dataclass(frozen=True)
class MoeRoute:
    """One branch of the stage choice the MoE op makes for the row its lookup found (get_2stage_cfgs after its
    'using' line), first that fits: conditions (moe_holds) on the call's cells as looked up, the row's cells
    (kernelName1/2, run_1stage, ksplit) and "flydsl" ("True" where FlyDSL is importable); the launchers it builds
    for stage 1 and 2. own_names: the branch names kernels of its own (a heuristic), the row's are not run."""
    where: str  # AITER's file:line at ROCm/aiter e4048607a5
    when: tuple[tuple[str, str, str], ...]
    stage1: MoeStage
    stage2: MoeStage = None
    own_names: bool = False
    # issue 35 (w35b): the launchers a route with own_names builds (stage 1, stage 2), where a wrapper step checks them
    builds: tuple[str, ...] = ()


@dataclass(frozen=True)
class MoeOpPath:
    """What the MoE op (fused_moe -> fused_moe_ -> _fused_moe_impl) does to a call before and after its lookup, as
    data: the activation dtype it derives from the weight dtype, quant type, activation, gate mode, the raw
    token count and the GPU (a_dtype, first branch that fits; the captured q_dtype_a is what the lookup is keyed
    on only where the op derives it), the calls it refuses, and for a row found, the stages it builds (routes)
    with the launchers they run (launchers)."""
    where: str  # AITER's file:line of the derivation
    a_dtype: tuple[MoeADtype, ...]
    # op arguments a capture does not carry, as the op's signature defaults them (column, value)
    call_defaults: tuple[tuple[str, str], ...] = ()
    # the calls a capture cannot tell apart (op arguments it does not carry), the default call first: a captured
    # q_dtype_a is looked up as captured where one of them derives it (the first that does is the call made),
    # else as the default call derives it; a_dtype "" marks a call the op cannot make for these cells
    call_variants: tuple[tuple[tuple[str, str], ...], ...] = ((),)
    launchers: tuple[MoeLauncher, ...] = ()
    routes: tuple[MoeRoute, ...] = ()
    # functions of the op's module its stage dispatch calls that must be AITER's own where it is run (a stub's
    # answer would route every row)
    needs: tuple[str, ...] = ()
    sources: tuple[str, ...] = ()  # AITER files the op's module imports those from (beside the lookup's)
    # calls the op refuses before its lookup, on the call's cells as a_dtype sees them (q_dtype_a derived) and
    # "flydsl" (True where FlyDSL is importable)
    raises: tuple[MissRaises, ...] = ()
    # the op calls get_gfx() (GPU_ARCHS) on every call, not only on a miss (fused_moe.py:799): a GPU_ARCHS
    # get_gfx() rejects makes every call raise
    calls_get_gfx: bool = False
    # calls the entry hands back to its caller's generic MoE (returns None) before or after its lookup: a miss
    # of this table (MissRaises.raises is the condition; "a_w" is "<q_dtype_a>/<q_dtype_w>")
    declines: tuple[MissRaises, ...] = ()
    declines_after: tuple[MissRaises, ...] = ()  # the same, after its lookup found a row
    # the calls whose lookup reads this family's table, on the call's cells (all hold); the others look up another
    # table (fhmoe.py:569-586: AITER_CONFIG_FHMOE for the DSV4 I384 contract only, else tuned_fmoe); empty: every call
    table_when: tuple[tuple[str, str, str], ...] = ()
    # before its own lookup the op asks for a row it runs at every padded token tier up to the call's token
    # (MissRaises: where, what it raises where one lacks), looked up with tier_cells in place of the call's
    tiers_cover: MissRaises | None = None
    tier_cells: tuple[tuple[str, str], ...] = ()
    # issue 35 (w35b): the serving environment's variables the op reads (their unset values are in call_defaults): a
    # capture's env sets them for its calls (engagement.check's env)
    env: tuple[str, ...] = ()
    # the stage launchers (stage 1, stage 2) the op's metadata transform accepts; any other route raises (why)
    stages: tuple[str, ...] = ()
    stages_raise: str = ""
    # issue 35 (w35b): the calls the metadata transform is applied to (conditions on the call's cells; empty: all)
    stages_when: tuple[tuple[str, str, str], ...] = ()
    # issue 35 (w35b): calls whose lookup reads another table (MissRaises.raises of the call's cells)
    other_table: tuple[MissRaises, ...] = ()

    def _derive(self, full: dict[str, str], gfx: str) -> str:
        for b in self.a_dtype:
            if all(moe_holds(full, c, gfx) for c in b.when):
                return full.get("q_dtype_w", "") if b.to == "@w" else gpu_fp8(gfx) if b.to == GPU_FP8 else b.to
        return full.get("q_dtype_a", "")

    def variant(self, cells: dict[str, str], gfx: str, arch: str | None = None) -> dict[str, str]:
        """The call a captured shape is taken to come from (call_variants). gfx: the device's (its fp8); arch:
        what get_gfx() answers (GPU_ARCHS' last entry), the "gfx" the conditions read (default gfx)."""
        return next(iter(self.variants_for(cells, gfx, arch)), dict(self.call_variants[0]))

    def variants_for(self, cells: dict[str, str], gfx: str, arch: str | None = None) -> list[dict[str, str]]:
        """issue 35 (w35b): every call of call_variants that derives the captured q_dtype_a, in order, among those
        the shape's own cells allow (a shape may say its call: its entry, its gate mode)."""
        base = dict(self.call_defaults) | dict(cells) | {"gfx": arch or gfx}
        return [dict(v) for v in self.call_variants if all(cells.get(k, x) == x for k, x in v)
                and self._derive(base | dict(v), gfx) == cells.get("q_dtype_a")]

    def _cells(self, cells: dict[str, str], gfx: str, flydsl: bool = True, arch: str | None = None) -> dict[str, str]:
        full = dict(self.call_defaults) | dict(cells) | self.variant(cells, gfx, arch) | {"gfx": arch or gfx,
                                                                                          "flydsl": str(flydsl)}
        return full | {"a_w": f"{full.get('q_dtype_a', '')}/{full.get('q_dtype_w', '')}"}

    def declined(self, cells: dict[str, str], gfx: str, after: bool = False) -> MissRaises | None:
        full = self._cells(cells, gfx)
        return next((r for r in (self.declines_after if after else self.declines) if r.raises(full)), None)

    def q_dtype_a(self, cells: dict[str, str], gfx: str, arch: str | None = None) -> str:
        """The activation dtype the lookup is keyed on for a captured call (call_variants)."""
        base = dict(self.call_defaults) | dict(cells) | {"gfx": arch or gfx}
        return self._derive(base | self.variant(cells, gfx, arch), gfx)

    def refuses(self, cells: dict[str, str], gfx: str, flydsl: bool, arch: str | None = None) -> MissRaises | None:
        full = self._cells(cells, gfx, flydsl, arch)
        return next((r for r in self.raises if r.raises(full)), None)

    def reads_table(self, cells: dict[str, str], gfx: str, arch: str | None = None) -> bool:
        full = self._cells(cells, gfx, True, arch)
        return all(moe_holds(full, c, gfx) for c in self.table_when) and not any(r.raises(full)
                                                                               for r in self.other_table)

    def launcher(self, name: str | None) -> MoeLauncher | None:
        return next((x for x in self.launchers if x.name == name), None)

    def row_use(self, cells: dict[str, str], row: dict[str, str], gfx: str, flydsl: bool,
                arch: str | None = None) -> tuple[str, str]:
        """("hit" | "default" | "fails", why) for the row the lookup found, as the op's routes run it."""
        # a row without run_1stage is 2-stage (cfg.get("run_1stage", False)); an empty cell is NaN, which is true
        full = self._cells(cells, gfx, flydsl, arch) | {c: str(row.get(c) if row.get(c) is not None else "")
                                                   for c in ("kernelName1", "kernelName2", "ksplit")}
        full["run_1stage"] = str(row["run_1stage"] if row.get("run_1stage") is not None else "") \
            if "run_1stage" in row else "0"
        route = next((r for r in self.routes if all(moe_holds(full, c, gfx) for c in r.when)), None)
        if self.stages and self.wraps_stages(full, gfx) and (
                route is None or (route.own_names and not route.builds) or self._picked(route, full) != self.stages):
            return "fails", self.stages_raise
        if route is None:
            return "hit", ""
        if route.own_names:
            return "default", f"the op runs kernels of its own heuristic here ({route.where}), not the row's"
        ran = []
        for stage, col in ((route.stage1, "kernelName1"), (route.stage2, "kernelName2")):
            name = full[col] if full[col] != "Null" else ""
            if stage is None or (col == "kernelName2" and not name):
                continue
            picked = stage if isinstance(stage, str) else next(la for rx, la in stage if re.match(rx, name))
            la = self.launcher(picked)
            assert la is not None, picked
            if la.kernel_arg and name and not re.match(la.runs, name):
                return "fails", (f"the op hands {col} {name!r} to {picked} ({route.where}), which does not run it: "
                                 "AITER raises at launch (not find kernel)")
            ran.append(bool(name) and re.match(la.runs, name) is not None)
        if ran and all(ran):
            return "hit", ""
        return "default", f"the op's stages ({route.where}) do not run the row's kernels"

    def wraps_stages(self, full: dict[str, str], gfx: str) -> bool:
        """The op's metadata transform (stages) is applied to this call (stages_when)."""
        return all(moe_holds(full, c, gfx) for c in self.stages_when)

    def stages_raise_on_miss(self, cells: dict[str, str], gfx: str, flydsl: bool,
                             arch: str | None = None) -> str | None:
        """issue 35 (w35b): a call without a row gets the op's default stages (get_2stage_cfgs with no cfg: no
        kernel names, run_1stage off for per_1x32, fused_moe.py:2377-2402), which the metadata transform checks as
        it checks a row's: what it raises, or None."""
        if not self.stages or not self.wraps_stages(self._cells(cells, gfx, flydsl, arch), gfx):
            return None
        use, why = self.row_use(cells, {"kernelName1": "", "kernelName2": "", "run_1stage": "0", "ksplit": "0"},
                                gfx, flydsl, arch)
        return why if use == "fails" else None

    @staticmethod
    def _picked(route: MoeRoute, full: dict[str, str]) -> tuple[str, ...]:
        """The launchers a route builds for the row (a 1-stage route: stage 1 only; a route naming its own
        kernels: what it builds)."""
        if route.own_names:
            return route.builds
        out = []
        for stage, col in ((route.stage1, "kernelName1"), (route.stage2, "kernelName2")):
            name = full[col] if full[col] != "Null" else ""
            if stage is not None:
                out.append(stage if isinstance(stage, str) else next(la for rx, la in stage if re.match(rx, name)))
        return tuple(out)


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
    # where the image's AITER lists every kernel the family's tuner races: (file under the AITER root, the
    # module attribute holding {id: instance with .name}); the aiter backend reports their names as the image's
    # kernel catalog (an upgrade's "kernel gone"). Empty: not every candidate list is known, so no catalog is
    # reported (a partial one would refuse the winners it lacks).
    catalog_lists: tuple[tuple[str, str], ...] = ()
    tuner_args: tuple[str, ...] = ()
    # the aiter backend races this tuner in two phases: its screen needs every candidate in -o2/--profile_file
    # (TunerCommon.post_process, base_tuner.py:482-491) and its confirmation a --run_config that runs the
    # production op (the base run_config only logs "not implemented", base_tuner.py:571-577)
    tuner_races: bool = True
    # the matrix-core precision the kernels run at: picks the peak FLOP/s and operand bytes in roofline.py
    math: str = "bf16"
    replay: ReplaySpec | None = None  # the aiter backend's graph-captured confirmation (None: AITER's timing only)
    # --- how the run-time lookup treats the table (aiter-tuning.md 1.4, 2.x, 6)
    gfx_source: str = "runtime"  # "get_gfx": honours GPU_ARCHS, last entry (tuned_gemm.py:28)
    gfx_on_miss: bool = False  # an untuned shape's default path calls get_gfx() (GPU_ARCHS), which may raise
    # a shape without a row takes a default path that raises instead of running a default kernel
    miss_raises: tuple[MissRaises, ...] = ()
    lookup_ignores: tuple[str, ...] = ()  # key columns the lookup effectively wildcards
    # a repeated lookup key: "raise" (drop_duplicates(), then set_index().to_dict), "raise_any" (identical rows
    # too) or "first" (first row)
    duplicate_keys: str = "raise"
    backfill_gfx: bool = False  # a missing/0/empty gfx cell is taken from cu_num at load (fused_moe.py:2158)
    # a table without a gfx column still loads: fmoe backfills it, CK loaders fall back to a cu_num-only key
    # with a WARNING (gemm_op_a8w8.py:509-525); bf16's set_index(["gfx", ...]) raises instead
    gfx_optional: bool = False
    dropped_rows: tuple[tuple[str, str], ...] = ()  # (column, value) rows the loader drops
    # a FlyDSL row where flydsl is absent: "skip" to the next M (bf16's lookup), "fails" (no fallback), "default"
    # (the op runs its default kernel, no next-M retry), "ignored" (the lookup does not look: the row is returned and
    # the op's libtype dispatch decides)
    flydsl_miss: str = "ignored"
    # the lookup tells a FlyDSL row by its libtype and asks the FlyDSL catalog for its kernel: one the catalog does
    # not know is taken as flydsl absent (flydsl_miss); the kernel names the catalog knows, a regex re.fullmatch'ed
    # on the row's kernel name (None: not asked, a FlyDSL row is told by its libtype or a flydsl_ kernel name)
    flydsl_catalog: str | None = None
    # cells that must be filled in a deployed row, and (column, value) rows that are exempt from a column
    filled: tuple[str, ...] = ("kernelName", "libtype")
    filled_unless: tuple[tuple[str, str, str], ...] = ()  # (column, exempt if this column, equals this)
    # captured values AITER rewrites before the lookup (and its tuner writes): (column, captured, looked up)
    remaps: tuple[tuple[str, str, str], ...] = ()
    # what the op does to its arguments before the lookup, per GPU (the captured value is what the server's op
    # was called with; the row must be keyed on what it looks up)
    op_remaps: tuple[OpRemap, ...] = ()
    # cells a capture may leave out, in order: (column, default value or the column it copies)
    shape_defaults: tuple[tuple[str, str], ...] = ()
    overlay_first: bool = False  # in a merged file the overlay's rows go first (first-match lookups)
    # the loader reads the env value itself: its ':' paths concatenated, no merge, no dedup; unset, AITER_CONFIGS'
    # merged file (grouped_moe_gfx1250.py _load_grouped_config_rows)
    env_concat: bool = False
    # how a row matches: "exact" keys, or "wildcard": an empty cell matches anything, cu_num is dropped when
    # nothing matches with it, the lowest us wins (grouped_moe_gfx1250.py _find_grouped_config)
    key_match: str = "exact"
    # the kernel comes from a C++ table compiled from the CSV, keyed on these columns with its own M padding
    # (keys.cpp_m_candidates), the last row of a key winning (chip_info.py build_tune_dict); None: Python only
    cpp_key: tuple[str, ...] | None = None
    deploy_notes: tuple[str, ...] = ()
    # what AITER's op runs for a row of this libtype, where that is not the kernel the row names: a race's gain on
    # another kernel does not carry into the served path (deploy.plan says so for the rows it concerns)
    served_as: tuple[tuple[str, str], ...] = ()
    # AITER's own lookup ("file:function") and the AITER_CONFIGS property naming the table it reads: what
    # workers.verify --engagement calls in the image (None: not probed yet)
    aiter_lookup: str | None = None
    aiter_file_attr: str | None = None
    dim_bounds: tuple[tuple[str, int, int], ...] = DIM_BOUNDS  # (column, min, max) of captured sizes
    # (column, value) cells outside dim_bounds that the lookup keys on as they are (grouped fmoe's EP topk=-1)
    sentinels: tuple[tuple[str, str], ...] = ()
    # key cells the lookup computes from another column: (column, from column, offset)
    lookup_derived: tuple[tuple[str, str, int], ...] = ()
    # what the generic probe passes AITER's lookup, in order: a column (as int), "q_dtype_w" (a torch dtype),
    # "@file" (the table AITER resolved); empty for the lookups with a probe of their own (bf16, fmoe)
    aiter_args: tuple[str, ...] = ()
    # the op's own entry points (OpEntry: in the lookup's file) that the probe calls with meta tensors of the shape
    # and its kernel launchers stubbed, so the op's own argument path (op_remaps) builds the lookup's arguments and
    # its own dispatch after the lookup decides what runs; none: the probe calls the lookup itself
    op_entries: tuple[OpEntry, ...] = ()
    # paths the op takes whatever the table holds (OpPath: its asserts before the lookup and in the branch that runs
    # the row, a row it cannot run)
    op_paths: tuple[OpPath, ...] = ()
    # the op (in the lookup's file) that dispatches on the row's libtype; what it does is libtype_use below
    aiter_op: str | None = None
    # what the op does with the row its lookup returned, by the row's libtype (the op's dispatch after the
    # lookup, e.g. gemm_op_a8w8.py:739-750): "hit" runs the row, "default" falls back to the op's default kernel,
    # "fails" raises (an assert); a libtype not listed gets libtype_other. Not applied to shapes that match
    # libtype_use_unless (another op reads the same table: int8 bpreshuffle rows go to gemm_a8w8_ASM, :621-640)
    libtype_use: tuple[tuple[str, str], ...] = ()
    libtype_other: str = "hit"
    libtype_use_unless: tuple[tuple[str, str], ...] = ()
    # the compiled table's M tries: "ck" exact then 16 / nextPow2 / 20480 (gemm_a8w8.cu rowwise_dispatch,
    # batched_gemm_*.cu), "gemm" getPaddedM gl0 then gl1 (gemm_a8w8_bpreshuffle.cu:137-159); and the one libtype
    # its rows are built from (build_tune_dict(libtype=...), gen_instances.py)
    cpp_padding: str = "ck"
    cpp_libtype: str | None = None
    # an error ratio above this is not a valid winner (the tuner's --errRatio default: GEMM 0.05, MoE 0.1)
    err_max: float = 0.05
    # headers seen in released tables besides tuned_header, with the key columns that release's loader indexes
    # on ("" = understood by its columns); shape-only untuned headers the tuner accepts (missing flags default)
    tuned_variants: tuple[tuple[str, str], ...] = ()
    untuned_variants: tuple[str, ...] = ()
    # a loader reading the file with csv instead of pandas: the lines it skips (starting with this prefix after
    # leading blanks, before and after the header), and the cells it int()s per row, (column, blank allowed):
    # one int() rejects (a pandas merge writes an integer column holding a blank as 128.0) empties the table
    comment_prefix: str | None = None
    loader_ints: tuple[tuple[str, bool], ...] = ()
    # the cells the op parses in a row it runs (a posted row that AITER could not parse is refused)
    read_cells: tuple[ReadCell, ...] = ()
    # the lines AITER logs when this family's lookup finds a row or not (log_lines.parse_log reads them back)
    log_lines: tuple[LogLine, ...] = ()
    # the cells naming the kernel a row runs (joined by '+'): what an image upgrade's triage looks for in the new
    # image's kernel catalog, and what a confirmation race names its incumbent by (workers' kernel_name)
    kernel_columns: tuple[str, ...] = ("kernelName",)
    # kernels AITER renamed between releases without changing them (oldest first): an upgrade carries a row whose
    # kernel the new image has under its new name (app/domain/upgrade.py)
    kernel_renames: tuple[KernelRename, ...] = ()
    # the MoE op's argument path and stage launchers (fused_moe.py); None: not a MoE op
    moe_op: MoeOpPath | None = None
    # issue 35 (w35b): AITER files the op imports beside its lookup's (the FlyDSL GEMM catalog), which the
    # differential harness runs as they are
    op_sources: tuple[str, ...] = ()
    # issue 35 (w35b): the op looks a miss up again at its weight's padded size (WeightRetry)
    weight_retry: WeightRetry | None = None

    def remap(self, shape: dict[str, str]) -> dict[str, str]:
        """A captured shape as AITER looks it up (fused_moe.py:1310 quant_remap)."""
        out = dict(shape)
        for col, captured, used in self.remaps:
            if out.get(col) == captured:
                out[col] = used
        return out

    def looked_up(self, shape: dict[str, str], gfx: str, arch: str | None = None) -> dict[str, str]:
        """A captured shape as the op on this GPU (get_gfx_runtime) hands it to the lookup: remap, then op_remaps."""
        out = self.remap(shape)
        for r in self.op_remaps:
            if r.column in out:
                out[r.column] = r.value(out[r.column], gfx)
        if self.moe_op is not None and "q_dtype_a" in out:  # the op derives the activation dtype itself
            out["q_dtype_a"] = self.moe_op.q_dtype_a(out, gfx, arch)  # arch: get_gfx() (GPU_ARCHS)
        return out

    def op_path(self, shape: dict[str, str], row: dict[str, str] | None, gfx: str,
                arch: str | None = None) -> OpPath | None:
        """The first op_paths rule this call (the shape as captured, the row found, the GPU's gfx, get_gfx()'s
        answer) takes."""
        return next((r for r in self.op_paths if r.applies(shape, row, gfx, arch)), None)

    def op_entry(self, shape: dict[str, str]) -> OpEntry | None:
        """The op a server calls for this shape (op_entries, first that serves it)."""
        return next((e for e in self.op_entries if e.serves(shape)), None)

    def flydsl_known(self, row: dict[str, str]) -> bool:
        """The FlyDSL catalog has the row's kernel (flydsl_catalog: the whole name, as AITER's parser fullmatches
        it; the name pandas read, so an empty cell is no name)."""
        return self.flydsl_catalog is None or any(re.fullmatch(self.flydsl_catalog, str(row.get(c) or "")) is not None
                                                  for c in self.kernel_columns)

    def other_op(self, shape: dict[str, str]) -> bool:
        """The shape is served by another op that reads this table without a libtype switch."""
        return any(shape.get(c) == v for c, v in self.libtype_use_unless)

    def unreadable(self, row: dict[str, str]) -> tuple[str, str] | None:
        """The first cell AITER could not parse when it runs this row, and why (read_cells)."""
        for rc in self.read_cells:
            why = rc.problem(row)
            if why is not None:
                return rc.column, why
        return None

    def unfilled(self, row: dict[str, str]) -> list[str]:
        exempt = {c for c, when, val in self.filled_unless if str(row.get(when, "")).strip() == val}
        return [c for c in self.filled if c not in exempt and c in row and not str(row.get(c, "")).strip()]

    def kernel_forms(self, name: str, row: Mapping[str, object] | None = None) -> list[str]:
        """One kernel's names, as written and as each later release names it (kernel_renames, applied in order;
        row: the table row naming it, for a rename that writes the row's cells into the name)."""
        out = [name]
        for rule in self.kernel_renames:
            renamed = rule.apply(out[-1], row)
            if renamed != out[-1]:
                out.append(renamed)
        return out

    def catalog_name(self, kernel: str, catalog: Collection[str] | None,
                     row: Mapping[str, object] | None = None) -> str:
        """A kernel (fmoe's: parts joined by '+') as the image's catalog names it: each part's newest form the
        catalog has (the name unchanged where it has none, or where no catalog is known); row: the row naming it."""
        if catalog is None or not kernel:
            return kernel
        parts = []
        for part in kernel.split("+"):
            forms = self.kernel_forms(part, row)
            parts.append(next((f for f in reversed(forms) if f in catalog), part))
        return "+".join(parts)

    def kernel_of(self, row: dict[str, str]) -> str:
        return "+".join(str(row[c]) for c in self.kernel_columns if str(row.get(c) or "").strip())

    @property
    def merge_name(self) -> str:
        """The substring AITER globs model_configs/ with (core.py get_config_file)."""
        return self.tuned_file.removesuffix(".csv")


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
# a CK GEMM lookup (gemm_op_a8w8.py get_CKGEMM_config, gemm_op_a4w4.py get_GEMM_config): M,N,K and the table
_MNK_FILE = ("M", "N", "K", "@file")


def _t(*dims: str, dtype: str = "torch.float32", keyword: str | None = None, if_true: str | None = None,
       attrs: tuple[tuple[str, str], ...] = ()) -> OpArg:
    return OpArg(dims, dtype, keyword, if_true, attrs)


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
_BF16_OP = OpEntry("gemm_a16w16", "tuned_gemm.py:290-354", _BF16_ARGS, _BF16_LAUNCHERS)
# int8/fp8 XQ [M,K] and WQ [N,K] of the captured weight dtype, fp32 per-token/per-channel scales
_A8W8_XW = (_t("M", "K", dtype="@q_dtype_w"), _t("N", "K", dtype="@q_dtype_w"), _t("M", "1"), _t("1", "N"))
_A8W8_OP = OpEntry("gemm_a8w8_CK", "ops/gemm_op_a8w8.py:646-679", _A8W8_XW, (("gemm_a8w8_ck", "*"),))
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
_BPRESHUFFLE_OPS = (
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
_BLOCKSCALE_OP = OpEntry("gemm_a8w8_blockscale", "ops/gemm_op_a8w8.py:805-872", _BLOCKSCALE_XW,
                         (("gemm_a8w8_blockscale_ck", "ck"), ("gemm_a8w8_blockscale_cktile", "cktile"),
                          ("aiter.ops.triton.gemm.basic.gemm_a8w8_blockscale:gemm_a8w8_blockscale", "triton")))
_BLOCKSCALE_BPRESHUFFLE_OP = OpEntry(
    "gemm_a8w8_blockscale_bpreshuffle", "ops/gemm_op_a8w8.py:909-1087", _BLOCKSCALE_XW,
    (("gemm_a8w8_blockscale_bpreshuffle_ck", "ck"), ("gemm_a8w8_blockscale_bpreshuffle_cktile", "cktile"),
     ("gemm_a8w8_blockscale_bpreshuffle_asm", "asm"),
     ("aiter.ops.triton.gemm.basic.gemm_a8w8_blockscale:gemm_a8w8_blockscale_preshuffle", "triton"),
     ("aiter.ops.opus.gemm_op_a8w8:opus_gemm_a8w8_blockscale_bpreshuffle_tune", "opus"),
     ("aiter.ops.flydsl.mxfp8_128_bpreshuffle_gemm_gfx1250:run_gemm_a8w8_mxfp8_128_bpreshuffle_gfx1250", "flydsl")))
# fp4x2 A [M,K/2], B [N,K/2] with e8m0 scales per 32 (gemm_op_a4w4.py:148-238): a CK row (a kernel name without
# "_ZN") runs gemm_a4w4_blockscale, an asm one (and no row) gemm_a4w4_asm with the row's name
_A4W4_XW = (_t("M", "K//2", dtype="dtypes.fp4x2"), _t("N", "K//2", dtype="dtypes.fp4x2"),
            _t("M", "(K+31)//32", dtype="dtypes.fp8_e8m0"), _t("N", "(K+31)//32", dtype="dtypes.fp8_e8m0"))
_A4W4_LAUNCHERS = (("gemm_a4w4_blockscale", "*"), ("_gemm_a4w4_asm", "*"), ("gemm_a4w4_asm", "*"))
_A4W4_OP = OpEntry("gemm_a4w4", "ops/gemm_op_a4w4.py:148-238", _A4W4_XW, _A4W4_LAUNCHERS)
# batched: XQ [B,M,K], WQ [B,N,K] (batched_gemm_op_a8w8.py:124-149, batched_gemm_op_bf16.py:107-130)
_A8W8_BATCHED_OP = OpEntry(
    "batched_gemm_a8w8_CK", "ops/batched_gemm_op_a8w8.py:124-149",
    (_t("B", "M", "K", dtype="torch.int8"), _t("B", "N", "K", dtype="torch.int8"), _t("B", "M", "1"),
     _t("B", "1", "N")), (("batched_gemm_a8w8", "*"),))
_BF16_BATCHED_OP = OpEntry(
    "batched_gemm_bf16_CK", "ops/batched_gemm_op_bf16.py:107-130",
    (_t("B", "M", "K", dtype="torch.bfloat16"), _t("B", "N", "K", dtype="torch.bfloat16")),
    (("batched_gemm_bf16", "*"),))
# a flydsl bpreshuffle kernel name the op runs: gemm_op_a8w8.py:148-151 (its spelling), or the 8-wave runner's (:178)
_FLYDSL_A8W8_NAME = (r"(?:flydsl_bpreshuffle_8w_|flydsl_bpreshuflle_(\d+)x(\d+)x(\d+)_\w+_\w+_\w+_(\d+)x(\d+)"
                     r"(?:x(\d+))?(?:x(\d+))?(?:_([A-Za-z][A-Za-z0-9]*))?$)")
# x [M,G,K] fp8, wo_a [G,N,K] fp8, e8m0 scales (batched_gemm_op_a8w8.py:257-297: the unguarded impl of
# batched_gemm_a8w8_mxscale; the table's b is G)
_MXSCALE_OP = OpEntry(
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

# --- issue 35 (w35b): the MoE op's environment knobs -------------------------------------------------------------
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

_P1X32, _SWIGLU = ("q_type", "==", "QuantType.per_1x32"), ("act_type", "==", "ActivationType.Swiglu")
_BF16, _FP4X2 = "torch.bfloat16", "torch.float4_e2m1fn_x2"
# fused_moe.py:759-806 (_fused_moe_impl), env unset (AITER_BF16_FP8_MOE_BOUND and GPTOSS_SWIGLU_MXFP4_BF16_BOUND
# 256, no AITER_SITUV2_A8W4/A4W4, no AITER_FORCE_A8W4); M is the raw token count; the per_1x128 fp8-input branch
# (:762-767) needs an fp8 hidden_states with a1_scale, which a bf16/fp16 `dtype` call never is
_SHARED = ("entry", "==", "shared")
_FMOE_A_DTYPE = (
    # fused_moe with shared experts goes to fhmoe_ (fused_moe.py:495-536), which calls _fused_moe_impl with
    # _q_dtype_a fp8 for interleaved gate/up weights, else fp4x2 (aiter/fhmoe.py:563, :611 at e4048607a5); its
    # contract (fhmoe.py _validate_fhmoe_contract) is gfx950, per_1x32, Silu and fp4x2 weights
    *(MoeADtype((_SHARED, ("gfx", "==", "gfx950"), _P1X32, ("act_type", "==", "ActivationType.Silu"),
                 ("q_dtype_w", "==", _FP4X2)) + g, a)
      for g, a in (((("gate_mode", "==", "GateMode.INTERLEAVE"),), GPU_FP8), ((), _FP4X2))),
    MoeADtype((_SHARED,), ""),
    # :799-803: AITER_FORCE_A8W4 `in ("1")` is a substring test of "1": set empty, it forces fp8 too
    MoeADtype((("gfx", "==", "gfx1250"), ("AITER_FORCE_A8W4", "in", "|1")), GPU_FP8),
    MoeADtype((("gfx", "==", "gfx1250"),), _FP4X2),
    MoeADtype((_P1X32, ("q_dtype_w", "==", "torch.int4")), _BF16),  # :769-771
    MoeADtype((_P1X32, ("q_dtype_w", "==", GPU_FP8)), GPU_FP8),  # :772-774
    *(MoeADtype((_P1X32, ("act_type", "==", "ActivationType.Situv2")) + c, a) for c, a in (  # :776-788
        ((("AITER_SITUV2_A8W4", "==", "1"),), GPU_FP8), ((("AITER_SITUV2_A4W4", "==", "1"),), _FP4X2), ((), _BF16))),
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
_G1U1, _NO_DOWEIGHT = ("use_g1u1", "in", "1|True"), ("doweight_stage1", "in", "0|False")
_HALF, _FLYDSL = ("dtype", "in", "torch.bfloat16|torch.float16"), ("flydsl", "==", "True")
_W_FP4 = ("q_dtype_w", "==", _FP4X2)
_CKTILE = ("cktile_moe_stage1", "cktile_moe_stage2")
_S2_TAIL = ((r"opus_moe2", "opus_a8w4_stage2_wrapper"), (r"cktile_", "cktile_moe_stage2"), (r"", "ck_moe_stage2_fwd"))
_S2_FLYDSL = ((r"flydsl_", "_flydsl_stage2_wrapper"),) + _S2_TAIL
_CK_KN1 = ("kernelName1", "~", r".*ck2stages")
# issue 35 (w35b): the stages _use_fhmoe_wrappers accepts (fhmoe.py:304-317), and what it raises on any other
_FLYDSL_STAGES = ("_flydsl_stage1_wrapper", "_flydsl_stage2_wrapper")
# fhmoe.py _is_dsv4_i384_fhmoe_contract (:569-586): the calls that read AITER_CONFIG_FHMOE's table; _PADLESS: of a
# tuned_fmoe capture, which carries no pads (fhmoe_'s defaults are 0)
_DSV4_I384 = (("model_dim", "==", "7168"), ("inter_dim", "==", "384"), ("expert", "==", "385"), ("topk", "==", "7"),
              ("hidden_pad", "==", "0"), ("intermediate_pad", "==", "0"), ("gate_mode", "==", "GateMode.INTERLEAVE"),
              ("doweight_stage1", "in", "0|False"))
_DSV4_I384_PADLESS = tuple(c if c[0] not in ("hidden_pad", "intermediate_pad") else (c[0], "in", "|0")
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
_FHMOE_RAISES = (("gfx", "!=", "gfx950", "NotImplementedError: Heterogeneous MXFP4/FP8 experts currently require "
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

FAMILIES: dict[str, TableFamily] = {f.name: f for f in [
    TableFamily(
        name="bf16_gemm", env_var="AITER_CONFIG_GEMM_BF16",
        log_lines=LOG_BF16,
        tuned_file="bf16_tuned_gemm.csv", untuned_file="bf16_untuned_gemm.csv",
        tuned_header=_h("gfx,cu_num,M,N,K,bias,dtype,outdtype,scaleAB,bpreshuffle,libtype,solidx,splitK,us,"
                        "kernelName,err_ratio,tflops,bw"),
        untuned_header=_h("M,N,K,bias,dtype,outdtype,scaleAB,bpreshuffle"),
        key_columns=_h("gfx,cu_num,M,N,K,bias,dtype,outdtype,scaleAB,bpreshuffle"),
        shape_columns=_h("M,N,K,bias,dtype,outdtype,scaleAB,bpreshuffle"),
        err_columns=("err_ratio",), tuner_script="csrc/gemm_a16w16/gemm_a16w16_tune.py",
        served_as=(("torch", "plain F.linear(inp, weights, bias) (tuned_gemm.py:415-451, solMap['torch'])"),
                   ("triton", "AITER's own gemm_a16w16 Triton kernel with AITER's own configs "
                              "(tuned_gemm.py:584-602)")),
        # gemm_a16w16 runs solMap[config["libtype"]] (tuned_gemm.py:327, :605-613): any other libtype is a KeyError
        # skinny_gemm sets its output only for solidx 0-2 (:372-389: any other is an UnboundLocalError); opus_gemm
        # int()s solidx and splitK (:562, :573)
        read_cells=(ReadCell("libtype", "enum", "tuned_gemm.py:327",
                             ("torch", "hipblaslt", "skinny", "asm", "triton", "flydsl", "opus")),
                    ReadCell("solidx", "enum", "tuned_gemm.py:372-389", ("0", "1", "2"),
                             when=(("libtype", "==", "skinny"),)),
                    ReadCell("solidx", "int", "tuned_gemm.py:573", when=(("libtype", "==", "opus"),)),
                    ReadCell("splitK", "int", "tuned_gemm.py:562", when=(("libtype", "==", "opus"),))),
        # the solfunc a row's libtype picks asserts on what it does not support (opus without its module falls back
        # to torch_gemm, which asserts too)
        op_paths=(OpPath("tuned_gemm.py:371, :427, :561, :601", "AssertionError: bpreshuffle is not supported in "
                         "the torch, skinny, opus and Triton GEMMs", when=(("bpreshuffle", "==", "True"),),
                         row_when=(("libtype", "in", "torch|skinny|triton|opus"),)),
                  OpPath("tuned_gemm.py:486-488, :558-560, :598-600", "AssertionError: the FlyDSL, opus and Triton "
                         "GEMMs do not support scaling", when=(("scaleAB", "==", "True"),),
                         row_when=(("libtype", "in", "flydsl|triton|opus"),))),
        gfx_source="get_gfx", aiter_lookup="aiter/tuned_gemm.py:get_GEMM_A16W16_config", flydsl_miss="skip",
        # tuned_gemm.py:163-177: a flydsl row runs only where get_flydsl_splitk_hgemm_kernel_params knows its kernel
        flydsl_catalog=FLYDSL_HGEMM_NAME, op_entries=(_BF16_OP,), op_sources=FLYDSL_HGEMM_SOURCES,
        aiter_file_attr="AITER_CONFIG_GEMM_BF16_FILE",
        # tuned_gemm.py:191-210: no row, bpreshuffle, a gfx other than gfx942: the asm default needs a bf16 input,
        # N and K multiples of 64 and a bf16/fp32 output, else `assert False, "no solution ..."`
        miss_raises=(MissRaises(
            "tuned_gemm.py:208", "AssertionError: no solution (bpreshuffle without a row, and no default asm kernel "
            "for this dtype/N/K/otype)", when=(("bpreshuffle", "==", "True"), ("gfx", "!=", "gfx942")),
            unless=(("dtype", "==", "torch.bfloat16"), ("N", "%", "64"), ("K", "%", "64"),
                    ("outdtype", "in", "torch.bfloat16|torch.float32"))),),
        # AITER's own defaults for an unflagged call (tuned_gemm.py:290-324): outdtype is the input dtype
        shape_defaults=(("bias", "False"), ("scaleAB", "False"), ("bpreshuffle", "False"),
                        ("dtype", "torch.bfloat16"), ("outdtype", "dtype")),
        tuned_variants=(("M,N,K,bias,dtype,outdtype,scaleAB,cu_num,libtype,solidx,splitK,us,kernelName,err_ratio,"
                         "tflops,bw", "cu_num,M,N,K,bias,dtype,outdtype,scaleAB"),),
        untuned_variants=("M,N,K,bias,dtype,outdtype,scaleAB", "M,N,K")),
    TableFamily(
        name="a8w8_gemm", gfx_optional=True, env_var="AITER_CONFIG_GEMM_A8W8",
        log_lines=LOG_A8W8,
        tuned_file="a8w8_tuned_gemm.csv", untuned_file="a8w8_untuned_gemm.csv",
        tuned_header=_h("gfx,cu_num,M,N,K,q_dtype_w," + _CK_RESULT),
        untuned_header=_h("M,N,K,q_dtype_w"), key_columns=_GEMM_KEY + ("q_dtype_w",),
        shape_columns=_h("M,N,K,q_dtype_w"), compiled=True, filled=("kernelName",),
        # gemm_a8w8_CK looks up any weight dtype but the GPU's own fp8 and int8 as torch.int8
        # (gemm_op_a8w8.py:663): a float8_e4m3fn weight on gfx942, a fnuz one on gfx950
        op_remaps=(OpRemap("ops/gemm_op_a8w8.py:663", "q_dtype_w", (GPU_FP8, "torch.int8"), "torch.int8"),),
        op_entries=(_A8W8_OP,),
        # gemm_a8w8.cu:94-136: the kernel comes from a (gfx,cu_num,M,N,K) table, no q_dtype_w, own padding
        cpp_key=_GEMM_KEY, aiter_lookup="aiter/ops/gemm_op_a8w8.py:get_GEMM_config_with_quant_type",
        aiter_file_attr="AITER_CONFIG_GEMM_A8W8_FILE", aiter_args=("M", "N", "K", "q_dtype_w", "@file"),
        tuned_variants=_CK_OLD_VARIANT, math="fp8", tuner_script="csrc/ck_gemm_a8w8/gemm_a8w8_tune.py",
        # the tuner races kernels_list only and names a row by kernels_list[kernelId].name (gemm_a8w8_tune.py:
        # 121-124, 223-228)
        catalog_lists=(("csrc/ck_gemm_a8w8/gemm_a8w8_common.py", "kernels_list"),),
        # gemm_a8w8_tune.py:74-108 (generate_data, gemm_a8w8_ref, run_gemm_a8w8) and :139-180 (run_config: the
        # data with seed 0, bf16 and eval(q_dtype_w); gemm_a8w8 is the production op)
        replay=ReplaySpec(data="generate_data", data_args=("q_dtype_w",), ref="gemm_a8w8_ref",
                          inputs=("x", "weight", "x_scale", "w_scale"), kernel="run_gemm_a8w8",
                          op="aiter.ops.gemm_op_a8w8:gemm_a8w8")),
    TableFamily(
        name="a8w8_bpreshuffle_gemm", gfx_optional=True, env_var="AITER_CONFIG_GEMM_A8W8_BPRESHUFFLE",
        log_lines=LOG_A8W8,
        tuned_file="a8w8_bpreshuffle_tuned_gemm.csv", untuned_file="a8w8_bpreshuffle_untuned_gemm.csv",
        tuned_header=_h("gfx,cu_num,M,N,K,q_dtype_w,libtype," + _CK_RESULT),
        untuned_header=_h("M,N,K,q_dtype_w"), key_columns=_GEMM_KEY + ("q_dtype_w",),
        shape_columns=_h("M,N,K,q_dtype_w"), compiled=True,
        aiter_lookup="aiter/ops/gemm_op_a8w8.py:get_GEMM_config_with_quant_type",
        aiter_file_attr="AITER_CONFIG_GEMM_A8W8_BPRESHUFFLE_FILE", aiter_args=("M", "N", "K", "q_dtype_w", "@file"),
        # gemm_a8w8_bpreshuffle (fp8, :739-750): ck, cktile and (FlyDSL importable) flydsl rows run; any other
        # libtype, or flydsl without FlyDSL, falls through to the default ck kernel, no next-M retry. int8 rows
        # are gemm_a8w8_ASM's (:621-640), which runs any row it finds.
        aiter_op="gemm_a8w8_bpreshuffle", op_entries=_BPRESHUFFLE_OPS, weight_retry=BPRESHUFFLE_RETRY,
        read_cells=(ReadCell("splitK", "int", "ops/gemm_op_a8w8.py:738",
                             when=(("q_dtype_w", "!=", "torch.int8"),)),),
        libtype_use=(("ck", "hit"), ("cktile", "hit"), ("flydsl", "hit")), libtype_other="default",
        op_paths=(
            # a weight neither int8 (gemm_a8w8_ASM's) nor the GPU's own fp8: `assert WQ.dtype == dtypes.fp8`
            OpPath("ops/gemm_op_a8w8.py:726", "AssertionError: gemm_a8w8_bpreshuffle only support fp8 now (the "
                   "weight is not the GPU's own fp8)", when=(("q_dtype_w", "!in", GPU_FP8 + "|torch.int8"),)),
            # issue 35 (w35b): a flydsl row (FlyDSL importable) off gfx1250 imports ops/flydsl/gemm_kernels.py (or its
            # 8-wave module) to run; its catalog registration names kernels with get_gfx() (:174, :689-697), which
            # raises on a GPU_ARCHS entry it does not know: every such call raises
            OpPath("ops/flydsl/gemm_kernels.py:174, :697", "KeyError: Unknown GPU architecture (get_gfx() of "
                   "GPU_ARCHS, in FlyDSL's GEMM catalog the flydsl row's kernel is run from)",
                   when=(("q_dtype_w", "!=", "torch.int8"), ("gfx", "!=", "gfx1250"), ("flydsl", "==", "True"),
                         ("arch", "!in", "@gfx_names")),
                   row_when=(("libtype", "==", "flydsl"), ("kernelName", "!~", "flydsl_bpreshuffle_8w_"))),
            # a flydsl row whose kernel name _parse_flydsl_kernel_name cannot read runs the default ck kernel
            OpPath("ops/gemm_op_a8w8.py:148-189", "a flydsl row whose kernel name does not parse",
                   runs="default", when=(("q_dtype_w", "!=", "torch.int8"),),
                   row_when=(("libtype", "==", "flydsl"), ("kernelName", "!~", _FLYDSL_A8W8_NAME)))),
        libtype_use_unless=(("q_dtype_w", "torch.int8"),), flydsl_miss="default",
        kernel_renames=(_FLYDSL_BPRESHUFFLE_X0,),
        # ck rows also pick the kernel in the compiled (gfx,cu_num,M,N,K) table, padded as Python pads
        cpp_key=_GEMM_KEY, cpp_padding="gemm", cpp_libtype="ck",
        tuned_variants=(("cu_num,M,N,K,q_dtype_w,kernelId,splitK,us,kernelName,tflops,bw,errRatio",
                         "cu_num,M,N,K,q_dtype_w"),),
        math="fp8", tuner_script="csrc/ck_gemm_a8w8_bpreshuffle/gemm_a8w8_bpreshuffle_tune.py"),
    TableFamily(
        name="a8w8_blockscale_gemm", gfx_optional=True, env_var="AITER_CONFIG_GEMM_A8W8_BLOCKSCALE",
        log_lines=LOG_CK,
        tuned_file="a8w8_blockscale_tuned_gemm.csv", untuned_file="a8w8_blockscale_untuned_gemm.csv",
        tuned_header=_h("gfx,cu_num,M,N,K,libtype," + _CK_RESULT),
        untuned_header=_h("M,N,K"), key_columns=_GEMM_KEY, shape_columns=_h("M,N,K"), compiled=True,
        aiter_lookup="aiter/ops/gemm_op_a8w8.py:get_CKGEMM_config", aiter_args=_MNK_FILE,
        aiter_file_attr="AITER_CONFIG_GEMM_A8W8_BLOCKSCALE_FILE",
        # gemm_a8w8_blockscale (:839-866): ck and cktile rows run (by kernelName); any other libtype asserts
        aiter_op="gemm_a8w8_blockscale", op_entries=(_BLOCKSCALE_OP,),
        libtype_use=(("ck", "hit"), ("cktile", "hit")), libtype_other="fails", tuned_variants=_CK_OLD_VARIANT,
        kernel_renames=(_BLOCKSCALE_1X1,),
        math="fp8", tuner_script="csrc/ck_gemm_a8w8_blockscale/gemm_a8w8_blockscale_tune.py"),
    TableFamily(
        name="a8w8_blockscale_bpreshuffle_gemm", gfx_optional=True, env_var="AITER_CONFIG_GEMM_A8W8_BLOCKSCALE_BPRESHUFFLE",
        log_lines=LOG_CK,
        tuned_file="a8w8_blockscale_bpreshuffle_tuned_gemm.csv",
        untuned_file="a8w8_blockscale_bpreshuffle_untuned_gemm.csv",
        tuned_header=_h("gfx,cu_num,M,N,K,libtype," + _CK_RESULT),
        untuned_header=_h("M,N,K"), key_columns=_GEMM_KEY, shape_columns=_h("M,N,K"), compiled=True,
        aiter_lookup="aiter/ops/gemm_op_a8w8.py:get_CKGEMM_config", aiter_args=_MNK_FILE,
        aiter_file_attr="AITER_CONFIG_GEMM_A8W8_BLOCKSCALE_BPRESHUFFLE_FILE",
        # gemm_a8w8_blockscale_bpreshuffle (:1021-1081): triton, cktile, ck, asm, opus and (FlyDSL importable)
        # flydsl rows run; anything else falls through to the default ck kernel
        aiter_op="gemm_a8w8_blockscale_bpreshuffle", op_entries=(_BLOCKSCALE_BPRESHUFFLE_OP,),
        # a flydsl row runs gemm_a8w8_mxfp8_128_bpreshuffle_flydsl, which raises on any gfx but gfx1250 (:219-222;
        # on gfx1250 every row goes to triton, :1026)
        libtype_use=tuple((t, "hit") for t in ("triton", "cktile", "ck", "asm", "opus")) + (("flydsl", "fails"),),
        libtype_other="default", flydsl_miss="default", tuned_variants=_CK_OLD_VARIANT,
        untuned_variants=("M,N,K,q_dtype_w",),
        # --preshuffle swaps the output default inside run(): always pass -o (aiter-tuning.md 5.1)
        math="fp8", tuner_script="csrc/ck_gemm_a8w8_blockscale/gemm_a8w8_blockscale_tune.py",
        tuner_args=("--preshuffle",)),
    TableFamily(
        name="a4w4_blockscale_gemm", gfx_optional=True, env_var="AITER_CONFIG_GEMM_A4W4",
        log_lines=LOG_CK,
        tuned_file="a4w4_blockscale_tuned_gemm.csv", untuned_file="a4w4_blockscale_untuned_gemm.csv",
        tuned_header=_h("gfx,cu_num,M,N,K," + _CK_RESULT),
        untuned_header=_h("M,N,K"), key_columns=_GEMM_KEY, shape_columns=_h("M,N,K"), compiled=True,
        aiter_lookup="aiter/ops/gemm_op_a4w4.py:get_GEMM_config", aiter_args=("M", "N", "K"),
        aiter_file_attr="AITER_CONFIG_GEMM_A4W4_FILE", tuned_variants=_CK_OLD_VARIANT, op_entries=(_A4W4_OP,),
        op_paths=(OpPath("ops/gemm_op_a4w4.py:196-199", "RuntimeError: A4W4 GEMM kernel is not supported on gfx942",
                         when=(("gfx", "==", "gfx942"),)),),
        math="fp4", tuner_script="csrc/ck_gemm_a4w4_blockscale/gemm_a4w4_blockscale_tune.py"),
    TableFamily(
        name="a8w8_batched_gemm", gfx_optional=True, env_var="AITER_CONFIG_A8W8_BATCHED_GEMM",
        log_lines=LOG_A8W8_BATCHED,
        tuned_file="a8w8_tuned_batched_gemm.csv", untuned_file="a8w8_untuned_batched_gemm.csv",
        tuned_header=_h("gfx,cu_num,B,M,N,K," + _CK_RESULT),
        untuned_header=_h("B,M,N,K"), key_columns=_h("gfx,cu_num,B,M,N,K"), shape_columns=_h("B,M,N,K"),
        padding="exact", compiled=True, math="fp8", filled=("kernelName",), cpp_key=_h("gfx,cu_num,B,M,N,K"),
        aiter_lookup="aiter/ops/batched_gemm_op_a8w8.py:get_CKBatchedGEMM_config", aiter_args=("B", "M", "N", "K"),
        aiter_file_attr="AITER_CONFIG_A8W8_BATCHED_GEMM_FILE", tuned_variants=_BATCHED_OLD_VARIANT,
        op_entries=(_A8W8_BATCHED_OP,),
        tuner_script="csrc/ck_batched_gemm_a8w8/batched_gemm_a8w8_tune.py"),
    TableFamily(
        name="bf16_batched_gemm", gfx_optional=True, env_var="AITER_CONFIG_BF16_BATCHED_GEMM",
        log_lines=LOG_BF16_BATCHED,
        tuned_file="bf16_tuned_batched_gemm.csv", untuned_file="bf16_untuned_batched_gemm.csv",
        tuned_header=_h("gfx,cu_num,B,M,N,K," + _CK_RESULT),
        untuned_header=_h("B,M,N,K"), key_columns=_h("gfx,cu_num,B,M,N,K"), shape_columns=_h("B,M,N,K"),
        padding="exact", compiled=True, filled=("kernelName",), cpp_key=_h("gfx,cu_num,B,M,N,K"),
        aiter_lookup="aiter/ops/batched_gemm_op_bf16.py:get_CKBatchedGEMM_config", aiter_args=("B", "M", "N", "K"),
        aiter_file_attr="AITER_CONFIG_BF16_BATCHED_GEMM_FILE", tuned_variants=_BATCHED_OLD_VARIANT,
        op_entries=(_BF16_BATCHED_OP,),
        tuner_script="csrc/ck_batched_gemm_bf16/batched_gemm_bf16_tune.py"),
    TableFamily(
        # fp8 e8m0 mxscale BMM: lowercase columns, no cu_num, no shipped default or untuned file
        name="a8w8_blockscale_mxscale_batched_gemm", env_var="AITER_CONFIG_BATCHED_GEMM_A8W8_BLOCKSCALE_MXSCALE",
        tuned_file="batched_gemm_a8w8_blockscale_mxscale_tuned.csv",
        untuned_file="batched_gemm_a8w8_blockscale_mxscale_untuned.csv",
        tuned_header=_h("gfx,b,m,n,k,libtype," + _CK_RESULT), untuned_header=_h("b,m,n,k"),
        key_columns=_h("gfx,b,m,n,k"), shape_columns=_h("b,m,n,k"), m_column="m", compiled=True,
        aiter_lookup="aiter/ops/batched_gemm_op_a8w8.py:lookup_mxscale_bmm_config", aiter_args=("b", "m", "n", "k"),
        aiter_file_attr="AITER_CONFIG_BATCHED_GEMM_A8W8_BLOCKSCALE_MXSCALE_FILE", op_entries=(_MXSCALE_OP,),
        # _batched_gemm_a8w8_mxscale_impl (batched_gemm_op_a8w8.py:279-297): an opus row runs (int() of its kernelId
        # and splitK), any other libtype raises NotImplementedError; no row: opus' own heuristic
        libtype_use=(("opus", "hit"),), libtype_other="fails",
        read_cells=(ReadCell("kernelId", "int", "ops/batched_gemm_op_a8w8.py:295", when=(("libtype", "==", "opus"),)),
                    ReadCell("splitK", "int", "ops/batched_gemm_op_a8w8.py:296", when=(("libtype", "==", "opus"),))),
        err_max=0.02,  # opus_bmm_mxscale_tune.py:32
        # OpusBmmMxscaleTuner (opus_bmm_mxscale_tune.py:245) has no run_config of its own: nothing to confirm with
        math="fp8", tuner_script="csrc/opus_gemm/opus_bmm_mxscale_tune.py", tuner_races=False),
    TableFamily(
        name="fmoe", kernel_columns=("kernelName1", "kernelName2"), kernel_renames=(_FMOE_CK_QUANT,),
        gfx_optional=True, env_var="AITER_CONFIG_FMOE",
        log_lines=LOG_MOE,
        tuned_file="tuned_fmoe.csv", untuned_file="untuned_fmoe.csv",
        # what gemm_moe_tune.py writes today; the shipped default lacks gfx and has _tag (see headers.py)
        tuned_header=_FMOE_KEY + _h("block_m,ksplit,us1,kernelName1,err1,us2,kernelName2,err2,us,run_1stage,"
                                    "xbf16,flat,tflops,bw"),
        untuned_header=_FMOE_SHAPE, key_columns=_FMOE_KEY, shape_columns=_FMOE_SHAPE,
        m_column="token", padding="moe", err_columns=("err1", "err2"),
        # the lookup keys on the pybind enum, which never equals the CSV string: every hit comes from the
        # act_type-wildcarded fallback, first row in file order (fused_moe.py:2290-2297, aiter-tuning.md 2.7)
        lookup_ignores=("act_type",), duplicate_keys="first", backfill_gfx=True,
        gfx_on_miss=True,  # fused_moe.py:2393: fused_moe_1stage_dict.get(get_gfx(), {}) when no row is found
        dropped_rows=(("_tag", "flydsl_fallback"),), flydsl_miss="fails", overlay_first=True,
        filled=("kernelName1", "kernelName2"), filled_unless=(("kernelName2", "run_1stage", "1"),),
        remaps=(("q_type", "QuantType.per_128x128", "QuantType.per_1x128"),),
        # fused_moe.py:2437-2449: run_1stage = cfg.get("run_1stage") (NaN is true), then int(cfg["xbf16"]) and
        # int(cfg["flat"]) of a 1-stage row (where the columns exist); block_m sizes the sort (:2430)
        read_cells=(ReadCell("block_m", "int", "fused_moe.py:2430"),
                    ReadCell("run_1stage", "int", "fused_moe.py:2437"),
                    ReadCell("xbf16", "int", "fused_moe.py:2445", when=(("run_1stage", "nonzero", ""),)),
                    ReadCell("flat", "int", "fused_moe.py:2449", when=(("run_1stage", "nonzero", ""),))),
        aiter_lookup="aiter/fused_moe.py:get_2stage_cfgs", aiter_file_attr="AITER_CONFIG_FMOE_FILE", err_max=0.1,
        moe_op=FMOE_OP,
        tuned_variants=(
            (_FMOE_HEAD + ",tflops,bw", _FMOE_OLD_KEYS),
            # the current release's own default and model_configs files (gfx backfilled from cu_num)
            (_FMOE_HEAD + ",tflops,bw,_tag", ""), (_FMOE_HEAD + ",tflops,bw,xbf16,_tag", ""),
            (_FMOE_HEAD + ",xbf16,tflops,bw,_tag", ""), (_FMOE_HEAD + ",xbf16,flat,tflops,bw,_tag", ""),
            ("gfx," + _FMOE_HEAD + ",xbf16,flat,tflops,bw,_tag", "")),
        deploy_notes=("fused_moe_dp_shared_expert.py reads aiter/configs/tuned_fmoe.csv directly and ignores the "
                      "env var; rows that differ from a shipped row only in act_type are matched first-wins.",),
        tuner_script="csrc/ck_gemm_moe_2stages_codegen/gemm_moe_tune.py"),
    TableFamily(
        name="fhmoe", kernel_columns=("kernelName1", "kernelName2"),
        env_var="AITER_CONFIG_FHMOE",
        log_lines=LOG_MOE,
        tuned_file="tuned_fhmoe.csv", untuned_file="untuned_fhmoe.csv",
        tuned_header=_h("gfx,cu_num,token,model_dim,inter_dim,expert,topk,shared_expert_id,act_type,dtype,"
                        "q_dtype_a,q_dtype_w,q_type,use_g1u1,doweight_stage1,hidden_pad,intermediate_pad,"
                        "gate_mode,block_m,ksplit,kernelName1,kernelName2"),
        untuned_header=("gfx", "cu_num") + _FMOE_SHAPE,
        key_columns=_FMOE_KEY + _h("shared_expert_id,hidden_pad,intermediate_pad,gate_mode"),
        shape_columns=_FMOE_SHAPE + _h("shared_expert_id,hidden_pad,intermediate_pad,gate_mode"),
        m_column="token", padding="moe_exact", time_column=None, err_columns=(),  # no us, no tuner
        # fused_moe.py:2153-2185,2271-2275: get_2stage_cfgs(config_file=AITER_CONFIG_FHMOE's table) keys also on
        # (expert - 1, hidden_pad, intermediate_pad, gate_mode), str(activation) exactly, no token tier retry; any
        # repeated key raises (duplicated(subset=...), identical rows included); FlyDSL kernels only
        duplicate_keys="raise_any", backfill_gfx=True, filled=("kernelName1", "kernelName2"), err_max=0.1,
        lookup_derived=(("shared_expert_id", "expert", -1),), dropped_rows=(("_tag", "flydsl_fallback"),),
        flydsl_miss="fails", aiter_lookup="aiter/fused_moe.py:get_2stage_cfgs", aiter_args=("@file",),
        aiter_file_attr="AITER_CONFIG_FHMOE_FILE", moe_op=FHMOE_OP,
        miss_raises=(MissRaises("fused_moe.py:2369-2374", "NotImplementedError: the dedicated FHMoE path requires an "
                                "exact tuned config row"),),
        deploy_notes=("fhmoe has no us column: any duplicate key in a multi-file merge raises RuntimeError.",)),
    TableFamily(
        # no kernel_renames across v0.1.19 -> v0.1.20: v0.1.19's kernelName1 followed gate_mode (SEPARATED: *_gguu,
        # 64 rows; INTERLEAVE: *_gugu, 20; grouped_moe_gfx1250.py:415 at v0.1.19); v0.1.20 dropped gate_mode and
        # reads gate/up interleaved only (grouped_moe_gfx1250.py:778-780: w1 MUST be GUGU), so a gguu kernel is gone,
        # not renamed; the 19 gugu rows at keys both ship keep their names
        name="grouped_fmoe", kernel_columns=("kernelName1", "kernelName2"),
        env_var="AITER_CONFIG_GROUPED_FMOE",
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
        gfx_source="get_gfx", duplicate_keys="first", filled=("kernelName1", "kernelName2"), err_max=0.1,
        sentinels=(("topk", "-1"),),  # an expert-parallel call (grouped_moe_gfx1250.py:1032-1033)
        aiter_lookup="aiter/ops/flydsl/grouped_moe_gfx1250.py:_find_grouped_config", env_concat=True,
        moe_op=GROUPED_OP,
        key_match="wildcard",
        aiter_file_attr="AITER_CONFIG_GROUPED_FMOE_FILE",
        deploy_notes=("AITER_CONFIG_GROUPED_FMOE bypasses merge and dedup: empty cells are wildcards, lowest us "
                      "wins.",),
        # GroupedFmoeTuner.post_process (gemm_moe_tune.py:6047-6049) writes no --profile_file: nothing to screen
        tuner_script="csrc/ck_gemm_moe_2stages_codegen/gemm_moe_tune.py", tuner_args=("--grouped-gemm",),
        tuner_races=False),
    TableFamily(
        name="gdn_k5_opt", kernel_columns=("BV",),
        env_var="AITER_CONFIG_GDN_K5_OPT",
        tuned_file="chunk_gdn_h_opt_tuned.csv", untuned_file="chunk_gdn_h_opt_untuned.csv",
        tuned_header=_h("gfx,cu_num,dtype,K,V,BT,H,Hg,is_varlen,use_h0,store_fs,snapshot_bf16,state_bf16,T_flat,"
                        "N,total_chunks,max_seq_chunks,BV,us"),
        untuned_header=_h("gfx,cu_num,H,Hg,V,is_varlen,use_h0,store_fs,snapshot_bf16,state_bf16,total_chunks,"
                          "max_seq_chunks"),
        key_columns=_h("gfx,cu_num,H,Hg,V,is_varlen,use_h0,store_fs,snapshot_bf16,state_bf16,total_chunks,"
                       "max_seq_chunks"),
        shape_columns=_h("H,Hg,V,is_varlen,use_h0,store_fs,snapshot_bf16,state_bf16,total_chunks,max_seq_chunks"),
        m_column=None, padding="exact", err_columns=(), tuner_script="csrc/gdn_k5/chunk_gdn_h_opt_tune.py",
        tuner_races=False,  # K5BvTuner.post_process (chunk_gdn_h_opt_tune.py:512-524) writes no --profile_file
        # linear_attention_prefill_kernels.py:658-753: read at import from AITER_CONFIGS' file (a read error leaves
        # it empty), rows without BV skipped, the first BV of a key kept, exact (gfx_runtime, cu_num, shape) lookup
        aiter_lookup="aiter/ops/flydsl/linear_attention_prefill_kernels.py:_tuned_bv",
        aiter_file_attr="AITER_CONFIG_GDN_K5_OPT_FILE", duplicate_keys="first", dropped_rows=(("BV", ""),),
        filled=("BV",),
        # _load_tuned_bv_table (:659-705): csv.DictReader over the lines not starting with '#' (after lstrip);
        # per kept row int(cu_num) unless blank, int() of H, Hg, V, total_chunks, max_seq_chunks and BV; a
        # ValueError or KeyError returns {} (no row at all)
        comment_prefix="#", loader_ints=(("cu_num", True), ("H", False), ("Hg", False), ("V", False),
                                         ("total_chunks", False), ("max_seq_chunks", False), ("BV", False)),
        # chunk_gated_delta_rule_fwd_h_flydsl_opt runs the BV its lookup returns only where it is 16, 32 or 64
        # (V is 128), and raises ValueError on any other
        read_cells=(ReadCell("BV", "enum", "ops/flydsl/linear_attention_prefill_kernels.py:1270", ("16", "32", "64")),),
        untuned_variants=("dtype,K,V,BT,H,Hg,is_varlen,use_h0,store_fs",)),
]}


@dataclass(frozen=True)
class AiterRelease:
    """One AITER release's table machinery: its ':'-merge (aiter/jit/core.py update_config_files), the file it
    reads when the env var is unset, and the family rules that differ from the current release's."""
    name: str
    version_prefixes: tuple[str, ...]
    # merge: union of columns with fills (current core.py:289-308) or identical columns asserted (0.1.7 :87-89)
    merge_union_columns: bool = True
    merge_dedup_extra: tuple[str, ...] = ("cu_num", "gfx")  # added to the untuned header (current :320-338)
    merge_dedup_tag: bool = True  # _tag joins the dedup key when present
    merge_on_duplicate: str = "raise_rewrite"  # or "lowest_us": silently keep the lowest us (0.1.7 :105-109)
    merge_first_must_exist: bool = False  # 0.1.7 reads the first path without an existence check (:82)
    merge_sorted_by_us: bool = False  # 0.1.7's merged file comes out sorted by us
    model_configs_suffix: str = ".csv"  # the model_configs glob: *<merge name>*<suffix>
    default_files: tuple[tuple[str, str], ...] = ()  # (family, default file name) when not family.tuned_file
    no_untuned_file: tuple[str, ...] = ("a8w8_blockscale_mxscale_batched_gemm",)  # merged without any dedup
    # families whose op calls the Python lookup only to log it: the compiled table alone picks the kernel
    lookup_unused: tuple[str, ...] = ()
    overrides: tuple[tuple[str, tuple[tuple[str, object], ...]], ...] = field(default=())

    def family(self, name: str) -> TableFamily:
        fam = get_family(name)
        return replace(fam, **dict(dict(self.overrides).get(name, ())))

    def merge_key(self, untuned_header: tuple[str, ...], header: tuple[str, ...]) -> tuple[str, ...]:
        """The merge's dedup key for a merged header: the image's untuned header (+ cu_num, gfx and _tag in the
        current release), as far as the merged table has them (core.py:320-338)."""
        keys = list(untuned_header)
        for extra in self.merge_dedup_extra + (("_tag",) if self.merge_dedup_tag else ()):
            if extra not in keys:
                keys.append(extra)
        return tuple(k for k in keys if k in header)

    def default_file(self, family: TableFamily) -> str:
        return dict(self.default_files).get(family.name, family.tuned_file)


CURRENT = AiterRelease(name="current", version_prefixes=())
# amd-aiter 0.1.7.post2 (Nov 2025): jit/core.py, tuned_gemm.py, ops/gemm_op_a8w8.py, fused_moe.py of that wheel
RELEASE_0_1_7 = AiterRelease(
    name="0.1.7", version_prefixes=("0.1.7",), merge_union_columns=False, merge_dedup_extra=(),
    merge_dedup_tag=False, merge_on_duplicate="lowest_us", merge_first_must_exist=True, merge_sorted_by_us=True,
    model_configs_suffix="",
    # core.py:183-186: the bf16 default is aiter/configs/tuned_gemm.csv, a file the wheel does not ship
    default_files=(("bf16_gemm", "tuned_gemm.csv"),),
    lookup_unused=("a8w8_bpreshuffle_gemm", "a8w8_blockscale_gemm", "a8w8_blockscale_bpreshuffle_gemm"),
    overrides=(
        # no FlyDSL check in its lookup, no bpreshuffle (nor its no-solution assert); its solMap is a list of four
        # (tuned_gemm.py:42: .index(libtype) at :173 raises ValueError on any other)
        ("bf16_gemm", (("gfx_source", "runtime"), ("flydsl_miss", "ignored"), ("miss_raises", ()), ("op_paths", ()),
                       ("read_cells", (ReadCell("libtype", "enum", "tuned_gemm.py:173",
                                                ("torch", "hipblaslt", "skinny", "asm")),
                                       ReadCell("solidx", "enum", "tuned_gemm.py:194-213", ("0", "1", "2"),
                                                when=(("libtype", "==", "skinny"),)))))),
        # csrc/ck_gemm_a8w8: gen_instances keeps the device's cu_num rows, gemm_a8w8.cu finds {M, N, K}; Python
        # keys without q_dtype_w (ops/gemm_op_a8w8.py:211-242), its gemm_a8w8_CK (:353-376) remaps no dtype
        ("a8w8_gemm", (("cpp_key", ("M", "N", "K")), ("aiter_lookup", "aiter/ops/gemm_op_a8w8.py:get_CKGEMM_config"),
                       ("op_remaps", ()),
                       ("aiter_args", _MNK_FILE))),
        # batched: tables without gfx; the compiled table is taken to key {B, M, N, K} over the device's cu_num rows
        # as a8w8's does (its .cu is not in what the tests unpack from the wheel: modelled, not executed)
        ("a8w8_batched_gemm", (("cpp_key", ("B", "M", "N", "K")),)),
        ("bf16_batched_gemm", (("cpp_key", ("B", "M", "N", "K")),)),
        # ops/gemm_op_a4w4.py:77-131: the caller passes out ([M padded to 32, N]: the asm path asserts it)
        ("a4w4_blockscale_gemm", (("op_entries", (replace(
            _A4W4_OP, where="ops/gemm_op_a4w4.py:77-131",
            args=_A4W4_XW + (_t("(M+31)//32*32", "N", dtype="torch.bfloat16"),)),)),
            ("op_paths", (OpPath("ops/gemm_op_a4w4.py:98-101", "RuntimeError: A4W4 GEMM kernel is not supported on "
                                 "gfx942", when=(("gfx", "==", "gfx942"),)),)))),
        # ops/gemm_op_a8w8.py:409-411, :466-467, :512: these ops call the lookup and drop its row
        ("a8w8_bpreshuffle_gemm", (("aiter_lookup", "aiter/ops/gemm_op_a8w8.py:get_bpreshuffle_GEMM_config"),
                                   ("padding", "exact"), ("libtype_use", ()), ("aiter_op", None),
                                   ("cpp_key", None))),
        # fused_moe.py:505-580: str(activation) in the key, no dedup (set_index().to_dict raises on a repeat),
        # no gfx, tokens padded 16 / nextPow2 / 1024 (get_padded_M :484-492)
        # no xbf16 nor flat read (fused_moe.py:632-636)
        ("fmoe", (("read_cells", (ReadCell("block_m", "int", "fused_moe.py:632"),
                                  ReadCell("run_1stage", "int", "fused_moe.py:636"))),
                  ("lookup_ignores", ()), ("duplicate_keys", "raise"), ("backfill_gfx", False),
                  ("dropped_rows", ()), ("padding", "moe_0_1_7"), ("overlay_first", False),
                  ("moe_op", FMOE_OP_0_1_7))),
    ),
)
RELEASES = (RELEASE_0_1_7, CURRENT)


def release_named(name: str) -> AiterRelease:
    return next(r for r in RELEASES if r.name == name)


def release_for(aiter_version: str | None) -> AiterRelease:
    """The release an image's AITER version belongs to; unknown versions are taken as current."""
    for r in RELEASES:
        if aiter_version and any(aiter_version.startswith(p) for p in r.version_prefixes):
            return r
    return CURRENT


# gfx_from_cu_num (chip_info.py:96-119): legacy cu_num -> gfx; any other value is the live GPU's arch
LEGACY_CU_NUM_TO_GFX = {256: "gfx950", 80: "gfx942", 304: "gfx942"}


def gfx_from_cu_num(cu_num: object, live_gfx: str) -> str:
    try:
        return LEGACY_CU_NUM_TO_GFX.get(int(str(cu_num).strip()), live_gfx)
    except ValueError:
        return live_gfx


# chip_info.py / build_targets.py: the archs get_gfx() accepts (GFX_MAP) and the default cu_num of a build target
GFX_NAMES = frozenset({"native", "gfx90a", "gfx908", "gfx940", "gfx941", "gfx942", "gfx945", "gfx1100", "gfx950",
                       "gfx1101", "gfx1102", "gfx1103", "gfx1150", "gfx1151", "gfx1152", "gfx1153", "gfx1200",
                       "gfx1201", "gfx1250"})
GFX_CU_NUM = {"gfx942": 304, "gfx950": 256, "gfx1250": 256}


@dataclass(frozen=True)
class LookupIdentity:
    """Who AITER's lookups think they run on, from the serving environment: the (gfx, cu_num) the Python lookup
    keys on, the (gfx, cu_num) targets the compiled tables are built for, and what AITER raises instead."""
    gfx: str
    cu_num: int
    build_targets: tuple[tuple[str, int], ...]
    error: str | None = None  # the Python lookup raises
    arch: str = ""  # what get_gfx() answers (GPU_ARCHS' last entry, or the GPU): what a MoE op's branches read
    miss_error: str | None = None  # the Python lookup raises on a shape it has no row for
    build_error: str | None = None  # building the compiled table raises


def lookup_identity(family: TableFamily, gpu_gfx: str, gpu_cu_num: int, env: dict[str, str]) -> LookupIdentity:
    """GPU_ARCHS and CU_NUM as AITER reads them. get_gfx() (chip_info.py get_gfx_custom_op_core) takes GPU_ARCHS
    as is ("native" or unset: the GPU; a ';' list: its last entry, unstripped) and raises KeyError on a name
    outside GFX_MAP; families whose lookup calls get_gfx_runtime() always see the GPU. get_cu_num() is
    int(CU_NUM) (0 or unset: the GPU; not an integer: ValueError). The compiled tables hold the rows of
    get_build_targets(): every stripped GPU_ARCHS entry with int(CU_NUM or its default cu_num), or with
    GPU_ARCHS unset/empty/native, (get_gfx(), get_cu_num()); the C++ lookup itself asks the device."""
    error = build_error = None
    raw = env.get("GPU_ARCHS")
    archs = "native" if raw is None else raw
    gfx = gpu_gfx if archs == "native" else archs.split(";")[-1]
    if gfx not in GFX_NAMES and archs != "native":  # the campaign's own gfx is taken as known (a CPU campaign)
        error = f"KeyError: Unknown GPU architecture: {gfx}"
    try:
        cu = int(env.get("CU_NUM", "0")) or gpu_cu_num
    except ValueError:
        cu, error = gpu_cu_num, error or f"ValueError: CU_NUM={env.get('CU_NUM')!r} is not an integer"
    targets: tuple[tuple[str, int], ...] = ()
    if (raw or "").strip() and (raw or "").strip().lower() != "native":
        names = [g.strip() for g in (raw or "").split(";") if g.strip()]
        unknown = [g for g in names if g not in GFX_CU_NUM]
        try:
            targets = tuple((g, int(env.get("CU_NUM", GFX_CU_NUM[g]))) for g in names if g in GFX_CU_NUM)
        except ValueError:
            build_error = f"ValueError: CU_NUM={env.get('CU_NUM')!r} is not an integer"
        if unknown:
            build_error = f"RuntimeError: Unknown gfx {unknown[0]!r} in GPU_ARCHS"
    elif error:
        build_error = f"RuntimeError: No GPU detected and GPU_ARCHS is not set to an explicit target ({error})"
    else:
        targets = ((gfx, cu),)
    miss_error = None
    if family.gfx_source != "get_gfx":
        gfx = gpu_gfx
        if error and error.startswith("KeyError") and not (family.moe_op and family.moe_op.calls_get_gfx):
            error, miss_error = None, error if family.gfx_on_miss else None
    arch = gpu_gfx if archs == "native" else archs.split(";")[-1]
    return LookupIdentity(gfx, cu, targets, error=error, miss_error=miss_error, build_error=build_error, arch=arch)


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
