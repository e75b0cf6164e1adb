"""After deploy, per rank (issue 49): a server log as vLLM writes it at tensor parallel 2 (one file, each worker's
lines prefixed "(Worker_TP<r> pid=<p>) ") is read rank by rank; a rank that misses shapes the overlay serves, or
builds kernels while serving, or logs nothing, raises an alert that the campaign page shows."""

from __future__ import annotations

import html

from tests.conftest import DIGEST
from tests.integration.test_ab_api import seed_overlay
from tests.unit.test_ab_gate import hit, miss

JIT = "[aiter] start build [module_gemm_a16w16] under /root/.aiter/build/module_gemm_a16w16\n"


def prefixed(rank: int, text: str) -> str:
    return "".join(f"\x1b[1;36m(Worker_TP{rank} pid={100 + rank})\x1b[0;0m {line}\n" for line in text.splitlines())


def post(client, log: str, ranks: int = 2) -> dict:
    r = client.post("/v1/engagement/logs", json={"image_digest": DIGEST, "gfx": "gfx942", "cu_num": 304,
                                                 "family": "bf16_gemm", "log": log, "ranks": ranks})
    assert r.status_code == 200, r.text
    return r.json()


def test_a_rank_that_misses_or_builds_while_serving_raises_an_alert_on_the_campaign_page(client):
    cid = seed_overlay(client, ms=(1, 2))
    log = ("(APIServer pid=99) INFO: started\n" + prefixed(0, hit(1, 1) + hit(2, 2))
           + prefixed(1, hit(1, 1) + miss(2) + JIT))
    rep = post(client, log)
    r0, r1 = rep["ranks"]
    assert (r0["rank"], r0["hit_lines"], r0["missed_served"], sum(r0["jit"].values())) == ("0", 2, 0, 0)
    assert (r1["rank"], r1["hit_lines"], r1["missed_served"], r1["jit"]["aiter"]) == ("1", 1, 1, 1)
    assert r1["missed_shapes"][0]["M"] == "2"
    assert rep["alerts"] == ["rank 1 missed 1 shape(s) the overlay serves (its files did not take on that rank)",
                             "rank 1 built kernels while serving (aiter: 1 line(s))"]
    page = html.unescape(client.get(f"/campaigns/{cid}").text)
    assert 'id="deploy-alert"' in page and "rank 1 missed 1 shape(s) the overlay serves" in page
    assert "rank 1 built kernels while serving" in page and 'id="deploy-ok"' not in page


def test_a_clean_log_on_every_rank_says_so(client):
    cid = seed_overlay(client, ms=(1, 2))
    assert 'id="deployed-none"' in client.get(f"/campaigns/{cid}").text
    rep = post(client, prefixed(0, hit(1, 1) + hit(2, 2)) + prefixed(1, hit(1, 1) + hit(2, 2)))
    assert rep["alerts"] == [] and [r["rank"] for r in rep["ranks"]] == ["0", "1"]
    page = client.get(f"/campaigns/{cid}").text
    assert 'id="deploy-ok"' in page and 'id="deploy-alert"' not in page


def test_a_rank_that_logged_nothing_is_named(client):
    seed_overlay(client, ms=(1, 2))
    rep = post(client, prefixed(0, hit(1, 1) + hit(2, 2)), ranks=2)
    assert rep["alerts"] == ["rank 1 logged no bf16_gemm lookup line (its log missing, or "
                             "AITER_LOG_TUNED_CONFIG=1 not set there)"]
    assert post(client, prefixed(0, hit(1, 1)), ranks=1)["alerts"] == []  # one rank expected, one seen
