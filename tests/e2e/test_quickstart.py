"""The README's CPU quick start, run word for word by scripts/quickstart_check.sh (fresh venv, service, capture,
worker, overlay download, dashboard), in a copy of this checkout."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.e2e


@pytest.mark.timeout(1200)
def test_the_readme_quick_start_ends_with_an_overlay_downloaded(tmp_path):
    p = subprocess.run(["bash", "scripts/quickstart_check.sh"], cwd=ROOT, capture_output=True, text=True,
                       env=dict(os.environ, QUICKSTART_DIR=str(tmp_path / "qs")), timeout=1150)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-6000:]
    assert "quickstart OK: 3 shapes tuned, overlay downloaded with" in out and "torch 2.13.0+cpu" in out
