"""What the launcher tests (Docker pool, Slurm array) share: a real service on SQLite with short leases, a campaign
the stand-in AITER tuner can answer, the moment a worker is mid-lease read from the service's database, and the
verdict read from it at the end (0 lost, 0 tuned twice)."""

from __future__ import annotations

import os
import sqlite3
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import LiveServer, start_server, wait_for
from tests.e2e import served_image
from workers.identity import cpu_count

# a killed worker's lease expires TTL s after its last heartbeat: longer than what the others still have to do
# once nothing is queued (one lease of 3 shapes at STUB_DELAY), so they must wait for its shapes to come back (a
# --once worker that ended on an empty queue would strand them); every stand-in row taken (-100)
SERVER_ENV = {"TUNER_LEASE_TTL_S": "12", "TUNER_LEASE_GRACE_S": "5", "TUNER_MIN_IMPROVEMENT_PCT": "-100",
              "TUNER_MAX_ATTEMPTS": "10"}
# each worker: the aiter backend driving the stand-in tuner, 3 shapes a lease, STUB_DELAY s a shape, --once
WORKER_ENV = {"TUNER_RACE": "exhaustive", "TUNER_COMPILE_BUDGET_S": "0", "TUNER_MAX_SHAPES": "3",
              "TUNER_POLL_S": "0.5", "TUNER_MIN_IMPROVEMENT_PCT": "-100", "TUNER_BUDGET_S": "60",
              "STUB_DELAY": "1.5"}


@dataclass
class Service:
    srv: LiveServer
    db: Path
    campaign: int
    n_shapes: int

    def query(self, sql: str, *args: object) -> list[tuple]:
        with sqlite3.connect(self.db, timeout=30) as c:
            return c.execute(sql, args).fetchall()

    def mid_lease(self, to_go: int = 1) -> tuple[str, str] | None:
        """(worker id, lease id) of a worker holding a lease with a shape finished and at least to_go still to go,
        once no shape is queued: the other workers then have nothing left but what comes back from this lease, so
        a --once worker that ended on an empty queue (ignoring shapes in flight) would strand them."""
        if self.states().get("queued", 0):
            return None
        rows = self.query("SELECT l.worker_id, l.id FROM leases l WHERE l.state = 'active' "
                          "AND EXISTS (SELECT 1 FROM results r WHERE r.lease_id = l.id) "
                          "AND (SELECT count(*) FROM shapes s WHERE s.lease_id = l.id AND s.state = 'leased') >= ? "
                          "ORDER BY l.created_at", to_go)
        return (rows[0][0], rows[0][1]) if rows else None

    def still_leased(self, lease_id: str) -> bool:
        """The lease is active and holds a shape not yet finished."""
        return bool(self.query("SELECT 1 FROM leases l WHERE l.id = ? AND l.state = 'active' AND EXISTS "
                               "(SELECT 1 FROM shapes s WHERE s.lease_id = l.id AND s.state = 'leased')", lease_id))

    def states(self) -> dict[str, int]:
        return dict(self.query("SELECT state, count(*) FROM shapes WHERE campaign_id = ? GROUP BY state",
                               self.campaign))

    def verdict(self) -> dict[str, object]:
        """lost: shapes not tuned; twice: shapes with more than one winning result; a lease's state by id."""
        states = self.states()
        twice = self.query("SELECT shape_id, count(*) FROM results WHERE verified = 1 OR status = 'default_best' "
                           "GROUP BY shape_id HAVING count(*) > 1")
        return {"shapes": self.n_shapes, "tuned": states.get("tuned", 0), "lost": self.n_shapes -
                states.get("tuned", 0), "twice": len(twice), "states": states}

    def lease_state(self, lease_id: str) -> str:
        return self.query("SELECT state FROM leases WHERE id = ?", lease_id)[0][0]


def start(tmp: Path, digest: str, n_shapes: int, token_name: str) -> tuple[Service, str]:
    """The service, a campaign of n_shapes for this CPU's identity under digest, and a worker token for it."""
    db = tmp / "tuner.db"
    srv = start_server(f"sqlite:///{db}", tmp / "server.log", SERVER_ENV)
    with srv.client() as c:
        r = c.post("/v1/captures", json={"image_digest": digest, "family": "bf16_gemm", "gfx": "cpu",
                                         "cu_num": cpu_count(), "host": "launcher-test",
                                         "shapes": served_image.shapes(n_shapes)})
        assert r.status_code == 201, r.text
        cid = r.json()["campaign_id"]
    token = srv.token("worker", token_name, digest)
    return Service(srv, db, cid, n_shapes), token


def stop(svc: Service) -> None:
    svc.srv.proc.terminate()
    try:
        svc.srv.proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        svc.srv.proc.kill()


def token_file(tmp: Path, token: str, name: str = "worker.token") -> Path:
    p = tmp / name
    p.write_text(token + "\n")
    os.chmod(p, 0o600)
    return p


def wait_mid_lease(svc: Service, alive, timeout: float = 600,  # type: ignore[no-untyped-def]
                   to_go: int = 1) -> tuple[str, str]:
    """The first worker seen mid-lease; alive() raises (with the logs) if the launched workers died first."""
    def seen():  # type: ignore[no-untyped-def]
        alive()
        return svc.mid_lease(to_go)
    return wait_for(seen, timeout=timeout, every=0.2)
