"""Demand for autoscalers through a real server process: queued shapes and estimated device seconds per worker
identity (image digest, gfx, cu_num), as JSON (GET /v1/demand) and as gauges on /metrics; a scoped token sees its
images only; the estimate moves from the default to the campaign's own measured seconds per shape."""

from __future__ import annotations

import os
import subprocess

from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import ADMIN, DIGEST, OTHER_DIGEST, ROOT, capture, console_script
from tests.integration.test_leasing_api import lease, ok_row, plausible_us

DEFAULT_COST = 30.0  # Settings.default_shape_cost_s: the estimate before any result


def gauges(text: str) -> dict[tuple[str, str, str, str], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        if fam.name in ("aiter_tuner_queued_shapes", "aiter_tuner_queued_gpu_seconds_estimate"):
            for s in fam.samples:
                out[(fam.name, s.labels["image_digest"], s.labels["gfx"], s.labels["cu_num"])] = s.value
    return out


def test_demand_per_identity_in_json_and_on_metrics_scoped_and_measured(live_server):
    admin = live_server.client()
    three = [{"M": m, "N": 1280, "K": 8192} for m in (1, 2, 4)]
    assert capture(admin, three).status_code == 201  # DIGEST gfx942/304
    assert capture(admin, three[:2], gfx="cpu", cu_num=2, digest=OTHER_DIGEST).status_code == 201
    d = admin.get("/v1/demand").json()
    ids = {(r["image_digest"], r["gfx"], r["cu_num"]): r for r in d["identities"]}
    assert set(ids) == {(DIGEST, "gfx942", 304), (OTHER_DIGEST, "cpu", 2)}
    assert ids[(DIGEST, "gfx942", 304)]["queued_shapes"] == 3
    assert ids[(DIGEST, "gfx942", 304)]["gpu_s_queued_est"] == 3 * DEFAULT_COST
    assert ids[(DIGEST, "gfx942", 304)]["families"][0]["cost_basis"].startswith("TUNER_DEFAULT_SHAPE_COST_S")
    assert d["total"] == {"queued_shapes": 5, "leased_shapes": 0, "gpu_s_queued_est": 5 * DEFAULT_COST}
    g = gauges(admin.get("/metrics").text)
    assert g[("aiter_tuner_queued_shapes", DIGEST, "gfx942", "304")] == 3
    assert g[("aiter_tuner_queued_gpu_seconds_estimate", OTHER_DIGEST, "cpu", "2")] == 2 * DEFAULT_COST

    # a filter, as a ScaledJob's metrics-api trigger asks for its own identity; a bad digest is refused
    one = admin.get("/v1/demand", params={"image_digest": DIGEST, "gfx": "gfx942", "cu_num": 304}).json()
    assert [r["image_digest"] for r in one["identities"]] == [DIGEST] and one["total"]["queued_shapes"] == 3
    bad = admin.get("/v1/demand", params={"image_digest": "sha256:nope"})
    assert bad.status_code == 422 and bad.json()["field"] == "image_digest"

    # a read token scoped to OTHER_DIGEST: its image only, in the JSON and on /metrics
    scoped = live_server.client(live_server.token("read", "scaler", OTHER_DIGEST))
    assert [r["image_digest"] for r in scoped.get("/v1/demand").json()["identities"]] == [OTHER_DIGEST]
    assert {k[1] for k in gauges(scoped.get("/metrics").text)} == {OTHER_DIGEST}
    assert scoped.get("/v1/demand", params={"image_digest": DIGEST}).json()["total"]["queued_shapes"] == 0

    # a worker leases all three and posts one result that took 12 s: two leased (not new work), and the
    # queued estimate is the campaign's own median once they come back
    body = lease(admin, budget_s=80_000).json()
    item = body["shapes"][0]
    row = ok_row(body, item, plausible_us(body, item, 2.0))
    row["elapsed_s"] = 12.0
    assert admin.post(f"/v1/leases/{body['lease_id']}/results", json=row).status_code == 200
    mine = admin.get("/v1/demand", params={"image_digest": DIGEST}).json()["identities"][0]
    assert (mine["queued_shapes"], mine["leased_shapes"], mine["gpu_s_queued_est"]) == (0, 2, 0.0)
    assert admin.post(f"/v1/leases/{body['lease_id']}/release", json={}).status_code == 200
    mine = admin.get("/v1/demand", params={"image_digest": DIGEST}).json()["identities"][0]
    assert (mine["queued_shapes"], mine["leased_shapes"]) == (2, 0)
    assert mine["gpu_s_queued_est"] == 2 * 12.0 and mine["families"][0]["est_shape_cost_s"] == 12.0
    assert mine["families"][0]["cost_basis"].startswith("median race seconds")
    assert gauges(admin.get("/metrics").text)[("aiter_tuner_queued_gpu_seconds_estimate", DIGEST, "gfx942",
                                                "304")] == 24.0

    # the CLI line an operator reads: shapes x the campaign's own seconds per shape
    out = subprocess.run([console_script("aiter-tuner"), "demand", "--service", live_server.url, "--image-digest",
                          DIGEST], cwd=ROOT, env=dict(os.environ, TUNER_TOKEN=ADMIN), capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert f"{DIGEST} gfx942/304: 2 shapes queued (0 leased), about 0.4 min of GPU time" in out.stdout
    assert "bf16_gemm (campaign 1): 2 x 12.0 s per shape (median race seconds" in out.stdout
    assert "total: 2 shapes queued" in out.stdout
