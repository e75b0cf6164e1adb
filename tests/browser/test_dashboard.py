"""The dashboard in headless Chromium against a running server with a small real CPU campaign."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.browser.conftest import ARTIFACTS
from tests.conftest import WORKER, DIGEST, ROOT
from workers.identity import cpu_count

CPU = {"gfx": "cpu", "cu_num": cpu_count()}  # the identity a worker on this machine reports
SHAPES = [{"M": m, "N": 256, "K": 512, "count": c} for m, c in ((8, 50), (16, 30), (32, 10), (64, 5))]


@pytest.fixture
def campaign(live_server):
    c = live_server.client()
    cid = c.post("/v1/captures", json={"image_digest": DIGEST, "family": "bf16_gemm", "shapes": SHAPES,
                                       "aiter_version": "0.1.13", **CPU}).json()["campaign_id"]
    # tune three of four shapes with a real worker, then leave the last one queued
    out = subprocess.run([*WORKER, "--service", live_server.url, "--backend", "torch",
                          "--budget-s", "90", "--image-digest", DIGEST, "--worker-id", "browser-w", "--once",
                          "--max-shapes", "3", "--max-batches", "1", "--repeats", "5", "--min-improvement-pct", "-100"],
                         cwd=ROOT, env=dict(os.environ, TUNER_TOKEN=live_server.token("worker", "b")),
                         capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stdout + out.stderr
    return cid


def test_a_person_sees_progress_downloads_the_overlay_and_sees_workers(live_server, campaign, page):
    page.goto(live_server.url + "/")
    row = page.locator(f"tr.campaign[data-campaign='{campaign}']")
    assert row.locator("td.captured").inner_text() == "4"
    assert row.locator("td.tuned").inner_text() == "3"
    assert row.locator("td.queued").inner_text() == "1"
    assert float(row.locator("progress").get_attribute("value")) == pytest.approx(0.75)
    covered = float(row.locator("td.covered").inner_text().rstrip("%"))
    assert covered > 75  # the three heaviest shapes carry most of the served time
    aiter = page.locator(f"section.image[data-digest='{DIGEST}'] p.aiter")
    assert aiter.locator(".claimed").inner_text() == "captures claimed: 0.1.13"  # no worker reported one
    page.screenshot(path=str(ARTIFACTS / "dashboard-home.png"), full_page=True)

    row.get_by_role("link", name="bf16_gemm").click()
    page.wait_for_url(f"**/campaigns/{campaign}")
    assert page.locator("tr.shape[data-state='tuned']").count() == 3
    assert page.locator("tr.shape[data-state='queued']").count() == 1
    # a CPU worker reports no AITER tables: neither the layer nor the merged file (the overlay alone then) is
    # offered, and the page says not to set the variable rather than a value that replaces the shipped table
    assert "do not set AITER_CONFIG_GEMM_BF16" in page.locator("#deploy-step").inner_text()
    svg = page.request.get(live_server.url + f"/campaigns/{campaign}/coverage.svg")
    assert svg.ok and "served-time coverage" in svg.text()
    with page.expect_download() as dl:
        page.locator("#download").click()
    text = Path(dl.value.path()).read_text()
    assert text.splitlines()[0].startswith("gfx,cu_num,M,N,K,bias") and len(text.strip().splitlines()) == 4
    eng = page.request.get(live_server.url + page.locator("#engagement").get_attribute("href"))
    assert eng.json()["hits"] == 3 and eng.json()["misses"] == 1
    page.screenshot(path=str(ARTIFACTS / "dashboard-campaign.png"), full_page=True)

    page.goto(live_server.url + "/workers")
    w = page.locator("tr.worker[data-worker='browser-w']")
    assert w.locator("td.posted").inner_text() == "3" and "cpu" in w.inner_text()
    page.screenshot(path=str(ARTIFACTS / "dashboard-workers.png"), full_page=True)


def test_metrics_count_what_happened(live_server, campaign):
    text = live_server.client().get("/metrics").text
    assert 'aiter_tuner_captures_received_total{family="bf16_gemm",format="json"} 1.0' in text
    assert 'aiter_tuner_shapes{family="bf16_gemm",state="tuned"} 3.0' in text
    assert 'aiter_tuner_results_total{backend="torch",status="ok",verified="true"} 3.0' in text
    assert 'aiter_tuner_leases{state="done"} 1.0' in text
    assert "aiter_tuner_request_seconds_bucket" in text
