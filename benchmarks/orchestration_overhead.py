"""Orchestration overhead: a campaign through the service versus the same backend racing the same shapes
directly in one process. Prints wall times and the overhead per shape. Not a test.

    python benchmarks/orchestration_overhead.py [--shapes 24] [--budget-s 2] [--device cpu]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.conftest import ADMIN, DIGEST, start_server  # noqa: E402
from workers.agent import Agent, AgentConfig  # noqa: E402
from workers.backends.base import Batch  # noqa: E402
from workers.backends.torch_race import TorchBackend  # noqa: E402
from workers.client import ServiceClient  # noqa: E402
from workers.identity import detect  # noqa: E402


def shapes(n: int) -> list[dict]:
    return [{"M": 8 * (i + 1), "N": 512, "K": 1024, "count": 1} for i in range(n)]


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
    srv = start_server(db_url, Path(tempfile.mkdtemp()) / "server.log")
    try:
        c = ServiceClient(srv.url, token=ADMIN)
        body = {"image_digest": DIGEST, "gfx": ident.gfx, "cu_num": ident.cu_num, "family": "bf16_gemm",
                "shapes": items}
        t0 = time.perf_counter()
        assert c.http.post("/v1/captures", json=body).status_code == 201
        agent = Agent(c, backend, ident, AgentConfig("bench", DIGEST, budget_s, once=True))
        stats = agent.run()
        wall = time.perf_counter() - t0
        camp = c.http.get("/v1/campaigns").json()[0]
        assert camp["tuned"] == len(items), camp
        return wall, stats.batches
    finally:
        srv.proc.terminate()
        srv.proc.wait()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", type=int, default=24)
    p.add_argument("--budget-s", type=float, default=2.0)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--device", default="cpu")
    p.add_argument("--database-url", default=None)
    a = p.parse_args()
    ident = detect(0 if a.device.startswith("cuda") else None)
    items = shapes(a.shapes)
    backend = TorchBackend(device=a.device, repeats=a.repeats)
    direct(backend, items[:2], ident)  # warm the kernels and allocator for both runs
    t_direct = direct(backend, items, ident)
    url = a.database_url or f"sqlite:///{tempfile.mkdtemp()}/bench.db"
    t_service, batches = through_service(backend, items, ident, a.budget_s, url)
    # the backend run directly in as many batches as the service leased: what batching alone costs
    k = max(1, batches)
    t_same = sum(direct(backend, items[i::k], ident) for i in range(k) if items[i::k])
    over = t_service - t_direct
    print(f"shapes={a.shapes} device={a.device} engine={url.split(':')[0]} batches={batches}")
    print(f"direct (one process):   {t_direct:8.3f} s  (one batch)")
    print(f"direct, {k} batches:    {t_same:8.3f} s  (the backend's own cost of running {k} batches)")
    print(f"through the service:    {t_service:8.3f} s  (capture, {batches} leases, heartbeats, "
          f"{a.shapes} result posts)")
    print(f"overhead:               {over:8.3f} s = {100 * over / t_direct:5.1f}% = "
          f"{1e3 * over / a.shapes:6.1f} ms per shape")
    print(f"  of which service + agent (vs the same batches direct): "
          f"{1e3 * (t_service - t_same) / a.shapes:6.1f} ms per shape")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
