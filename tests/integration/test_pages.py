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
    in_request = [n for name, n in checked if not name.startswith("page-totals")]
    assert in_request == [200], checked  # never every shape within the request
    deadline = time.monotonic() + 30
    while (now := predicted.search(client.get(f"/campaigns/{cid}").text).groups())[0] == "(counting)":
        assert time.monotonic() < deadline, "the count never landed"
        time.sleep(0.1)
    assert now == inline  # the background count is the same count
    assert ("page-totals-%d" % cid, 205) in checked
