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
