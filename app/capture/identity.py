"""Who the server is. The campaign's identity is the GPU itself, as rocminfo shows it: the gfx AITER's runtime
lookups see (chip_info.py get_gfx_runtime -> _detect_native: the first gfx name in rocminfo's output), the cu_num
of its GPU agents (get_cu_num_custom_op with CU_NUM unset) and what the compiled C++ tables ask the device for.
GPU_ARCHS and CU_NUM are not folded into it: they go along as the serving environment (serving_env), from which
the service predicts what get_gfx() (GPU_ARCHS' last entry) and get_cu_num() (CU_NUM) make of it
(families.lookup_identity). Only where rocminfo is missing do GPU_ARCHS and CU_NUM stand in for the GPU.
AITER's version comes from the installed package (app/aiter_install.py). The image digest cannot be seen from
inside a container: it comes from the pod spec or `docker inspect` (flag or TUNER_IMAGE_DIGEST)."""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess

from app.domain.families import MOE_ENV


def _rocminfo() -> str | None:
    exe = shutil.which("rocminfo") or ("/opt/rocm/bin/rocminfo" if os.path.exists("/opt/rocm/bin/rocminfo")
                                       else None)
    if exe is None:
        return None
    try:
        return subprocess.run([exe], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None


# what AITER reads from the serving environment besides the GPU (chip_info.py, build_targets.py), and what its MoE
# op reads (families.MOE_ENV: fused_moe.py:76, :768, :781-784, :799-800)
SERVING_ENV = ("GPU_ARCHS", "CU_NUM") + tuple(n for n, _ in MOE_ENV)


def serving_env(env: dict[str, str]) -> dict[str, str]:
    """SERVING_ENV as set (absent when unset): sent with every capture for the service's prediction."""
    return {k: env[k] for k in SERVING_ENV if k in env}


def gfx_from(env: dict[str, str], rocminfo: str | None) -> str | None:
    """The GPU's gfx: rocminfo's first gfx name (_detect_native); without rocminfo, GPU_ARCHS' last entry."""
    for line in (rocminfo or "").splitlines():
        m = re.search(r"\b(gfx\w+)\b", line, re.IGNORECASE)
        if m:
            return m.group(1).lower()
    archs = env.get("GPU_ARCHS", "native")
    if archs.strip() and archs != "native":
        return archs.split(";")[-1].strip()  # chip_info.py get_gfx_custom_op_core: the last entry
    return None


def cu_num_from(env: dict[str, str], rocminfo: str | None) -> int | None:
    """The GPU agents' compute units (all equal, or AITER asserts); without rocminfo, CU_NUM."""
    gpu = _gpu_cu_num(rocminfo)
    if gpu is not None or rocminfo:
        return gpu
    try:
        return int(env.get("CU_NUM", "0")) or None
    except ValueError:
        return None


def _gpu_cu_num(rocminfo: str | None) -> int | None:
    units = []
    for device in re.split(r"Agent\s*\d+", rocminfo or ""):
        for line in device.split("\n"):
            if "Device Type" in line and line.find("GPU") != -1:
                m = re.search(r"Compute Unit\s*:\s*(\d+)", device)
                if m:
                    units.append(int(m.group(1)))
                break
    return units[0] if units and len(set(units)) == 1 else None


def detect(gfx: str | None, cu_num: int | None) -> tuple[str | None, int | None]:
    """Given values win; rocminfo runs only when one is missing."""
    env = dict(os.environ)
    if gfx and cu_num:
        return gfx, cu_num
    info = _rocminfo()
    if info is None and any(k in env for k in SERVING_ENV):
        logging.getLogger("aiter-tuner.capture").warning(
            "no rocminfo: the GPU is taken to be what GPU_ARCHS/CU_NUM name; pass --gfx/--cu-num if it is not")
    return gfx or gfx_from(env, info), cu_num or cu_num_from(env, info)
