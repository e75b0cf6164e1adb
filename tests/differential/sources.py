"""Where the differential tests find AITER: the current release through tests/conftest.py's one setting
(TUNER_AITER_SRC, ../shared/aiter-src, tests/fixtures/aiter/src, pinned download), the older release from its wheel on the registry."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.conftest import OLD_AITER, ROOT, aiter_src as _conftest_aiter_src

_WANTED_META = ("aiter_meta/csrc/include/", "aiter_meta/csrc/py_itfs_cu/gemm_common.cu",
                "aiter_meta/csrc/ck_gemm_a8w8/gemm_a8w8.cu")


def aiter_src() -> Path | None:
    try:
        return _conftest_aiter_src()
    except pytest.skip.Exception:
        return None


def old_release_tree() -> Path | None:
    """The amd-aiter 0.1.7 wheel's aiter/ Python and configs and the csrc files the lookups need, unpacked once
    into .cache/ (the wheel itself is not kept). None where the registry cannot be reached."""
    dest = ROOT / ".cache" / (OLD_AITER.replace("==", "-") + "-src")
    if (dest / "aiter" / "jit" / "core.py").exists():
        return dest
    wheels = dest.with_name(dest.name + "-wheel")
    try:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(wheels), OLD_AITER],
                       check=True, capture_output=True, timeout=600)
    except (subprocess.SubprocessError, OSError):
        return None
    (whl,) = wheels.glob("*.whl")
    tmp = dest.with_name(dest.name + ".part")
    with zipfile.ZipFile(whl) as z:
        for name in z.namelist():
            if (name.startswith("aiter/") and (name.endswith(".py") or name.startswith("aiter/configs/"))
                    and "__pycache__" not in name) or name.startswith(_WANTED_META):
                z.extract(name, tmp)
    for w in wheels.glob("*.whl"):
        w.unlink()
    tmp.rename(dest)
    return dest
