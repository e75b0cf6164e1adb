"""Issue 26's input defects over HTTP on a real database: identifiers checked whole, lease size from successful
results and capped."""

from __future__ import annotations

import pytest

from app.wire import header_value
from tests.conftest import DIGEST, capture
from tests.integration.test_leasing_api import lease, ok_row, shapes


@pytest.mark.parametrize("field,value", [("image_digest", DIGEST + "\n"), ("gfx", "gfx942\n"),
                                         ("image_digest", DIGEST + "\r\n")])
def test_an_identifier_with_a_trailing_newline_is_refused(client, field, value):
    r = capture(client, shapes(1), **{"digest" if field == "image_digest" else field: value})
    assert r.status_code == 422 and r.json()["field"] == field, r.text
    r = lease(client, **{"digest" if field == "image_digest" else field: value})
    assert r.status_code == 422 and r.json()["field"] == field, r.text
    assert client.get("/v1/campaigns").json() == []


@pytest.mark.parametrize("body,field", [({"worker_id": "w1\n"}, "worker_id"), ({"backends": ["torch\n"]}, "backends.0")])
def test_a_name_with_a_trailing_newline_is_refused(client, body, field):
    """pydantic's `pattern` runs on Rust's regex engine, whose `$` is the end of the text only."""
    r = lease(client, **body)
    assert r.status_code == 422 and r.json()["field"] == field, r.text


def test_a_header_value_never_carries_a_line_break():
    assert header_value("image sha256:ab..ab\n (3 queued)\r\x00é") == "image sha256:ab..ab\\n (3 queued)\\r\\x00\\xe9"


def test_lease_size_ignores_failed_tries_and_is_capped(client, settings):
    """Three failures in 1 ms each used to size the next lease at budget / 1 ms: every queued shape."""
    settings.max_lease_shapes = 8
    capture(client, shapes(40))
    first = lease(client, budget_s=settings.default_shape_cost_s * 3).json()
    for item in first["shapes"]:
        r = client.post(f"/v1/leases/{first['lease_id']}/results",
                        json={"shape_id": item["shape_id"], "backend": "torch", "status": "failed",
                              "error": "no kernel", "elapsed_s": 0.001})
        assert r.status_code == 200, r.text
    second = lease(client, budget_s=settings.default_shape_cost_s * 3).json()
    assert second["est_shape_cost_s"] == settings.default_shape_cost_s and len(second["shapes"]) == 3
    for item in second["shapes"]:
        r = client.post(f"/v1/leases/{second['lease_id']}/results", json=dict(ok_row(second, item), elapsed_s=0.01))
        assert r.status_code == 200, r.text
    third = lease(client, budget_s=600).json()  # measured 0.01 s a shape: 60000 fit, the cap says 8
    assert third["est_shape_cost_s"] == 0.01 and len(third["shapes"]) == 8


def _one_lease(client, n=1):
    capture(client, [{"M": m, "N": 1280, "K": 8192} for m in range(1, n + 1)])
    return lease(client, budget_s=80_000).json()


def _post(client, body, result):
    return client.post(f"/v1/leases/{body['lease_id']}/results", json=result)


FORMULAS = ['=HYPERLINK("http://x","y")', "+cmd|' /C calc'!A0", "-2+3", "@SUM(A1)", "\tk", "\rk"]


@pytest.mark.parametrize("cell", FORMULAS)
def test_formula_safe_refuses_what_a_spreadsheet_would_run_and_keeps_numbers(cell):
    from app.wire import formula_safe
    with pytest.raises(ValueError):
        formula_safe(cell)
    for ok in ("-1", "+2.5", "-1e-3", "torch_linear", "a8w8_bpreshuffle_1x128", ""):
        assert formula_safe(ok) == ok


@pytest.mark.parametrize("where,cell", [("kernel_name", FORMULAS[0]), ("row.kernelName", FORMULAS[1]),
                                        ("candidates.0.name", FORMULAS[3])])
def test_a_cell_that_starts_a_spreadsheet_formula_is_refused(client, where, cell):
    body = _one_lease(client)
    item = body["shapes"][0]
    res = ok_row(body, item, us=9.0)
    if where == "kernel_name":
        res["kernel_name"] = cell
    elif where == "row.kernelName":
        res["row"]["kernelName"] = cell
    else:
        res["candidates"] = [{"name": cell, "us": 9.0}]
    r = _post(client, body, res)
    assert r.status_code == 422 and r.json()["field"] == where, r.text
    assert client.get(f"/v1/overlays/{body['image_digest']}/bf16_gemm").json()["rows"] == 0


def test_aiter_s_own_tables_pass_the_formula_check(aiter_src_dir):
    """Its shipped tables start numbers with '-' (-1 in tuned_fmoe.csv) and no kernel name with =+-@."""
    import csv

    from app.wire import formula_safe
    from tests.conftest import configs_dir
    cells = [c for p in sorted(configs_dir().rglob("*.csv")) for row in csv.reader(p.open()) for c in row]
    assert "-1" in cells and len(cells) > 10_000
    for c in cells:
        formula_safe(c)


def test_a_kernel_outside_the_image_catalog_is_refused(client):
    body = _one_lease(client, 3)
    a, b, c = body["shapes"]
    r = client.put(f"/v1/images/{body['image_digest']}/tables",
                   json={"tables": {}, "kernels": {"bf16_gemm": ["torch_linear", "k"]}})
    assert r.status_code == 200, r.text
    r = _post(client, body, dict(ok_row(body, a, us=9.0), kernel_name="not_in_the_image"))
    assert r.status_code == 422 and r.json()["field"] == "kernel_name", r.text
    r = _post(client, body, ok_row(body, b, us=9.0, kernelName="not_in_the_image"))
    assert r.status_code == 422 and r.json()["field"] == "row.kernelName", r.text
    assert _post(client, body, dict(ok_row(body, c, us=9.0), kernel_name="k")).status_code == 200
    # another family's catalog does not widen or narrow this one's; a later report adds families
    client.put(f"/v1/images/{body['image_digest']}/tables", json={"tables": {}, "kernels": {"tuned_fmoe": ["x"]}})
    from app.db.models import Image
    from app.db.session import Database
    db = Database(client.app.state.settings.database_url)
    with db.session() as s:
        assert set(s.get(Image, body["image_digest"]).kernel_catalog) == {"bf16_gemm", "tuned_fmoe"}
    db.dispose()


def test_default_us_must_be_a_timed_candidate_and_within_the_device_ceiling(client):
    from app.domain.families import get_family
    from app.domain.roofline import ceiling_us
    body = _one_lease(client, 3)
    a, b, c = body["shapes"]
    inflated = dict(ok_row(body, a, us=9.0), default_us=1e6, candidates=[{"name": "torch_linear", "us": 10.0}])
    r = _post(client, body, inflated)
    assert r.status_code == 422 and r.json()["field"] == "default_us", r.text
    ceiling = ceiling_us(get_family("bf16_gemm"), b["shape"], body["gfx"], body["cu_num"])
    huge = dict(ok_row(body, b, us=9.0), default_us=ceiling * 2, candidates=[{"name": "torch_linear", "us": ceiling * 2}])
    r = _post(client, body, huge)
    assert r.status_code == 422 and r.json()["field"] == "default_us", r.text
    fair = dict(ok_row(body, c, us=9.0), default_us=10.0, candidates=[{"name": "torch_linear", "us": 10.0}])
    assert _post(client, body, fair).status_code == 200
    assert client.get(f"/v1/overlays/{body['image_digest']}/bf16_gemm").json()["rows"] == 1


@pytest.mark.parametrize("field,value", [("started_at", "1970-01-01T00:00:00Z"), ("finished_at", "2999-01-01T00:00:00Z"),
                                         ("elapsed_s", 7 * 24 * 3600.0)])
def test_absurd_timestamps_and_elapsed_are_refused(client, field, value):
    body = _one_lease(client)
    r = _post(client, body, dict(ok_row(body, body["shapes"][0], us=9.0), **{field: value}))
    assert r.status_code == 422 and r.json()["field"] == field, r.text


def test_a_result_names_the_kernel_its_row_serves(client):
    """The confirmation is decided on kernel_name and the overlay serves the row's kernelName (issue 35): a result
    whose two differ is refused naming kernel_name, nothing stored; one without kernel_name takes its row's."""
    from app.db.models import Result
    body = _one_lease(client, 2)
    a, b = body["shapes"]
    r = _post(client, body, dict(ok_row(body, a, us=9.0, kernelName="served_k"), kernel_name="confirmed_k"))
    assert r.status_code == 422 and r.json()["field"] == "kernel_name", r.text
    assert client.get(f"/v1/overlays/{body['image_digest']}/bf16_gemm").json()["rows"] == 0
    r = _post(client, body, ok_row(body, b, us=9.0, kernelName="served_k"))
    assert r.status_code == 200, r.text
    with client.app.state.db.session(write=False) as s:
        stored = s.get(Result, r.json()["result_id"])
        assert (stored.kernel_name, stored.row["kernelName"]) == ("served_k", "served_k")
