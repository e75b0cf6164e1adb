"""A stand-in for a served image (vLLM's or SGLang's), built locally without a registry or network: a rootfs of
this machine's own Python (the interpreter the tests run on, its standard library and the shared libraries it
links), pydantic and httpx with their dependencies (what vLLM images carry and the worker needs from the image),
and a stand-in AITER tree at /opt/aiter whose bf16 tuner is tests/fixtures/stub_tuner.py, reading rows from a
table stamped for this machine's CPU identity. No torch and no pip: the pool installs the worker from its
wheelhouse. `docker import` of the tar: seconds, no Dockerfile, no base image to pull. An image with the same
contents (tag = their hash) is reused: built once per machine and run, whichever test asks first.
"""

from __future__ import annotations

import csv
import hashlib
import importlib.metadata as md
import io
import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

from tests.conftest import ROOT
from workers.identity import cpu_count

REPO = "aiter-tuner-standin"
AITER = "/opt/aiter"
STUB_SOURCE = f"{AITER}/bf16_tuned_gemm.csv"
IMAGE_PACKAGES = ("pydantic", "httpx")  # what the served image brings (vLLM's do); the rest comes from wheels
SKIP_STDLIB = {"test", "idlelib", "tkinter", "turtledemo", "site-packages", "dist-packages", "ensurepip",
               "lib2to3", "pydoc_data"}
SOURCE_TABLE = ROOT / "tests" / "fixtures" / "aiter" / "configs" / "bf16_tuned_gemm.csv"
SHAPE_COLUMNS = ("M", "N", "K", "bias", "dtype", "outdtype", "scaleAB", "bpreshuffle")  # bf16_gemm's untuned header


def stub_rows(n: int | None = None) -> list[dict[str, str]]:
    """The stand-in tuner's answers: AITER's shipped bf16 rows (one gfx/cu_num, distinct shapes) restamped for this
    CPU (gfx cpu, cu_num = its CPUs, as workers/identity.py names it) and slowed 1000x, past a CPU's roofline."""
    rows, seen = [], set()
    for r in csv.DictReader(open(SOURCE_TABLE)):
        key = tuple(r[c].strip() for c in SHAPE_COLUMNS)
        if key in seen:
            continue
        seen.add(key)
        rows.append({**r, "gfx": "cpu", "cu_num": str(cpu_count()), "us": f"{float(r['us']) * 1000:.4f}",
                     "tflops": f"{float(r['tflops']) / 1000:.6f}", "bw": f"{float(r['bw']) / 1000:.6f}"})
    return rows[:n]


def shapes(n: int) -> list[dict[str, str]]:
    """A capture's shapes the stand-in tuner has rows for."""
    return [{c: r[c].strip() for c in SHAPE_COLUMNS} for r in stub_rows(n)]


def write_stub_tree(root: Path) -> Path:
    """The stand-in AITER tree at root (its bf16 tuner script and the rows it answers from), for a worker on the
    host (the Slurm test); returns the STUB_SOURCE table."""
    script = root / "csrc" / "gemm_a16w16" / "gemm_a16w16_tune.py"
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text((ROOT / "tests" / "fixtures" / "stub_tuner.py").read_text())
    rows = stub_rows()
    with open(root / "bf16_tuned_gemm.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]), lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
    return root / "bf16_tuned_gemm.csv"


def _base_paths() -> dict[str, str]:
    """The base interpreter (not this venv): its executable, standard library and site-packages."""
    exe = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    out = subprocess.run([exe, "-I", "-c", "import sysconfig, sys, json; p = sysconfig.get_paths(); print(json.dumps("
                          "{'stdlib': p['stdlib'], 'platstdlib': p['platstdlib'], 'purelib': p['purelib']}))"],
                         check=True, capture_output=True, text=True).stdout
    return {"exe": exe, **json.loads(out)}


def _closure(names: tuple[str, ...]) -> list[md.Distribution]:
    """These distributions and what they require (no extras), as installed here."""
    seen: dict[str, md.Distribution] = {}
    todo = list(names)
    while todo:
        name = re.split(r"[ ;<>=!~\[(]", todo.pop(), maxsplit=1)[0].lower().replace("_", "-")
        if name in seen:
            continue
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue
        seen[name] = dist
        for req in dist.requires or []:
            marker = req.partition(";")[2]
            if "extra" in marker:
                continue
            if marker.strip():
                from packaging.markers import Marker
                if not Marker(marker).evaluate():
                    continue
            todo.append(req)
    return list(seen.values())


def _libs(files: list[str]) -> set[str]:
    """The shared libraries these ELF files load (ldd), the dynamic loader included."""
    libs: set[str] = set()
    for chunk in range(0, len(files), 200):
        out = subprocess.run(["ldd", *files[chunk:chunk + 200]], capture_output=True, text=True).stdout
        libs |= set(re.findall(r"(/\S+) \(0x", out))
    return libs


class _Tar:
    def __init__(self) -> None:
        self.buf = io.BytesIO()
        self.tar = tarfile.open(fileobj=self.buf, mode="w")
        self.names: set[str] = set()

    def _dirs(self, path: str) -> None:
        parts = Path(path).parts[1:-1]
        for i in range(1, len(parts) + 1):
            d = "/".join(parts[:i])
            if d not in self.names:
                self.names.add(d)
                info = tarfile.TarInfo(d)
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                self.tar.addfile(info)

    def path(self, src: str, dest: str | None = None) -> None:
        """A file or symlink of this machine at the same path (or dest); a symlink's target comes along."""
        dest = dest or src
        name = dest.lstrip("/")
        if name in self.names or not os.path.lexists(src):
            return
        self._dirs(dest)
        self.names.add(name)
        if os.path.islink(src):
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, os.readlink(src)
            self.tar.addfile(info)
            target = os.path.join(os.path.dirname(src), os.readlink(src))
            self.path(os.path.normpath(target))
            return
        self.tar.add(src, arcname=name, recursive=False)

    def data(self, dest: str, data: bytes, mode: int = 0o644) -> None:
        self._dirs(dest)
        info = tarfile.TarInfo(dest.lstrip("/"))
        info.size, info.mode = len(data), mode
        self.names.add(info.name)
        self.tar.addfile(info, io.BytesIO(data))

    def dir(self, dest: str, mode: int) -> None:
        """A directory of its own mode (before anything is put under it)."""
        name = dest.lstrip("/")
        assert name not in self.names, name
        self.names.add(name)
        info = tarfile.TarInfo(name)
        info.type, info.mode = tarfile.DIRTYPE, mode
        self.tar.addfile(info)

    def bytes(self) -> bytes:
        self.tar.close()
        return self.buf.getvalue()


def rootfs() -> tuple[bytes, str]:
    """(the rootfs tar, the interpreter's path in it)."""
    base = _base_paths()
    t = _Tar()
    t.dir("/tmp", 0o1777)
    t.dir("/root", 0o755)  # HOME (the worker's spool); the pyenv interpreter may live under it too
    elves = [base["exe"]]
    t.path(base["exe"])
    for stdlib in dict.fromkeys((base["stdlib"], base["platstdlib"])):
        for dirpath, dirnames, filenames in os.walk(stdlib):
            if dirpath == stdlib:
                dirnames[:] = [d for d in dirnames if d not in SKIP_STDLIB and not d.startswith("config-")]
            for f in filenames:
                p = os.path.join(dirpath, f)
                t.path(p)
                if f.endswith(".so"):
                    elves.append(p)
    for dist in _closure(IMAGE_PACKAGES):
        for f in dist.files or []:
            src = str(dist.locate_file(f))
            if ".." in f.parts or not os.path.isfile(src):
                continue
            dest = os.path.join(base["purelib"], str(f))
            t.path(src, dest)
            if src.endswith(".so"):
                elves.append(src)
    for lib in sorted(_libs(elves)):
        t.path(lib)
    t.path(base["exe"], "/usr/local/bin/python3") if base["exe"] != "/usr/local/bin/python3" else None
    t.data(f"{AITER}/csrc/gemm_a16w16/gemm_a16w16_tune.py", (ROOT / "tests/fixtures/stub_tuner.py").read_bytes())
    rows = stub_rows()
    out = io.StringIO()
    w = csv.DictWriter(out, fieldnames=list(rows[0]), lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    t.data(STUB_SOURCE, out.getvalue().encode())
    return t.bytes(), base["exe"]


def build(log: list[str] | None = None) -> tuple[str, str]:
    """(tag, image Id) of the stand-in image: reused when one with these contents exists."""
    data, exe = rootfs()
    tag = f"{REPO}:{hashlib.sha256(data).hexdigest()[:16]}"
    have = subprocess.run(["docker", "image", "inspect", "--format", "{{.Id}}", tag], capture_output=True, text=True)
    if have.returncode == 0:
        return tag, have.stdout.strip()
    changes = ["ENV PATH=/usr/local/bin:/usr/bin:/bin", "ENV HOME=/root", f"ENV AITER_ROOT={AITER}",
               f"ENV STUB_SOURCE={STUB_SOURCE}", f'CMD ["{exe}"]']
    args = ["docker", "import"] + [a for c in changes for a in ("--change", c)] + ["-", tag]
    subprocess.run(args, input=data, check=True, capture_output=True)
    image_id = subprocess.run(["docker", "image", "inspect", "--format", "{{.Id}}", tag], check=True,
                              capture_output=True, text=True).stdout.strip()
    if log is not None:
        log.append(f"built {tag} ({len(data) / 2**20:.0f} MiB rootfs)")
    return tag, image_id
