"""Orchestration overhead: a campaign through the service and the agent versus the same backend racing the
same shapes directly in one process. Not a test; it prints the figures.

    python benchmarks/orchestration_overhead.py [--shapes 48] [--runs 5] [--budget-s 2] [--device cpu]

The overhead per shape is the service run's wall time less the time the backend spent on its own work inside
it (its run() less the agent's result callbacks, and any compile-lane warm-up), over the shapes: what the
capture, leases, heartbeats, spooled and posted results and releases cost. Measured that way it does not carry the
race's own run-to-run noise (a CPU race of 1 s varies by more than the whole overhead); the median of --runs
fresh services is printed. The wall-clock comparison with a direct run is printed too, with that noise in it.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

# The service, the agent and a CPU race share this machine's cores here: OpenMP threads that spin between
# torch's CPU kernels (the default wait policy) would hold every core and slow the service's answers, and the
# race itself, several times over. They sleep instead (both runs alike); a real service runs elsewhere.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.service_load import cpu_s  # noqa: E402
from tests.conftest import ADMIN, DIGEST, start_server  # noqa: E402
from workers.agent import Agent, AgentConfig  # noqa: E402
from workers.backends.base import Batch  # noqa: E402
from workers.backends.torch_race import TorchBackend  # noqa: E402
from workers.client import ServiceClient  # noqa: E402
from workers.identity import detect  # noqa: E402


def shapes(n: int) -> list[dict]:
    return [{"M": 8 * (i + 1), "N": 256, "K": 256, "count": 1} for i in range(n)]


def clocks() -> tuple[float, float]:
    """(wall seconds, this process's CPU seconds: every thread, torch's included)"""
    return time.perf_counter(), time.process_time()


class Timed:
    """The backend, summing the wall and CPU seconds of its own work: run() less the agent's emit callbacks
    (which spool and post each result), plus warm()."""

    def __init__(self, backend: TorchBackend):
        self.backend, self.own, self.own_cpu = backend, 0.0, 0.0

    def _count(self, start: tuple[float, float], less: tuple[float, float] = (0.0, 0.0)) -> None:
        now = clocks()
        self.own += now[0] - start[0] - less[0]
        self.own_cpu += now[1] - start[1] - less[1]

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        attr = getattr(self.backend, name)
        if name != "warm":
            return attr

        def warm(*a, **k):  # type: ignore[no-untyped-def]
            start = clocks()
            try:
                return attr(*a, **k)
            finally:
                self._count(start)
        return warm

    def run(self, batch, emit) -> None:  # type: ignore[no-untyped-def]
        in_emit = [0.0, 0.0]

        def timed_emit(res) -> None:  # type: ignore[no-untyped-def]
            start = clocks()
            try:
                emit(res)
            finally:
                now = clocks()
                in_emit[0] += now[0] - start[0]
                in_emit[1] += now[1] - start[1]
        start = clocks()
        try:
            self.backend.run(batch, timed_emit)
        finally:
            self._count(start, (in_emit[0], in_emit[1]))


def direct(backend: TorchBackend, items: list[dict], ident) -> float:
    from app.domain.families import FAMILIES
    from app.domain.shapes import make_shape
    lease = {"gfx": ident.gfx, "cu_num": ident.cu_num, "tuned_header": list(FAMILIES["bf16_gemm"].tuned_header),
             "shapes": [{"shape_id": i, "shape": make_shape(FAMILIES["bf16_gemm"], {k: v for k, v in s.items()
                                                                                   if k != "count"}).as_dict()}
                        for i, s in enumerate(items)]}
    out: list = []
    t0 = time.perf_counter()
    backend.run(Batch(lease, time.monotonic() + 1e6, lambda: False), out.append)
    assert all(r.status in ("ok", "default_best") for r in out), [(r.status, r.error) for r in out]
    return time.perf_counter() - t0


def through_service(backend: TorchBackend, items: list[dict], ident, budget_s: float, db_url: str) -> tuple:
    """(wall seconds from the capture to the last result, the backend's own seconds in it, batches, and the
    CPU seconds of the orchestration: the server process's, and the agent's outside the backend's work)"""
    srv = start_server(db_url, Path(tempfile.mkdtemp()) / "server.log")
    timed = Timed(backend)
    try:
        c = ServiceClient(srv.url, token=ADMIN)
        body = {"image_digest": DIGEST, "gfx": ident.gfx, "cu_num": ident.cu_num, "family": "bf16_gemm",
                "shapes": items}
        t0, cpu0, srv0 = time.perf_counter(), time.process_time(), cpu_s(srv.proc.pid)
        assert c.http.post("/v1/captures", json=body).status_code == 201
        agent = Agent(c, timed, ident, AgentConfig("bench", DIGEST, budget_s, once=True,  # type: ignore[arg-type]
                                                   spool_dir=tempfile.mkdtemp()))
        stats = agent.run()
        wall = time.perf_counter() - t0
        cpu = cpu_s(srv.proc.pid) - srv0, time.process_time() - cpu0 - timed.own_cpu
        camp = c.http.get("/v1/campaigns").json()[0]
        assert camp["tuned"] == len(items), camp
        return wall, timed.own, stats.batches, cpu
    finally:
        srv.proc.terminate()
        srv.proc.wait()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", type=int, default=48)
    p.add_argument("--runs", type=int, default=5, help="fresh services run; the median is the figure")
    p.add_argument("--budget-s", type=float, default=2.0)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--device", default="cpu")
    p.add_argument("--database-url", default=None, help="default: a fresh SQLite file per run")
    a = p.parse_args()
    ident = detect(0 if a.device.startswith("cuda") else None)
    items = shapes(a.shapes)
    backend = TorchBackend(device=a.device, repeats=a.repeats)
    direct(backend, items[:2], ident)  # warm the kernels and allocator for every run
    runs = []
    for _ in range(a.runs):
        url = a.database_url or f"sqlite:///{tempfile.mkdtemp()}/bench.db"
        t_direct = direct(backend, items, ident)
        wall, own, batches, (srv_cpu, agent_cpu) = through_service(backend, items, ident, a.budget_s, url)
        cpu_ms = 1e3 * (srv_cpu + agent_cpu) / a.shapes
        runs.append((1e3 * (wall - own) / a.shapes, wall, own, t_direct, batches, cpu_ms))
        print(f"run {len(runs)}: through the service {wall:7.3f} s ({batches} batches), backend's own work in it "
              f"{own:7.3f} s -> overhead {runs[-1][0]:6.2f} ms/shape; its CPU {cpu_ms:5.2f} ms/shape (server "
              f"{1e3 * srv_cpu / a.shapes:.2f} + agent {1e3 * agent_cpu / a.shapes:.2f}); direct, one batch: "
              f"{t_direct:7.3f} s", flush=True)
    per, wall, own, t_direct, batches, _ = sorted(runs)[len(runs) // 2]
    cpu_med = sorted(r[5] for r in runs)[len(runs) // 2]
    engine = (a.database_url or "sqlite").split(":")[0]
    print(f"shapes={a.shapes} device={a.device} engine={engine} runs={a.runs} budget_s={a.budget_s} "
          f"(the median run below)")
    print(f"through the service:     {wall:8.3f} s  (capture, {batches} leases, heartbeats, {a.shapes} results "
          "spooled and posted, releases)")
    print(f"  the backend's own work: {own:8.3f} s")
    print(f"direct (one process):    {t_direct:8.3f} s  (one batch; the wall-clock difference carries the race's "
          f"noise: {1e3 * (wall - t_direct) / a.shapes:+.1f} ms/shape)")
    print(f"orchestration overhead per shape (median of {a.runs}): {per:.2f} ms "
          f"(runs: {', '.join(f'{r[0]:.2f}' for r in runs)}); goal <= 10 ms: {'met' if per <= 10 else 'MISSED'}")
    print(f"  its CPU per shape (server process + agent outside the backend; not slowed by other load), median: "
          f"{cpu_med:.2f} ms")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
