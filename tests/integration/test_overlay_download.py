"""What the plain overlay download serves (issue 49): the promoted version's rows only; where no version is
promoted, the shipped tables' state (a header-only layer file, or the shipped table as the merged file), saying
so in its headers; the overlay as built now only when asked for by name (version=latest, "not A/B'd")."""

from __future__ import annotations

import csv
import io
import random

from tests.conftest import CONFIGS, DIGEST, capture
from tests.integration.test_ab_api import POINTS, drive_synthetic, seed_overlay
from tests.integration.test_leasing_api import tune_all

URL = f"/v1/overlays/{DIGEST}/bf16_gemm.csv"
PLAN = f"/v1/overlays/{DIGEST}/bf16_gemm/deploy"


def rows(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text)))


def promote(c, planted=None) -> dict:
    """A version of the overlay as it is now, through a booked A/B run, promoted."""
    v = c.post("/v1/ab/versions", json={"image_digest": DIGEST}).json()
    run = c.post("/v1/ab/runs", json={"image_digest": DIGEST, "version_id": v["id"], "baseline": "shipped",
                                      "points": POINTS, "repeats": 4, "requests_per_pass": 8}).json()
    run = c.post(f"/v1/ab/runs/{run['id']}/start").json()
    drive_synthetic(c, run, planted or {}, random.Random(7))
    booked = c.post(f"/v1/ab/runs/{run['id']}/finish").json()
    assert booked["state"] == "booked" and booked["result"]["promotable"] is None, booked["result"]
    assert c.post(f"/v1/ab/runs/{run['id']}/promote").status_code == 200
    return v


def test_with_nothing_promoted_the_download_serves_the_shipped_state_and_says_so(client):
    seed_overlay(client)
    r = client.get(URL)
    assert r.status_code == 200 and rows(r.text) == [] and r.text.startswith("gfx,cu_num,M,N,K")
    assert r.headers["x-aiter-version"] == "shipped" and r.headers["x-aiter-rows"] == "0"
    assert "no promoted version" in r.headers["x-aiter-note"] and "version=latest" in r.headers["x-aiter-note"]
    # the same file name as the built overlay's: a deploy mounting the download keeps its env line
    latest = client.get(URL, params={"version": "latest"})
    assert latest.headers["content-disposition"] == r.headers["content-disposition"]
    assert len(rows(latest.text)) == 4 and latest.headers["x-aiter-version"] == "latest"
    assert "not A/B'd" in latest.headers["x-aiter-note"]
    # merged: the shipped table alone (it replaces the env var's value: nothing of ours in it)
    merged = client.get(URL, params={"form": "merged"})
    shipped = rows((CONFIGS / "bf16_tuned_gemm.csv").read_text())
    assert merged.status_code == 200 and merged.headers["x-aiter-version"] == "shipped"
    assert len(rows(merged.text)) == len(shipped) and 'filename="merged_' in merged.headers["content-disposition"]
    plan = client.get(PLAN).json()
    assert plan["version"] is None and plan["served"]["version"] == "shipped"
    assert plan["notes"][0].startswith("the download serves no promoted version")
    plan = client.get(PLAN, params={"version": "latest"}).json()
    assert plan["served"]["version"] == "latest" and "not A/B'd" in plan["notes"][0]


def test_a_candidate_version_is_not_served_until_promoted(client):
    seed_overlay(client)
    v = client.post("/v1/ab/versions", json={"image_digest": DIGEST}).json()
    assert v["state"] == "candidate"
    assert client.get(URL).headers["x-aiter-version"] == "shipped" and rows(client.get(URL).text) == []
    asked = client.get(URL, params={"version": v["id"]})  # a version by id: served, and says it is not promoted
    assert len(rows(asked.text)) == 4 and "not promoted" in asked.headers["x-aiter-note"]


def test_the_default_download_serves_the_promoted_rows_only(client):
    seed_overlay(client)
    v = promote(client)
    capture(client, [{"M": 128, "N": 4096, "K": 4096}])  # tuned after the promotion: in the build, not served
    tune_all(client)
    r = client.get(URL)
    assert r.headers["x-aiter-version"] == str(v["id"]) and r.headers["x-aiter-ab-run"]
    assert sorted(int(x["M"]) for x in rows(r.text)) == [1, 2, 32, 64]
    assert sorted(int(x["M"]) for x in rows(client.get(URL, params={"version": "latest"}).text)) == [1, 2, 32, 64,
                                                                                                    128]
    assert client.get(PLAN).json()["served"]["version"] == str(v["id"])


def test_a_form_the_promoted_version_does_not_hold_is_refused_not_built(client):
    seed_overlay(client)
    v = promote(client)  # frozen as a layer
    for params, field in (({"merged": True}, "merged"), ({"form": "merged"}, "form"),
                          ({"form": "model_configs_dropin"}, "form")):
        r = client.get(URL, params=params)
        assert r.status_code == 409 and r.json()["field"] == field, r.text
        assert f"version {v['id']} is frozen as 'layer'" in r.json()["detail"] and "version=latest" in r.json()["detail"]
    assert client.get(URL, params={"form": "layer"}).headers["x-aiter-version"] == str(v["id"])
    assert client.get(URL, params={"exclude_shipped": True}).headers["x-aiter-version"] == str(v["id"])
    assert client.get(URL, params={"version": "latest", "merged": True}).headers["x-aiter-version"] == "latest"


def test_a_merged_shipped_state_of_unknown_tables_is_refused(client):
    capture(client, [{"M": 1, "N": 4096, "K": 4096}])  # no worker reported the image's tables
    assert client.get(URL).headers["x-aiter-version"] == "shipped"  # the layer: header alone, adds nothing
    r = client.get(URL, params={"form": "merged"})
    assert r.status_code == 409 and r.json()["field"] == "form" and "tables are unknown" in r.json()["detail"]
