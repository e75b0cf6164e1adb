"""/healthz reflects whether the database takes writes (issue 35: it said 200 while every write answered 503 on a
full disk). A real server process on a SQLite file on a tiny filesystem of its own (a 4 MiB tmpfs), filled to the
last byte: writes answer 503, and so does /healthz, with the reason; freed, a write commits and /healthz is 200."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.conftest import start_server


@pytest.fixture
def tiny_fs(tmp_path):  # type: ignore[no-untyped-def]
    mnt = tmp_path / "fs"
    mnt.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if done.returncode:
        pytest.skip(f"!!!!! cannot mount a tmpfs here (needs root or CAP_SYS_ADMIN): {done.stderr.strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def fill(mnt: Path) -> Path:
    """Every free byte of the filesystem taken by one file."""
    filler = mnt / "filler"
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 65536)
        except OSError:
            pass
        try:  # the last partial block
            while True:
                f.write(b"\0" * 512)
        except OSError:
            pass
    return filler


def capture(c, lo: int, n: int):  # type: ignore[no-untyped-def]
    return c.post("/v1/captures", json={"image_digest": "sha256:" + "ab" * 32, "gfx": "gfx942", "cu_num": 304,
                                        "family": "bf16_gemm", "shapes": [{"M": m, "N": 64, "K": 64}
                                                                          for m in range(lo, lo + n)]})


def test_healthz_is_503_with_the_reason_while_the_disk_is_full_and_200_once_a_write_commits(tiny_fs, tmp_path):
    srv = start_server(f"sqlite:///{tiny_fs / 'tuner.db'}", tmp_path / "server.log",
                       {"TUNER_HEALTH_WRITE_HOLD_S": "3600"})  # no probe of its own: the failure decides
    try:
        with srv.client() as c:
            assert c.get("/healthz").status_code == 200
            assert capture(c, 1, 100).status_code == 201
            filler = fill(tiny_fs)
            codes = []
            for lo in range(1000, 200_000, 3000):  # captures until one needs space the disk has no more of
                r = capture(c, lo, 3000)
                codes.append(r.status_code)
                if r.status_code == 503:
                    break
            assert codes[-1] == 503 and set(codes) <= {201, 503}, codes
            h = c.get("/healthz")
            assert h.status_code == 503 and "full" in h.json()["detail"], h.text
            assert capture(c, 300_000, 3000).status_code == 503  # writes still fail, health still says so
            assert c.get("/healthz").status_code == 503
            filler.unlink()
            assert capture(c, 400_000, 50).status_code == 201  # a write commits: the database takes writes again
            assert c.get("/healthz").status_code == 200
    finally:
        srv.proc.terminate()
        srv.proc.wait(timeout=30)
