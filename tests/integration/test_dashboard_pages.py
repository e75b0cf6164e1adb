"""Dashboard pages explain themselves: the device's own time unit, labelled plots, empty states, HTML 404s."""

from __future__ import annotations

import re

from tests.conftest import capture
from tests.integration.test_leasing_api import tune_all


def test_a_cpu_campaign_speaks_of_cpu_time_and_a_gpu_one_of_gpu_time(client):
    cpu = capture(client, [{"M": 1, "N": 64, "K": 64}], gfx="cpu", cu_num=2).json()["campaign_id"]
    gpu = capture(client, [{"M": 1, "N": 64, "K": 64}]).json()["campaign_id"]
    tune_all(client, "cpu", 2)
    tune_all(client)
    cpu_page, gpu_page = client.get(f"/campaigns/{cpu}").text, client.get(f"/campaigns/{gpu}").text
    assert "CPU time spent" in cpu_page and "GPU" not in cpu_page
    assert "GPU time spent" in gpu_page and "CPU" not in gpu_page
    svg = client.get(f"/campaigns/{cpu}/coverage.svg").text
    assert re.search(r'class="xlabel">CPU time spent \((s|min|h)\)<', svg)
    assert "GPU" not in svg and "share of served time covered" in svg
    assert len(re.findall(r'class="xtick"', svg)) >= 2 and len(re.findall(r'class="ytick"', svg)) == 5
    assert "GPU time spent" in client.get(f"/campaigns/{gpu}/coverage.svg").text


def test_a_campaign_without_results_shows_empty_states_not_an_empty_plot(client):
    cid = capture(client, [{"M": 1, "N": 64, "K": 64}]).json()["campaign_id"]
    page = client.get(f"/campaigns/{cid}").text
    assert 'id="download-none"' in page and 'id="download"' not in page
    assert 'id="coverage-none"' in page and "coverage.svg" not in page
    tune_all(client)
    page = client.get(f"/campaigns/{cid}").text
    assert 'id="download"' in page and "(1 rows)" in page and "coverage.svg" in page


def test_unknown_pages_are_html_404s_and_api_routes_stay_json(client):
    for path in ("/campaigns/999", "/no/such/page", "/campaigns/999/coverage.svg"):
        r = client.get(path)
        assert r.status_code == 404 and r.headers["content-type"].startswith("text/html"), path
        assert 'id="not-found"' in r.text and 'href="/"' in r.text
    assert "no campaign 999" in client.get("/campaigns/999").text
    for path in ("/v1/campaigns/999", "/v1/nothing"):
        r = client.get(path)
        assert r.status_code == 404 and r.headers["content-type"].startswith("application/"), path
        assert r.json()["status" if path == "/v1/campaigns/999" else "detail"]


def test_the_image_shows_the_aiter_its_workers_read_apart_from_what_captures_claimed(client):
    from tests.conftest import DIGEST
    capture(client, [{"M": 1, "N": 64, "K": 64}], aiter_version="0.1.13")
    capture(client, [{"M": 2, "N": 64, "K": 64}], aiter_version="0.1.13'; DROP TABLE images;--")
    section = client.get("/").text
    assert "not yet (no worker has reported" in section
    assert "captures claimed: 0.1.13, 0.1.13&#39;; DROP TABLE images;--" in section
    r = client.put(f"/v1/images/{DIGEST}/tables", json={"aiter_version": "0.1.12.dev3+e4048607a5",
                                                         "aiter_commit": "e4048607a535", "tables": {}})
    assert r.status_code == 200, r.text
    capture(client, [{"M": 3, "N": 64, "K": 64}], aiter_version="9.9.9")  # a later claim changes nothing
    home = client.get("/").text
    assert '<b class="reported">0.1.12.dev3+e4048607a5</b>' in home and "e4048607a5" in home
    assert "captures claimed: 0.1.13, 0.1.13&#39;; DROP TABLE images;--, 9.9.9" in home


def test_a_listed_shape_shows_its_fields_but_not_the_ones_every_shape_has_at_their_usual_value(client):
    cid = capture(client, [{"M": 1, "N": 64, "K": 64}]).json()["campaign_id"]
    stored = client.get(f"/v1/campaigns/{cid}/shapes").json()["shapes"][0]["shape"]
    hidden = {k for k, v in stored.items() if v in ("False", "torch.bfloat16")}
    assert hidden  # the bf16 GEMM's untuned row has a bias flag and dtypes
    page = client.get(f"/campaigns/{cid}").text
    (cell,) = re.findall(r'<tr class="shape"[^>]*>\s*<td><code>(.*?)</code></td>', page)
    assert cell == "".join(f"{k}={v} " for k, v in stored.items() if k not in hidden)
    assert cell.startswith("M=1 N=64 K=64 ")


def test_a_campaign_the_default_won_says_why_its_overlay_is_empty_and_plots_what_the_page_counts(client):
    from app.services import campaigns
    from tests.integration.test_leasing_api import lease
    cid = capture(client, [{"M": m, "N": 1280, "K": 8192} for m in (1, 2)], gfx="cpu", cu_num=2).json()["campaign_id"]
    body = lease(client, budget_s=80_000, gfx="cpu", cu_num=2).json()
    for item in body["shapes"]:  # the default won each shape: tuned, no row (what a CPU quick start ends with)
        r = client.post(f"/v1/leases/{body['lease_id']}/results", json={
            "shape_id": item["shape_id"], "backend": "torch", "status": "default_best", "us": 5000.0,
            "default_us": 5000.0, "err_ratio": 0.0, "kernel_name": "torch_linear", "elapsed_s": 1.0,
            "candidates": [{"name": "torch_linear", "us": 5000.0}]})
        assert r.status_code == 200, r.text
    page = client.get(f"/campaigns/{cid}").text
    assert "Nothing to deploy yet" in page and "the\ndefault path AITER takes today won" in page
    assert 'id="envline"' not in page  # no AITER_CONFIG line for an overlay that has no row
    camp = client.get(f"/v1/campaigns/{cid}").json()
    with client.app.state.db.session(write=False) as s:
        last = campaigns.coverage_points(s, cid)[-1][1]
    assert camp["served_time_covered"] == 1.0 and last == 1.0


def test_the_campaign_page_tells_what_the_deploy_plan_says(client):
    """Issue 33: the page told you to mount the file and set AITER_CONFIG_* while the plan refused that form for an
    image whose tables are unknown (the value would name the overlay alone and REPLACE the shipped table; so would
    the merged file, which is the overlay alone then). The page renders the plan's verdict: its first offered form,
    or none, and each refused form with why; the prediction is on the same form."""
    import html

    from tests.conftest import CONFIGS, DIGEST
    cid = capture(client, [{"M": 1, "N": 1280, "K": 8192}, {"M": 3, "N": 77, "K": 99}]).json()["campaign_id"]
    tune_all(client)
    plan = client.get(f"/v1/overlays/{DIGEST}/bf16_gemm/deploy").json()
    assert plan["offered"] == [] and not plan["shipped_tables_known"]  # the tables are unknown
    page = html.unescape(client.get(f"/campaigns/{cid}").text)
    assert 'id="no-form"' in page and 'id="envline"' not in page and "do not set AITER_CONFIG_GEMM_BF16" in page
    for form in ("layer", "merged"):
        assert f"not offered: <b>{form}</b>: {plan[form]['why_not']}" in page and "REPLACE" in plan[form]["why_not"]
    # the image's tables reported: the plan now offers the layer over them, and so do the page and the prediction
    default = (CONFIGS / "bf16_tuned_gemm.csv").read_text()
    assert client.put(f"/v1/images/{DIGEST}/tables", json={"tables": {"bf16_tuned_gemm.csv": default}}).status_code == 200
    plan = client.get(f"/v1/overlays/{DIGEST}/bf16_gemm/deploy").json()
    assert plan["offered"][0] == "layer" and ":" in plan["layer"]["env"] and "merged" in plan["offered"]
    page = html.unescape(client.get(f"/campaigns/{cid}").text)
    assert "offers the <b>layer</b> form" in page and f'<code id="envline">{plan["layer"]["env"]}</code>' in page
    assert "not offered: <b>layer</b>" not in page and "on the <b>layer</b> form" in page
    assert client.get(f"/v1/campaigns/{cid}/engagement").json()["form"] == "layer"
