"""Hostile and careless inputs: every one a 4xx naming the field, nothing stored, never a 500 (both engines)."""

from __future__ import annotations

import json

import pytest

from tests.conftest import DIGEST, capture
from tests.integration.test_leasing_api import lease, ok_row, shapes

BASE = {"image_digest": DIGEST, "gfx": "gfx942", "cu_num": 304, "family": "bf16_gemm"}


def post_raw(client, path, text):
    return client.post(path, content=text.encode("utf-8", "surrogatepass"),
                       headers={"content-type": "application/json"})


def capture_json(**over):
    return json.dumps({**BASE, "shapes": [{"M": 1, "N": 64, "K": 64}], **over})


@pytest.mark.parametrize("text, field", [
    (capture_json(host="a\x00b"), "host"),
    (capture_json(host="h" * 300), "host"),
    (capture_json(aiter_version="\ud800"), "aiter_version"),  # a lone surrogate
    (capture_json(env={"GPU_ARCHS": "gfx942\x00"}), "env"),
    (capture_json(shapes=[{"M": 1, "N": 64, "K": 64, "count": 2**64}]), "shapes"),
    (capture_json(shapes=[{"M": 1, "N": 64, "K": 64, "count": 2**45}]), "shapes[0].count"),
    (capture_json(shapes=[{"M": 0, "N": 64, "K": 64}]), "shapes[0].M"),
    (capture_json(shapes=[{"M": 2**31, "N": 64, "K": 64}]), "shapes[0].M"),
    (capture_json(shapes=[{"M": 1, "N": 1 << 19, "K": 64}]), "shapes[0].N"),
    (capture_json(shapes=[{"M": 1.5, "N": 64, "K": 64}]), "shapes[0].M"),
    (capture_json(shapes=[{"M": [[[1]]], "N": 64, "K": 64}]), "shapes.0.M"),
    (capture_json().replace('"K": 64', '"K": Infinity'), "shapes.0.K"),
    ('{"image_digest": ' + "[" * 100_000 + "]" * 100_000 + "}", "body"),  # nested past any parser's depth
])
def test_a_hostile_capture_is_a_422_naming_the_field_and_stores_nothing(client, text, field):
    r = post_raw(client, "/v1/captures", text)
    assert r.status_code == 422, r.text
    assert r.headers["content-type"] == "application/problem+json" and r.json()["field"] == field, r.json()
    assert client.get("/v1/campaigns").json() == []


@pytest.mark.parametrize("over, field", [
    ({"us": float("nan")}, "us"), ({"us": float("inf")}, "us"), ({"err_ratio": float("-inf")}, "err_ratio"),
    ({"err_ratio": 1.5}, "err_ratio"), ({"shape_id": 2**63}, "shape_id"), ({"kernel_name": "k\x00"}, "kernel_name"),
    ({"backend": "b" * 200}, "backend"), ({"row": {"M": {"deep": [1]}}}, "row.M"),
])
def test_a_hostile_result_is_a_422_naming_the_field(client, over, field):
    capture(client, shapes(1))
    body = lease(client).json()
    res = {**ok_row(body, body["shapes"][0]), **over}
    r = post_raw(client, f"/v1/leases/{body['lease_id']}/results", json.dumps(res))
    assert r.status_code == 422 and r.json()["field"] == field, r.text
    assert client.get(f"/v1/campaigns/{body['campaign_id']}").json()["leased"] == 1  # the lease still holds it


@pytest.mark.parametrize("path", ["/v1/campaigns/9223372036854775808", "/v1/campaigns/0/shapes",
                                  "/v1/campaigns/99999999999999999999999/engagement"])
def test_ids_past_64_bits_are_a_422_not_a_database_error(client, path):
    r = client.get(path)
    assert r.status_code == 422 and r.json()["field"] == "campaign_id", r.text


def test_a_hot_shape_counts_past_32_bits(client):
    for _ in range(3):  # 3 x 2^31 calls: past int32 (it was a 500 on PostgreSQL)
        assert capture(client, [{"M": 1, "N": 64, "K": 64, "count": 2**31}]).status_code == 201
    (s,) = client.get("/v1/campaigns/1").json()["shape_list"]
    assert s["calls"] == 3 * 2**31


def test_caps_on_shapes_per_capture_and_per_campaign(client, settings):
    settings.max_capture_shapes, settings.max_campaign_shapes = 5, 8
    r = capture(client, shapes(6))
    assert r.status_code == 422 and r.json()["field"] == "shapes" and "more than 5" in r.json()["detail"]
    assert capture(client, shapes(5)).status_code == 201
    assert capture(client, shapes(5)).status_code == 201  # the same shapes again: nothing new
    r = capture(client, [{"M": m, "N": 64, "K": 64} for m in range(100, 104)])
    assert r.status_code == 422 and "above the cap of 8" in r.json()["detail"]
    assert client.get("/v1/campaigns/1").json()["shapes"] == 5  # the refused capture added nothing
