"""The GPUs AITER knows, as its tables and lookups see them: each gfx's own fp8, its last-level cache, the archs
get_gfx() accepts, a build target's default cu_num and the legacy cu_num -> gfx map."""

from __future__ import annotations

# The GPU's own fp8 (aiter/utility/dtypes.py:11-21 defaultDtypes, read by get_gfx_runtime(): the device, never
# GPU_ARCHS); any other gfx gets torch.uint8 (:24 _8bit_fallback)
FP8_OF_GFX = {"gfx942": "torch.float8_e4m3fnuz", **{g: "torch.float8_e4m3fn" for g in (
    "gfx950", "gfx1100", "gfx1101", "gfx1102", "gfx1151", "gfx1200", "gfx1201", "gfx1250")}}
GPU_FP8 = "@fp8"  # in an OpRemap: the running GPU's own fp8

# The last-level cache a timing scrub must evict, by gfx: the 256 MiB AMD Infinity Cache (MALL) of MI300X/MI325X
# (gfx942, CDNA3 white paper) and MI350X/MI355X (gfx950, CDNA4 white paper); a 2x-L2 scrub (4 MiB L2 per XCD)
# left it warm (issue 34). A gfx not listed: the L2 torch reports is the last level (NVIDIA: 50 MiB on an H200).
LLC_BYTES_OF_GFX = {"gfx942": 256 << 20, "gfx950": 256 << 20}


def llc_bytes(gfx: str, l2_bytes: int | None = None) -> int | None:
    """The device's last-level cache in bytes: the gfx's Infinity Cache where it has one, else its L2."""
    return LLC_BYTES_OF_GFX.get(gfx, l2_bytes or None)


def gpu_fp8(gfx: str) -> str:
    return FP8_OF_GFX.get(gfx, "torch.uint8")


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
