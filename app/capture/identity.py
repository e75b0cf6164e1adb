"""Who the server is, read the way AITER reads it (aiter/jit/utils/chip_info.py at ROCm/aiter e4048607a5):
gfx from GPU_ARCHS (the last of a ';' list) or else the first gfx name in rocminfo's output (get_gfx,
_detect_native); cu_num from CU_NUM or else the GPU agents' "Compute Unit" in rocminfo
(get_cu_num_custom_op); AITER's version from the installed package. The image digest cannot be seen from
inside a container: it comes from the pod spec or `docker inspect` (flag or TUNER_IMAGE_DIGEST)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess


def _rocminfo() -> str | None:
    exe = shutil.which("rocminfo") or ("/opt/rocm/bin/rocminfo" if os.path.exists("/opt/rocm/bin/rocminfo")
                                       else None)
    if exe is None:
        return None
    try:
        return subprocess.run([exe], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None


def gfx_from(env: dict[str, str], rocminfo: str | None) -> str | None:
    archs = env.get("GPU_ARCHS", "native")
    if archs.strip() and archs != "native":
        return archs.split(";")[-1].strip()  # chip_info.py get_gfx_custom_op_core: the last entry
    for line in (rocminfo or "").splitlines():
        m = re.search(r"\b(gfx\w+)\b", line, re.IGNORECASE)
        if m:
            return m.group(1).lower()
    return None


def cu_num_from(env: dict[str, str], rocminfo: str | None) -> int | None:
    try:
        cu = int(env.get("CU_NUM", "0"))
    except ValueError:
        cu = 0
    if cu:
        return cu
    units = []
    for device in re.split(r"Agent\s*\d+", rocminfo or ""):
        for line in device.split("\n"):
            if "Device Type" in line and line.find("GPU") != -1:
                m = re.search(r"Compute Unit\s*:\s*(\d+)", device)
                if m:
                    units.append(int(m.group(1)))
                break
    return units[0] if units and len(set(units)) == 1 else None


def aiter_version() -> str | None:
    from workers.image_tables import aiter_package_dir, aiter_version as from_package
    pkg = aiter_package_dir()
    if pkg is not None:
        return from_package(pkg)
    try:
        from importlib.metadata import version
        return version("amd-aiter")
    except Exception:
        return None


def detect(gfx: str | None, cu_num: int | None) -> tuple[str | None, int | None]:
    """Given values win; rocminfo runs only when one is missing."""
    env = dict(os.environ)
    if gfx and cu_num:
        return gfx, cu_num
    info = None if (gfx or env.get("GPU_ARCHS", "native") != "native") and (cu_num or env.get("CU_NUM")) \
        else _rocminfo()
    return gfx or gfx_from(env, info), cu_num or cu_num_from(env, info)
