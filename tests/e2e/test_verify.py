"""Post-deploy verification in the image: the worker replays the overlay with the tuner's --run_config."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from tests.conftest import console_script, DIGEST, ROOT
from tests.integration.test_leasing_api import ok_row

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def _aiter_root(tmp_path):
    d = tmp_path / "aiter" / "csrc" / "gemm_a16w16"
    d.mkdir(parents=True)
    (d / "gemm_a16w16_tune.py").write_text((FIXTURES / "stub_tuner.py").read_text())
    return tmp_path / "aiter"


def _tuned_campaign(c):
    cid = c.post("/v1/captures", json={"image_digest": DIGEST, "gfx": "gfx942", "cu_num": 304, "family": "bf16_gemm",
                                       "shapes": [{"M": 1, "N": 1280, "K": 8192}, {"M": 8, "N": 1280, "K": 8192}]}
                 ).json()["campaign_id"]
    body = c.post("/v1/leases", json={"worker_id": "t", "image_digest": DIGEST, "gfx": "gfx942", "cu_num": 304,
                                      "backends": ["aiter"], "budget_s": 600}).json()
    for item in body["shapes"]:
        assert c.post(f"/v1/leases/{body['lease_id']}/results", json=ok_row(body, item)).status_code == 200
    return cid


def run_verify(live_server, root, rc):
    env = dict(os.environ, TUNER_TOKEN=live_server.token("worker", "verifier", DIGEST), STUB_RUN_RC=str(rc))
    return subprocess.run([console_script("aiter-tuner"), "verify", "--service", live_server.url, "--image-digest",
                           DIGEST, "--family", "bf16_gemm", "--aiter-root", str(root), "--worker-id", "gpu0"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def test_replay_result_is_stored_and_shown(live_server, tmp_path):
    c = live_server.client()
    cid = _tuned_campaign(c)
    root = _aiter_root(tmp_path)
    ok = run_verify(live_server, root, 0)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert json.loads(ok.stdout.strip().splitlines()[-1])["rows"] == 2
    bad = run_verify(live_server, root, 1)
    assert bad.returncode == 1
    runs = c.get(f"/v1/overlays/{DIGEST}/bf16_gemm/verifications").json()
    assert [r["passed"] for r in runs] == [False, True]
    assert "--run_config" in runs[0]["command"] and "[run_config] M=1" in runs[1]["output_tail"]
    page = c.get(f"/campaigns/{cid}").text
    assert "FAILED" in page and "2 rows replayed by gpu0" in page
