"""Priority by served time over HTTP: roofline default time until measured, served steps when a capture
brings a step histogram, and capture ids that are counted once."""

from __future__ import annotations

from app.domain.families import FAMILIES
from app.domain.roofline import estimate_us
from app.domain.shapes import make_shape
from tests.conftest import capture
from tests.integration.test_leasing_api import lease, ok_row

BF16 = FAMILIES["bf16_gemm"]
DECODE = {"M": 1, "N": 1280, "K": 8192}
PREFILL = {"M": 4096, "N": 8192, "K": 8192}
HIST = {"1": 900, "8": 50, "16": 20, "32": 10, "64": 5, "128": 5, "256": 3, "512": 2, "1024": 2, "2048": 1,
        "4096": 1, "8192": 1, "+Inf": 0}


def order(client, cid):
    return [(s["shape"]["M"], s["served"]) for s in client.get(f"/v1/campaigns/{cid}").json()["shape_list"]]


def test_step_histogram_reorders_the_queue_and_the_campaign_says_which_rule(client):
    r = capture(client, [dict(DECODE), dict(PREFILL)])
    cid = r.json()["campaign_id"]
    assert r.json()["priority_rule"] == "calls x default time"
    before = order(client, cid)
    est = estimate_us(BF16, make_shape(BF16, PREFILL).as_dict(), "gfx942", 304)
    assert [m for m, _ in before] == ["4096", "1"] and before[0][1] == est  # 1 call x roofline estimate
    r = capture(client, [], step_buckets=HIST)  # a metrics-only update
    assert r.status_code == 201, r.text
    assert r.json()["priority_rule"] == "served steps x default time" and r.json()["calls_added"] == 0
    after = order(client, cid)
    assert [m for m, _ in after] == ["1", "4096"]
    assert after[1][1] == est * 1  # one step in (2048, 4096]
    summary = client.get(f"/v1/campaigns/{cid}").json()
    assert summary["priority_rule"] == "served steps x default time" and summary["steps_seen"] == 1000
    assert "served steps x default time" in client.get(f"/campaigns/{cid}").text
    # a later histogram adds up: twice the prefill steps, same decode steps
    capture(client, [], step_buckets={"4096": 1})
    assert dict(order(client, cid))["4096"] == est * 2


def test_a_repeated_capture_uid_is_acknowledged_without_counting_twice(client):
    body = dict(capture_uid="agent-1:0001:bf16_gemm", step_buckets={"1": 10})
    first = capture(client, [{**DECODE, "count": 3}], **body)
    again = capture(client, [{**DECODE, "count": 3}], **body)
    assert first.status_code == again.status_code == 201
    assert again.json()["duplicate"] is True and again.json()["capture_id"] == first.json()["capture_id"]
    (s,) = client.get(f"/v1/campaigns/{first.json()['campaign_id']}").json()["shape_list"]
    assert s["calls"] == 3 and s["steps"] == 10
    assert capture(client, [{**DECODE, "count": 1}], capture_uid="short").status_code == 422


def test_a_measured_default_replaces_the_estimate(client):
    cid = capture(client, [{**DECODE, "count": 5}]).json()["campaign_id"]
    body = lease(client).json()
    item = body["shapes"][0]
    res = dict(ok_row(body, item), default_us=123.0, candidates=[{"name": "torch_linear", "us": 123.0}])
    assert client.post(f"/v1/leases/{body['lease_id']}/results", json=res).status_code in (200, 201)
    (s,) = client.get(f"/v1/campaigns/{cid}").json()["shape_list"]
    assert s["served"] == 5 * 123.0 and s["default_us_est"] is None


def test_bad_step_buckets_are_refused_naming_the_field(client):
    r = capture(client, [dict(DECODE)], step_buckets={"eight": 3})
    assert r.status_code == 422 and "step_buckets" in r.text
    assert client.get("/v1/campaigns").json() == []


def test_a_bucket_row_carries_the_steps_of_the_ms_it_covers(client):
    cid = capture(client, [{"M": m, "N": 64, "K": 64} for m in (9, 12, 16)]).json()["campaign_id"]
    r = client.post(f"/v1/campaigns/{cid}/bucket-plan/apply")
    assert r.status_code == 200 and r.json()["covered"] == 2, r.text
    capture(client, [], step_buckets={"8": 5, "16": 80})
    by_m = {s["shape"]["M"]: s for s in client.get(f"/v1/campaigns/{cid}").json()["shape_list"]}
    assert by_m["16"]["state"] == "queued" and by_m["9"]["state"] == "covered"
    row = by_m["16"]
    assert row["steps"] == 80 and row["served"] == 80 * row["default_us_est"]  # all of (8, 16], not 4/8 of it
