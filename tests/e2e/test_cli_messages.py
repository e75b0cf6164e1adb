"""The CLI says what went wrong instead of a traceback or silence (issue 33): `example-capture` with a wrong
token or against a dead server, through a real server process and a port nobody listens on."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT, free_port

pytestmark = pytest.mark.e2e


def example(service: str, *extra: str, token: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TUNER_TOKEN"}
    if token is not None:
        env["TUNER_TOKEN"] = token
    return subprocess.run([sys.executable, "-m", "app.cli", "example-capture", "--service", service, *extra],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def test_a_wrong_token_is_a_message_naming_the_refusal(live_server):
    r = example(live_server.url, token="wrong-token")
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert f"POST {live_server.url}/v1/captures answered 401" in r.stderr
    assert "--token or TUNER_TOKEN" in r.stderr
    with live_server.client() as c:  # nothing stored
        assert c.get("/v1/campaigns").json() == []


def test_a_dead_server_is_a_message_naming_it(tmp_path):
    dead = f"http://127.0.0.1:{free_port()}"
    r = example(dead, "--wait-s", "1")
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert f"could not reach the service at {dead}" in r.stderr and "within 1 s" in r.stderr
