"""Who AITER's lookups think they run on, from a serving environment's GPU_ARCHS and CU_NUM (chip_info.py)."""

from __future__ import annotations

from dataclasses import dataclass

from app.domain.families.gpus import GFX_CU_NUM, GFX_NAMES
from app.domain.families.record import TableFamily

BuildTargets = tuple[tuple[str, int], ...]


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
    raw = env.get("GPU_ARCHS")
    arch, gfx_error = _get_gfx(raw, gpu_gfx)
    cu, cu_error = _get_cu_num(env, gpu_cu_num)
    error = gfx_error or cu_error
    targets, build_error = _build_targets(raw, env, arch, cu, error)
    gfx, miss_error = arch, None
    if family.gfx_source != "get_gfx":
        gfx = gpu_gfx
        if error and error.startswith("KeyError") and not (family.moe_op and family.moe_op.calls_get_gfx):
            error, miss_error = None, error if family.gfx_on_miss else None
    return LookupIdentity(gfx, cu, targets, error=error, miss_error=miss_error, build_error=build_error, arch=arch)


def _get_gfx(raw: str | None, gpu_gfx: str) -> tuple[str, str | None]:
    """What get_gfx() answers and what it raises."""
    archs = "native" if raw is None else raw
    arch = gpu_gfx if archs == "native" else archs.split(";")[-1]
    if arch not in GFX_NAMES and archs != "native":  # the campaign's own gfx is taken as known (a CPU campaign)
        return arch, f"KeyError: Unknown GPU architecture: {arch}"
    return arch, None


def _get_cu_num(env: dict[str, str], gpu_cu_num: int) -> tuple[int, str | None]:
    """What get_cu_num() answers and what it raises."""
    try:
        return int(env.get("CU_NUM", "0")) or gpu_cu_num, None
    except ValueError:
        return gpu_cu_num, f"ValueError: CU_NUM={env.get('CU_NUM')!r} is not an integer"


def _build_targets(raw: str | None, env: dict[str, str], gfx: str, cu: int,
                   error: str | None) -> tuple[BuildTargets, str | None]:
    """get_build_targets(): the (gfx, cu_num) the compiled tables are built for, and what building them raises."""
    if (raw or "").strip() and (raw or "").strip().lower() != "native":
        return _explicit_targets(raw or "", env)
    if error:
        return (), f"RuntimeError: No GPU detected and GPU_ARCHS is not set to an explicit target ({error})"
    return ((gfx, cu),), None


def _explicit_targets(raw: str, env: dict[str, str]) -> tuple[BuildTargets, str | None]:
    """Every stripped GPU_ARCHS entry with int(CU_NUM or its default cu_num)."""
    names = [g.strip() for g in raw.split(";") if g.strip()]
    unknown = [g for g in names if g not in GFX_CU_NUM]
    targets: BuildTargets = ()
    build_error = None
    try:
        targets = tuple((g, int(env.get("CU_NUM", GFX_CU_NUM[g]))) for g in names if g in GFX_CU_NUM)
    except ValueError:
        build_error = f"ValueError: CU_NUM={env.get('CU_NUM')!r} is not an integer"
    if unknown:
        build_error = f"RuntimeError: Unknown gfx {unknown[0]!r} in GPU_ARCHS"
    return targets, build_error
