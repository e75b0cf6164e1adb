"""The capture agent installs and runs without the service's dependencies."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib

from tests.conftest import ROOT

AGENT = ROOT / "tests" / "fixtures" / "light_capture.py"


def test_the_base_install_is_httpx_and_pydantic_only():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = {re.split(r"[<>=\[ ;]", d, maxsplit=1)[0].lower() for d in project["dependencies"]}
    assert names == {"httpx", "pydantic"}
    server = " ".join(project["optional-dependencies"]["server"])
    assert all(m in server for m in ("fastapi", "sqlalchemy", "alembic", "uvicorn"))


def test_capture_imports_nothing_of_the_service_stack():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, str(AGENT), "capture", "--help"], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0 and "--metrics-url" in r.stdout, r.stderr
    # and the blocker works: serve on the same path fails on the first server import
    r = subprocess.run([sys.executable, str(AGENT), "serve", "--port", "1"], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and "server extra" in r.stderr
