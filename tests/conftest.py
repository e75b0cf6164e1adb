"""Shared fixtures: AITER's real tables, a real database per test, the app over HTTP, a live server."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[1]
# AITER's shipped tables (ROCm/aiter e4048607a5, MIT: tests/fixtures/aiter/LICENSE), big ones cut to their first
# rows (tests/fixtures/aiter/SOURCES.csv); TUNER_AITER_CONFIGS=<an aiter/configs folder> runs against full tables.
CONFIGS = Path(os.environ.get("TUNER_AITER_CONFIGS", ROOT / "tests" / "fixtures" / "aiter" / "configs"))
AITER_COMMIT = "e4048607a535ace3a2b51ded31b1c8c2d45c0879"  # the commit the fixtures and ../shared/aiter-src are from
DIGEST = "sha256:" + "ab" * 32
OTHER_DIGEST = "sha256:" + "cd" * 32
PG_URL = os.environ.get("TUNER_TEST_PG_URL")
ADMIN = "atk_test-admin-token"  # TUNER_ADMIN_TOKEN of the servers the tests start  # a PostgreSQL server to test against as well


def configs_dir() -> Path:
    """AITER's aiter/configs folder the tests read (fixtures unless TUNER_AITER_CONFIGS says otherwise)."""
    return CONFIGS


_AITER_SRC_MISSING: list[str] = []  # why AITER's sources are absent, for the loud line in the terminal summary


def _download_aiter_src(dest: Path) -> None:
    """ROCm/aiter at AITER_COMMIT from GitHub, only its aiter/ and csrc/ folders (the paths ../shared/aiter-src has)."""
    import io
    import tarfile
    url = f"https://codeload.github.com/ROCm/aiter/tar.gz/{AITER_COMMIT}"
    data = httpx.get(url, timeout=httpx.Timeout(120, connect=10), follow_redirects=True).raise_for_status().content
    tmp = dest.with_name(dest.name + ".part")
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for m in tar.getmembers():
            rel = m.name.split("/", 1)[-1]
            if (m.isfile() or m.isdir()) and rel.split("/", 1)[0] in ("aiter", "csrc", "LICENSE"):
                m.name = rel
                tar.extract(m, tmp, filter="data")
    tmp.rename(dest)


def _downloaded(what: str) -> Path:
    """The pinned download in .cache/, fetched once per session; a failure is kept for the loud summary line."""
    cached = ROOT / ".cache" / f"aiter-src-{AITER_COMMIT[:10]}"
    if not cached.is_dir() and not _AITER_SRC_MISSING:
        try:
            _download_aiter_src(cached)
        except Exception as e:  # noqa: BLE001 - any failure means: no sources, skip loudly
            _AITER_SRC_MISSING.append(f"{what}{type(e).__name__}: {e}")
    return cached


VENDORED_SRC = ROOT / "tests" / "fixtures" / "aiter" / "src"  # the files of AITER_COMMIT the tests read (SOURCES.csv)


def _local_trees() -> list[Path]:
    """AITER's sources at hand, in order: TUNER_AITER_SRC, ../shared/aiter-src beside the checkout, the vendored
    copy in tests/fixtures/aiter/src (every file these tests read, so a fresh clone needs no network)."""
    if os.environ.get("TUNER_AITER_SRC"):
        return [Path(os.environ["TUNER_AITER_SRC"])]
    shared = ROOT.parent / "shared" / "aiter-src"
    return [t for t in (shared, VENDORED_SRC) if t.is_dir()]


def aiter_src() -> Path:
    """AITER's own sources for differential tests: the first of _local_trees(), else a download of ROCm/aiter at
    AITER_COMMIT cached in .cache/ (a last resort: the vendored copy makes it unneeded). Skips the calling test
    (and says so in the terminal summary) when none of these is there."""
    if trees := _local_trees():
        return trees[0]
    cached = _downloaded("")
    if not cached.is_dir():
        pytest.skip(f"AITER's sources not found (TUNER_AITER_SRC, ../shared/aiter-src, {VENDORED_SRC}, download: "
                    f"{_AITER_SRC_MISSING[0]})")
    return cached


def aiter_tree_with(*rels: str) -> Path:
    """AITER's sources holding the files rels: the first of _local_trees() that has them all (../shared/aiter-src
    carries only part of the tree), else the download of the same pinned commit. Skips loudly, as aiter_src()
    does, when none has them."""
    trees = _local_trees()
    for src in trees:
        if all((src / r).exists() for r in rels):
            return src
    cached = _downloaded(f"{', '.join(rels)}: ")
    if all((cached / r).exists() for r in rels):
        return cached
    if not _AITER_SRC_MISSING:
        _AITER_SRC_MISSING.append(f"{', '.join(rels)} not in {', '.join(map(str, trees))} nor in {cached}")
    pytest.skip(f"AITER's sources not found: {', '.join(rels)} ({_AITER_SRC_MISSING[0]})")


@pytest.fixture(scope="session")
def aiter_src_dir() -> Path:
    return aiter_src()


def pytest_terminal_summary(terminalreporter):
    """One loud line whenever AITER's sources were asked for and not found (tests skipped, or differential
    tests run on fewer releases), never a silent pass."""
    if not _AITER_SRC_MISSING:
        return
    skipped = [r for r in terminalreporter.stats.get("skipped", []) if "AITER's sources not found" in str(r.longrepr)]
    terminalreporter.write_line(
        f"!!!!! AITER's sources not found ({_AITER_SRC_MISSING[0]}): {len(skipped)} tests SKIPPED, differential "
        f"tests ran without the current release (or without the families whose lookup files are missing). "
        f"Set TUNER_AITER_SRC=<a ROCm/aiter checkout at {AITER_COMMIT[:10]}>, or restore {VENDORED_SRC} "
        f"(SOURCES.csv there).", red=True, bold=True)


def console_script(name: str) -> str:
    """One of this install's console scripts (aiter-tuner, aiter-tuner-worker), beside the Python running the
    tests: never `python -m workers`, which imports whatever `app` package the working directory holds."""
    path = Path(sys.executable).parent / name
    assert path.exists(), f"{path}: the project is not installed in this environment (pip install -e '.[dev]')"
    return str(path)


WORKER = [console_script("aiter-tuner-worker")]


def engines() -> list[str]:
    return ["sqlite", "postgresql"] if PG_URL else ["sqlite"]


def _pg_database() -> str:
    """A fresh database on the test server, so tests never share state."""
    import psycopg
    name = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return PG_URL.rsplit("/", 1)[0] + "/" + name


@pytest.fixture(params=engines())
def db_url(request, tmp_path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'tuner.db'}"
    return _pg_database()


@pytest.fixture
def settings(db_url):
    from app.config import Settings
    # functional tests run with auth off; tests/integration/test_auth.py covers it on
    return Settings(database_url=db_url, lease_ttl_s=30, lease_grace_s=5, max_attempts=2, auth=False)


@pytest.fixture
def client(settings):
    from fastapi.testclient import TestClient

    from app.main import create_app
    with TestClient(create_app(settings)) as c:
        yield c


def wait_for(pred, timeout: float = 60.0, every: float = 0.1):  # type: ignore[no-untyped-def]
    """Poll until pred() is truthy and return its value; a state is waited for, never slept for (a fixed
    sleep is a guess at how fast a loaded machine gets there)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if v := pred():
            return v
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout} s")


def max_in_flight(recs) -> int:  # type: ignore[no-untyped-def]
    """The most requests in flight at once, from each request's own start and latency (an end before a start at a
    tie): a band's load held its concurrency when this equals it."""
    ev = sorted([(r.started_s, 1) for r in recs] + [(r.started_s + r.latency_s, -1) for r in recs])
    flight = top = 0
    for _, d in ev:
        flight += d
        top = max(top, flight)
    return top


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LiveServer:
    def __init__(self, url: str, proc: subprocess.Popen, log: Path, db_url: str):
        self.url, self.proc, self.log, self.db_url = url, proc, log, db_url

    def client(self, token: str = ADMIN) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=30, headers={"Authorization": f"Bearer {token}"})

    def token(self, role: str, name: str, *digests: str) -> str:
        """A token made with the CLI, as an operator would."""
        args = [sys.executable, "-m", "app.cli", "token", "create", "--role", role, "--name", name]
        for d in digests:
            args += ["--digest", d]
        out = subprocess.run(args, cwd=ROOT, env=dict(os.environ, DATABASE_URL=self.db_url), check=True,
                             capture_output=True, text=True).stdout
        return json.loads(out)["token"]


def spawn_server(db_url: str, log: Path, env_extra: dict[str, str] | None = None, port: int | None = None,
                 args: tuple[str, ...] = (), cwd: Path = ROOT) -> LiveServer:
    """A `serve` process started, not waited for (wait_up): several at the same instant (replicas)."""
    port = port or free_port()
    env = {**os.environ, "DATABASE_URL": db_url, "TUNER_ADMIN_TOKEN": ADMIN, **(env_extra or {})}
    out = open(log, "w")
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", "serve", "--port", str(port), *args], cwd=cwd, env=env,
                            stdout=out, stderr=subprocess.STDOUT)
    return LiveServer(f"http://127.0.0.1:{port}", proc, log, db_url)


def wait_up(srv: LiveServer, timeout: float = 60) -> LiveServer:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if srv.proc.poll() is not None:
            raise RuntimeError(f"server exited: {srv.log.read_text()[-2000:]}")
        try:
            if httpx.get(srv.url + "/healthz", timeout=2).status_code == 200:
                return srv
        except httpx.HTTPError:
            time.sleep(0.2)
    srv.proc.kill()
    raise RuntimeError("server did not come up")


def start_server(db_url: str, log: Path, env_extra: dict[str, str] | None = None, port: int | None = None,
                 args: tuple[str, ...] = (), cwd: Path = ROOT) -> LiveServer:
    """port: a restart on the port workers already use; args: more `serve` flags (--access-log); cwd: the
    checkout whose app/ it serves (a benchmark's older commit)."""
    return wait_up(spawn_server(db_url, log, env_extra, port, args, cwd))


@pytest.fixture
def live_server(db_url, tmp_path):
    srv = start_server(db_url, tmp_path / "server.log",  # every winner a row (a CPU's torch_linear mostly wins)
                       {"TUNER_LEASE_TTL_S": "6", "TUNER_LEASE_GRACE_S": "5", "TUNER_MAX_ATTEMPTS": "3",
                        "TUNER_MIN_IMPROVEMENT_PCT": "-100"})
    yield srv
    srv.proc.terminate()
    try:
        srv.proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        srv.proc.kill()


def capture(c, shapes, family="bf16_gemm", gfx="gfx942", cu_num=304, digest=DIGEST, **extra):
    body = {"image_digest": digest, "gfx": gfx, "cu_num": cu_num, "family": family, "host": "test", **extra}
    if shapes is not None:
        body["shapes"] = shapes
    return c.post("/v1/captures", json=body)


OLD_AITER = "amd-aiter==0.1.7.post2.dev18"  # a published release whose tables predate gfx/bpreshuffle columns


def old_release_package() -> Path:
    """The aiter package dir of an older published AITER release: its configs/ and _version.py, unpacked
    from the wheel on the package registry (fetched once into .cache/, never committed)."""
    import zipfile
    dest = ROOT / ".cache" / OLD_AITER.replace("==", "-")
    if not (dest / "aiter" / "configs" / "bf16_tuned_gemm.csv").exists():
        wheels = dest / "wheel"
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(wheels), OLD_AITER],
                       check=True)
        (whl,) = wheels.glob("*.whl")
        with zipfile.ZipFile(whl) as z:
            for name in z.namelist():
                if name.startswith("aiter/configs/") or name == "aiter/_version.py":
                    z.extract(name, dest)
        for w in wheels.glob("*.whl"):
            w.unlink()
    return dest / "aiter"
