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


def test_the_console_scripts_work_where_the_directory_holds_its_own_app_package(tmp_path):
    """`python -m workers` puts the working directory first on sys.path, so a directory holding its own `app`
    package (any FastAPI project) shadows ours; the console scripts the docs and tests use do not."""
    from tests.conftest import WORKER, console_script
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "__init__.py").write_text("raise ImportError('a project of its own')\n")
    shadowed = subprocess.run([sys.executable, "-m", "workers", "--help"], cwd=tmp_path, capture_output=True,
                              text=True, timeout=120)
    assert shadowed.returncode != 0 and "a project of its own" in shadowed.stderr  # why the docs stopped using it
    for argv in ([*WORKER, "--help"], [console_script("aiter-tuner"), "verify", "--help"]):
        r = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0 and "usage:" in r.stdout, (argv, r.stderr)
