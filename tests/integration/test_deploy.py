"""Overlays AITER really loads, on its real tables: collisions, merged files, M buckets, runtime identity."""

from __future__ import annotations

import csv
import io

from app.domain import buckets
from app.domain.capture_parsing import from_untuned_csv
from app.domain.families import FAMILIES
from app.domain.keys import m_candidates, row_key
from tests.conftest import CONFIGS, DIGEST, capture
from tests.integration.test_leasing_api import tune_all

BF16 = FAMILIES["bf16_gemm"]
LLAMA = CONFIGS / "model_configs" / "llama70B_untuned_gemm_bf16.csv"


def rows(text):
    return list(csv.DictReader(io.StringIO(text)))


def ship(client, *paths):
    tables = {p: (CONFIGS / p).read_text() for p in paths}
    r = client.put(f"/v1/images/{DIGEST}/tables", json={"tables": tables, "configs_dir": "/opt/aiter/aiter/configs"})
    assert r.status_code == 200, r.text


def test_an_overlay_repeating_a_shipped_key_is_refused_naming_the_key(client):
    ship(client, "bf16_tuned_gemm.csv", "model_configs/dsv3_bf16_tuned_gemm.csv")
    s0 = rows((CONFIGS / "model_configs/dsv3_bf16_tuned_gemm.csv").read_text())[0]
    gfx, cu = s0["gfx"], int(s0["cu_num"])
    capture(client, [{c: s0[c] for c in BF16.shape_columns}, {"M": 3, "N": 77, "K": 99}], gfx=gfx, cu_num=cu)
    tune_all(client, gfx, cu, us_of=lambda item: 0.5)
    r = client.get(f"/v1/overlays/{DIGEST}/bf16_gemm.csv", params={"version": "latest"})
    assert r.status_code == 409 and r.json()["field"] == "overlay"
    assert f"M={s0['M']}" in r.json()["detail"] and "dsv3_bf16_tuned_gemm.csv" in r.json()["detail"]
    layer = rows(client.get(f"/v1/overlays/{DIGEST}/bf16_gemm.csv", params={"version": "latest", "exclude_shipped": True}).text)
    assert [x["N"] for x in layer] == ["77"]

    merged = rows(client.get(f"/v1/overlays/{DIGEST}/bf16_gemm.csv", params={"version": "latest", "merged": True}).text)
    keys = [row_key(BF16.key_columns, x) for x in merged]
    assert len(keys) == len(set(keys)), "AITER's set_index(...).to_dict('index') needs a unique index"
    shipped_n = sum(len(rows((CONFIGS / p).read_text())) for p in
                    ("bf16_tuned_gemm.csv", "model_configs/dsv3_bf16_tuned_gemm.csv"))
    assert len(merged) == shipped_n + 1
    mine = next(x for x in merged if row_key(BF16.key_columns, x) == row_key(BF16.key_columns, s0))
    assert mine["us"] == "0.5"  # lowest us wins, as in AITER's own merge
    assert all(x["kernelName"] and x["libtype"] for x in merged)


def test_deploy_plan_lists_the_shipped_tables_then_the_overlay(client):
    ship(client, "a8w8_blockscale_tuned_gemm.csv", "model_configs/a8w8_blockscale_tuned_gemm_ds_v3.csv",
         "a8w8_blockscale_untuned_gemm.csv")
    plan = client.get(f"/v1/overlays/{DIGEST}/a8w8_blockscale_gemm/deploy").json()
    env = plan["layer"]["env"]
    name, value = env.split("=", 1)
    assert name == "AITER_CONFIG_GEMM_A8W8_BLOCKSCALE" and "," not in value
    parts = value.split(":")
    assert parts[0] == "/opt/aiter/aiter/configs/a8w8_blockscale_tuned_gemm.csv"
    assert parts[1].endswith("model_configs/a8w8_blockscale_tuned_gemm_ds_v3.csv")
    assert parts[-1] == plan["layer"]["overlay"] and len(parts) == 3
    assert plan["rebuild"] == "AITER_REBUILD=1" and any("build time" in n for n in plan["notes"])
    assert plan["log_hits"] == "AITER_LOG_TUNED_CONFIG=1"
    assert "untuned" not in plan["model_configs_dropin"]["copy_to"].rsplit("/", 1)[-1]
    bf16 = client.get(f"/v1/overlays/{DIGEST}/bf16_gemm/deploy").json()
    assert bf16["rebuild"] is None and not bf16["shipped_tables_known"]
    # without the image's tables the layer value is the overlay alone, which replaces the shipped table: not offered
    assert "layer" not in bf16["offered"] and not bf16["layer"]["offered"], bf16
    assert "REPLACE" in bf16["layer"]["why_not"] and plan["layer"]["offered"] and "layer" in plan["offered"]
    # nor the merged file: over no reported tables it is the overlay alone (issue 33)
    assert "merged" not in bf16["offered"] and "REPLACE" in bf16["merged"]["why_not"], bf16


def test_bucket_plan_covers_every_captured_m_of_a_real_model_with_fewer_rows():
    parsed = from_untuned_csv(BF16, LLAMA.read_text())
    shapes = [(s.as_dict(), float(n)) for s, n in parsed.shapes.values()]
    plan = buckets.plan(BF16, shapes)
    assert len(plan) < len(shapes)
    served = {}
    for r in plan:
        for m in r.covers:
            shape = dict(r.rest, M=str(m))
            assert r.m in m_candidates(BF16, shape), (m, r.m)
            served[tuple(sorted(shape.items()))] = r.m
    assert len(served) == len(shapes)


def test_applied_bucket_plan_engages_every_captured_shape(client):
    text = LLAMA.read_text()
    cid = client.post("/v1/captures", json={"image_digest": DIGEST, "gfx": "gfx942", "cu_num": 304,
                                            "family": "bf16_gemm", "untuned_csv": text}).json()["campaign_id"]
    plan = client.get(f"/v1/campaigns/{cid}/bucket-plan").json()
    assert plan["rows_to_tune"] < plan["captured_shapes"] and abs(plan["served_time_covered"] - 1) < 1e-9
    applied = client.post(f"/v1/campaigns/{cid}/bucket-plan/apply").json()
    assert applied["covered"] > 0
    tune_all(client, "gfx942", 304)
    camp = client.get(f"/v1/campaigns/{cid}").json()
    assert camp["tuned"] == plan["rows_to_tune"]
    eng = client.get(f"/v1/campaigns/{cid}/engagement").json()
    assert eng["misses"] == 0 and eng["hits"] == eng["shapes"]
    assert camp["covered"] + camp["tuned"] == eng["shapes"]


def test_runtime_identity_from_the_server_environment(client):
    r = capture(client, [{"M": 1, "N": 1280, "K": 8192}], env={"GPU_ARCHS": "gfx942;gfx950", "CU_NUM": "80"})
    cid = r.json()["campaign_id"]
    tune_all(client, "gfx942", 304)
    eng = client.get(f"/v1/campaigns/{cid}/engagement").json()
    assert eng["identity"]["lookup_gfx"] == "gfx950" and eng["identity"]["lookup_cu_num"] == 80
    assert eng["hits"] == 0 and "gfx" in eng["report"][0]["reason"]
    assert any("GPU_ARCHS" in w for w in eng["warnings"]) and any("CU_NUM" in w for w in eng["warnings"])
    capture(client, [{"M": 1, "N": 1280, "K": 8192}], env={})
    assert client.get(f"/v1/campaigns/{cid}/engagement").json()["hits"] == 1


def test_a_flydsl_row_engages_only_where_flydsl_imports(client):
    cid = capture(client, [{"M": 1, "N": 1280, "K": 8192}], env={"flydsl": "0"}).json()["campaign_id"]
    # a kernel of FlyDSL's catalog (tuned_gemm.py:163-177 asks it for the row's kernel: ops/flydsl/gemm_kernels.py
    # :45-65 reads the whole name)
    tune_all(client, "gfx942", 304, libtype="flydsl",
             kernelName="flydsl_gemm4_abf16_wbf16_bf16_t32x64x128_split_k7_block_m_warp1_block_n_warp2_block_k_warp1_"
                        "async_copyFalse_b_to_ldsTrue_b_preshuffleFalse_c_to_ldsFalse_gfx942")
    eng = client.get(f"/v1/campaigns/{cid}/engagement").json()
    assert eng["hits"] == 0 and "flydsl" in eng["report"][0]["reason"].lower()
    capture(client, [{"M": 1, "N": 1280, "K": 8192}], env={"flydsl": "1"})
    assert client.get(f"/v1/campaigns/{cid}/engagement").json()["hits"] == 1
