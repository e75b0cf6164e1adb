"""AITER table families as data: one definition each, split by the AITER mechanism each part describes.

- columns.py: how a column's cells are read (kinds, dtypes, enum values, the size bounds of a capture)
- conditions.py: the (column, op, value) conditions rules are written in
- gpus.py: the GPUs AITER knows (each gfx's fp8, last-level cache, the archs get_gfx() accepts, cu_num -> gfx)
- identity.py: who the lookups think they run on, from GPU_ARCHS and CU_NUM
- ops.py: the op model (argument remaps, cells parsed, a raising miss, entry points, paths whatever the table holds)
- gemm_ops.py: the GEMM ops the servers call, as data
- moe_paths.py: the MoE op model (activation dtype, routes, stage launchers); moe_ops.py: the MoE ops as data
- log_formats.py: the lines AITER logs on a lookup
- renames.py: kernels AITER renamed between releases
- rules.py: a family's rules grouped by mechanism (lookup, loader, op dispatch, deploy, tuner, capture)
- record.py: TableFamily (flat.py: each rule read flat, family.<field>, as before the grouping)
- catalog.py: FAMILIES, get_family, family_for_file
- releases.py: AITER releases and the family rules each changes, as typed functions

Headers, key columns and env var names come from ROCm/aiter at e4048607a5 (aiter/jit/core.py:90-166,
aiter/tuned_gemm.py, aiter/ops/gemm_op_*.py, aiter/fused_moe.py, the csrc/*/*_tune.py scripts); see
../shared/reference/aiter-tuning.md sections 1-2. Every name below is importable from app.domain.families as it
was when this was one module.
"""

from __future__ import annotations

from app.domain.families.catalog import FAMILIES, UnknownFamily, family_for_file, get_family
from app.domain.families.columns import (BOOL, BOOL01, DIM_BOUNDS, DTYPE, DTYPES, ENUM, ENUM_VALUES, FLOAT, INT,
                                         STR, ColumnKind, column_kind, enum_prefix, int_floor)
from app.domain.families.conditions import Cond, CondOp, Conds, holds
from app.domain.families.gemm_ops import BPRESHUFFLE_RETRY, FLYDSL_HGEMM_NAME, FLYDSL_HGEMM_SOURCES
from app.domain.families.gpus import (FP8_OF_GFX, GFX_CU_NUM, GFX_NAMES, GPU_FP8, LEGACY_CU_NUM_TO_GFX,
                                      LLC_BYTES_OF_GFX, gfx_from_cu_num, gpu_fp8, llc_bytes)
from app.domain.families.identity import LookupIdentity, lookup_identity
from app.domain.families.log_formats import (LOG_A8W8, LOG_A8W8_BATCHED, LOG_BF16, LOG_BF16_BATCHED, LOG_CK, LOG_MOE,
                                             LogLine)
from app.domain.families.moe_ops import FHMOE_OP, FMOE_OP, FMOE_OP_0_1_7, GROUPED_OP, MOE_ENV, MOE_ENV_RAISES
from app.domain.families.moe_paths import MoeADtype, MoeLauncher, MoeOpPath, MoeRoute, MoeStage, moe_holds
from app.domain.families.ops import (CellParse, MissRaises, OpArg, OpEntry, OpPath, OpRemap, PathRuns, ReadCell,
                                     RowUse, WeightRetry)
from app.domain.families.record import TableFamily
from app.domain.families.releases import (CURRENT, RELEASE_0_1_7, RELEASES, AiterRelease, FamilyOverride,
                                          MergeOnDuplicate, release_for, release_named)
from app.domain.families.renames import KernelRename
from app.domain.families.rules import (SNR_MIN_DB_OF_MATH, CaptureRules, CppPadding, DeployRules, DuplicateKeys,
                                       FlydslMiss, GfxSource, KeyMatch, LoaderRules, LookupRules, Math, OpDispatch,
                                       Padding, ReplaySpec, TunerRules)

__all__ = [
    "BOOL", "BOOL01", "BPRESHUFFLE_RETRY", "CURRENT", "DIM_BOUNDS", "DTYPE", "DTYPES", "ENUM", "ENUM_VALUES",
    "FAMILIES", "FHMOE_OP", "FLOAT", "FLYDSL_HGEMM_NAME", "FLYDSL_HGEMM_SOURCES", "FMOE_OP", "FMOE_OP_0_1_7",
    "FP8_OF_GFX", "GFX_CU_NUM", "GFX_NAMES", "GPU_FP8", "GROUPED_OP", "INT", "LEGACY_CU_NUM_TO_GFX",
    "LLC_BYTES_OF_GFX", "LOG_A8W8", "LOG_A8W8_BATCHED", "LOG_BF16", "LOG_BF16_BATCHED", "LOG_CK", "LOG_MOE",
    "MOE_ENV", "MOE_ENV_RAISES", "RELEASES", "RELEASE_0_1_7", "SNR_MIN_DB_OF_MATH", "STR",
    "AiterRelease", "CaptureRules", "CellParse", "ColumnKind", "Cond", "CondOp", "Conds", "CppPadding", "DeployRules",
    "DuplicateKeys", "FamilyOverride", "FlydslMiss", "GfxSource", "KernelRename", "KeyMatch", "LoaderRules",
    "LogLine", "LookupIdentity", "LookupRules", "Math", "MergeOnDuplicate", "MissRaises", "MoeADtype", "MoeLauncher",
    "MoeOpPath", "MoeRoute", "MoeStage", "OpArg", "OpDispatch", "OpEntry", "OpPath", "OpRemap", "Padding",
    "PathRuns", "ReadCell", "ReplaySpec", "RowUse", "TableFamily", "TunerRules", "UnknownFamily", "WeightRetry",
    "column_kind", "enum_prefix", "family_for_file", "get_family", "gfx_from_cu_num", "gpu_fp8", "holds",
    "int_floor", "llc_bytes", "lookup_identity", "moe_holds", "release_for", "release_named",
]
