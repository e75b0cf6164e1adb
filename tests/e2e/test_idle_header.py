"""A digest with a newline stored before issue 26's fullmatch (re.match's `$` let it in) must not break every idle
worker's 'no work' answer: the reason header is made a safe value, the worker's --once ends."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from app.db.session import Database
from tests.conftest import DIGEST, OTHER_DIGEST, start_server
from tests.e2e.test_agent_resilience import IDENT, Scripted
from workers.agent import Agent, AgentConfig
from workers.client import ServiceClient

pytestmark = pytest.mark.e2e


def test_a_stored_digest_with_a_newline_does_not_break_the_idle_answer(tmp_path):
    url = f"sqlite:///{tmp_path / 'tuner.db'}"
    srv = start_server(url, tmp_path / "server.log")
    try:
        with srv.client() as c:
            r = c.post("/v1/captures", json={"image_digest": DIGEST, "gfx": "gfx942", "cu_num": 304,
                                             "family": "bf16_gemm", "shapes": [{"M": 1, "N": 64, "K": 64}]})
            assert r.status_code == 201, r.text
        db = Database(url)
        with db.session() as s:  # as an older service stored it
            s.execute(text("INSERT INTO images (digest, created_at) SELECT :d, created_at FROM images"),
                      {"d": DIGEST + "\n"})
            for table in ("campaigns", "captures"):
                s.execute(text(f"UPDATE {table} SET image_digest = :d"), {"d": DIGEST + "\n"})
        db.dispose()
        client = ServiceClient(srv.url, token="atk_test-admin-token", retry_for_s=30)
        a = Agent(client, Scripted(), IDENT, AgentConfig("w1", OTHER_DIGEST, budget_s=30, once=True, poll_s=0.1,
                                                         spool_dir=str(tmp_path / "spool")))
        a.run()  # returns: the 204 came through, --once saw no work
        assert client.idle_reason and "\n" not in client.idle_reason and "\\n" in client.idle_reason
    finally:
        srv.proc.kill()
        srv.proc.wait()
