"""The overlays a service keeps built (app/services/overlays.py build, per process): every view reads the same
one until something it is built from changes, and then never the old one: a new result, an image table added or
replaced in place, another AITER release, another database. Each test sees the view change with that input
(and fails if the cache key misses it)."""

from __future__ import annotations

import csv
import io

from fastapi.testclient import TestClient

from app.config import Settings
from app.main import create_app
from app.services import overlays
from tests.conftest import CONFIGS, DIGEST, capture
from tests.integration.test_leasing_api import lease, ok_row, plausible_us, tune_all

DS_V3 = "model_configs/a8w8_blockscale_tuned_gemm_ds_v3.csv"


def rows(text: str) -> list[dict]:
    return list(csv.DictReader(io.StringIO(text)))


def ship(client, tables: dict[str, str], **extra) -> None:
    r = client.put(f"/v1/images/{DIGEST}/tables", json={"tables": tables, **extra})
    assert r.status_code == 200, r.text


def tune_one(client, us: float = 2.0) -> None:
    body = lease(client, max_shapes=1).json()
    item = body["shapes"][0]
    r = client.post(f"/v1/leases/{body['lease_id']}/results", json=ok_row(body, item, plausible_us(body, item, us)))
    assert r.status_code == 200 and r.json()["verified"], r.text


def test_a_new_result_is_in_the_next_view(client):
    cid = capture(client, [{"M": 1, "N": 1280, "K": 8192, "count": 9},
                           {"M": 2, "N": 1280, "K": 8192}]).json()["campaign_id"]
    url = f"/v1/campaigns/{cid}/engagement"
    assert client.get(url).json()["hits"] == 0
    built = client.app.state.caches.built  # this app's (app/services/caches.py)
    builds = built.builds
    assert client.get(url).json()["hits"] == 0 and built.builds == builds  # kept while nothing moved
    tune_one(client)
    assert client.get(url).json()["hits"] == 1
    assert len(rows(client.get(f"/v1/overlays/{DIGEST}/bf16_gemm.csv", params={"version": "latest"}).text)) == 1
    tune_one(client)
    assert client.get(url).json()["hits"] == 2
    assert len(rows(client.get(f"/v1/overlays/{DIGEST}/bf16_gemm.csv", params={"version": "latest"}).text)) == 2
    assert client.get(f"/campaigns/{cid}").status_code == 200


def test_an_image_table_added_or_replaced_in_place_is_in_the_next_view(client):
    default = (CONFIGS / "a8w8_blockscale_tuned_gemm.csv").read_text()
    ship(client, {"a8w8_blockscale_tuned_gemm.csv": default})
    plan = f"/v1/overlays/{DIGEST}/a8w8_blockscale_gemm/deploy"
    assert len(client.get(plan).json()["layer"]["files"]) == 2
    ds_v3 = (CONFIGS / DS_V3).read_text()
    ship(client, {DS_V3: ds_v3})  # another table: the layer lists it
    assert client.get(plan).json()["layer"]["files"][1].endswith(DS_V3)

    merged = f"/v1/overlays/{DIGEST}/a8w8_blockscale_gemm.csv"
    before = rows(client.get(merged, params={"version": "latest", "form": "merged"}).text)
    assert len(before) == len(rows(default)) + len(rows(ds_v3))
    assert rows(client.get(merged, params={"version": "latest", "form": "layer"}).text) == []  # each form's own file: no results yet
    lines = ds_v3.splitlines(keepends=True)
    ship(client, {DS_V3: "".join(lines[:-1])})  # the same path again, one row less: the same row id, new content
    after = rows(client.get(merged, params={"version": "latest", "form": "merged"}).text)
    assert len(after) == len(before) - 1


def test_another_release_of_the_image_is_in_the_next_view(client):
    capture(client, [{"M": 1, "N": 1280, "K": 8192}])
    plan = f"/v1/overlays/{DIGEST}/bf16_gemm/deploy"
    assert client.get(plan).json()["release"] == "current"
    ship(client, {}, aiter_version="0.1.7.post2.dev18")
    assert client.get(plan).json()["release"] == "0.1.7"


def test_each_database_has_its_own(tmp_path):
    """Two databases in one process with the same image, ids and counts, different rows."""
    def overlay(name: str, us: float) -> list[dict]:
        settings = Settings(database_url=f"sqlite:///{tmp_path / name}", auth=False)
        with TestClient(create_app(settings)) as c:
            capture(c, [{"M": 1, "N": 1280, "K": 8192}])
            tune_all(c, us_of=lambda item: us)
            return rows(c.get(f"/v1/overlays/{DIGEST}/bf16_gemm.csv", params={"version": "latest"}).text)
    one, two = overlay("one.db", 5.0), overlay("two.db", 7.0)
    assert [r["us"] for r in one] != [r["us"] for r in two]


def test_a_new_result_builds_on_the_kept_shipped_tables_a_changed_table_does_not(client):
    """The next result's overlay keeps the image's parsed tables and what is made of them (deploy.Shipped.memo),
    and equals one built from scratch; a table reported again is read again."""
    fam = "a8w8_blockscale_gemm"
    default, ds_v3 = (CONFIGS / "a8w8_blockscale_tuned_gemm.csv").read_text(), (CONFIGS / DS_V3).read_text()
    ship(client, {"a8w8_blockscale_tuned_gemm.csv": default, DS_V3: ds_v3})
    shipped = rows(default)[0]  # a shape the image ships a row for: our result repeats its key
    capture(client, [{c: shipped[c] for c in ("M", "N", "K")}, {"M": 4097, "N": 7168, "K": 2048}],
            family=fam, gfx=shipped["gfx"], cu_num=int(shipped["cu_num"]))
    db = client.app.state.db

    def built(scratch: bool = False) -> overlays.Overlay:
        if scratch:
            client.app.state.caches.built.clear()
        with db.session(write=False) as s:
            ov = overlays.build(s, DIGEST, fam)
            for form in ("layer", "merged", "model_configs_dropin"):  # made while the session is open
                ov.digest(form)
            return ov

    def tune(us: float) -> None:
        body = lease(client, max_shapes=1, gfx=shipped["gfx"], cu_num=int(shipped["cu_num"])).json()
        item = body["shapes"][0]
        r = client.post(f"/v1/leases/{body['lease_id']}/results", json=ok_row(
            body, item, plausible_us(body, item, us), kernelId=1, libtype="ck", errRatio=0.0, kernelName="k_ck"))
        assert r.status_code == 200 and r.json()["verified"], r.text

    def same(ov: overlays.Overlay, scratch: overlays.Overlay) -> None:
        assert ov.artifacts() == scratch.artifacts()
        assert [ov.digest(f) for f in ov.artifacts()] == [scratch.digest(f) for f in scratch.artifacts()]

    first = built()
    for _ in range(2):
        tune(1.0)
        ov = built()
        assert ov is not first and ov.shipped is first.shipped  # rebuilt on the kept tables
        fresh = built(scratch=True)
        assert fresh.shipped is not ov.shipped
        same(ov, fresh)
        first = fresh
    assert any(a.excluded_shipped for a in ov.artifacts().values())  # our row for a shipped key was in it
    ship(client, {DS_V3: "".join(ds_v3.splitlines(keepends=True)[:-1])})  # reported again, one row less
    ov = built()
    assert ov.shipped is not first.shipped
    same(ov, built(scratch=True))
