"""A worker with no work says why: the service names the identity it asked for and where work is queued."""

from __future__ import annotations

import json
import socket

from tests.conftest import DIGEST, capture
from workers import cli
from workers.identity import cpu_count


def test_an_empty_lease_names_the_identity_and_the_queued_campaigns(client):
    body = {"worker_id": "w", "image_digest": DIGEST, "gfx": "cpu", "cu_num": 2, "backends": ["torch"],
            "budget_s": 10}
    r = client.post("/v1/leases", json=body)
    assert r.status_code == 204 and "no campaign has queued shapes" in r.headers["x-tuner-idle-reason"]
    capture(client, [{"M": 1, "N": 1280, "K": 8192}, {"M": 2, "N": 1280, "K": 8192}])
    r = client.post("/v1/leases", json=body)
    reason = r.headers["x-tuner-idle-reason"]
    assert r.status_code == 204 and reason.startswith("no queued shapes for gfx=cpu cu_num=2"), reason
    assert "gfx942/304 bf16_gemm (2 queued" in reason


def test_the_worker_prints_why_it_had_nothing_to_do_and_names_host_and_device(live_server, capsys):
    c = live_server.client()
    assert capture(c, [{"M": 1, "N": 1280, "K": 8192}]).status_code == 201
    rc = cli.main(["--service", live_server.url, "--backend", "torch", "--image-digest", DIGEST, "--once",
                   "--token", live_server.token("worker", "idle")])
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 0 and out["batches"] == 0
    assert out["idle"].startswith(f"no queued shapes for gfx=cpu cu_num={cpu_count()}")
    assert "gfx942/304 bf16_gemm (1 queued" in out["idle"]
    assert out["worker_id"] == f"{socket.gethostname()}-cpu"
