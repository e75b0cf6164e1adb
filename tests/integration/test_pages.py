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
