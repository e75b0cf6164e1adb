"""32 agents lease from one campaign at once against a real server; busy SQLite answers 503, never 500."""

from __future__ import annotations

import sqlite3
import threading
from collections import Counter

import httpx
import pytest
from sqlalchemy import func, select

from app.db.models import CampaignShape, Result
from app.db.session import Database
from tests.conftest import ADMIN, DIGEST, start_server, wait_for
from workers.client import ServiceClient

N_AGENTS, N_SHAPES = 32, 240


@pytest.fixture
def server(db_url, tmp_path):
    srv = start_server(db_url, tmp_path / "server.log", {"TUNER_LEASE_TTL_S": "120"})
    yield srv
    srv.proc.terminate()
    srv.proc.wait()


def test_32_agents_never_share_a_shape_and_every_shape_has_one_result(server, db_url):
    live_server = server
    c = live_server.client()
    shapes = [{"M": m, "N": 64, "K": 64} for m in range(1, N_SHAPES + 1)]
    assert c.post("/v1/captures", json={"image_digest": DIGEST, "gfx": "gfx942", "cu_num": 304,
                                        "family": "bf16_gemm", "shapes": shapes}).status_code == 201
    leased: list[list[int]] = []
    statuses: Counter = Counter()
    lock = threading.Lock()
    errors: list[str] = []
    start = threading.Barrier(N_AGENTS)

    def agent(i: int) -> None:
        cl = ServiceClient(live_server.url, retry_for_s=60, token=ADMIN)
        try:
            start.wait()
            while True:
                body = cl.lease({"worker_id": f"a{i}", "image_digest": DIGEST, "gfx": "gfx942", "cu_num": 304,
                                 "backends": ["torch"], "budget_s": 60, "max_shapes": 3})
                if body is None:
                    return
                with lock:
                    leased.append([x.shape_id for x in body.shapes])
                for item in body.shapes:
                    row = dict(item.shape, gfx="gfx942", cu_num="304", libtype="torch", solidx="0", splitK="0",
                               us=str(1 + i), kernelName=f"k{i}", err_ratio="0", tflops="1", bw="1")
                    res = {"shape_id": item.shape_id, "backend": "torch", "status": "ok", "row": row,
                           "us": 1.0 + i, "err_ratio": 0.0, "elapsed_s": 0.01}
                    for _ in range(2 if item.shape_id % 3 == 0 else 1):  # some posts repeated
                        out = cl.post_result(body.lease_id, res)
                        with lock:
                            statuses["duplicate" if out.duplicate else "new"] += 1
        except Exception as e:  # surfaced below
            errors.append(repr(e))
        finally:
            cl.close()

    threads = [threading.Thread(target=agent, args=(i,)) for i in range(N_AGENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors[:3]
    ids = [sid for batch in leased for sid in batch]
    assert len(ids) == len(set(ids)) == N_SHAPES, "a shape was in two leases"
    assert statuses["new"] == N_SHAPES and statuses["duplicate"] == N_SHAPES // 3
    db = Database(db_url)
    with db.session(write=False) as s:
        per_shape = Counter(s.scalars(select(Result.shape_id)))
        tuned = s.scalar(select(func.count()).select_from(CampaignShape).where(CampaignShape.state == "tuned"))
    db.dispose()
    assert len(per_shape) == N_SHAPES and set(per_shape.values()) == {1}
    assert tuned == N_SHAPES
    camp = c.get("/v1/campaigns").json()[0]
    assert (camp["tuned"], camp["queued"], camp["leased"]) == (N_SHAPES, 0, 0)


def test_busy_sqlite_is_503_with_retry_after_and_the_agent_waits(tmp_path):
    url = f"sqlite:///{tmp_path / 'busy.db'}"
    srv = start_server(url, tmp_path / "server.log", {"TUNER_SQLITE_BUSY_MS": "100", "TUNER_RETRY_AFTER_S": "1"})
    try:
        holder = sqlite3.connect(tmp_path / "busy.db", isolation_level=None, check_same_thread=False)
        holder.execute("BEGIN IMMEDIATE")  # another writer holds the database
        body = {"image_digest": DIGEST, "gfx": "gfx942", "cu_num": 304, "family": "bf16_gemm",
                "shapes": [{"M": 1, "N": 2, "K": 3}]}
        r = httpx.post(srv.url + "/v1/captures", json=body, timeout=10,
                       headers={"Authorization": f"Bearer {ADMIN}"})
        assert r.status_code == 503 and r.headers["retry-after"] == "1", r.text
        cl = ServiceClient(srv.url, retry_for_s=30, token=ADMIN)

        def release_once_refused() -> None:  # the lock goes once a request met it, however long that took
            try:
                wait_for(lambda: cl.retries >= 1)
            finally:
                holder.execute("ROLLBACK")
        threading.Thread(target=release_once_refused, daemon=True).start()
        out = cl.lease({"worker_id": "w", "image_digest": DIGEST, "gfx": "gfx942", "cu_num": 304,
                        "backends": ["torch"], "budget_s": 10})
        assert out is None and cl.retries >= 1  # it waited for the lock instead of failing
        cl.close()
        assert "Traceback" not in srv.log.read_text()
    finally:
        srv.proc.terminate()
        srv.proc.wait()

