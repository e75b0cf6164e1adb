"""A regular install of this checkout's wheel, the way a user gets one: scripts/build_dist.sh builds the sdist and
the wheel from it; a fresh venv (no editable install, no PYTHONPATH) installs the wheel with pip, run from a
folder outside the checkout so nothing is imported from it.

The heavy dependencies (torch, FastAPI, ...) are not downloaded again: the venv sees the tested environment's
packages (this interpreter's site-packages, less this project's own install) through a .pth line, and pip
resolves the wheel's declared requirements against them with --no-index, so a requirement the wheel forgot or
that the tested set does not satisfy fails the install."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import httpx

from tests.conftest import ROOT

OWN = ("aiter_tuner", "__editable__", "pip")  # this checkout's editable install, and the venv's own pip


def build(out: Path) -> tuple[Path, Path]:
    """(wheel, sdist) of this checkout, the wheel built from the sdist."""
    subprocess.run(["bash", "scripts/build_dist.sh"], cwd=ROOT, check=True, capture_output=True, text=True,
                   env=dict(os.environ, PYTHON=sys.executable, DIST=str(out)))
    (wheel,), (sdist,) = out.glob("aiter_tuner-*.whl"), out.glob("aiter_tuner-*.tar.gz")
    return wheel, sdist


def venv(dest: Path) -> Path:
    """A fresh venv at dest (with pip) that sees the tested packages; returns its bin/."""
    subprocess.run([sys.executable, "-m", "venv", str(dest)], check=True, capture_output=True)
    bin_ = dest / "bin"
    # the venv's bundled setuptools is older than what torch requires; the tested one is seen instead
    subprocess.run([str(bin_ / "python"), "-m", "pip", "uninstall", "-q", "-y", "setuptools"], check=True,
                   capture_output=True)
    farm = dest / "tested-packages"  # the tested site-packages less this project's install: links, no copies
    farm.mkdir()
    base = Path(sysconfig.get_paths()["purelib"])
    for entry in base.iterdir():
        if not entry.name.startswith(OWN) and entry.suffix != ".pth":
            (farm / entry.name).symlink_to(entry)
    site = subprocess.run([str(bin_ / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    Path(site, "tested-packages.pth").write_text(f"{farm}\n")
    return bin_


def env(bin_: Path, **extra: str) -> dict[str, str]:
    """A newcomer's shell with bin_ first on PATH: none of the test run's TUNER_*, DATABASE_URL, PYTHONPATH."""
    keep = {k: v for k, v in os.environ.items()
            if not k.startswith("TUNER_") and k not in ("DATABASE_URL", "PYTHONPATH", "VIRTUAL_ENV")}
    return dict(keep, PATH=f"{bin_}{os.pathsep}{keep.get('PATH', '')}", VIRTUAL_ENV=str(bin_.parent),
                PIP_NO_INDEX="1", **extra)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, proc: subprocess.Popen, log: Path, timeout_s: float = 240) -> None:
    """Until the service answers /healthz; fails at once (with its log) if the process exits first."""
    end = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise AssertionError(f"service exited {proc.returncode}:\n{log.read_text()[-4000:]}")
        try:
            if httpx.get(f"{url}/healthz", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > end:
            raise AssertionError(f"service not up after {timeout_s} s:\n{log.read_text()[-4000:]}")
        time.sleep(0.3)


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
