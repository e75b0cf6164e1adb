"""The worker loop: lease a turn-sized batch, heartbeat while working, post each result, release on stop."""

from __future__ import annotations

import logging
import signal
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from workers.backends.base import Backend, Batch, ShapeResult
from workers.client import LeaseLost, ServiceClient
from workers.identity import WorkerIdentity

log = logging.getLogger("aiter_tuner.worker")


@dataclass
class AgentConfig:
    worker_id: str
    image_digest: str
    budget_s: float
    aiter_commit: str | None = None
    once: bool = False  # stop when the service has no work (tests, one-shot runs)
    poll_s: float = 5.0
    max_batches: int | None = None
    max_shapes: int | None = None


@dataclass
class Stats:
    batches: int = 0
    posted: int = 0
    released: int = 0
    lost_leases: int = 0
    results: list[dict[str, Any]] = field(default_factory=list)


class Heartbeat(threading.Thread):
    def __init__(self, client: ServiceClient, lease_id: str, every_s: float):
        super().__init__(daemon=True)
        self.client, self.lease_id, self.every_s = client, lease_id, every_s
        self.done = threading.Event()
        self.lost = threading.Event()

    def run(self) -> None:
        while not self.done.wait(self.every_s):
            try:
                self.client.heartbeat(self.lease_id)
            except LeaseLost:
                self.lost.set()
                return
            except Exception as e:  # keep trying; the lease dies on its own if we stay unreachable
                log.warning("heartbeat failed: %s", e)


class Agent:
    def __init__(self, client: ServiceClient, backend: Backend, ident: WorkerIdentity, cfg: AgentConfig):
        self.client, self.backend, self.ident, self.cfg = client, backend, ident, cfg
        self.stop = threading.Event()
        self.stats = Stats()

    def install_signals(self) -> None:
        def _term(signum: int, _frame: Any) -> None:
            log.info("signal %s: finishing the current shape and releasing the lease", signum)
            self.stop.set()
        signal.signal(signal.SIGTERM, _term)
        signal.signal(signal.SIGINT, _term)

    def lease_request(self) -> dict[str, Any]:
        return {"worker_id": self.cfg.worker_id, "image_digest": self.cfg.image_digest, "gfx": self.ident.gfx,
                "cu_num": self.ident.cu_num, "backends": [self.backend.name], "families": self.backend.families,
                "budget_s": self.cfg.budget_s, "host": self.ident.host, "aiter_commit": self.cfg.aiter_commit,
                "max_shapes": self.cfg.max_shapes}

    def run(self) -> Stats:
        while not self.stop.is_set():
            if self.cfg.max_batches is not None and self.stats.batches >= self.cfg.max_batches:
                break
            lease = self.client.lease(self.lease_request())
            if lease is None:
                if self.cfg.once:
                    break
                self.stop.wait(self.cfg.poll_s)
                continue
            self.run_lease(lease)
        return self.stats

    def run_lease(self, lease: dict[str, Any]) -> None:
        self.stats.batches += 1
        lid = lease["lease_id"]
        hb = Heartbeat(self.client, lid, lease["heartbeat_every_s"])
        hb.start()
        # never past our budget, nor past the service's hard deadline for this lease
        hard = datetime.fromisoformat(lease["hard_deadline"].replace("Z", "+00:00"))
        to_hard = (hard - datetime.now(timezone.utc)).total_seconds() - 1.0
        deadline = time.monotonic() + min(self.cfg.budget_s, to_hard)
        batch = Batch(lease, deadline, lambda: self.stop.is_set() or hb.lost.is_set())
        posted: set[int] = set()

        def emit(res: ShapeResult) -> None:
            if hb.lost.is_set():
                return
            try:
                out = self.client.post_result(lid, res.payload(self.backend.name, self.cfg.aiter_commit))
            except LeaseLost:
                hb.lost.set()
                return
            posted.add(res.shape_id)
            self.stats.posted += 1
            self.stats.results.append({"shape_id": res.shape_id, "status": res.status, **out})

        try:
            self.backend.run(batch, emit)
        finally:
            hb.done.set()
            hb.join(timeout=5)
            if hb.lost.is_set():
                self.stats.lost_leases += 1
            elif len(posted) < len(lease["shapes"]):
                try:  # unfinished shapes go straight back to the queue, uncounted
                    self.stats.released += self.client.release(lid)["requeued"]
                except LeaseLost:
                    self.stats.lost_leases += 1
