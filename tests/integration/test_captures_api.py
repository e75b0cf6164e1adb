"""Captures over HTTP on a real database: formats, counts, and 4xx that store nothing."""

from __future__ import annotations

import pytest

from tests.conftest import CONFIGS, DIGEST, capture


def campaigns(client):
    r = client.get("/v1/campaigns")
    assert r.status_code == 200
    return r.json()


def test_json_capture_creates_a_campaign_ordered_by_served_time(client):
    r = capture(client, [{"M": 1, "N": 1280, "K": 8192, "count": 10}, {"M": 4096, "N": 4096, "K": 4096, "count": 1}])
    assert r.status_code == 201, r.text
    assert r.json()["shapes_new"] == 2 and r.json()["calls_added"] == 11
    cid = r.json()["campaign_id"]
    shapes = client.get(f"/v1/campaigns/{cid}").json()["shape_list"]
    assert [s["shape"]["M"] for s in shapes] == ["4096", "1"]  # 1 x 137 GFLOP beats 10 x 21 MFLOP
    assert all(s["state"] == "queued" and s["attempts"] == 0 for s in shapes)


def test_same_shape_twice_adds_counts(client):
    capture(client, [{"M": 8, "N": 64, "K": 64, "count": 3}])
    r = capture(client, [{"M": 8, "N": 64, "K": 64, "count": 4}, {"M": 9, "N": 64, "K": 64}])
    assert r.json()["shapes_new"] == 1
    (c,) = campaigns(client)
    assert c["shapes"] == 2
    shapes = client.get(f"/v1/campaigns/{c['campaign_id']}").json()["shape_list"]
    assert {s["shape"]["M"]: s["calls"] for s in shapes} == {"8": 7, "9": 1}
    assert all(s["served"] == pytest.approx(s["calls"] * s["default_us_est"]) for s in shapes)  # follows calls


def test_untuned_csv_body_and_raw_text_body(client):
    text = (CONFIGS / "a8w8_untuned_gemm.csv").read_text()
    r = client.post("/v1/captures", json={"image_digest": DIGEST, "gfx": "gfx942", "cu_num": 80,
                                          "family": "a8w8_gemm", "untuned_csv": text})
    assert r.status_code == 201, r.text
    n = r.json()["shapes_received"]
    raw = client.post("/v1/captures", content=text, headers={"content-type": "text/csv"},
                      params={"image_digest": DIGEST, "gfx": "gfx942", "cu_num": 80, "family": "a8w8_gemm"})
    assert raw.status_code == 201 and raw.json()["shapes_new"] == 0 and raw.json()["shapes_received"] == n


def test_log_capture(client):
    from tests.unit.test_capture_parsing import aiter_lines
    r = client.post("/v1/captures", content=aiter_lines(), headers={"content-type": "text/plain"},
                    params={"image_digest": DIGEST, "gfx": "gfx942", "cu_num": 304, "family": "bf16_gemm"})
    assert r.status_code == 201, r.text
    assert r.json()["shapes_new"] == 2 and r.json()["calls_added"] == 3


@pytest.mark.parametrize("patch,field", [
    ({"family": "nope_gemm"}, "family"),
    ({"image_digest": "sha256:1234"}, "image_digest"),
    ({"image_digest": "latest"}, "image_digest"),
    ({"cu_num": 0}, "cu_num"),
    ({"gfx": "gfx 942"}, "gfx"),
    ({"shapes": [{"M": 1, "N": -4, "K": 2}]}, "shapes[0].N"),
    ({"shapes": [{"M": 1, "N": 4, "K": 2}, {"M": "a", "N": 4, "K": 2}]}, "shapes[1].M"),
    ({"shapes": []}, "shapes"),
    ({"shapes": None, "untuned_csv": "M,N,Z\n1,2,3\n"}, "untuned_csv.header"),
    ({"shapes": None, "log": "no aiter lines here"}, "log"),
    ({"untuned_csv": "M,N,K\n1,2,3\n"}, "shapes"),  # two payloads at once
])
def test_bad_input_is_4xx_naming_the_field_and_nothing_is_stored(client, patch, field):
    body = {"image_digest": DIGEST, "gfx": "gfx942", "cu_num": 304, "family": "bf16_gemm",
            "shapes": [{"M": 1, "N": 4, "K": 2}], **patch}
    body = {k: v for k, v in body.items() if v is not None}
    r = client.post("/v1/captures", json=body)
    assert r.status_code == 422, r.text
    assert r.json()["field"] == field, r.json()
    assert field.split(".")[0].split("[")[0] in r.json()["detail"]
    assert campaigns(client) == []


def test_oversized_body_is_413(client, settings):
    big = "M,N,K\n" + "1,2,3\n" * (settings.max_body_bytes // 6 + 10)
    r = client.post("/v1/captures", content=big, headers={"content-type": "text/csv"},
                    params={"image_digest": DIGEST, "gfx": "gfx942", "cu_num": 304, "family": "bf16_gemm"})
    assert r.status_code == 413 and r.json()["field"] == "body"
    assert campaigns(client) == []


def test_bad_json_and_content_type(client):
    r = client.post("/v1/captures", content="{nope", headers={"content-type": "application/json"})
    assert r.status_code == 422 and r.json()["field"] == "body"
    r = client.post("/v1/captures", content="x", headers={"content-type": "image/png"})
    assert r.status_code == 422 and r.json()["field"] == "content-type"


def test_a_posted_log_is_read_with_the_lookup_identity_its_environment_gives(client):
    """A 256-CU GPU served with CU_NUM=304: AITER's lines print the cu_num its lookup used (304); with the
    capture's env they are this GPU's lines, without it they name another identity and are refused."""
    from tests.unit.test_capture_parsing import aiter_lines
    r = capture(client, None, family="fmoe", cu_num=256, log=aiter_lines(), env={"CU_NUM": "304"})
    assert r.status_code == 201 and r.json()["calls_added"] == 2, r.text
    r = capture(client, None, family="fmoe", cu_num=256, log=aiter_lines())
    assert r.status_code == 422 and r.json()["field"] == "log", r.text
