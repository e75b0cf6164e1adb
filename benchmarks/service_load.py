"""Lease round-trip latency (p50/p99) and captures ingested per second at 1, 8 and 64 concurrent clients,
for SQLite and (with --pg-url or TUNER_TEST_PG_URL) PostgreSQL. Not a test.

    python benchmarks/service_load.py [--pg-url postgresql://...] [--seconds 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.conftest import ADMIN, DIGEST, start_server  # noqa: E402

IDENT = {"image_digest": DIGEST, "gfx": "gfx942", "cu_num": 304}


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] * 1e3 if xs else float("nan")


def run_clients(n: int, seconds: float, work) -> tuple[list[float], int]:
    lat: list[float] = []
    errors = 0
    lock = threading.Lock()
    stop = time.monotonic() + seconds

    def loop(i: int) -> None:
        nonlocal errors
        with httpx.Client(base_url=URL, timeout=60, headers=AUTH) as c:
            k = 0
            while time.monotonic() < stop:
                t0 = time.perf_counter()
                ok = work(c, i, k)
                with lock:
                    (lat.append(time.perf_counter() - t0) if ok else None)
                    errors += 0 if ok else 1
                k += 1

    ts = [threading.Thread(target=loop, args=(i,)) for i in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return lat, errors


def lease_roundtrip(c: httpx.Client, i: int, k: int) -> bool:
    r = c.post("/v1/leases", json={**IDENT, "worker_id": f"b{i}", "backends": ["torch"], "budget_s": 10,
                                   "max_shapes": 1})
    if r.status_code != 200:
        return False
    return c.post(f"/v1/leases/{r.json()['lease_id']}/release").status_code == 200


def capture(c: httpx.Client, i: int, k: int) -> bool:
    shapes = [{"M": 1 + (k * 10 + j) % 4096, "N": 64 * (1 + i), "K": 128, "count": 3} for j in range(10)]
    return c.post("/v1/captures", json={**IDENT, "family": "bf16_gemm", "shapes": shapes}).status_code == 201


def bench(engine: str, url: str, seconds: float) -> None:
    global URL
    srv = start_server(url, Path(tempfile.mkdtemp()) / "server.log", {"TUNER_LEASE_TTL_S": "600"})
    URL = srv.url
    try:
        httpx.post(URL + "/v1/captures", headers=AUTH, json={**IDENT, "family": "bf16_gemm",
                                               "shapes": [{"M": m, "N": 64, "K": 64} for m in range(1, 2001)]})
        for n in (1, 8, 64):
            lat, err = run_clients(n, seconds, lease_roundtrip)
            print(f"{engine:10} lease+release  clients={n:3d}  n={len(lat):6d}  p50={pct(lat, .5):7.1f} ms  "
                  f"p99={pct(lat, .99):7.1f} ms  non-2xx={err}")
        for n in (1, 8, 64):
            lat, err = run_clients(n, seconds, capture)
            print(f"{engine:10} capture(10)    clients={n:3d}  captures/s={len(lat) / seconds:7.1f}  "
                  f"shapes/s={10 * len(lat) / seconds:8.1f}  p50={pct(lat, .5):7.1f} ms  non-2xx={err}")
    finally:
        srv.proc.terminate()
        srv.proc.wait()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--pg-url", default=os.environ.get("TUNER_TEST_PG_URL"))
    p.add_argument("--seconds", type=float, default=5.0)
    a = p.parse_args()
    bench("sqlite", f"sqlite:///{tempfile.mkdtemp()}/load.db", a.seconds)
    if a.pg_url:
        import psycopg
        name = f"bench_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(a.pg_url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        bench("postgresql", a.pg_url.rsplit("/", 1)[0] + "/" + name, a.seconds)
    else:
        print("postgresql: skipped (no --pg-url / TUNER_TEST_PG_URL)")


URL = ""
AUTH = {"Authorization": f"Bearer {ADMIN}"}
if __name__ == "__main__":
    main()
