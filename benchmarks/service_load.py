"""Does the service keep up with a fleet? Every figure beside a raw baseline measured in the same run, on
SQLite and (with --pg-url, TUNER_TEST_PG_URL, or a PostgreSQL it starts like scripts/test.sh) PostgreSQL.
Not a test: it prints a table of figures, ratios and the goals of issue #15 (met or MISSED).

    python benchmarks/service_load.py          # both engines: it starts a throwaway PostgreSQL itself
    python benchmarks/service_load.py [--pg-url postgresql://...] [--no-pg | --no-sqlite] [--shapes 100000] [--open-s 20]
    python benchmarks/service_load.py --no-sqlite --open-rounds 4 [--before main]  # only the open loop, 4 rounds

Per engine, one service (uvicorn, the CLI's flags) on a fresh database:
- ingest: a 100k-shape untuned CSV posted as one capture, against plain sqlite3 / psycopg parsing the same
  CSV and upserting the same rows into the same schema (psycopg: COPY into a temp table + INSERT ON CONFLICT);
- lease+release (one client, closed loop) with ~2k and then ~200k shapes queued: p50, and the server
  process's CPU per lease+release, against a bare FastAPI app (same uvicorn flags) doing the same lease and
  release with plain SQL on the same schema and queue;
- open loop: 64 agents each leasing (and releasing) once a second, from one asyncio process with a keep-alive
  connection each (class Conn): p50/p99 of the lease (from when it was due) and of the release, against the
  same load on the raw app;
- pages of the ~100k-shape campaign: the HTML page, the API's campaign, the engagement report, and the live
  refresh of an unchanged page (304).
The clients run in this process and share the machine's cores with the servers (and PostgreSQL).
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import io
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import httpx
from pydantic import BaseModel

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.worktree import checkout  # noqa: E402
from tests.conftest import ADMIN, DIGEST, free_port, start_server  # noqa: E402

IDENT = {"image_digest": DIGEST, "gfx": "gfx942", "cu_num": 304}
AUTH = {"Authorization": f"Bearer {ADMIN}"}
HEADER = "M,N,K,bias,dtype,outdtype,scaleAB,bpreshuffle,count"


def csv_capture(n: int, n0: int) -> str:
    """n distinct bf16 shapes (N from n0 up), as an AITER untuned CSV with call counts."""
    rows = [HEADER] + [f"{1 + i % 4096},{64 * (n0 + i // 4096)},4096,False,torch.bfloat16,torch.bfloat16,False,"
                       f"False,{1 + i % 7}" for i in range(n)]
    return "\n".join(rows) + "\n"


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] * 1e3 if xs else float("nan")


def steal_s() -> float:
    """CPU seconds the hypervisor gave other guests while this VM's cores wanted them (/proc/stat's steal, all
    cores): the figures of a run with a high share are a busy host's, not the code's."""
    try:
        with open("/proc/stat") as f:
            return int(f.readline().split()[8]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (Linux /proc)."""
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


# ---- the raw baselines: plain drivers on the same schema ---------------------------------------------------

RAW_UPSERT = ("INSERT INTO shapes (campaign_id, shape_key, shape, calls, flops, default_us, priority, "
              "default_measured, state, attempts, updated_at) VALUES ({ph}) ON CONFLICT (campaign_id, shape_key) "
              "DO UPDATE SET calls = shapes.calls + excluded.calls, "
              "priority = (shapes.calls + excluded.calls) * shapes.default_us")


def raw_rows(text: str, cid: int) -> list[tuple]:
    """The same rows the service stores, parsed with the csv module and nothing else."""
    r = csv.reader(io.StringIO(text))
    cols = next(r)[:-1]
    out = []
    for cells in r:
        d = dict(zip(cols, cells))
        n, f = int(cells[-1]), 2.0 * int(d["M"]) * int(d["N"]) * int(d["K"])
        us = f / 1.3e9 + 4.0
        out.append((cid, "|".join(f"{c}={v}" for c, v in d.items()), json.dumps(d), n, f, us, n * us))
    return out


def raw_ingest(url: str, text: str) -> float:
    """Seconds for plain sqlite3 / psycopg to parse the CSV and upsert its rows into a fresh campaign."""
    now = datetime.now(timezone.utc)
    if url.startswith("sqlite"):
        import sqlite3
        con = sqlite3.connect(url.split("///", 1)[1], isolation_level=None)
        con.execute("INSERT INTO images (digest, created_at) VALUES (?, '2026-01-01 00:00:00.000000') "
                    "ON CONFLICT DO NOTHING", (DIGEST,))
        con.execute("INSERT INTO campaigns (image_digest, gfx, cu_num, family, created_at) VALUES "
                    "(?, 'gfx942', 304, 'bf16_gemm', '2026-01-01 00:00:00.000000') ON CONFLICT DO NOTHING",
                    (DIGEST,))
        cid = con.execute("SELECT id FROM campaigns WHERE image_digest = ?", (DIGEST,)).fetchone()[0]
        t0 = time.perf_counter()
        rows = [r + (0, "queued", 0, now.strftime("%Y-%m-%d %H:%M:%S.%f")) for r in raw_rows(text, cid)]
        con.execute("BEGIN IMMEDIATE")
        con.executemany(RAW_UPSERT.format(ph=", ".join("?" * 11)), rows)
        con.execute("COMMIT")
        dt = time.perf_counter() - t0
        con.close()
        return dt
    import psycopg
    with psycopg.connect(url) as con:
        con.execute("INSERT INTO images (digest, created_at) VALUES (%s, now()) ON CONFLICT DO NOTHING", (DIGEST,))
        con.execute("INSERT INTO campaigns (image_digest, gfx, cu_num, family, created_at) VALUES "
                    "(%s, 'gfx942', 304, 'bf16_gemm', now()) ON CONFLICT DO NOTHING", (DIGEST,))
        cid = con.execute("SELECT id FROM campaigns WHERE image_digest = %s", (DIGEST,)).fetchone()[0]
        con.commit()
        t0 = time.perf_counter()
        rows = raw_rows(text, cid)
        with con.cursor() as cur:
            cur.execute("CREATE TEMP TABLE raw_in (campaign_id int, shape_key text, shape text, calls int, "
                        "flops float8, default_us float8, priority float8) ON COMMIT DROP")
            with cur.copy("COPY raw_in FROM STDIN") as cp:
                for r in rows:
                    cp.write_row(r)
            cur.execute(RAW_UPSERT.replace("VALUES ({ph})", "SELECT campaign_id, shape_key, shape::json, calls, "
                                           "flops, default_us, priority, false, 'queued', 0, %s FROM raw_in "
                                           "ORDER BY shape_key"), (now,))
        con.commit()
        return time.perf_counter() - t0


class LeaseReq(BaseModel):
    worker_id: str
    image_digest: str
    gfx: str
    cu_num: int


def raw_app(url: str):  # type: ignore[no-untyped-def]
    """A bare FastAPI app: lease the top queued shape of the identity's top campaign and release it, in plain
    SQL on the same schema and indexes (no auth, no validation beyond pydantic, no state machine)."""
    from fastapi import FastAPI, Response

    app = FastAPI()
    pg = not url.startswith("sqlite")
    ph = "%s" if pg else "?"
    pick = (f"SELECT id, campaign_id, shape FROM shapes WHERE campaign_id = (SELECT id FROM campaigns WHERE "
            f"image_digest = {ph} AND gfx = {ph} AND cu_num = {ph} LIMIT 1) AND state = 'queued' "
            f"ORDER BY priority DESC, id LIMIT 1" + (" FOR UPDATE SKIP LOCKED" if pg else ""))
    local = threading.local()

    def conn():  # type: ignore[no-untyped-def]
        c = getattr(local, "c", None)
        if c is None:
            if pg:
                import psycopg
                c = psycopg.connect(url, autocommit=True)  # transaction() below is then the transaction
            else:
                import sqlite3
                c = sqlite3.connect(url.split("///", 1)[1], isolation_level=None, timeout=5,
                                    check_same_thread=False)
                c.execute("PRAGMA journal_mode=WAL")
                c.execute("PRAGMA synchronous=NORMAL")  # as the service sets it
            local.c = c
        return c

    def tx(work):  # type: ignore[no-untyped-def]
        c = conn()
        if pg:
            with c.transaction():
                return work(c)
        c.execute("BEGIN IMMEDIATE")
        try:
            out = work(c)
            c.execute("COMMIT")
            return out
        except BaseException:
            c.execute("ROLLBACK")
            raise

    @app.post("/lease")
    def lease(body: LeaseReq):  # type: ignore[no-untyped-def]
        def work(c):  # type: ignore[no-untyped-def]
            row = c.execute(pick, (body.image_digest, body.gfx, body.cu_num)).fetchone()
            if row is None:
                return None
            lid, now = str(uuid.uuid4()), datetime.now(timezone.utc)
            stamp = now if pg else now.strftime("%Y-%m-%d %H:%M:%S.%f")
            c.execute(f"INSERT INTO workers (id, image_digest, gfx, cu_num, backends, first_seen_at, last_seen_at) "
                      f"VALUES ({ph}, {ph}, {ph}, {ph}, '[\"torch\"]', {ph}, {ph}) ON CONFLICT (id) DO UPDATE "
                      f"SET last_seen_at = excluded.last_seen_at",
                      (body.worker_id, body.image_digest, body.gfx, body.cu_num, stamp, stamp))
            later = now + timedelta(seconds=60)
            c.execute(f"INSERT INTO leases (id, worker_id, campaign_id, backend, budget_s, state, created_at, "
                      f"heartbeat_at, expires_at, hard_deadline) VALUES ({ph}, {ph}, {ph}, 'torch', 10, 'active', "
                      f"{ph}, {ph}, {ph}, {ph})",
                      (lid, body.worker_id, row[1], stamp, stamp, later if pg else later.strftime(
                          "%Y-%m-%d %H:%M:%S.%f"), later if pg else later.strftime("%Y-%m-%d %H:%M:%S.%f")))
            c.execute(f"UPDATE shapes SET state = 'leased', lease_id = {ph}, attempts = attempts + 1 "
                      f"WHERE id = {ph}", (lid, row[0]))
            return {"lease_id": lid, "shapes": [{"shape_id": row[0], "shape": row[2] if pg else json.loads(row[2])}]}
        out = tx(work)
        return out if out is not None else Response(status_code=204)

    @app.post("/release/{lease_id}")
    def release(lease_id: str):  # type: ignore[no-untyped-def]
        def work(c):  # type: ignore[no-untyped-def]
            c.execute(f"UPDATE leases SET state = 'released' WHERE id = {ph} AND state = 'active'", (lease_id,))
            c.execute(f"UPDATE shapes SET state = 'queued', lease_id = NULL, attempts = attempts - 1 "
                      f"WHERE lease_id = {ph} AND state = 'leased'", (lease_id,))
            return {"lease_id": lease_id}
        return tx(work)

    return app


class Proc:
    def __init__(self, url: str, proc: subprocess.Popen):
        self.url, self.proc = url, proc


def start_raw(db_url: str) -> Proc:
    port = free_port()
    proc = subprocess.Popen([sys.executable, __file__, "--raw-server", db_url, "--port", str(port)], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            httpx.get(url + "/docs", timeout=1)
            return Proc(url, proc)
        except httpx.HTTPError:
            time.sleep(0.1)
    raise RuntimeError("raw server did not come up")


# ---- the two kinds of client ---------------------------------------------------------------------------------

class Target:
    """How to lease and release on the service or on the raw app."""

    def __init__(self, base: str, raw: bool):
        self.base, self.raw = base, raw

    def lease_req(self, i: int) -> tuple[str, dict]:
        body = {**IDENT, "worker_id": f"b{i}"}
        if self.raw:
            return "/lease", body
        return "/v1/leases", {**body, "backends": ["torch"], "budget_s": 10, "max_shapes": 1}

    def release_path(self, lease_id: str) -> str:
        return f"/release/{lease_id}" if self.raw else f"/v1/leases/{lease_id}/release"


def closed_loop(t: Target, n: int) -> list[float]:
    lat = []
    with httpx.Client(base_url=t.base, timeout=60, headers=AUTH) as c:
        for k in range(n):
            path, body = t.lease_req(0)
            t0 = time.perf_counter()
            r = c.post(path, json=body)
            r.raise_for_status()
            c.post(t.release_path(r.json()["lease_id"])).raise_for_status()
            lat.append(time.perf_counter() - t0)
    return lat


def alternate(targets: list[tuple[Target, int]], rounds: int, per_round: int) -> list[tuple[float, float]]:
    """(p50 ms, server CPU ms) per lease+release for each (target, server pid), measured in alternating rounds
    so that all of them see the same machine (other work on the shared cores drifts over minutes)."""
    lat: list[list[float]] = [[] for _ in targets]
    cpu = [0.0] * len(targets)
    for t, _ in targets:
        closed_loop(t, 20)  # warm
    for _ in range(rounds):
        for i, (t, pid) in enumerate(targets):
            c0 = cpu_s(pid)
            lat[i] += closed_loop(t, per_round)
            cpu[i] += cpu_s(pid) - c0
    return [(pct(x, .5), c / len(x) * 1e3) for x, c in zip(lat, cpu)]


class Conn:
    """One keep-alive HTTP/1.1 connection spoken directly over asyncio streams: the open loop's 64 agents cost
    the client tens of microseconds a request (httpx costs ~0.5 ms), so the client does not starve the servers
    of the machine's cores."""

    def __init__(self, base: str):
        host, _, port = base.removeprefix("http://").partition(":")
        self.host, self.port = host, int(port)
        self.head = f"Host: {host}:{port}\r\nAuthorization: Bearer {ADMIN}\r\nContent-Type: application/json\r\n"

    async def open(self) -> None:
        self.r, self.w = await asyncio.open_connection(self.host, self.port)

    async def post(self, path: str, body: dict | None = None) -> tuple[int, bytes]:
        data = json.dumps(body).encode() if body is not None else b""
        self.w.write(f"POST {path} HTTP/1.1\r\n{self.head}Content-Length: {len(data)}\r\n\r\n".encode() + data)
        head = await self.r.readuntil(b"\r\n\r\n")
        low = head.lower()
        at = low.find(b"content-length:")
        n = int(low[at + 15:low.index(b"\r\n", at)]) if at >= 0 else 0
        return int(head[9:12]), await self.r.readexactly(n) if n else b""

    def close(self) -> None:
        self.w.close()


def open_loop(t: Target, agents: int, seconds: float, warm_s: float = 2.0
              ) -> tuple[list[float], list[float], int, float]:
    """agents clients in this one asyncio process, each on its own keep-alive connection, each leasing once a
    second at its own phase and releasing at once: latencies of the leases, measured from the moment each was
    due (a late start counts against the server, not hidden), and of the releases; failures; the client's CPU
    seconds. The first warm_s seconds are not counted (the servers' thread pools and connections grow)."""
    leases: list[float] = []
    releases: list[float] = []
    errors = 0

    async def agent(i: int, start: float) -> None:
        nonlocal errors
        c = Conn(t.base)
        await c.open()
        phase, k = random.random(), 0
        try:
            while (at := start + phase + k) <= start + warm_s + seconds:
                await asyncio.sleep(max(0.0, at - time.monotonic()))
                path, body = t.lease_req(i)
                try:
                    status, out = await c.post(path, body)
                    counted = at >= start + warm_s
                    if counted:
                        leases.append(time.monotonic() - at)
                    if status != 200:
                        errors += 1
                    else:
                        t1 = time.monotonic()
                        status, _ = await c.post(t.release_path(json.loads(out)["lease_id"]))
                        if counted:
                            releases.append(time.monotonic() - t1)
                        errors += status != 200
                except (OSError, asyncio.IncompleteReadError, ValueError):
                    errors += 1
                    c.close()
                    await c.open()
                k += 1
        finally:
            c.close()

    async def main() -> None:
        start = time.monotonic() + 1.0  # every connection open first
        await asyncio.gather(*(agent(i, start) for i in range(agents)))

    cpu0 = time.process_time()
    try:
        import uvloop
        uvloop.run(main())
    except ImportError:
        asyncio.run(main())
    return leases, releases, errors, time.process_time() - cpu0


# ---- one engine ----------------------------------------------------------------------------------------------

def fresh_db(kind: str, pg_url: str | None, tmp: Path, name: str, upgrade: bool = True) -> str:
    """upgrade=False: left empty, for a server of another checkout that upgrades it to its own migrations."""
    from app.db import migrate
    if kind == "sqlite":
        url = f"sqlite:///{tmp / (name + '.db')}"
    else:
        import psycopg
        db = f"bench_{name}_{uuid.uuid4().hex[:6]}"
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{db}"')
        url = pg_url.rsplit("/", 1)[0] + "/" + db
    if upgrade:
        migrate.upgrade(url)
    return url


def drop_db(kind: str, pg_url: str | None, url: str) -> None:
    """A database the run no longer needs (the raw ingest's): gone before the timed leases, so autovacuum does not
    visit it while they run (it did, in the service's open loop, on PostgreSQL)."""
    if kind == "sqlite":
        for suffix in ("", "-wal", "-shm"):
            Path(url.split("///", 1)[1] + suffix).unlink(missing_ok=True)
        return
    import psycopg
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE "{url.rsplit("/", 1)[1]}" WITH (FORCE)')


def settle(urls: list[str]) -> None:
    """PostgreSQL after bulk loads: VACUUM ANALYZE, what autovacuum does within a minute of them (planner
    statistics; the visibility map, for index-only scans), done before the timed phases rather than during
    them, for the service's databases and the raw baseline's alike."""
    import psycopg
    for u in urls:
        with psycopg.connect(u, autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE")


def post_csv(base: str, text: str) -> tuple[float, dict]:
    t0 = time.perf_counter()
    r = httpx.post(base + "/v1/captures", content=text.encode(), timeout=600,
                   headers={**AUTH, "content-type": "text/csv"}, params={**IDENT, "family": "bf16_gemm"})
    dt = time.perf_counter() - t0
    assert r.status_code == 201, r.text[:500]
    return dt, r.json()


def timed_get(base: str, path: str, **kw) -> tuple[float, httpx.Response]:  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    r = httpx.get(base + path, timeout=600, headers={**AUTH, **kw.pop("headers", {})}, **kw)
    return (time.perf_counter() - t0) * 1e3, r


def median_get(base: str, path: str, n: int = 3, **kw) -> tuple[float, httpx.Response]:  # type: ignore[no-untyped-def]
    """The median of n timed GETs after a first one (templates compile, caches fill), and that first's ms."""
    cold = timed_get(base, path, **dict(kw))[0]
    runs = [timed_get(base, path, **dict(kw)) for _ in range(n)]
    runs.sort(key=lambda x: x[0])
    return runs[n // 2][0], runs[n // 2][1], cold


def bench(kind: str, pg_url: str | None, a: argparse.Namespace, rows: list[tuple]) -> None:
    tmp = Path(tempfile.mkdtemp())
    big = csv_capture(a.shapes, 100)
    raw_db = fresh_db(kind, pg_url, tmp, "rawingest")
    raw_before = raw_ingest(raw_db, big)
    drop_db(kind, pg_url, raw_db)
    env = {"TUNER_LEASE_TTL_S": "600", "TUNER_MAX_CAPTURE_SHAPES": str(max(a.shapes, a.queue)),
           "TUNER_MAX_CAMPAIGN_SHAPES": str(4 * max(a.shapes, a.queue))}
    small = start_server(fresh_db(kind, pg_url, tmp, "small"), tmp / "small.log", env)
    large = start_server(fresh_db(kind, pg_url, tmp, "large"), tmp / "large.log", env)
    raws: list[Proc] = []
    try:
        post_csv(small.url, csv_capture(2000, 1))
        post_csv(large.url, csv_capture(2000, 1))
        t_svc, out = post_csv(large.url, big)
        # the raw baseline just before and just after, the faster one counts (the machine's load drifts)
        raw_db = fresh_db(kind, pg_url, tmp, "rawingest2")
        t_raw = min(raw_before, raw_ingest(raw_db, big))
        drop_db(kind, pg_url, raw_db)
        cid = out["campaign_id"]
        # the first view lists its shapes' verdicts and starts the count of the totals after it is sent; the
        # warm views are timed once the totals landed (the count would share the server's cores with them)
        cold_page, first = timed_get(large.url, f"/campaigns/{cid}")
        t0 = time.perf_counter()
        while "(counting)" in timed_get(large.url, f"/campaigns/{cid}")[1].text:
            time.sleep(0.5)
        counted_s = time.perf_counter() - t0
        ms_page, page, _ = median_get(large.url, f"/campaigns/{cid}")
        tag = page.headers["etag"]
        ms_304, same, _ = median_get(large.url, f"/campaigns/{cid}", headers={"If-None-Match": tag})
        ms_api, api, _ = median_get(large.url, f"/v1/campaigns/{cid}")
        # the report's totals on the page's form are the page's count (the same slot and version): not recounted
        ms_eng, eng, cold_eng = median_get(large.url, f"/v1/campaigns/{cid}/engagement", n=1)
        fill = a.queue - 2000 - a.shapes
        if fill > 0:
            post_csv(large.url, csv_capture(fill, 100 + a.shapes // 4096 + 2))
        queued = httpx.get(large.url + f"/v1/campaigns/{cid}", headers=AUTH, params={"limit": 1}).json()["queued"]
        raw_small, raw_large = fresh_db(kind, pg_url, tmp, "rawsmall"), fresh_db(kind, pg_url, tmp, "rawlarge")
        raw_ingest(raw_small, csv_capture(2000, 1))
        for text in (csv_capture(2000, 1), big) + ((csv_capture(fill, 100 + a.shapes // 4096 + 2),) if fill > 0 else ()):
            raw_ingest(raw_large, text)
        if kind == "postgresql":
            settle([small.db_url, large.db_url, raw_small, raw_large])
        raws = [start_raw(raw_small), start_raw(raw_large)]
        (p50_2k, cpu_2k), (p50_200k, cpu_200k), (raw_p50_2k, raw_cpu_2k), (raw_p50_200k, raw_cpu_200k) = alternate(
            [(Target(small.url, False), small.proc.pid), (Target(large.url, False), large.proc.pid),
             (Target(raws[0].url, True), raws[0].proc.pid), (Target(raws[1].url, True), raws[1].proc.pid)],
            a.rounds, a.ops // a.rounds)
        ol_raw = open_loop(Target(raws[1].url, True), a.agents, a.open_s)
        ol = open_loop(Target(large.url, False), a.agents, a.open_s)
    finally:
        for p in [small, large] + raws:
            p.proc.terminate()
            p.proc.wait()

    e = kind
    rows += [
        (e, f"ingest {a.shapes // 1000}k-shape CSV capture", f"{a.shapes / t_svc:,.0f} shapes/s ({t_svc:.2f} s)",
         f"{a.shapes / t_raw:,.0f} shapes/s ({t_raw:.2f} s)", t_raw / t_svc, ">= 0.3x raw", t_raw / t_svc >= 0.3),
        (e, "lease+release p50, 2k queued (1 client)", f"{p50_2k:.1f} ms", f"{raw_p50_2k:.1f} ms",
         p50_2k / raw_p50_2k, "", None),
        (e, f"lease+release p50, {queued // 1000}k queued", f"{p50_200k:.1f} ms", f"{raw_p50_200k:.1f} ms",
         p50_200k / raw_p50_200k, "", None),
        (e, "  p50 at ~200k / p50 at 2k", f"{p50_200k / p50_2k:.2f}x", f"{raw_p50_200k / raw_p50_2k:.2f}x",
         None, "<= 1.2x", p50_200k / p50_2k <= 1.2),
        (e, "server CPU per lease+release (2k / 200k)", f"{cpu_2k:.2f} / {cpu_200k:.2f} ms",
         f"{raw_cpu_2k:.2f} / {raw_cpu_200k:.2f} ms", cpu_200k / raw_cpu_200k, "<= 2x raw",
         max(cpu_2k / raw_cpu_2k, cpu_200k / raw_cpu_200k) <= 2),
        (e, f"open loop {a.agents} agents x 1 lease/s: lease p50/p99", f"{pct(ol[0], .5):.1f} / {pct(ol[0], .99):.1f} ms",
         f"{pct(ol_raw[0], .5):.1f} / {pct(ol_raw[0], .99):.1f} ms", pct(ol[0], .99) / pct(ol_raw[0], .99),
         "p99 <= 20 ms", pct(ol[0], .99) <= 20),
        (e, "  release p50/p99; failed requests", f"{pct(ol[1], .5):.1f} / {pct(ol[1], .99):.1f} ms; {ol[2]}",
         f"{pct(ol_raw[1], .5):.1f} / {pct(ol_raw[1], .99):.1f} ms; {ol_raw[2]}", None, "", None),
        (e, "  the load generator's CPU (one asyncio process)", f"{100 * ol[3] / (a.open_s + 2):.0f}% of a core",
         f"{100 * ol_raw[3] / (a.open_s + 2):.0f}% of a core", None, "", None),
        (e, f"campaign page, {a.shapes // 1000}k shapes (HTML)", f"{ms_page:.0f} ms, {len(page.content) / 1e3:.0f} kB",
         "", None, "< 300 ms, < 1 MB", ms_page < 300 and len(page.content) < 1e6),
        (e, "  the same page's first view", f"{cold_page:.0f} ms, {len(first.content) / 1e3:.0f} kB", "", None,
         "< 300 ms", cold_page < 300 and first.status_code == 200),
        (e, "  its totals over every shape, counted after it", f"shown {counted_s:.1f} s later", "", None, "",
         None),
        (e, "  live refresh, page unchanged", f"{same.status_code}, {len(same.content)} B, {ms_304:.0f} ms", "", None,
         "304", same.status_code == 304),
        (e, "  API campaign (first page of shapes)", f"{ms_api:.0f} ms, {len(api.content) / 1e3:.0f} kB", "", None,
         "< 1 MB", len(api.content) < 1e6),
        (e, "  engagement report (first page: first / repeat view)",
         f"{cold_eng:.0f} / {ms_eng:.0f} ms, {len(eng.content) / 1e3:.0f} kB"
         + (" (totals pending)" if eng.json().get("totals_pending") else ""), "", None, "< 300 ms, < 1 MB",
         max(cold_eng, ms_eng) < 300 and len(eng.content) < 1e6),
    ]
    shutil.rmtree(tmp, ignore_errors=True)


def db_cpu_s(pg_url: str | None) -> float:
    """CPU seconds of the PostgreSQL cluster (it serves only this benchmark): its live processes, and the ended
    ones as the postmaster's reaped children; 0 on SQLite."""
    if not pg_url:
        return 0.0
    import psycopg
    with psycopg.connect(pg_url, autocommit=True) as conn:
        pids = [r[0] for r in conn.execute("SELECT pid FROM pg_stat_activity")]
    master = int(open(f"/proc/{pids[0]}/stat").read().rsplit(")", 1)[1].split()[1])
    f = open(f"/proc/{master}/stat").read().rsplit(")", 1)[1].split()
    total = sum(int(x) for x in f[11:15]) / os.sysconf("SC_CLK_TCK")  # its own and its reaped children's
    for pid in pids:
        try:
            total += cpu_s(pid)
        except OSError:  # a backend that just ended (counted among the reaped at the next reading)
            pass
    return total


def open_rounds(kind: str, pg_url: str | None, a: argparse.Namespace) -> None:
    """Only the open loop, in alternating rounds (raw, the service, and with --before REF the service at REF) on
    a --shapes queue each: per round, lease p50/p99 (from when due), release p99, and per lease+release the
    server's CPU and the database's (PostgreSQL's processes)."""
    tmp = Path(tempfile.mkdtemp())
    env = {"TUNER_LEASE_TTL_S": "600", "TUNER_MAX_CAPTURE_SHAPES": str(a.shapes),
           "TUNER_MAX_CAMPAIGN_SHAPES": str(4 * a.shapes)}
    with checkout(a.before, tmp) as old:
        roots = [("service", ROOT)] + ([(f"@{a.before}"[:9], old)] if old else [])
        servers = []
        try:
            for name, root in roots:
                srv = start_server(fresh_db(kind, pg_url, tmp, name.strip("@")), tmp / f"{len(servers)}.log", env,
                                   cwd=root)
                servers.append((name, srv))
                post_csv(srv.url, csv_capture(a.shapes, 1))
            raw_url = fresh_db(kind, pg_url, tmp, "raw")
            raw_ingest(raw_url, csv_capture(a.shapes, 1))
            if pg_url:
                settle([raw_url] + [srv.db_url for _, srv in servers])
            raw = start_raw(raw_url)
            servers.append(("raw", raw))
            print(f"{kind}, {a.agents} agents x 1 lease/s, {a.open_s:.0f} s a round, {a.shapes} queued; per "
                  "lease+release: server CPU ms, database CPU ms", flush=True)
            for k in range(a.open_rounds):
                for name, srv in servers[-1:] + servers[:-1]:
                    pid, t = srv.proc.pid, Target(srv.url, name == "raw")
                    c0, d0, t0 = cpu_s(pid), db_cpu_s(pg_url), time.strftime("%H:%M:%S")
                    lease, rel, err, _ = open_loop(t, a.agents, a.open_s)
                    n = a.agents * (a.open_s + 2)  # leases in the round, warm-up included
                    print(f"  {t0} round {k + 1} {name:9s} lease p50/p99 {pct(lease, .5):5.1f} / "
                          f"{pct(lease, .99):5.1f} ms  release p99 {pct(rel, .99):5.1f} ms  server {(cpu_s(pid) - c0) / n * 1e3:.2f}  db "
                          f"{(db_cpu_s(pg_url) - d0) / n * 1e3:.2f}  failed {err}  load {os.getloadavg()[0]:.2f}",
                          flush=True)
        finally:
            for _, p in servers:
                p.proc.terminate()
                p.proc.wait()
    shutil.rmtree(tmp, ignore_errors=True)


def start_pg() -> tuple[str, list[str]]:
    """A throwaway PostgreSQL on loopback, as scripts/test.sh starts one (returns its URL and stop command)."""
    bins = sorted(Path("/usr/lib/postgresql").glob("*/bin"))
    if not bins:
        raise RuntimeError("no PostgreSQL server installed (apt-get install postgresql) and no --pg-url")
    b, data = bins[-1], tempfile.mkdtemp(prefix="bench-pg.")
    run = ["runuser", "-u", "postgres", "--"] if os.getuid() == 0 else []
    if run:
        shutil.chown(data, "postgres")
    port = free_port()
    subprocess.run(run + [str(b / "initdb"), "-D", data, "-A", "trust", "-U", "postgres"], check=True,
                   stdout=subprocess.DEVNULL)
    subprocess.run(run + [str(b / "pg_ctl"), "-D", data, "-l", f"{data}/log", "-w", "-o",
                          f"-p {port} -k {data} -c listen_addresses=127.0.0.1 -c max_connections=300 "
                          "-c fsync=off", "start"], check=True, stdout=subprocess.DEVNULL)
    return f"postgresql://postgres@127.0.0.1:{port}/postgres", run + [str(b / "pg_ctl"), "-D", data, "-m",
                                                                       "fast", "stop"]


def table(rows: list[tuple]) -> str:
    head = ("engine", "measure", "service", "raw baseline", "ratio", "goal", "")
    body = [(e, m, s, r, "" if x is None else f"{x:.2f}x", g, "" if ok is None else ("met" if ok else "MISSED"))
            for e, m, s, r, x, g, ok in rows]
    w = [max(len(str(r[i])) for r in [head] + body) for i in range(len(head))]
    return "\n".join("  ".join(str(c).ljust(w[i]) for i, c in enumerate(r)).rstrip() for r in [head] + body)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--pg-url", default=os.environ.get("TUNER_TEST_PG_URL"))
    p.add_argument("--no-pg", action="store_true")
    p.add_argument("--no-sqlite", action="store_true")
    p.add_argument("--shapes", type=int, help="shapes in the big capture (100k); the open-rounds queue (20k)")
    p.add_argument("--queue", type=int, default=200_000, help="shapes queued for the second lease figure")
    p.add_argument("--ops", type=int, default=400, help="closed-loop lease+release round trips per figure")
    p.add_argument("--rounds", type=int, default=8, help="alternating rounds those round trips are split into")
    p.add_argument("--agents", type=int, default=64)
    p.add_argument("--open-s", type=float, default=20.0)
    p.add_argument("--open-rounds", type=int, default=0,
                   help="only the open loop: this many alternating raw/service rounds on a --shapes queue")
    p.add_argument("--before", help="with --open-rounds: the service at this git ref too, in the same rounds")
    p.add_argument("--raw-server", help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.raw_server:
        import uvicorn
        uvicorn.run(raw_app(a.raw_server), host="127.0.0.1", port=a.port, log_level="warning", http="httptools",
                    loop="uvloop")
        return
    rows: list[tuple] = []
    began, stolen = time.monotonic(), steal_s()
    a.shapes = a.shapes or (20_000 if a.open_rounds else 100_000)
    if not a.no_sqlite:
        if a.open_rounds:
            open_rounds("sqlite", None, a)
        else:
            bench("sqlite", None, a, rows)
    print(table(rows), flush=True)  # SQLite's figures, before PostgreSQL's run
    stop = None
    if not a.no_pg:
        pg = a.pg_url
        if not pg:
            pg, stop = start_pg()
        try:
            if a.open_rounds:
                open_rounds("postgresql", pg, a)
            else:
                bench("postgresql", pg, a, rows)
        finally:
            if stop:
                subprocess.run(stop, stdout=subprocess.DEVNULL)
    took = time.monotonic() - began
    print(f"machine: {os.cpu_count()} cores, {time.strftime('%Y-%m-%d %H:%M')}; servers, PostgreSQL and "
          f"clients share them; the run took {took / 60:.1f} min; the hypervisor took "
          f"{100 * (steal_s() - stolen) / took / (os.cpu_count() or 1):.1f}% of the cores' time (steal)")
    print(table(rows))


if __name__ == "__main__":
    main()
