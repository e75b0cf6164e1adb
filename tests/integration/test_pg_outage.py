"""A PostgreSQL outage (its postmaster killed -9) under a real server: every route answers 503 with Retry-After, never
500, for as long as the database is gone (pooled connections found dead in use, then connections refused), and
the server serves again once it is back. The database is a server of the test's own (tests/private_pg.py)."""

from __future__ import annotations

import subprocess
import time

import httpx
import pytest

from app.db.session import IDLE_PING_S
from tests.conftest import DIGEST, start_server, wait_for
from tests.private_pg import private_pg  # noqa: F401 - the fixture

pytestmark = pytest.mark.e2e
WORKER = {"X-Worker-Id": "w-outage"}


def _calls(cid: int, lease_id: str, shape_id: int) -> list[tuple[str, str, dict | None]]:
    """Every route of the API and the dashboard, with a valid body where it takes one."""
    result = {"shape_id": shape_id, "backend": "torch", "status": "failed", "error": "x"}
    lease = {"worker_id": "w-outage", "image_digest": DIGEST, "gfx": "gfx942", "cu_num": 304, "backends": ["torch"],
             "budget_s": 60, "max_shapes": 1}
    overlay = f"/v1/overlays/{DIGEST}/bf16_gemm"
    return [
        ("POST", "/v1/leases", lease), ("POST", f"/v1/leases/{lease_id}/heartbeat", None),
        ("POST", f"/v1/leases/{lease_id}/results", result),
        ("POST", f"/v1/leases/{lease_id}/results/batch", {"results": [result]}),
        ("POST", f"/v1/leases/{lease_id}/release", {"started": []}), ("GET", "/healthz", None),
        ("POST", "/v1/captures", {"image_digest": DIGEST, "gfx": "gfx942", "cu_num": 304, "family": "bf16_gemm",
                                  "shapes": [{"M": 7, "N": 64, "K": 64}]}),
        ("GET", "/v1/campaigns", None), ("GET", f"/v1/campaigns/{cid}", None),
        ("GET", f"/v1/campaigns/{cid}/shapes", None), ("GET", f"/v1/campaigns/{cid}/engagement", None),
        ("GET", f"/v1/campaigns/{cid}/bucket-plan", None), ("POST", f"/v1/campaigns/{cid}/requeue-failed", None),
        ("GET", "/v1/workers", None), ("GET", overlay + ".csv", None), ("GET", overlay, None),
        ("GET", overlay + "/deploy", None), ("GET", overlay + "/verifications", None),
        ("POST", "/v1/builds", {"image_digest": DIGEST, "family": "bf16_gemm", "worker_id": "w-outage",
                                "seconds": 1.0, "ok": True}),
        ("GET", f"/v1/images/{DIGEST}/schemas", None), ("GET", "/v1/tokens", None),
        ("POST", "/v1/tokens", {"name": "t", "role": "read"}), ("DELETE", "/v1/tokens/999", None),
        ("GET", "/", None), ("GET", f"/campaigns/{cid}", None), ("GET", f"/campaigns/{cid}/coverage.svg", None),
        ("GET", "/workers", None), ("GET", "/tokens", None), ("GET", "/metrics", None),
    ]


def test_every_route_answers_503_never_500_while_postgresql_is_down(private_pg, tmp_path):  # noqa: F811
    from tests.conftest import _pg_database
    import tests.conftest as conftest
    shared, conftest.PG_URL = conftest.PG_URL, private_pg.url
    try:
        url = _pg_database()  # a database on the private server
    finally:
        conftest.PG_URL = shared
    srv = start_server(url, tmp_path / "server.log", {"TUNER_LEASE_TTL_S": "600", "TUNER_TOKEN_CACHE_S": "600"})
    try:
        with srv.client() as c:
            r = c.post("/v1/captures", json={"image_digest": DIGEST, "gfx": "gfx942", "cu_num": 304,
                                             "family": "bf16_gemm", "shapes": [{"M": m, "N": 64, "K": 64}
                                                                               for m in range(1, 5)]})
            assert r.status_code == 201, r.text
            cid = r.json()["campaign_id"]
            lease = c.post("/v1/leases", json=_calls(cid, "", 0)[0][2], headers=WORKER).json()
            calls = _calls(cid, lease["lease_id"], lease["shapes"][0]["shape_id"])
            for method, path, body in calls:  # every connection the server keeps is a used one now
                c.request(method, path, json=body, headers=WORKER)
            private_pg.kill()
            seen: dict[str, set[int]] = {}
            for _round in range(3):  # pooled connections found dead in use, then none to be had at all
                if _round:  # each kept connection idle past the ping interval: the pool connects afresh, refused
                    time.sleep(IDLE_PING_S + 0.5)
                for method, path, body in calls:
                    r = c.request(method, path, json=body, headers=WORKER)
                    seen.setdefault(f"{method} {path}", set()).add(r.status_code)
                    assert r.status_code < 500 or (r.status_code == 503 and r.headers.get("Retry-After")), \
                        f"{method} {path} answered {r.status_code} during the outage: {r.text[:300]}"
            assert seen["POST /v1/leases"] == {503} and seen[f"POST /v1/leases/{lease['lease_id']}/results"] == {503}
            private_pg.start()
            wait_for(lambda: c.get("/v1/campaigns").status_code == 200, timeout=120, every=0.5)
            assert c.post("/v1/leases", json=calls[0][2], headers=WORKER).status_code in (200, 204)
        assert srv.proc.poll() is None
    finally:
        srv.proc.terminate()
        try:
            srv.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            srv.proc.kill()
    log = (tmp_path / "server.log").read_text()
    assert "Traceback" not in log, log[-3000:]
