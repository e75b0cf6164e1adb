"""Image upgrades over HTTP on a real database: inherit, the provisional overlay, confirmation races, triage
against the new image's tables and kernel catalog, and the refusals that write nothing."""

from __future__ import annotations

import csv
import io

import pytest

from tests.conftest import DIGEST, OTHER_DIGEST, capture
from tests.integration.test_leasing_api import lease, ok_row, plausible_us

NEW = OTHER_DIGEST
THIRD = "sha256:" + "ef" * 32
HIST = {"1": 100.0, "8": 40.0, "+Inf": 0.0}
LENGTHS = {"prompt": {"100": 4}, "generation": {"20": 4}}


def overlay_rows(client, digest, family="bf16_gemm"):
    r = client.get(f"/v1/overlays/{digest}/{family}.csv", params={"version": "latest"})
    assert r.status_code == 200, r.text
    return list(csv.DictReader(io.StringIO(r.text)))


def tune(client, digest=DIGEST, kernel_of=lambda item: f"k{item['shape']['M']}", worker="w1"):
    """Lease and post a verified result for every queued shape of the image (candidates: the winner, two
    runners-up and the default, as a race posts them)."""
    while (r := lease(client, budget_s=80_000, digest=digest, worker=worker)).status_code == 200:
        body = r.json()
        for item in body["shapes"]:
            us = plausible_us(body, item, 2.0)
            k = kernel_of(item)
            res = ok_row(body, item, us, kernelName=k)
            res.update(kernel_name=k, default_us=us * 2, candidates=[
                {"name": k, "us": us}, {"name": "torch_linear", "us": us * 2},
                {"name": "r1", "us": us * 1.1}, {"name": "r2", "us": us * 1.2}, {"name": "r3", "us": us * 1.3},
                {"name": "broken", "us": None, "error": "launch failed"}])
            assert client.post(f"/v1/leases/{body['lease_id']}/results", json=res).status_code == 200
    assert r.status_code == 204, r.text


def inherit(client, new=NEW, old=DIGEST):
    return client.post(f"/v1/images/{new}/inherit", json={"from": old})


@pytest.fixture
def parent(client):
    """Image DIGEST: 4 shapes captured with a step histogram, all tuned."""
    assert capture(client, [{"M": m, "N": 64, "K": 64, "count": 10 * m} for m in (1, 2, 4, 8)],
                   step_buckets=HIST, length_buckets=LENGTHS).status_code == 201
    tune(client)
    return client.get("/v1/campaigns").json()[0]


def test_an_inherited_image_has_its_parents_campaigns_and_serves_its_rows_before_any_capture(client, parent):
    r = inherit(client)
    assert r.status_code == 201, r.text
    (camp,) = r.json()["campaigns"]
    assert (camp["from_campaign_id"], camp["shapes_added"], camp["carried"]) == (parent["campaign_id"], 4, 4)
    detail = client.get(f"/v1/campaigns/{camp['campaign_id']}").json()
    assert (detail["image_digest"], detail["gfx"], detail["cu_num"], detail["queued"]) == (NEW, "gfx942", 304, 4)
    assert detail["priority_rule"] == parent["priority_rule"] and "step" in detail["priority_rule"]
    assert detail["served_lengths"] == parent["served_lengths"] == {"prompt_median": 50, "generation_median": 10}
    assert sorted(s["calls"] for s in detail["shape_list"]) == [10, 20, 40, 80]
    assert detail["upgrade"]["carried"] == detail["upgrade"]["provisional"] == 4
    # the provisional overlay: the parent's rows, downloadable before the new image's first capture
    assert sorted(r["kernelName"] for r in overlay_rows(client, NEW)) == ["k1", "k2", "k4", "k8"]
    info = client.get(f"/v1/overlays/{NEW}/bf16_gemm").json()
    assert (info["provisional_rows"], info["carried_from"]) == (4, DIGEST)
    assert client.get(f"/v1/images/{NEW}/lineage").json()["parent"] == DIGEST
    assert client.get(f"/v1/images/{DIGEST}/lineage").json()["children"] == [NEW]


def test_a_confirmation_race_gets_the_incumbent_and_the_parents_top_kernels_and_a_loser_is_withdrawn(client, parent):
    assert inherit(client).status_code == 201
    body = lease(client, budget_s=80_000, digest=NEW).json()
    by_m = {item["shape"]["M"]: item for item in body["shapes"]}
    assert by_m["4"]["incumbent"] == "k4"
    assert by_m["4"]["finalists"] == ["k4", "r1", "r2", "r3"]  # the incumbent first, then the top 3 that ran
    for m, item in by_m.items():
        us = plausible_us(body, item, 2.0)
        k = "k1" if m != "2" else "r1"  # shape M=2: a runner-up wins; M=1 confirms its incumbent
        if m in ("4", "8"):
            k = item["incumbent"]
        res = ok_row(body, item, us, kernelName=k)
        res.update(kernel_name=k, default_us=us * 2, candidates=[{"name": k, "us": us},
                                                                 {"name": "torch_linear", "us": us * 2}])
        r = client.post(f"/v1/leases/{body['lease_id']}/results", json=res)
        assert r.status_code == 200, r.text
        assert r.json()["shape_state"] == ("queued" if m == "2" else "tuned")
    up = client.get(f"/v1/campaigns/{body['campaign_id']}").json()["upgrade"]
    assert (up["confirmed"], up["overturned"], up["provisional"]) == (3, 1, 0)
    # the overturned shape is raced in full now: no incumbent, no finalists, and the carried row is gone
    again = lease(client, budget_s=80_000, digest=NEW).json()
    (item,) = again["shapes"]
    assert (item["shape"]["M"], item["incumbent"], item["finalists"]) == ("2", None, [])
    assert sorted(r["kernelName"] for r in overlay_rows(client, NEW)) == ["k1", "k4", "k8", "r1"]


def test_a_default_that_beats_the_carried_row_overturns_it(client, parent):
    assert inherit(client).status_code == 201
    body = lease(client, budget_s=80_000, digest=NEW, max_shapes=1).json()
    (item,) = body["shapes"]
    us = plausible_us(body, item, 2.0)
    r = client.post(f"/v1/leases/{body['lease_id']}/results", json={
        "shape_id": item["shape_id"], "backend": "torch", "status": "default_best", "us": us, "err_ratio": 0.0,
        "default_us": us, "elapsed_s": 1.0, "candidates": [{"name": "torch_linear", "us": us}]})
    assert r.status_code == 200 and r.json()["shape_state"] == "queued"
    assert item["incumbent"] not in {r["kernelName"] for r in overlay_rows(client, NEW)}


def test_the_new_images_tables_and_kernels_triage_the_carried_rows_again(client, parent):
    assert inherit(client).status_code == 201
    header = "gfx,cu_num,M,N,K,bias,dtype,outdtype,scaleAB,bpreshuffle,libtype,solidx,splitK,us,kernelName,err_ratio,tflops,bw"
    shipped = header + "\ngfx942,304,1,64,64,False,torch.bfloat16,torch.bfloat16,False,False,hipblaslt,7,0,1.0,shipped_k,0,1,1\n"
    untuned = "M,N,K,bias,dtype,outdtype,scaleAB,bpreshuffle\n"
    r = client.put(f"/v1/images/{NEW}/tables", json={
        "tables": {"bf16_tuned_gemm.csv": shipped, "bf16_untuned_gemm.csv": untuned},
        "kernels": {"bf16_gemm": ["k1", "k4", "k8", "r1", "r2", "shipped_k"]}})  # k2 is gone (renamed, removed)
    assert r.status_code == 200, r.text
    rows = overlay_rows(client, NEW)
    # M=1's key is shipped now: never served beside the shipped row; M=2's kernel is gone: raced in full
    assert sorted(r["kernelName"] for r in rows) == ["k4", "k8"]
    cid = client.get(f"/v1/campaigns").json()[-1]["campaign_id"]
    up = client.get(f"/v1/campaigns/{cid}").json()["upgrade"]
    assert (up["carried"], up["now_shipped"], up["kernel_gone"], up["provisional"]) == (2, 1, 1, 2)
    body = lease(client, budget_s=80_000, digest=NEW).json()
    by_m = {item["shape"]["M"]: item for item in body["shapes"]}
    assert by_m["1"]["incumbent"] == "shipped_k" and by_m["1"]["finalists"][:2] == ["shipped_k", "k1"]
    assert (by_m["2"]["incumbent"], by_m["2"]["finalists"]) == (None, [])
    assert by_m["8"]["finalists"] == ["k8", "r1", "r2"]  # r3 is not in the new image's catalog
    # the shipped kernel is as fast as ours: the shipped row stays and no row of ours repeats its key
    item = by_m["1"]
    us = plausible_us(body, item, 2.0)
    res = ok_row(body, item, us, kernelName="shipped_k")
    res.update(kernel_name="shipped_k", default_us=us * 2, candidates=[{"name": "shipped_k", "us": us},
                                                                       {"name": "torch_linear", "us": us * 2}])
    assert client.post(f"/v1/leases/{body['lease_id']}/results", json=res).json()["verified"] is False
    assert "1" not in {r["M"] for r in overlay_rows(client, NEW)}
    assert client.get(f"/v1/campaigns/{cid}").json()["upgrade"]["shipped_kept"] == 1


@pytest.mark.parametrize("new, old, status, field", [
    (NEW, THIRD, 404, "from"),  # an unknown parent
    (DIGEST, DIGEST, 422, "from"),  # itself
])
def test_an_inherit_that_cannot_be_done_is_refused_and_writes_nothing(client, parent, new, old, status, field):
    r = inherit(client, new, old)
    assert r.status_code == status, r.text
    assert r.json()["field"] == field
    assert len(client.get("/v1/campaigns").json()) == 1


def test_a_second_inherit_and_a_cycle_are_refused_without_a_half_copy(client, parent):
    assert inherit(client).status_code == 201
    n = len(client.get("/v1/campaigns").json())
    r = inherit(client, DIGEST, NEW)  # the parent from its own child
    assert (r.status_code, r.json()["field"]) == (409, "from")
    capture(client, [{"M": 3, "N": 64, "K": 64}], digest=THIRD)
    r = inherit(client, NEW, THIRD)  # a second parent
    assert (r.status_code, r.json()["field"]) == (409, "image_digest")
    assert len(client.get("/v1/campaigns").json()) == n + 1  # THIRD's own campaign only
    r = client.post(f"/v1/images/{NEW}/inherit", json={"from": "sha256:abc"})
    assert r.status_code == 422 and "from" in r.text


def test_a_capture_from_a_host_that_ran_another_image_suggests_the_inherit(client, parent):
    r = capture(client, [{"M": 3, "N": 64, "K": 64}], digest=NEW)  # host "test" ran DIGEST before
    assert r.status_code == 201
    assert any(f"/v1/images/{NEW}/inherit" in n and DIGEST in n for n in r.json()["notes"]), r.json()["notes"]
    assert client.get(f"/v1/images/{NEW}/lineage").json()["suggested_from"] == [DIGEST]
    # inheriting into the image the capture made keeps its own shape and adds the parent's
    assert inherit(client).status_code == 201
    cid = r.json()["campaign_id"]
    assert client.get(f"/v1/campaigns/{cid}").json()["shapes"] == 5


BF16_HEADER = ("gfx,cu_num,M,N,K,bias,dtype,outdtype,scaleAB,bpreshuffle,libtype,solidx,splitK,us,kernelName,"
               "err_ratio,tflops,bw")


@pytest.mark.parametrize("table", [
    BF16_HEADER + "\ngfx942,304,1,64,64,False,torch.bfloat16,torch.bfloat16,False,False,hipblaslt,7,0,1.0,"
                  "\"=HYPERLINK(\"\"http://x\"\",\"\"y\"\")\",0,1,1\n",  # a formula cell in the image's own rows
    BF16_HEADER + ",=cmd|' /C calc'!A0\n",  # a formula column into every overlay header (DDE)
    BF16_HEADER + "\ngfx942,304,1,64,64,False,torch.bfloat16,torch.bfloat16,False,False,hipblaslt,7,0,1.0,k,0,"
                  "@SUM(A1),1\n",
])
def test_a_posted_table_with_a_formula_cell_or_column_is_refused_and_stores_nothing(client, parent, table):
    assert inherit(client).status_code == 201
    r = client.put(f"/v1/images/{NEW}/tables", json={"tables": {"bf16_tuned_gemm.csv": table}})
    assert r.status_code == 422 and r.json()["field"] == "tables.bf16_tuned_gemm.csv", r.text
    assert client.get(f"/v1/images/{NEW}/schemas").json() == [] or all(
        "=" not in ",".join(f["header"]) for f in client.get(f"/v1/images/{NEW}/schemas").json())
    text = client.get(f"/v1/overlays/{NEW}/bf16_gemm.csv", params={"version": "latest"}).text
    assert not any(c[:1] in "=@" for line in csv.reader(io.StringIO(text)) for c in line)


@pytest.mark.parametrize("name", ["k\nevil", "ｋ＝1", "=cmd", "k 1", "k;1"])
def test_a_kernel_name_is_one_as_aiter_names_its_kernels(client, parent, name):
    """Free text nowhere: a catalog, a result's kernel_name and its row's kernelName are ASCII letters, digits and
    '_' (fmoe's two stages joined by '+')."""
    r = client.put(f"/v1/images/{NEW}/tables", json={"tables": {}, "kernels": {"bf16_gemm": ["k1", name]}})
    assert r.status_code == 422 and r.json()["field"].startswith("kernels"), r.text
    capture(client, [{"M": 3, "N": 64, "K": 64}], digest=NEW)
    body = lease(client, budget_s=80_000, digest=NEW).json()
    item = body["shapes"][0]
    us = plausible_us(body, item, 2.0)
    r = client.post(f"/v1/leases/{body['lease_id']}/results", json=ok_row(body, item, us, kernelName=name))
    assert r.status_code == 422 and r.json()["field"] == "row.kernelName", r.text
    r = client.post(f"/v1/leases/{body['lease_id']}/results",
                    json=dict(ok_row(body, item, us), kernel_name=name))
    assert r.status_code == 422 and r.json()["field"] == "kernel_name", r.text


def test_a_catalog_that_drops_kernels_and_is_then_restored_carries_the_rows_again(client, parent):
    """A catalog is a fact of the image as its worker reports it: triage follows the latest report both ways, so a
    wrong report (or any worker token's) costs nothing once the right one is back, as long as nobody raced the
    shapes meanwhile."""
    assert inherit(client).status_code == 201
    cid = client.get("/v1/campaigns").json()[-1]["campaign_id"]
    everything = ["k1", "k2", "k4", "k8", "r1", "r2", "r3", "torch_linear"]
    assert client.put(f"/v1/images/{NEW}/tables", json={"tables": {}, "kernels": {"bf16_gemm": ["nothing"]}}
                      ).status_code == 200
    up = client.get(f"/v1/campaigns/{cid}").json()["upgrade"]
    assert (up["carried"], up["kernel_gone"]) == (0, 4)
    assert overlay_rows(client, NEW) == []
    assert client.put(f"/v1/images/{NEW}/tables", json={"tables": {}, "kernels": {"bf16_gemm": everything}}
                      ).status_code == 200
    up = client.get(f"/v1/campaigns/{cid}").json()["upgrade"]
    assert (up["carried"], up["kernel_gone"]) == (4, 0)
    assert sorted(r["kernelName"] for r in overlay_rows(client, NEW)) == ["k1", "k2", "k4", "k8"]
    body = lease(client, budget_s=80_000, digest=NEW).json()
    assert sorted(item["incumbent"] for item in body["shapes"]) == ["k1", "k2", "k4", "k8"]


def test_a_shape_the_parent_tuned_as_default_is_best_is_confirmed_by_a_short_race_not_raced_in_full(client):
    """Issue 35: a shape whose parent race found nothing better than the default (no row) was raced in full on the
    new image; it is a confirmation race now (the default as incumbent, the parent's top kernels), and a result
    that says the default is still best confirms it, tuned, no full race."""
    capture(client, [{"M": 5, "N": 64, "K": 64}])
    body = lease(client, budget_s=80_000).json()
    (item,) = body["shapes"]
    us = plausible_us(body, item, 2.0)
    timed = [{"name": "torch_linear", "us": us}, {"name": "r1", "us": us * 1.01}, {"name": "r2", "us": us * 1.2}]
    r = client.post(f"/v1/leases/{body['lease_id']}/results", json={
        "shape_id": item["shape_id"], "backend": "torch", "status": "default_best", "us": us, "err_ratio": 0.0,
        "default_us": us, "kernel_name": "torch_linear", "elapsed_s": 1.0, "candidates": timed})
    assert r.status_code == 200 and r.json()["shape_state"] == "tuned", r.text
    r = inherit(client)
    assert r.status_code == 201, r.text
    assert r.json()["campaigns"][0]["default_best"] == 1
    body = lease(client, budget_s=80_000, digest=NEW).json()
    (item,) = body["shapes"]
    assert item["incumbent"] == "torch_linear" and item["finalists"][:3] == ["torch_linear", "r1", "r2"]
    us = plausible_us(body, item, 2.0)
    r = client.post(f"/v1/leases/{body['lease_id']}/results", json={
        "shape_id": item["shape_id"], "backend": "torch", "status": "default_best", "us": us, "err_ratio": 0.0,
        "default_us": us, "kernel_name": "torch_linear", "elapsed_s": 1.0,
        "candidates": [{"name": "torch_linear", "us": us}]})
    assert r.status_code == 200 and r.json()["shape_state"] == "tuned", r.text
    cid = client.get("/v1/campaigns").json()[-1]["campaign_id"]
    up = client.get(f"/v1/campaigns/{cid}").json()["upgrade"]
    assert (up["default_best"], up["confirmed"], up["overturned"]) == (1, 1, 0), up
    assert overlay_rows(client, NEW) == []  # the default is best: nothing to serve
