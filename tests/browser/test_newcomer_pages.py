"""A newcomer's pages in headless Chromium: a CPU campaign from empty to done (live refresh), an HTML 404,
and the token page (create, refuse a bad digest, revoke). Screenshots go to test-artifacts/."""

from __future__ import annotations

from tests.browser.conftest import ARTIFACTS
from tests.conftest import ADMIN, DIGEST
from tests.integration.test_leasing_api import tune_all
from workers.identity import cpu_count

CPU = {"gfx": "cpu", "cu_num": cpu_count()}


def test_a_cpu_campaign_from_empty_to_done(live_server, page):
    c = live_server.client()
    shapes = [{"M": m, "N": 128, "K": 256, "count": 10} for m in (4, 8)]
    cid = c.post("/v1/captures", json={"image_digest": DIGEST, "family": "bf16_gemm", "shapes": shapes,
                                       **CPU}).json()["campaign_id"]
    page.goto(f"{live_server.url}/campaigns/{cid}")
    assert page.locator("#download-none").is_visible() and page.locator("#download").count() == 0
    assert page.locator("#coverage-none").is_visible() and page.locator("#coverage").count() == 0
    assert "CPU time spent" in page.locator("#time-spent").inner_text()
    page.screenshot(path=str(ARTIFACTS / "campaign-empty.png"), full_page=True)

    tune_all(c, **CPU)  # a worker's results over HTTP (without a timed default, each row goes in)
    # the open page refreshes itself (static/live.js): the download link and the plot appear without a reload.
    # Waited for with both rows in: a refresh that lands between the two posts shows one (one refresh in 5 s
    # does, as often as the posts take on a loaded machine)
    page.wait_for_function("(document.getElementById('download')?.parentElement.innerText || '').includes('(2 rows)')",
                           timeout=30_000)
    page.locator("#coverage").wait_for()
    assert page.locator("tr.shape[data-state='tuned']").count() == 2
    svg = page.request.get(f"{live_server.url}/campaigns/{cid}/coverage.svg").text()
    assert "CPU time spent" in svg and 'class="xtick"' in svg
    page.wait_for_function("document.getElementById('coverage').complete")
    page.screenshot(path=str(ARTIFACTS / "campaign-done.png"), full_page=True)


def test_an_unknown_campaign_is_a_page_that_leads_home(live_server, page):
    r = page.goto(f"{live_server.url}/campaigns/999")
    assert r.status == 404 and page.locator("h1#not-found").inner_text() == "Not found"
    assert "no campaign 999" in page.content()
    page.screenshot(path=str(ARTIFACTS / "not-found.png"), full_page=True)
    page.get_by_role("link", name="All images and campaigns").click()
    page.wait_for_url(f"{live_server.url}/")
    assert page.locator("h1").first.inner_text() == "Images"


def test_the_token_page_creates_refuses_and_revokes(live_server, page):
    page.goto(f"{live_server.url}/tokens")
    assert page.locator("#tokens-empty").is_visible()
    page.fill("#admin-token", ADMIN)
    page.click("#auth-form button")
    page.locator("tr.token[data-name='bootstrap-admin']").wait_for()

    page.fill("#new-name", "pool-b")
    page.fill("#new-digests", "notadigest")
    page.click("#create-form button")
    page.wait_for_function("document.getElementById('token-error').textContent.includes('digests')")
    assert page.locator("tr.token[data-name='pool-b']").count() == 0

    page.fill("#new-digests", DIGEST)
    page.click("#create-form button")
    page.locator("tr.token[data-name='pool-b']").wait_for()
    secret = page.locator("#new-secret").inner_text()
    assert secret.startswith("atk_") and page.locator("#token-error").inner_text() == ""
    assert live_server.client(secret).get("/v1/workers").status_code == 200
    page.screenshot(path=str(ARTIFACTS / "tokens.png"), full_page=True)

    row = page.locator("tr.token[data-name='pool-b']")
    row.locator("button.revoke").click()
    page.wait_for_function(
        "document.querySelector(\"tr.token[data-name='pool-b']\").innerText.includes('revoked')")
    assert live_server.client(secret).get("/v1/workers").status_code == 401
