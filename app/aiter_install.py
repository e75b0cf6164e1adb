"""What is installed here, probed with the standard library only, as both agents report it: the AITER package
(where, which version and commit, whether FlyDSL is usable) and the CPUs a CPU-only process may use. The capture
agent (app/capture, in serving images without the service's dependencies) and the worker (workers/) share it, so
app never imports workers."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
from pathlib import Path


def aiter_package_dir() -> Path | None:
    try:
        spec = importlib.util.find_spec("aiter")
    except (ImportError, ValueError):
        return None
    return Path(spec.origin).resolve().parent if spec and spec.origin else None


def aiter_version(pkg: Path) -> str | None:
    v = pkg / "_version.py"
    if v.exists():
        m = re.search(r"""__version__\s*=\s*['"]([^'"]+)['"]""", v.read_text())
        if m:
            return m.group(1)
    try:
        from importlib.metadata import version
        return version("amd-aiter")
    except Exception:
        return None


def aiter_commit(pkg: Path) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(pkg.parent), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def flydsl_available() -> bool:
    """AITER's own answer where its flydsl helper imports (flydsl present, new enough, and the arch known:
    aiter/ops/flydsl/utils.py is_flydsl_available), else whether the flydsl package is there at all."""
    try:
        from aiter.ops.flydsl.utils import is_flydsl_available  # type: ignore[import-not-found]
        return bool(is_flydsl_available())
    except Exception:  # noqa: BLE001  no aiter, or its import needs a GPU: fall back to the package
        try:
            return importlib.util.find_spec("flydsl") is not None
        except (ImportError, ValueError):
            return False


def installed_aiter_version() -> str | None:
    """The version of the AITER this process would import: its package's _version.py, else amd-aiter's metadata."""
    pkg = aiter_package_dir()
    if pkg is not None:
        return aiter_version(pkg)
    try:
        from importlib.metadata import version
        return version("amd-aiter")
    except Exception:
        return None


def cpu_count() -> int:
    """The CPUs this process may run on, as `nproc` prints them (a container's share, not the host's)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
