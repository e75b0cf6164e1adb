"""Two AITER releases: the current tables (tests/fixtures/aiter) and the published amd-aiter 0.1.7 wheel.
Each image's overlay is written in its own header, and a table in the wrong release's header is flagged."""

from __future__ import annotations

import csv
import io
import shutil

import pytest

from app.domain.families import FAMILIES, column_kind
from app.domain.headers import tuned_schema
from app.domain.shapes import cell
from app.domain.tables import read_table
from tests.conftest import CONFIGS, old_release_package
from tests.integration.test_leasing_api import lease
from workers import image_tables

OLD, NEW = "sha256:" + "01" * 32, "sha256:" + "02" * 32


@pytest.fixture(scope="module")
def old_pkg():
    return old_release_package()


@pytest.fixture(scope="module")
def new_pkg(tmp_path_factory):
    pkg = tmp_path_factory.mktemp("new") / "aiter"
    shutil.copytree(CONFIGS, pkg / "configs")
    (pkg / "_version.py").write_text("__version__ = '0.1.13.dev0+e4048607a5'\n")
    return pkg


class Direct:
    """The worker's reporting path, through the test client."""

    def __init__(self, c):
        self.c = c

    def put_tables(self, digest, body):
        r = self.c.put(f"/v1/images/{digest}/tables", json=body)
        assert r.status_code == 200, r.text
        return r.json()


def test_the_old_release_really_differs(old_pkg):
    header = read_table((old_pkg / "configs" / "bf16_tuned_gemm.csv").read_text()).header
    assert "gfx" not in header and "bpreshuffle" not in header
    assert image_tables.aiter_version(old_pkg) == "0.1.7.post2.dev18"


@pytest.mark.parametrize("which", ["old", "new"])
def test_every_release_table_is_understood_and_spelled_as_we_spell(which, old_pkg, new_pkg):
    pkg = old_pkg if which == "old" else new_pkg
    for path, text in image_tables.read_tables(pkg / "configs").items():
        fam = next((f for f in FAMILIES.values() if path.rsplit("/", 1)[-1] == f.tuned_file), None)
        if fam is None:
            continue
        table = read_table(text, path)
        schema = tuned_schema(fam, table.header)
        assert schema.known, (which, path, table.header)
        for row in table.rows[:200]:
            for col in schema.key_columns:
                if column_kind(col) in ("bool", "bool01", "dtype", "enum") and row[col]:
                    assert cell(col, row[col], col) == row[col], (which, path, col, row[col])


def _tune(c, digest, gfx, cu, shapes, family="bf16_gemm"):
    c.post("/v1/captures", json={"image_digest": digest, "gfx": gfx, "cu_num": cu, "family": family,
                                 "shapes": shapes})
    body = lease(c, digest=digest, gfx=gfx, cu_num=cu, budget_s=10_000).json()
    for item in body["shapes"]:
        vals = dict(item["shape"], gfx=gfx, cu_num=str(cu), libtype="torch", solidx="0", splitK="0", us="3.5",
                    kernelName="native", err_ratio="0.0", tflops="1", bw="1", kernelId="7", errRatio="0.0")
        row = {col: vals[col] for col in body["tuned_header"]}  # the worker writes the lease's header
        r = c.post(f"/v1/leases/{body['lease_id']}/results", json={
            "shape_id": item["shape_id"], "backend": "torch", "status": "ok", "row": row, "us": 3.5,
            "err_ratio": 0.0})
        assert r.status_code == 200 and r.json()["verified"], r.text
    return body


def test_each_image_gets_its_own_header_and_the_wrong_one_is_flagged(client, old_pkg, new_pkg):
    assert image_tables.report(Direct(client), OLD, old_pkg)["bf16_gemm"] >= 1
    assert image_tables.report(Direct(client), NEW, new_pkg)["bf16_gemm"] >= 1
    old_header = read_table((old_pkg / "configs" / "bf16_tuned_gemm.csv").read_text()).header
    new_header = FAMILIES["bf16_gemm"].tuned_header
    shapes = [{"M": 1, "N": 1280, "K": 8192}, {"M": 100, "N": 4096, "K": 4096}]
    lo = _tune(client, OLD, "gfx942", 304, shapes)
    ln = _tune(client, NEW, "gfx942", 304, shapes)
    assert tuple(lo["tuned_header"]) == old_header and tuple(ln["tuned_header"]) == new_header

    old_csv = client.get(f"/v1/overlays/{OLD}/bf16_gemm.csv", params={"version": "latest"}).text
    new_csv = client.get(f"/v1/overlays/{NEW}/bf16_gemm.csv", params={"version": "latest"}).text
    assert tuple(old_csv.splitlines()[0].split(",")) == old_header
    assert tuple(new_csv.splitlines()[0].split(",")) == new_header
    assert client.get(f"/v1/campaigns/{lo['campaign_id']}/engagement").json()["hits"] == 2
    assert client.get(f"/v1/campaigns/{ln['campaign_id']}/engagement").json()["hits"] == 2

    wrong = client.post(f"/v1/campaigns/{ln['campaign_id']}/engagement", content=old_csv,
                        headers={"content-type": "text/csv"}).json()
    assert wrong["hits"] == 0 and all("'gfx'" in x["reason"] or "gfx" in x["reason"] for x in wrong["report"])
    assert any("gfx" in w for w in wrong["warnings"])
    # the other way round the old loader's keys are all there, but the column order is not the image's
    other = client.post(f"/v1/campaigns/{lo['campaign_id']}/engagement", content=new_csv,
                        headers={"content-type": "text/csv"}).json()
    assert other["hits"] == 2 and any("order" in w for w in other["warnings"])


def test_tuner_input_and_schemas_follow_the_image(client, old_pkg, new_pkg):
    image_tables.report(Direct(client), OLD, old_pkg)
    image_tables.report(Direct(client), NEW, new_pkg)
    body = _tune(client, OLD, "gfx942", 80, [{"M": 16, "N": 1280, "K": 8192, "q_dtype_w": "torch.int8"}],
                 family="a8w8_gemm")
    assert body["untuned_header"] == ["M", "N", "K"] and "gfx" not in body["tuned_header"]
    schemas = {x["family"]: x for x in client.get(f"/v1/images/{OLD}/schemas").json()}
    assert schemas["a8w8_gemm"]["key_columns"] == ["cu_num", "M", "N", "K"] and schemas["a8w8_gemm"]["from_image"]
    new = {x["family"]: x for x in client.get(f"/v1/images/{NEW}/schemas").json()}
    assert new["a8w8_gemm"]["key_columns"] == ["gfx", "cu_num", "M", "N", "K", "q_dtype_w"]
    rows = list(csv.DictReader(io.StringIO(client.get(f"/v1/overlays/{OLD}/a8w8_gemm.csv", params={"version": "latest"}).text)))
    assert len(rows) == 1 and "gfx" not in rows[0]


def test_a_table_missing_a_key_column_is_refused_by_name(client):
    bad = "M,N,K,cu_num,libtype,us\n1,2,3,80,torch,1.0\n"
    r = client.put(f"/v1/images/{OLD}/tables", json={"tables": {"bf16_tuned_gemm.csv": bad}})
    assert r.status_code == 422 and "gfx" in r.json()["detail"] and r.json()["field"] == "tables.bf16_tuned_gemm.csv"
