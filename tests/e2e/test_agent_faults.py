"""The agent outlives a full disk and a proxy's page (issue 26): the measurement in hand is kept and delivered,
its lease's other shapes go back to the queue at once, nothing crashes."""

from __future__ import annotations

import errno
import http.server
import sqlite3
import threading

import pytest

from tests.e2e.test_agent_resilience import Scripted, agent, capture, server, states  # noqa: F401 - fixture
from tests.conftest import DIGEST
from workers.agent import Agent, AgentConfig
from workers.client import ServiceClient, ServiceError
from workers.identity import WorkerIdentity

pytestmark = pytest.mark.e2e


def test_a_full_spool_keeps_the_result_in_memory_posts_it_and_releases_the_rest(server, tmp_path):
    cid = capture(server, range(1, 5))
    a = agent(server, Scripted(), tmp_path, max_shapes=4)
    real_put, real_post = a.spool.put, a.client.post_results
    puts: list[int] = []

    def put(lease_id, payload):  # type: ignore[no-untyped-def]
        puts.append(payload["shape_id"])
        if len(puts) in (2, 3):  # the second result finds the disk full, and so does the retry of its write
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_put(lease_id, payload)
    posts = []

    def post_results(lease_id, bodies, as_worker=None):  # type: ignore[no-untyped-def]
        posts.append([b["shape_id"] for b in bodies])
        if len(posts) == 2:  # and its post meets an outage: it waits in memory for the next turn
            raise ServiceError("503 for a while")
        return real_post(lease_id, bodies, as_worker)
    a.spool.put, a.client.post_results = put, post_results
    stats = a.run()  # returns only because --once found no work left, nothing pending
    assert {x["state"] for x in states(server, cid).values()} == {"tuned"}
    kept = puts[1]
    assert puts.count(kept) == 2, "the spool write is retried"
    assert stats.spool_faults == 2 and stats.released == 2 and not a.unspooled and not a.spool.pending()
    with sqlite3.connect(server.db_url.removeprefix("sqlite:///")) as db:
        ended = sorted(s for s, in db.execute("SELECT state FROM leases"))
    assert "expired" not in ended and "released" in ended, ended  # the rest went back at once, not at expiry
    assert all(x["attempts"] <= 1 for x in states(server, cid).values())


class ProxyPage:
    """A load balancer answering 200 with its HTML page to the first lease request, then the service's 'no work'."""

    def __init__(self):
        self.leases = 0
        page = self

        class H(http.server.BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                page.leases += 1
                body = b"<html><body>Service temporarily unavailable</body></html>" if page.leases == 1 else b""
                self.send_response(200 if page.leases == 1 else 204)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a):  # type: ignore[no-untyped-def]
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def test_a_200_with_a_proxy_page_is_retried_not_fatal(tmp_path):
    proxy = ProxyPage()
    try:
        a = Agent(ServiceClient(proxy.url, backoff_cap_s=0.2), Scripted(),
                  WorkerIdentity(gfx="gfx942", cu_num=304, device="cpu", host="test"),
                  AgentConfig("w1", DIGEST, budget_s=30, once=True, poll_s=0.05, spool_dir=str(tmp_path / "spool")))
        stats = a.run()
        assert proxy.leases == 2 and stats.batches == 0
    finally:
        proxy.server.shutdown()
