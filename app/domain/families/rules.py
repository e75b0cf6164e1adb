"""A table family's rules, grouped by the AITER mechanism each describes: how the run-time lookup finds a row
(LookupRules), how the loader reads the file (LoaderRules), what the op does around its lookup (OpDispatch),
what a deployed table must hold (DeployRules), how the tuner races (TunerRules) and what a capture carries
(CaptureRules). Each is a frozen record whose behaviour switches are Literal types (mypy checks the spellings).
See ../shared/reference/aiter-tuning.md sections 1-2, 6 for the mechanisms."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from app.domain.families.columns import DIM_BOUNDS
from app.domain.families.log_formats import LogLine
from app.domain.families.moe_paths import MoeOpPath
from app.domain.families.ops import MissRaises, OpEntry, OpPath, OpRemap, ReadCell, RowUse, WeightRetry

# how the lookup pads M before it looks a row up: gemm [M, gl0, gl1]; moe nextPow2 tiers; moe_exact fhmoe's tiers
# without a retry; moe_0_1_7 amd-aiter 0.1.7's get_padded_M; exact: no padding (app/domain/keys.py)
Padding = Literal["gemm", "moe", "moe_exact", "moe_0_1_7", "exact"]
# the gfx the Python lookup keys on: the device's (get_gfx_runtime) or get_gfx()'s, which honours GPU_ARCHS
GfxSource = Literal["runtime", "get_gfx"]
# a repeated lookup key: "raise" (drop_duplicates(), then set_index().to_dict), "raise_any" (identical rows too)
# or "first" (first row)
DuplicateKeys = Literal["raise", "raise_any", "first"]
# a FlyDSL row where flydsl is absent: "skip" to the next M (bf16's lookup), "fails" (no fallback), "default" (the
# op runs its default kernel, no next-M retry), "ignored" (the lookup does not look: the row is returned and the
# op's libtype dispatch decides)
FlydslMiss = Literal["skip", "fails", "default", "ignored"]
# how a row matches: "exact" keys, or "wildcard": an empty cell matches anything, cu_num is dropped when nothing
# matches with it, the lowest us wins (grouped_moe_gfx1250.py _find_grouped_config)
KeyMatch = Literal["exact", "wildcard"]
# the compiled table's M tries: "ck" exact then 16 / nextPow2 / 20480 (gemm_a8w8.cu rowwise_dispatch,
# batched_gemm_*.cu), "gemm" getPaddedM gl0 then gl1 (gemm_a8w8_bpreshuffle.cu:137-159)
CppPadding = Literal["ck", "gemm"]
# the matrix-core precision the kernels run at: picks the peak FLOP/s and operand bytes in roofline.py
Math = Literal["bf16", "fp8", "fp4"]


# An fp8 family's output is gated on its SNR against the reference, 20 * log10(||ref|| / ||out - ref||) (issue 34),
# beside AITER's error ratio. 20 dB (a 10% relative RMS error): e4m3's 3-bit mantissa rounds an input by at most
# 2^-4 (~29 dB RMS against an unquantized reference), and AITER's references are computed from the same
# quantized inputs (gemm_a8w8_tune.py:100 gemm_a8w8_ref), so a right kernel sits far above it (its bf16 output's
# own rounding: ~50 dB) and a wrong one (index, scale or layout bugs: 0 dB and below) far under. PyTorch's own
# quantization tests ask 30 dB of int8 models (test/test_quantized_models.py).
SNR_MIN_DB_OF_MATH: dict[str, float] = {"fp8": 20.0}


@dataclass(frozen=True)
class ReplaySpec:
    """How the aiter backend's graph-captured replay (workers/backends/aiter_replay.py) runs one tuned kernel and
    the default op of a family, with the tuner script's own functions (TunerRules.tuner_script)."""

    data: str  # tuner-module function(M, N, K, seed, dtype, q_dtype_w) -> dict of named tensors
    data_args: tuple[str, ...]  # the shape cells after M, N, K, each eval'd as AITER's run_config does
    ref: str  # tuner-module function(*inputs) -> the reference output
    inputs: tuple[str, ...]  # the data dict's tensors passed to the kernel, the op and the reference
    kernel: str  # tuner-module function(*inputs, out, kernelId, splitK) -> out: one tuned kernel
    op: str  # "module:function" the image runs with no row (the default path): op(*inputs) -> out


@dataclass(frozen=True)
class LookupRules:
    """How AITER's run-time lookup treats the table (aiter-tuning.md 1.4, 2.x, 6), and its own lookup function as
    the engagement probe calls it."""
    padding: Padding = "gemm"
    gfx_source: GfxSource = "runtime"  # "get_gfx": honours GPU_ARCHS, last entry (tuned_gemm.py:28)
    gfx_on_miss: bool = False  # an untuned shape's default path calls get_gfx() (GPU_ARCHS), which may raise
    # a shape without a row takes a default path that raises instead of running a default kernel
    miss_raises: tuple[MissRaises, ...] = ()
    lookup_ignores: tuple[str, ...] = ()  # key columns the lookup effectively wildcards
    key_match: KeyMatch = "exact"
    # key cells the lookup computes from another column: (column, from column, offset)
    lookup_derived: tuple[tuple[str, str, int], ...] = ()
    flydsl_miss: FlydslMiss = "ignored"
    # the lookup tells a FlyDSL row by its libtype and asks the FlyDSL catalog for its kernel: one the catalog does
    # not know is taken as flydsl absent (flydsl_miss); the kernel names the catalog knows, a regex re.fullmatch'ed
    # on the row's kernel name (None: not asked, a FlyDSL row is told by its libtype or a flydsl_ kernel name)
    flydsl_catalog: str | None = None
    compiled: bool = False  # kernels picked from a table compiled into a CK JIT module
    # the kernel comes from a C++ table compiled from the CSV, keyed on these columns with its own M padding
    # (keys.cpp_m_candidates), the last row of a key winning (chip_info.py build_tune_dict); None: Python only
    cpp_key: tuple[str, ...] | None = None
    # the compiled table's M tries, and the one libtype its rows are built from (build_tune_dict(libtype=...),
    # gen_instances.py)
    cpp_padding: CppPadding = "ck"
    cpp_libtype: str | None = None
    # AITER's own lookup ("file:function") and the AITER_CONFIGS property naming the table it reads: what
    # workers.verify --engagement calls in the image (None: not probed yet)
    aiter_lookup: str | None = None
    aiter_file_attr: str | None = None
    # what the generic probe passes AITER's lookup, in order: a column (as int), "q_dtype_w" (a torch dtype),
    # "@file" (the table AITER resolved); empty for the lookups with a probe of their own (bf16, fmoe)
    aiter_args: tuple[str, ...] = ()


@dataclass(frozen=True)
class LoaderRules:
    """How AITER's loader reads the file into the lookup's index, and the headers released tables had."""
    duplicate_keys: DuplicateKeys = "raise"
    backfill_gfx: bool = False  # a missing/0/empty gfx cell is taken from cu_num at load (fused_moe.py:2158)
    # a table without a gfx column still loads: fmoe backfills it, CK loaders fall back to a cu_num-only key
    # with a WARNING (gemm_op_a8w8.py:509-525); bf16's set_index(["gfx", ...]) raises instead
    gfx_optional: bool = False
    dropped_rows: tuple[tuple[str, str], ...] = ()  # (column, value) rows the loader drops
    # the loader reads the env value itself: its ':' paths concatenated, no merge, no dedup; unset, AITER_CONFIGS'
    # merged file (grouped_moe_gfx1250.py _load_grouped_config_rows)
    env_concat: bool = False
    # a loader reading the file with csv instead of pandas: the lines it skips (starting with this prefix after
    # leading blanks, before and after the header), and the cells it int()s per row, (column, blank allowed):
    # one int() rejects (a pandas merge writes an integer column holding a blank as 128.0) empties the table
    comment_prefix: str | None = None
    loader_ints: tuple[tuple[str, bool], ...] = ()
    # headers seen in released tables besides tuned_header, with the key columns that release's loader indexes
    # on ("" = understood by its columns); shape-only untuned headers the tuner accepts (missing flags default)
    tuned_variants: tuple[tuple[str, str], ...] = ()
    untuned_variants: tuple[str, ...] = ()


@dataclass(frozen=True)
class OpDispatch:
    """What AITER's op does around its lookup: the arguments it rewrites before, the entry points a server calls,
    the paths it takes whatever the table holds, and what it runs for the row found (by libtype, or the MoE op's
    stages)."""
    # captured values AITER rewrites before the lookup (and its tuner writes): (column, captured, looked up)
    remaps: tuple[tuple[str, str, str], ...] = ()
    # what the op does to its arguments before the lookup, per GPU (the captured value is what the server's op
    # was called with; the row must be keyed on what it looks up)
    op_remaps: tuple[OpRemap, ...] = ()
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
    libtype_use: tuple[tuple[str, RowUse], ...] = ()
    libtype_other: RowUse = "hit"
    libtype_use_unless: tuple[tuple[str, str], ...] = ()
    # the cells the op parses in a row it runs (a posted row that AITER could not parse is refused)
    read_cells: tuple[ReadCell, ...] = ()
    # the MoE op's argument path and stage launchers (fused_moe.py); None: not a MoE op
    moe_op: MoeOpPath | None = None
    # issue 35 (w35b): AITER files the op imports beside its lookup's (the FlyDSL GEMM catalog), which the
    # differential harness runs as they are
    op_sources: tuple[str, ...] = ()
    # issue 35 (w35b): the op looks a miss up again at its weight's padded size (WeightRetry)
    weight_retry: WeightRetry | None = None


@dataclass(frozen=True)
class DeployRules:
    """What a deployed table must hold and how it is laid out, and what an operator is told about it."""
    # cells that must be filled in a deployed row, and (column, value) rows that are exempt from a column
    filled: tuple[str, ...] = ("kernelName", "libtype")
    filled_unless: tuple[tuple[str, str, str], ...] = ()  # (column, exempt if this column, equals this)
    overlay_first: bool = False  # in a merged file the overlay's rows go first (first-match lookups)
    deploy_notes: tuple[str, ...] = ()
    # what AITER's op runs for a row of this libtype, where that is not the kernel the row names: a race's gain on
    # another kernel does not carry into the served path (deploy.plan says so for the rows it concerns)
    served_as: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class TunerRules:
    """How the family's AITER tuner is run and its winners judged."""
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
    math: Math = "bf16"
    replay: ReplaySpec | None = None  # the aiter backend's graph-captured confirmation (None: AITER's timing only)
    # an error ratio above this is not a valid winner (the tuner's --errRatio default: GEMM 0.05, MoE 0.1)
    err_max: float = 0.05


@dataclass(frozen=True)
class CaptureRules:
    """What a capture of a serving process carries for this family, and how its cells are read."""
    # cells a capture may leave out, in order: (column, default value or the column it copies)
    shape_defaults: tuple[tuple[str, str], ...] = ()
    dim_bounds: tuple[tuple[str, int, int], ...] = DIM_BOUNDS  # (column, min, max) of captured sizes
    # (column, value) cells outside dim_bounds that the lookup keys on as they are (grouped fmoe's EP topk=-1)
    sentinels: tuple[tuple[str, str], ...] = ()
    # the lines AITER logs when this family's lookup finds a row or not (log_lines.parse_log reads them back)
    log_lines: tuple[LogLine, ...] = ()
