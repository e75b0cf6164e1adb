"""Pages stay small: shapes and engagement reports come a keyset page at a time, the live page gets a 304
until it changed."""

from __future__ import annotations

from tests.conftest import capture
from tests.integration.test_leasing_api import lease

# M x bias: bias=True/False pairs tie on served time, so the id must break ties the same way on every page
SHAPES = [{"M": m, "N": 64, "K": 64, "bias": b, "count": 1 + m % 3} for m in range(1, 14) for b in (False, True)]


def walk(client, url, key, limit):
    out, after = [], None
    while True:
        body = client.get(url, params={"limit": limit, **({"after": after} if after else {})}).json()
        out += body[key]
        after = body["next"]
        if after is None:
            return out


def test_shape_pages_walk_the_served_order_once_across_states(client):
    cid = capture(client, SHAPES).json()["campaign_id"]
    assert lease(client, max_shapes=3).status_code == 200  # a mix of queued and leased rows
    rows = walk(client, f"/v1/campaigns/{cid}/shapes", "shapes", 4)
    assert len(rows) == len(SHAPES) == len({x["shape_id"] for x in rows})
    assert [x["shape_id"] for x in rows] == [x["shape_id"] for x in sorted(rows, key=lambda x: (-x["served"],
                                                                                                  x["shape_id"]))]
    assert {x["state"] for x in rows} == {"queued", "leased"}
    first = client.get(f"/v1/campaigns/{cid}", params={"limit": 4}).json()
    assert [x["shape_id"] for x in first["shape_list"]] == [x["shape_id"] for x in rows[:4]] and first["next"]
    assert client.get(f"/v1/campaigns/{cid}/shapes", params={"after": "nope"}).json()["field"] == "after"
    assert client.get(f"/v1/campaigns/{cid}/shapes", params={"limit": 0}).status_code == 422


def test_engagement_report_pages_but_counts_every_shape(client):
    cid = capture(client, SHAPES).json()["campaign_id"]
    one = client.get(f"/v1/campaigns/{cid}/engagement", params={"limit": 5}).json()
    assert one["shapes"] == len(SHAPES) and one["misses"] == len(SHAPES) and len(one["report"]) == 5
    report = walk(client, f"/v1/campaigns/{cid}/engagement", "report", 5)
    assert sorted(x["shape_id"] for x in report) == sorted({x["shape_id"] for x in report})
    assert len(report) == len(SHAPES)


def test_campaign_page_links_the_next_page_and_answers_304_until_it_changes(client):
    cid = capture(client, SHAPES).json()["campaign_id"]
    page = client.get(f"/campaigns/{cid}", params={"partial": 1})
    assert page.status_code == 200 and page.text.count('class="shape"') == len(SHAPES)
    tag = page.headers["etag"]
    assert client.get(f"/campaigns/{cid}", params={"partial": 1}, headers={"If-None-Match": tag}).status_code == 304
    assert lease(client, max_shapes=1).status_code == 200
    changed = client.get(f"/campaigns/{cid}", params={"partial": 1}, headers={"If-None-Match": tag})
    assert changed.status_code == 200 and changed.headers["etag"] != tag


def test_a_large_campaign_page_checks_only_its_listed_shapes_and_counts_the_totals_off_the_request(client,
                                                                                                    monkeypatch):
    import re
    import threading
    import time

    from app.domain import engagement as eng
    from app.services import page_totals
    from tests.integration.test_leasing_api import ok_row, plausible_us

    cid = capture(client, [{"M": m, "N": 64, "K": 64} for m in range(1, 206)]).json()["campaign_id"]
    body = lease(client, max_shapes=3, budget_s=1000).json()
    for item in body["shapes"]:
        r = client.post(f"/v1/leases/{body['lease_id']}/results",
                        json=ok_row(body, item, plausible_us(body, item, 2.0)))
        assert r.status_code == 200, r.text
    predicted = re.compile(r'id="predicted">.*?(\(counting\)|\d+)(?:</i>)?\s+of (\d+) captured', re.S)
    inline = predicted.search(client.get(f"/campaigns/{cid}").text).groups()  # small enough: counted in place
    assert inline[1] == "205" and int(inline[0]) >= 3

    checked: list[tuple[str, int]] = []
    real = eng.check
    monkeypatch.setattr(eng, "check", lambda *a, **k: checked.append(
        (threading.current_thread().name, len(a[4]))) or real(*a, **k))
    monkeypatch.setattr(page_totals, "INLINE_MAX", 100)
    first = client.get(f"/campaigns/{cid}").text
    assert predicted.search(first).groups() == ("(counting)", "205")
    assert first.count('class="shape"') == 200  # its own verdicts: the shapes it lists
    # the page's tag reads the table's own verdict (a loader that raises) with no shape: engagement.page_version
    in_request = [n for name, n in checked if n and not name.startswith("page-totals")]
    assert in_request == [200], checked  # never every shape within the request
    deadline = time.monotonic() + 30
    while (now := predicted.search(client.get(f"/campaigns/{cid}").text).groups())[0] == "(counting)":
        assert time.monotonic() < deadline, "the count never landed"
        time.sleep(0.1)
    assert now == inline  # the background count is the same count
    assert ("page-totals-%d" % cid, 205) in checked


def test_a_large_campaign_report_checks_its_page_and_counts_totals_per_version_off_the_request(client,
                                                                                                 monkeypatch):
    """The report of a large campaign checks its page's shapes only; its totals over every shape are a
    background count kept per (form or table, rules and table, shapes, proof): null and pending until counted,
    then equal to a count of every shape within the request, and counted anew when any of those moves."""
    import threading
    import time

    from app.domain import engagement as eng
    from app.services import page_totals
    from tests.integration.test_leasing_api import ok_row, plausible_us

    cid = capture(client, [{"M": m, "N": 64, "K": 64, "count": m} for m in range(1, 206)]).json()["campaign_id"]
    url = f"/v1/campaigns/{cid}/engagement"
    totals = ("hits", "misses", "served_time_covered", "totals_pending", "totals_stale_s")
    monkeypatch.setattr(page_totals, "REFRESH_S", 0.0)  # a newer version is recounted at once

    def full(**kw):  # the same report counted over every shape within the request
        monkeypatch.setattr(page_totals, "INLINE_MAX", 10_000)
        try:
            return view(**kw)
        finally:
            monkeypatch.setattr(page_totals, "INLINE_MAX", 100)

    def view(table=None, **params):
        r = (client.get(url, params=params) if table is None else
             client.post(url, params=params, content=table, headers={"content-type": "text/csv"}))
        assert r.status_code == 200, r.text
        return r.json()

    def settled(**kw):
        deadline = time.monotonic() + 60
        while (body := view(**kw))["totals_pending"]:
            assert time.monotonic() < deadline, "the count never landed"
            time.sleep(0.05)
        want = full(**kw)
        assert {k: body[k] for k in totals} == {k: want[k] for k in totals}
        assert (body["proof"] or {}).get("disagreements") == (want["proof"] or {}).get("disagreements")
        return body

    checked: list[tuple[str, int]] = []
    real = eng.check
    monkeypatch.setattr(eng, "check", lambda *a, **k: checked.append(
        (threading.current_thread().name, len(a[4]))) or real(*a, **k))
    monkeypatch.setattr(page_totals, "INLINE_MAX", 100)
    first = view(limit=10)
    assert [n for name, n in checked if not name.startswith("page-totals")] == [10], checked  # the page only
    assert first["shapes"] == 205 and len(first["report"]) == 10 and first["next"]
    assert first["totals_pending"] and first["hits"] is first["misses"] is first["served_time_covered"] is None
    assert first["report"] == full(limit=10)["report"]  # each shape's verdict as when every shape is checked
    before = settled(limit=10)
    assert before["hits"] == 0 and before["misses"] == 205 and before["totals_stale_s"] is None
    assert ("page-totals-%d" % cid, 205) in checked

    body = lease(client, max_shapes=3, budget_s=1000).json()  # a result lands: its row makes a hit
    for item in body["shapes"]:
        assert client.post(f"/v1/leases/{body['lease_id']}/results",
                           json=ok_row(body, item, plausible_us(body, item, 2.0))).status_code == 200
    moved = view()
    assert moved["totals_pending"] and moved["totals_stale_s"] is not None and moved["hits"] == 0  # the last count
    tuned = settled()
    assert tuned["hits"] == 3 and tuned["served_time_covered"] > 0

    capture(client, [dict(item["shape"], count=10_000) for item in body["shapes"]])  # their served time grows
    assert view()["totals_pending"]
    assert settled()["served_time_covered"] > tuned["served_time_covered"]

    proof = {"form": tuned["form"], "worker_id": "w1", "results": [  # proved misses: 3 disagreements, and the
        {"shape_id": item["shape_id"], "hit": False} for item in body["shapes"]]}  # 202 not probed disagree too
    assert client.post(f"{url}/proofs", json=proof).status_code == 201
    assert view()["totals_pending"]
    assert settled()["proof"]["disagreements"] == 205

    other = next(f for f in ("merged", "layer") if f != tuned["form"])  # another form: its own count
    assert view(form=other)["hits"] is None
    settled(form=other)

    header = "gfx,cu_num,M,N,K,bias,dtype,outdtype,scaleAB,bpreshuffle,libtype,solidx,splitK,us,kernelName"
    row = "gfx942,304,{m},64,64,False,torch.bfloat16,torch.bfloat16,False,False,hipblaslt,1,0,5.0,k"
    one = f"{header}\n{row.format(m=7)}\n"
    assert view(table=one)["hits"] is None  # a supplied table: its own count, by its content
    assert settled(table=one)["hits"] == 1
    two = f"{header}\n{row.format(m=7)}\n{row.format(m=8)}\n"
    assert view(table=two)["hits"] is None
    assert settled(table=two)["hits"] > 1  # M=8 is also the padded M of smaller shapes


def test_a_results_timing_confidence_and_spread_are_stored_and_shown_on_the_campaign_page(client):
    """Issue 34: what a worker says of its timing (the decision's confidence over capture windows, the winner's
    spread, worst/p90/drift) is kept with the result and shown beside the shape; out of range is a 422."""
    from tests.integration.test_leasing_api import ok_row, plausible_us

    cid = capture(client, [{"M": 1, "N": 64, "K": 64}]).json()["campaign_id"]
    body = lease(client, max_shapes=1, budget_s=1000).json()
    item = body["shapes"][0]
    good = ok_row(body, item, plausible_us(body, item, 2.0))
    timing = {"decision": "win", "reason": "x 2.00% faster than torch_linear in 5 of 5 capture windows",
              "windows": 5, "busy_windows": 1, "worst_us": 3.0, "p90_us": 2.5, "drift": 0.004, "spread": 0.012}
    bad = client.post(f"/v1/leases/{body['lease_id']}/results", json={**good, "confidence": 1.5})
    assert bad.status_code == 422 and "confidence" in bad.text
    r = client.post(f"/v1/leases/{body['lease_id']}/results",
                    json={**good, "confidence": 0.96875, "spread": 0.012, "timing": timing})
    assert r.status_code == 200, r.text
    page = client.get(f"/campaigns/{cid}").text
    assert '<td class="num confidence" title="win: x 2.00% faster' in page and ">0.969</td>" in page
    assert '<td class="num spread">1.2%</td>' in page
