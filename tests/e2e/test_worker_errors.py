"""A worker ends at once, non-zero, with a one-line reason on a permanent error (issue 33): a missing, unknown or
wrong-role token, a malformed --image-digest, a --service URL without http(s)://, an unreadable token file. Only
transient errors are retried, and a worker waiting on a dead service says so periodically. A real service
process over HTTP; the worker is the installed console script (aiter-tuner-worker), without --once unless said."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import DIGEST, ROOT, free_port, start_server, wait_for

pytestmark = pytest.mark.e2e

WORKER = str(Path(sys.executable).with_name("aiter-tuner-worker"))
PERMANENT_S = 10.0  # issue 33: a permanent error ends the worker within this


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("worker-errors")
    srv = start_server(f"sqlite:///{tmp / 'tuner.db'}", tmp / "server.log")
    yield srv
    srv.proc.terminate()
    srv.proc.wait(timeout=30)


def worker(*args: str, env: dict[str, str] | None = None, spool: Path) -> subprocess.Popen:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TUNER_")}
    return subprocess.Popen([WORKER, "--backend", "aiter", "--poll-s", "0.2", "--spool-dir", str(spool), *args],
                            cwd=ROOT, env={**clean, "PYTHONUNBUFFERED": "1", **(env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def ends(proc: subprocess.Popen) -> tuple[int, str, float]:
    """(exit code, stderr, seconds from start to exit); a worker still running after PERMANENT_S fails."""
    t0 = time.monotonic()
    try:
        out, err = proc.communicate(timeout=60)  # the bound is checked below; this only guards a hang
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"the worker did not stop on a permanent error:\n{err[-3000:]}") from None
    return proc.returncode, err, time.monotonic() - t0


def reason(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.startswith("aiter-tuner-worker: error:")]
    assert len(lines) == 1, err[-3000:]
    return lines[0]


@pytest.mark.parametrize("case", ["missing", "unknown", "wrong role", "wrong image"])
def test_a_missing_or_refused_token_ends_the_worker_at_once(server, tmp_path, case):
    token = {"missing": None, "unknown": "atk_not-a-token", "wrong role": server.token("capture", "cap"),
             "wrong image": server.token("worker", "other", "sha256:" + "cd" * 32)}[case]
    env = {"TUNER_TOKEN": token} if token else {}
    t0 = time.monotonic()
    code, err, _ = ends(worker("--service", server.url, "--image-digest", DIGEST, env=env, spool=tmp_path))
    took = time.monotonic() - t0
    line = reason(err)
    assert code == 3, err[-3000:]
    if case in ("missing", "unknown"):
        assert "answered 401" in line and "token is missing or refused" in line, line
    else:
        assert "answered 403" in line and "token is not allowed" in line, line
    assert took < PERMANENT_S, f"took {took:.1f} s: {line}"


def test_a_token_file_is_read_and_a_bad_one_is_named(server, tmp_path):
    tok = tmp_path / "token"
    tok.write_text(server.token("worker", "from-file", DIGEST) + "\n")
    # --once, nothing queued for this identity: exits 0, having leased with the file's token (a 401 would exit 3)
    for how in (["--token-file", str(tok)], []):
        code, err, _ = ends(worker("--service", server.url, "--image-digest", DIGEST, "--once", *how,
                                   env={} if how else {"TUNER_TOKEN_FILE": str(tok)}, spool=tmp_path))
        assert code == 0, err[-3000:]
    for bad, why in ((tmp_path / "absent", "No such file"), (tmp_path / "empty", "is empty")):
        if bad.name == "empty":
            bad.write_text("\n")
        code, err, took = ends(worker("--service", server.url, "--image-digest", DIGEST, "--token-file", str(bad),
                                      spool=tmp_path))
        line = reason(err)
        assert code == 2 and "--token-file" in line and str(bad) in line and why in line, line


@pytest.mark.parametrize("args, flag", [
    (["--service", "127.0.0.1:8000", "--image-digest", DIGEST], "--service (TUNER_SERVICE_URL)"),
    (["--service", "http://127.0.0.1:9", "--image-digest", "sha256:abc"], "--image-digest (TUNER_IMAGE_DIGEST)"),
    (["--service", "http://127.0.0.1:9", "--image-digest", DIGEST.upper()], "--image-digest (TUNER_IMAGE_DIGEST)"),
])
def test_bad_settings_end_the_worker_naming_the_flag(tmp_path, args, flag):
    code, err, took = ends(worker(*args, env={"TUNER_TOKEN": "atk_x"}, spool=tmp_path))
    line = reason(err)
    assert code == 2 and flag in line and "Traceback" not in err, err[-3000:]
    assert took < PERMANENT_S


def test_a_dead_service_is_retried_and_reported_periodically(tmp_path):
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens: connection refused, a transient error
    proc = worker("--service", url, "--image-digest", DIGEST, "--once", "--outage-log-s", "1",
                  env={"TUNER_TOKEN": "atk_x"}, spool=tmp_path)
    err: list[str] = []
    line = re.compile(rf"service at {re.escape(url)} unreachable for (\d+) s: ConnectError: .*; retrying")

    def reports() -> list[int]:
        return [int(n) for n in line.findall("".join(err))]
    import threading
    reader = threading.Thread(target=lambda: err.extend(iter(proc.stderr.readline, "")), daemon=True)
    reader.start()
    try:
        # still retrying (even with --once) and saying so, with the outage's length growing
        seen = wait_for(lambda: (r := reports()) and len(r) >= 3 and r[-1] > r[0] and r, timeout=120, every=0.2)
        assert proc.poll() is None, "".join(err)[-3000:]
        proc.send_signal(signal.SIGTERM)  # a stop ends the wait: exit 0, nothing was leased
        assert proc.wait(timeout=60) == 0, "".join(err)[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert seen[0] == 0, seen


def test_429_is_waited_out_not_refused(tmp_path):
    """A 429 (a proxy's rate limit) is transient: retried with backoff, honouring Retry-After."""
    import http.server
    import threading

    from workers.client import ServiceClient
    calls = []

    class H(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            calls.append(1)
            self.send_response(429 if len(calls) < 3 else 204)
            self.send_header("Retry-After", "0.1")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *a):  # type: ignore[no-untyped-def]
            pass
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        c = ServiceClient(f"http://127.0.0.1:{srv.server_address[1]}", backoff_cap_s=0.2)
        body = {"worker_id": "w", "image_digest": DIGEST, "gfx": "cpu", "cu_num": 2, "backends": ["aiter"],
                "families": ["bf16_gemm"], "budget_s": 30, "host": "h"}
        assert c.lease(body) is None and len(calls) == 3 and c.retries == 2
    finally:
        srv.shutdown()


def _catches_sigterm(pid: int) -> bool:
    status = Path(f"/proc/{pid}/status").read_text()
    return bool(int(re.search(r"^SigCgt:\s*([0-9a-f]+)", status, re.M).group(1), 16) & (1 << (signal.SIGTERM - 1)))


def test_sigterm_is_held_before_the_heavy_imports(tmp_path):
    """A worker stopped while it starts (a pool stopped, a pod deleted, scancel: tests/e2e/test_chaos.py's final
    SIGTERM once met a worker restarted a moment before) exits 0, not -15: the handler is installed before torch
    is imported (torch's import takes seconds on a loaded machine: the window the signal used to kill in)."""
    proc = worker("--service", f"http://127.0.0.1:{free_port()}", "--image-digest", DIGEST, "--backend", "torch",
                  env={"TUNER_TOKEN": "atk_x"}, spool=tmp_path)
    try:
        wait_for(lambda: proc.poll() is not None or _catches_sigterm(proc.pid), timeout=120, every=0.002)
        torch_loaded = "libtorch" in Path(f"/proc/{proc.pid}/maps").read_text()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not torch_loaded, "SIGTERM was held only after torch was imported"
    assert code == 0, proc.stderr.read()[-3000:]
