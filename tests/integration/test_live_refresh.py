"""The live refresh (app/web/static/live.js) polls a page with the tag it last got. The campaign page's tag is made
from what the page shows, read before its listed shapes are checked or it is rendered (app/web/routes.py _Head):
an unchanged page costs a bodiless 304 and no rendering, and every change that alters the page alters the tag.
Each kind of change is made here over HTTP to a real server (both engines) and seen to move the tag."""

from __future__ import annotations

import time

import pytest

from tests.conftest import DIGEST, capture, wait_for
from tests.integration.test_leasing_api import lease, ok_row, plausible_us

SHAPES = [{"M": m, "N": 64, "K": 64, "count": 1 + m % 3} for m in range(1, 9)]
HEADER = "gfx,cu_num,M,N,K,bias,dtype,outdtype,scaleAB,bpreshuffle,libtype,solidx,splitK,us,kernelName"


class Tags:
    """A page's tag as the live refresh sees it: its own tag gets a 304, and each change must move it."""

    def __init__(self, c, url: str, **params) -> None:  # type: ignore[no-untyped-def]
        self.c, self.url, self.params = c, url, {"partial": 1, **params}
        self.last = self.now()

    def now(self) -> str:
        r = self.c.get(self.url, params=self.params)
        assert r.status_code == 200 and r.headers["etag"], r.text[:300]
        again = self.c.get(self.url, params=self.params, headers={"If-None-Match": r.headers["etag"]})
        assert again.status_code == 304 and again.content == b"", "an unchanged page is sent again"
        return r.headers["etag"]

    def moved(self, what: str) -> str:
        new = self.now()
        assert new != self.last, f"{what} left the page's tag as it was"
        self.last = new
        return new

    def same(self, what: str) -> None:
        r = self.c.get(self.url, params=self.params, headers={"If-None-Match": self.last})
        assert r.status_code == 304, f"{what} moved the page's tag"


def tune(c, body: dict, item: dict) -> None:  # type: ignore[no-untyped-def]
    r = c.post(f"/v1/leases/{body['lease_id']}/results", json=ok_row(body, item, plausible_us(body, item, 2.0)))
    assert r.status_code == 200 and r.json()["verified"], r.text


def test_each_change_on_the_campaign_page_moves_its_tag(live_server):
    c = live_server.client()
    cid = capture(c, SHAPES).json()["campaign_id"]
    page = Tags(c, f"/campaigns/{cid}")
    assert page.last != Tags(c, f"/campaigns/{cid}", partial=0).last  # the whole page is another body
    capture(c, [{"M": 99, "N": 64, "K": 64}])
    page.moved("a new shape")
    capture(c, [dict(SHAPES[0], count=500)])
    page.moved("a shape's served time")

    body = lease(c, max_shapes=2, budget_s=1000).json()
    page.moved("a lease taken")
    assert c.post(f"/v1/leases/{body['lease_id']}/heartbeat").status_code == 200
    page.same("a heartbeat")
    tuned, back = body["shapes"]
    tune(c, body, tuned)
    page.moved("a result")
    assert c.post(f"/v1/leases/{body['lease_id']}/release").json()["requeued"] == 1
    page.moved("a lease released")

    before = page.last
    body = lease(c, max_shapes=1, budget_s=1000).json()
    page.moved("a lease taken")
    assert c.post(f"/v1/leases/{body['lease_id']}/release").status_code == 200
    page.moved("a lease given back")
    assert page.last == before  # untouched: the page, and so its tag, is as it was before the lease
    body = lease(c, max_shapes=1, budget_s=1000).json()
    page.moved("a lease taken")
    started = [body["shapes"][0]["shape_id"]]
    assert c.post(f"/v1/leases/{body['lease_id']}/release", json={"started": started}).status_code == 200
    page.moved("a lease given back")
    assert page.last != before, "a counted try (the shape's attempts, its last error) left the tag as it was"

    form = c.get(f"/v1/campaigns/{cid}/engagement").json()["form"]
    proof = {"form": form, "worker_id": "w1", "results": [{"shape_id": tuned["shape_id"], "hit": True}]}
    assert c.post(f"/v1/campaigns/{cid}/engagement/proofs", json=proof).status_code == 201
    page.moved("a proof")
    shipped = f"{HEADER}\ngfx942,304,7,64,64,False,torch.bfloat16,torch.bfloat16,False,False,hipblaslt,1,0,5.0,k\n"
    hits = c.get(f"/v1/campaigns/{cid}/engagement").json()["hits"]
    r = c.put(f"/v1/images/{DIGEST}/tables", json={"tables": {"bf16_tuned_gemm.csv": shipped}})
    assert r.status_code == 200, r.text
    assert c.get(f"/v1/campaigns/{cid}/engagement").json()["hits"] == hits + 1  # M=7 now hits a shipped row
    page.moved("the rules' table (the image's shipped rows)")
    verification = {"image_digest": DIGEST, "family": "bf16_gemm", "worker_id": "w1", "rows": 1, "exit_code": 0,
                    "command": "python -m workers.verify", "output_tail": "ok"}
    assert c.post("/v1/verifications", json=verification).status_code == 201
    page.moved("a verification")
    build = {"image_digest": DIGEST, "family": "bf16_gemm", "worker_id": "w1", "seconds": 12.5, "ok": True,
             "output_tail": "[aiter] build ..."}
    assert c.post("/v1/builds", json=build).status_code == 201
    page.moved("a build's time")


def test_a_large_campaigns_totals_landing_move_its_tag(live_server):
    """Over page_totals.INLINE_MAX shapes the totals are counted off the request: "(counting)", then the count."""
    c = live_server.client()
    cid = capture(c, [{"M": m, "N": 64, "K": 64} for m in range(1, 1102)]).json()["campaign_id"]
    first = c.get(f"/campaigns/{cid}", params={"partial": 1})  # it starts the count, which may land at once
    assert "(counting)" in first.text
    wait_for(lambda: "(counting)" not in c.get(f"/campaigns/{cid}", params={"partial": 1}).text, 120)
    assert Tags(c, f"/campaigns/{cid}").last != first.headers["etag"]


def test_the_home_pages_tag_moves_with_its_campaigns(live_server):
    c = live_server.client()
    capture(c, SHAPES)
    home = Tags(c, "/")
    capture(c, SHAPES, gfx="gfx950", cu_num=256)
    home.moved("a new campaign")
    assert lease(c, max_shapes=1).status_code == 200
    home.moved("a lease taken")


@pytest.fixture
def large(client, monkeypatch):  # type: ignore[no-untyped-def]
    """A campaign whose totals are counted off the request, counted once, then moved on by a result: the page
    shows the last count with its age."""
    from app.services import page_totals

    monkeypatch.setattr(page_totals, "INLINE_MAX", 100)
    cid = capture(client, [{"M": m, "N": 64, "K": 64} for m in range(1, 206)]).json()["campaign_id"]
    url = f"/campaigns/{cid}"
    wait_for(lambda: "(counting)" not in client.get(url).text)
    body = lease(client, max_shapes=1, budget_s=1000).json()
    tune(client, body, body["shapes"][0])
    page = client.get(url, params={"partial": 1})
    assert "(counted under a minute ago)" in page.text
    return url, page.headers["etag"]


def test_an_unchanged_campaign_page_is_a_304_checked_and_rendered_nowhere(client, large, monkeypatch):
    from app.domain import engagement as eng
    from app.services import campaigns
    from app.web import routes

    url, tag = large
    work: list[str] = []
    render, listing, check = routes.templates.TemplateResponse, campaigns.shapes, eng.check
    monkeypatch.setattr(routes.templates, "TemplateResponse", lambda *a, **k: work.append("render") or render(*a, **k))
    monkeypatch.setattr(campaigns, "shapes", lambda *a, **k: work.append("list") or listing(*a, **k))
    monkeypatch.setattr(eng, "check", lambda *a, **k: work.append(f"check {len(a[4])}") or check(*a, **k))
    for _ in range(3):
        r = client.get(url, params={"partial": 1}, headers={"If-None-Match": tag})
        assert r.status_code == 304 and r.headers["etag"] == tag
    assert work == ["check 0"] * 3  # the table's own verdict (a loader that raises) only: no shape, no page
    assert client.get(url, params={"partial": 1}).status_code == 200
    assert "render" in work and "list" in work and "check 200" in work  # the counter sees a page made


def test_a_stale_counts_age_moves_the_tag_once_a_minute(client, large, monkeypatch):
    from app.services import page_totals

    url, tag = large
    real = time.monotonic
    monkeypatch.setattr(page_totals.time, "monotonic", lambda: real() + 25)
    assert client.get(url, params={"partial": 1}, headers={"If-None-Match": tag}).status_code == 304
    monkeypatch.setattr(client.app.state.caches.totals, "_start", lambda *a: None)  # the stale count stays on the page
    monkeypatch.setattr(page_totals.time, "monotonic", lambda: real() + 61)
    later = client.get(url, params={"partial": 1}, headers={"If-None-Match": tag})
    assert later.status_code == 200 and later.headers["etag"] != tag
    assert "(counted 1 min ago)" in later.text


def test_a_304_starts_a_due_count(client, large, monkeypatch):
    """The tag of a stale count holds until the count is redone; the 304 starts it once due, as a page does."""
    from app.services import page_totals

    url, tag = large
    monkeypatch.setattr(page_totals, "REFRESH_S", 0.0)
    deadline = time.monotonic() + 30
    while (r := client.get(url, params={"partial": 1}, headers={"If-None-Match": tag})).status_code == 304:
        assert time.monotonic() < deadline, "no 304 started the due count"
        time.sleep(0.1)
    assert "counted" not in r.text and r.headers["etag"] != tag
