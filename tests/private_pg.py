"""A PostgreSQL server of the test's own (initdb and pg_ctl in a temporary folder), for tests that kill it: the
shared test server (TUNER_TEST_PG_URL) is never touched. Skips loudly where PostgreSQL's binaries are absent."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from tests.conftest import free_port


def pg_bin() -> Path | None:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parts[-3]))
    if found:
        return found[-1].parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


class PrivatePG:
    """One server: start(), kill() (-9 of the postmaster, as an OOM killer or a crashed host does), start() again on
    the same data (crash recovery), stop()."""

    def __init__(self, bindir: Path):
        self.bin, self.port = bindir, free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="tuner-private-pg."))
        self.data = self.dir / "data"
        self.kills = 0
        self._as = ["runuser", "-u", "postgres", "--"] if os.getuid() == 0 else []
        if self._as:
            shutil.chown(self.dir, "postgres")
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres")
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, tool: str, *args: str) -> None:
        done = subprocess.run([*self._as, str(self.bin / tool), *args], capture_output=True, text=True)
        if done.returncode:
            log = self.dir / "log"
            raise RuntimeError(f"{tool} failed: {done.stdout}{done.stderr}"
                               f"{log.read_text()[-2000:] if log.exists() else ''}")

    def start(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.dir / "log"), "-w", "-t", "120", "-o",
                  f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c max_connections=400 "
                  "-c fsync=off", "start")

    def postmaster_pid(self) -> int:
        return int((self.data / "postmaster.pid").read_text().split()[0])

    def kill(self) -> None:
        """SIGKILL to the postmaster; its backends, orphaned, end when they notice (waited for: a restart needs
        their shared memory gone)."""
        pid = self.postmaster_pid()
        children = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
        os.kill(pid, signal.SIGKILL)
        self.kills += 1
        for c in children:  # a backend blocked in a query may not look for its postmaster soon: end it too
            try:
                os.kill(int(c), signal.SIGKILL)
            except ProcessLookupError:
                pass
        for p in [pid, *map(int, children)]:
            while Path(f"/proc/{p}").exists() and "Z" not in _state(p):
                time.sleep(0.05)
        # dead, maybe a zombie nobody reaps here (a container without an init): its pid still "exists" to pg_ctl
        for lock in (self.data / "postmaster.pid", self.dir / f".s.PGSQL.{self.port}.lock"):
            lock.unlink(missing_ok=True)

    def stop(self) -> None:
        try:
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "stop")
        except RuntimeError:
            pass
        shutil.rmtree(self.dir, ignore_errors=True)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return "Z"


@pytest.fixture
def private_pg():  # type: ignore[no-untyped-def]
    bindir = pg_bin()
    if bindir is None:
        pytest.skip("!!!!! PostgreSQL's binaries (initdb, pg_ctl) not found: this test needs a PostgreSQL of its own "
                    "to kill; install postgresql (scripts/test.sh does)")
    pg = PrivatePG(bindir)
    pg.start()
    yield pg
    pg.stop()
