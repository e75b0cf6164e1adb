"""Schemathesis against the running server, for every role (and none): 0 server errors and 0 responses that
break the OpenAPI document, with bounded examples per operation. Figures are printed."""

from __future__ import annotations

import re
import subprocess
import sys

import httpx
import pytest

from tests.conftest import ADMIN, DIGEST, ROOT, start_server

pytestmark = pytest.mark.e2e
EXAMPLES = 5  # per operation and phase: bounded, so the run stays ~20 s a role on a 2-core box


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fuzz")
    srv = start_server(f"sqlite:///{tmp / 'fuzz.db'}", tmp / "server.log", {"TUNER_READ_OPEN": "false"})
    with srv.client() as c:  # something to read, lease and report on
        r = c.post("/v1/captures", json={"image_digest": DIGEST, "gfx": "gfx942", "cu_num": 304,
                                         "family": "bf16_gemm",
                                         "shapes": [{"M": m, "N": 64, "K": 64} for m in range(1, 30)]})
        assert r.status_code == 201, r.text
        # the document, fetched once: fuzzing as admin may revoke any token, the bootstrap admin's included
        srv.schema = ROOT / ".cache" / "fuzz-openapi.json"
        srv.schema.parent.mkdir(exist_ok=True)
        srv.schema.write_text(c.get("/openapi.json").text)
    yield srv
    srv.proc.terminate()
    srv.proc.wait()


def fuzz(url: str, schema, token: str | None) -> tuple[int, str]:  # type: ignore[no-untyped-def]
    args = [sys.executable, "-m", "schemathesis.cli", "run", str(schema), "--url", url, "-n", str(EXAMPLES),
            "--checks", "not_a_server_error,response_schema_conformance", "--phases", "examples,coverage,fuzzing",
            "--seed", "1", "--no-shrink", "--continue-on-failure", "--max-failures", "50",
            "--request-timeout", "20", "--warnings", "off"]
    if token:
        args += ["-H", f"Authorization: Bearer {token}"]
    out = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=600)
    return out.returncode, out.stdout + out.stderr


@pytest.mark.parametrize("role", ["anonymous", "read", "capture", "worker", "admin"])  # admin last: it may revoke
def test_no_server_error_and_no_schema_violation_for_any_role(server, role):
    token = ADMIN if role == "admin" else None if role == "anonymous" else server.token(role, f"fuzz-{role}")
    rc, out = fuzz(server.url, server.schema, token)
    cases = re.search(r"(\d+) generated", out)
    reader = server.token("read", f"metrics-after-{role}")  # made now: the fuzzing may have revoked others
    metrics = httpx.get(server.url + "/metrics", headers={"Authorization": f"Bearer {reader}"}).text
    assert "aiter_tuner_request_seconds_count" in metrics
    five = sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
               if line.startswith("aiter_tuner_request_seconds_count{") and re.search(r'status="5\d\d"', line))
    print(f"fuzz {role}: {cases.group(1) if cases else '?'} requests, server 5xx so far: {five:.0f}, rc {rc}")
    assert rc == 0 and five == 0, out[-6000:]
