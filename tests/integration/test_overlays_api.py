"""Overlays, merges over the image's shipped table, and engagement before and after deploy."""

from __future__ import annotations

import csv
import io

from app.domain.families import FAMILIES
from app.domain.keys import row_key
from app.domain.roofline import estimate_us
from app.domain.shapes import make_shape
from tests.conftest import CONFIGS, DIGEST, capture
from tests.integration.test_leasing_api import lease, ok_row, tune_all

BF16 = FAMILIES["bf16_gemm"]


def rows(text):
    return list(csv.DictReader(io.StringIO(text)))


def test_overlay_has_the_exact_header_and_the_best_verified_row_per_key(client):
    capture(client, [{"M": 1, "N": 1280, "K": 8192}, {"M": 32, "N": 1280, "K": 8192}])
    tune_all(client, us_of=lambda item: 5.0)
    r = client.get(f"/v1/overlays/{DIGEST}/bf16_gemm.csv", params={"version": "latest"})
    assert r.status_code == 200 and r.headers["x-aiter-env"] == "AITER_CONFIG_GEMM_BF16"
    assert r.text.splitlines()[0] == ",".join(BF16.tuned_header)
    assert len(rows(r.text)) == 2
    info = client.get(f"/v1/overlays/{DIGEST}/bf16_gemm").json()
    assert info["env_line"].startswith("AITER_CONFIG_GEMM_BF16=") and info["rows"] == 2


def test_overlay_unknown_family_and_bad_digest(client):
    assert client.get(f"/v1/overlays/{DIGEST}/nope.csv", params={"version": "latest"}).json()["field"] == "family"
    assert client.get("/v1/overlays/sha256:zz/bf16_gemm.csv", params={"version": "latest"}).json()["field"] == "image_digest"


def test_an_image_never_seen_has_no_overlay_but_a_known_one_without_rows_keeps_its_plan(client):
    """A header-only table for an unknown digest, deployed as the only file, would replace AITER's shipped table:
    404 naming the digest on every overlay route. A known image with no rows answers what its deploy plan says."""
    unknown = "sha256:" + "ef" * 32
    for path in (f"{unknown}/bf16_gemm.csv", f"{unknown}/bf16_gemm", f"{unknown}/bf16_gemm/deploy",
                 f"{unknown}/bf16_gemm.csv?form=merged"):
        r = client.get(f"/v1/overlays/{path}")
        assert r.status_code == 404 and r.json()["field"] == "image_digest", (path, r.text)
        assert unknown in r.json()["detail"]
    capture(client, [{"M": 1, "N": 1280, "K": 8192}])  # DIGEST is known now, with no tuned row
    r = client.get(f"/v1/overlays/{DIGEST}/bf16_gemm.csv", params={"version": "latest"})
    assert r.status_code == 200 and rows(r.text) == []
    plan = client.get(f"/v1/overlays/{DIGEST}/bf16_gemm/deploy").json()
    assert plan["shipped_tables_known"] is False and "layer" not in plan["offered"]


def test_merged_overlay_over_the_image_default_has_unique_keys(client):
    default = (CONFIGS / "bf16_tuned_gemm.csv").read_text()
    r = client.put(f"/v1/images/{DIGEST}/tables", json={"tables": {"bf16_tuned_gemm.csv": default}})
    assert r.status_code == 200 and r.json()["stored"] == {"bf16_gemm": 1}
    shipped = rows(default)
    s0 = shipped[0]  # re-tune a shape the image already ships, plus a new one
    capture(client, [{c: s0[c] for c in BF16.shape_columns}, {"M": 3, "N": 77, "K": 99}], gfx=s0["gfx"],
            cu_num=int(s0["cu_num"]))
    tune_all(client, s0["gfx"], int(s0["cu_num"]), us_of=lambda item: 1.5)
    merged = rows(client.get(f"/v1/overlays/{DIGEST}/bf16_gemm.csv", params={"version": "latest", "merged": True}).text)
    keys = [row_key(BF16.key_columns, r) for r in merged]
    assert len(keys) == len(set(keys)), "a merged table must load with a unique index"
    assert len(merged) == len(shipped) + 1
    mine = next(r for r in merged if row_key(BF16.key_columns, r) == row_key(BF16.key_columns, s0))
    assert mine["us"] == "1.5" and mine["kernelName"] == "k"
    assert all(r["kernelName"] != "" and r["libtype"] != "" for r in merged)


def test_engagement_before_deploy_reports_hits_and_reasons(client):
    r = capture(client, [{"M": 1, "N": 1280, "K": 8192, "count": 9}, {"M": 2, "N": 1280, "K": 8192, "count": 1}])
    cid = r.json()["campaign_id"]
    body = lease(client, max_shapes=1).json()
    client.post(f"/v1/leases/{body['lease_id']}/results", json=ok_row(body, body["shapes"][0]))
    rep = client.get(f"/v1/campaigns/{cid}/engagement").json()
    assert (rep["hits"], rep["misses"]) == (1, 1)
    miss = next(x for x in rep["report"] if not x["hit"])
    # M=1 (9 calls) outranks M=2 (1 call, about the same time per call), so it was leased and tuned first
    assert miss["shape"]["M"] == "2" and miss["tried_m"] == [2, 16]
    assert "M=[1]" in miss["reason"]
    one, two = (estimate_us(BF16, make_shape(BF16, {"M": m, "N": 1280, "K": 8192}).as_dict(), "gfx942", 304)
                for m in (1, 2))
    assert abs(rep["served_time_covered"] - 9 * one / (9 * one + two)) < 1e-9


def test_engagement_after_deploy_counts_log_lines(client):
    from tests.unit.test_capture_parsing import aiter_lines
    capture(client, [{"M": 100, "N": 4096, "K": 4096}])
    r = client.post("/v1/engagement/logs", json={"image_digest": DIGEST, "gfx": "gfx942", "cu_num": 304,
                                                 "family": "bf16_gemm", "log": aiter_lines()})
    assert r.status_code == 200
    rep = r.json()
    by_m = {x["shape"]["M"]: x for x in rep["report"]}
    assert by_m["100"]["hits"] == 1 and by_m["100"]["shape_id"] is not None
    assert by_m["20"]["misses"] == 2 and by_m["20"]["shape_id"] is None
    assert "AITER_LOG_TUNED_CONFIG=1" in rep["note"]


def test_default_is_best_is_tuned_without_a_row_and_counted(client):
    """Rows only where they help: a winner that does not beat the default by AITER's 3% margin
    (--min_improvement_pct) is stored as 'default is best' — the shape is tuned, the overlay has no row."""
    capture(client, [{"M": m, "N": 1280, "K": 8192} for m in (1, 2, 3)])
    body = lease(client, budget_s=80_000).json()
    a, b, c = body["shapes"]
    timed = [{"name": "torch_linear", "us": 10.0}]  # the default, timed in the same race
    posts = [dict(ok_row(body, a, us=9.0), default_us=10.0, candidates=timed),  # 10% better: a row
             dict(ok_row(body, b, us=9.8), default_us=10.0, candidates=timed),  # 2% better: inside the margin
             {"shape_id": c["shape_id"], "backend": "torch", "status": "default_best", "us": 10.0,
              "default_us": 10.0, "err_ratio": 0.0, "kernel_name": "torch_linear", "elapsed_s": 1.0,
              "candidates": timed}]
    for p in posts:
        r = client.post(f"/v1/leases/{body['lease_id']}/results", json=p)
        assert r.status_code == 200 and r.json()["shape_state"] == "tuned", r.text
    assert [r["M"] for r in rows(client.get(f"/v1/overlays/{DIGEST}/bf16_gemm.csv", params={"version": "latest"}).text)] == [a["shape"]["M"]]
    (camp,) = client.get("/v1/campaigns").json()
    assert camp["tuned"] == 3 and camp["default_best"] == 2 and camp["tuned_with_row"] == 1
    page = client.get(f"/campaigns/{camp['campaign_id']}").text
    assert "1 with a row that helps" in page and "2 default is best" in page


def test_the_compile_lane_is_counted_apart_from_race_time(client):
    capture(client, [{"M": 1, "N": 1280, "K": 8192}])
    tune_all(client)
    body = {"image_digest": DIGEST, "family": "bf16_gemm", "worker_id": "w1", "seconds": 95.5, "ok": True,
            "output_tail": "[aiter] build [module_gemm_a16w16_asm] ..."}
    r = client.post("/v1/builds", json=body)
    assert r.status_code == 201 and r.json()["seconds"] == 95.5
    assert client.post("/v1/builds", json=dict(body, seconds=-1)).json()["field"] == "seconds"
    assert client.post("/v1/builds", json=dict(body, family="nope")).json()["field"] == "family"
    (camp,) = client.get("/v1/campaigns").json()
    assert camp["build_s"] == 95.5 and camp["gpu_s_spent"] == 2.0  # race time stays the results' own
    page = client.get(f"/campaigns/{camp['campaign_id']}").text
    assert "1.6 min building AITER" in page.split('id="build-time"')[1]
