"""Chaos with several replicas on one PostgreSQL: 3 `serve` processes started at the same instant on an empty database
(a PostgreSQL of the test's own, tests/private_pg.py), real CPU workers (torch backend, small GEMMs) spread across
them, workers SIGSTOPped past the short lease TTL again and again (every replica's sweeper, and every lease request
that sweeps, ends the same expired leases), and PostgreSQL's postmaster killed -9 and restarted twice mid-campaign.

Afterwards: one migration and one admin token; every shape tuned exactly once; no finished result lost; no agent
exited before it was asked to; no 5xx but 503; no traceback in any replica's log. Phases follow the campaign's
progress and the servers' state, never the clock. Select it with `-m chaos`; TUNER_CHAOS_SEED replays a run.
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import httpx
import psycopg
import pytest
from sqlalchemy import create_engine, text

from tests.conftest import WORKER, ADMIN, DIGEST, ROOT, LiveServer, spawn_server, wait_for, wait_up
from tests.e2e.test_chaos import ACCESS, DELIVERED, FINISHED, progress, spooled
from tests.private_pg import private_pg  # noqa: F401 - the fixture
from workers.identity import cpu_count

pytestmark = [pytest.mark.e2e, pytest.mark.chaos, pytest.mark.timeout(900)]

N_REPLICAS, N_WORKERS, N_SHAPES, N_OUTAGES, N_SWEPT = 3, 4, 120, 2, 3
SERVER_ENV = {"TUNER_LEASE_TTL_S": "3", "TUNER_LEASE_GRACE_S": "20", "TUNER_MIN_IMPROVEMENT_PCT": "-100",
              "TUNER_MAX_ATTEMPTS": "40"}  # chaos costs tries; none of it may park a shape
MIGRATED = re.compile(r"aiter-tuner: database migrated to \w+")


def db_status(srv: LiveServer) -> int:
    """A replica's answer to a request that needs the database (0: no answer)."""
    try:
        return httpx.get(f"{srv.url}/v1/campaigns", timeout=10).status_code
    except httpx.HTTPError:
        return 0


class Workers:
    """Worker processes, worker i on replica i % N_REPLICAS; SIGSTOPs from a chaos thread."""

    def __init__(self, tmp: Path, token: str, servers: list[LiveServer], db_url: str):
        self.tmp, self.procs, self.db_url, self.lock = tmp, {}, db_url, threading.Lock()
        self.stops = self.swept = 0  # swept: leases a SIGSTOPped holder lost to a sweep, seen in the database
        env = dict(os.environ, PYTHONUNBUFFERED="1", TUNER_TOKEN=token, OMP_NUM_THREADS="1")
        for i in range(N_WORKERS):
            wid = f"replica-chaos-{i}"
            self.procs[wid] = subprocess.Popen(
                [*WORKER, "--service", servers[i % len(servers)].url, "--backend", "torch",
                 "--image-digest", DIGEST, "--worker-id", wid, "--budget-s", "2", "--max-shapes", "3", "--repeats", "3",
                 "--poll-s", "0.2",
                 "--compile-budget-s", "0", "--min-improvement-pct", "-100", "--spool-dir", str(tmp / "spool" / wid)],
                cwd=ROOT, env=env, stdout=open(tmp / f"{wid}.log", "w"), stderr=subprocess.STDOUT)

    def _query(self, sql: str, *args: object) -> list[tuple]:
        """Rows from the campaign's database; none while PostgreSQL is down (the outages overlap the stops)."""
        try:
            with psycopg.connect(self.db_url, connect_timeout=3) as conn:
                return conn.execute(sql, args).fetchall()
        except psycopg.Error:
            return []

    def _stop(self, wid: str) -> subprocess.Popen:
        with self.lock:
            proc = self.procs[wid]
            proc.send_signal(signal.SIGSTOP)
            self.stops += 1
        return proc

    def stop_until_swept(self, until: threading.Event, running: list[str]) -> str | None:
        """SIGSTOP a running worker that holds an active lease and keep it stopped until that lease has ended: a
        sweeper or another worker's lease request found it past its TTL (counted in swept), or its last result
        was already on the wire (not counted). Its shapes cannot be tuned meanwhile, so however fast the
        machine, the campaign cannot end before the sweep."""
        while not until.is_set():
            held = [(w, lid) for w, lid in self._query("SELECT worker_id, id FROM leases WHERE state = 'active'")
                    if w in running]
            if not held:
                until.wait(0.1)
                continue
            wid, lid = sorted(held)[0]
            self._stop(wid)
            state = "active"
            while state == "active" and not until.wait(0.2):
                state = next(iter(self._query("SELECT state FROM leases WHERE id = %s", lid)), ("active",))[0]
            if state == "expired":
                self.swept += 1
                return wid
            self.procs[wid].send_signal(signal.SIGCONT)
        return None

    def chaos(self, rng: random.Random, until: threading.Event) -> None:
        """First N_SWEPT lease holders stopped one after another, each kept stopped until its lease is swept
        (the later ones may hold the shapes the earlier ones lost); then, until told to stop, a worker stopped
        1-8 s (past the 3 s TTL about two times in three) every 0.2-1 s."""
        stopped: list[str] = []
        while len(stopped) < N_SWEPT and not until.is_set():
            if wid := self.stop_until_swept(until, [w for w in self.procs if w not in stopped]):
                stopped.append(wid)
        until.wait(rng.uniform(0.0, 2.0))  # later sweeps of other replicas collide on the ended leases
        self.continue_all()
        while not until.wait(rng.uniform(0.2, 1.0)):
            proc = self._stop(rng.choice(list(self.procs)))
            until.wait(rng.uniform(1.0, 8.0))
            proc.send_signal(signal.SIGCONT)

    def continue_all(self) -> None:
        with self.lock:
            for p in self.procs.values():
                p.send_signal(signal.SIGCONT)


def test_replicas_on_one_postgresql_through_outages_and_colliding_sweepers(private_pg, tmp_path, capsys):  # noqa: F811
    seed = int(os.environ.get("TUNER_CHAOS_SEED") or random.randrange(2**32))
    rng, t0 = random.Random(seed), time.monotonic()
    with psycopg.connect(private_pg.url, autocommit=True) as conn:
        conn.execute("CREATE DATABASE tuner")
    db_url = private_pg.url.rsplit("/", 1)[0] + "/tuner"
    # the replicas at the same instant on the empty database, each migrating and bootstrapping at start
    servers = [spawn_server(db_url, tmp_path / f"replica-{i}.log", SERVER_ENV, args=("--access-log",))
               for i in range(N_REPLICAS)]
    workers, stop_chaos, outages, tuned_at_kill = None, threading.Event(), [], []
    chaos = None
    try:
        for s in servers:
            wait_up(s, timeout=180)
        with servers[0].client() as c:
            r = c.post("/v1/captures", json={"image_digest": DIGEST, "family": "bf16_gemm", "gfx": "cpu",
                                             "cu_num": cpu_count(), "host": "chaos",
                                             "shapes": [{"M": m, "N": 512, "K": 512} for m in range(1, N_SHAPES + 1)]})
            assert r.status_code == 201, r.text
            cid = r.json()["campaign_id"]
        workers = Workers(tmp_path, servers[1].token("worker", "replica-chaos", DIGEST), servers, db_url)

        def tuned() -> int:
            return max(progress(s.url, cid).get("tuned", 0) for s in servers)
        chaos = threading.Thread(target=workers.chaos, args=(random.Random(rng.random()), stop_chaos))
        wait_for(lambda: tuned() >= 5, timeout=300, every=0.5)
        chaos.start()
        for k in range(N_OUTAGES):  # PostgreSQL dies mid-campaign, each time further in
            wait_for(lambda: tuned() >= N_SHAPES * (k + 1) // (N_OUTAGES + 2), timeout=600, every=0.5)
            tuned_at_kill.append(tuned())
            private_pg.kill()
            wait_for(lambda: all(db_status(s) == 503 for s in servers), timeout=120, every=0.3)  # felt everywhere
            private_pg.start()
            wait_for(lambda: all(db_status(s) == 200 for s in servers), timeout=180, every=0.5)
            outages.append(tuned())
        wait_for(lambda: workers.swept >= N_SWEPT and (workers.stops >= 6 or tuned() == N_SHAPES), timeout=600,
                 every=0.5)  # a hang guard: each sweep holds shapes back from the campaign
        stop_chaos.set()
        chaos.join()
        workers.continue_all()
        wait_for(lambda: tuned() == N_SHAPES, timeout=600, every=0.5)
        wait_for(lambda: not any(spooled(d) for d in (tmp_path / "spool").iterdir()), timeout=120, every=0.5)
        exited = {w: p.returncode for w, p in workers.procs.items() if p.poll() is not None}
        for p in workers.procs.values():
            p.send_signal(signal.SIGTERM)
        codes = {w: p.wait(timeout=60) for w, p in workers.procs.items()}
    finally:
        stop_chaos.set()
        if workers is not None:
            workers.continue_all()
            for p in workers.procs.values():
                if p.poll() is None:
                    p.kill()
        for s in servers:
            s.proc.terminate()
        for s in servers:
            try:
                s.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                s.proc.kill()
    wall = time.monotonic() - t0

    server_logs = [s.log.read_text() for s in servers]
    worker_logs = "\n".join((tmp_path / f"{w}.log").read_text() for w in workers.procs)
    finished = {(int(s), lid) for s, _st, lid in FINISHED.findall(worker_logs)}
    delivered = {(int(s), lid) for s, lid, _r in DELIVERED.findall(worker_logs)}
    statuses = [int(code) for t in server_logs for _path, code in ACCESS.findall(t)]
    not_503 = [c for c in statuses if c >= 500 and c != 503]
    engine = create_engine(db_url.replace("postgresql://", "postgresql+psycopg://", 1))
    with engine.connect() as conn:
        def q(sql: str):  # type: ignore[no-untyped-def]
            return conn.execute(text(sql)).all()
        shapes = dict(q("SELECT id, state FROM shapes"))
        stored = {(s, lid) for s, lid in q("SELECT shape_id, lease_id FROM results")}
        tuned_by = q("SELECT shape_id, count(*) FROM results WHERE verified OR status = 'default_best' "
                     "GROUP BY shape_id")
        admins = q("SELECT count(*) FROM tokens WHERE role = 'admin'")[0][0]
        versions = q("SELECT count(*) FROM alembic_version")[0][0]
        expired = q("SELECT count(*) FROM leases WHERE state = 'expired'")[0][0]
        max_attempts = q("SELECT max(attempts) FROM shapes")[0][0]
    engine.dispose()
    lost = (finished | delivered) - stored
    duplicated = sum(n - 1 for _s, n in tuned_by if n > 1)
    migrations = sum(len(MIGRATED.findall(t)) for t in server_logs)
    tracebacks = sum(t.count("Traceback") for t in server_logs)
    figures = (
        f"replica chaos figures (seed {seed}; {os.cpu_count()} CPUs, no GPU, torch on the CPU; PostgreSQL "
        f"{private_pg.bin.parent.name}):\n"
        f"  replicas {N_REPLICAS} started at once on an empty database: migrations run {migrations}, admin tokens "
        f"{admins}, alembic_version rows {versions}\n"
        f"  shapes {len(shapes)}, tuned {sum(st == 'tuned' for st in shapes.values())}, max attempts on a shape "
        f"{max_attempts}; results stored {len(stored)}, finished by workers {len(finished)}, lost {len(lost)}, "
        f"duplicated {duplicated}\n"
        f"  PostgreSQL kill -9 + restarts {private_pg.kills} (tuned at each kill {tuned_at_kill}), SIGSTOPs "
        f"{workers.stops} ({workers.swept} held until their lease was swept), leases expired and swept {expired}\n"
        f"  requests {len(statuses)}, 503 {statuses.count(503)}, other 5xx {len(not_503)}, tracebacks in replica "
        f"logs {tracebacks}\n"
        f"  workers {N_WORKERS}: exits before asked {len(exited)} {exited or ''}, exit codes on SIGTERM "
        f"{sorted(codes.values())}\n"
        f"  wall time {wall:.0f} s")
    with capsys.disabled():
        print("\n" + figures)
    (ROOT / "test-artifacts").mkdir(exist_ok=True)
    (ROOT / "test-artifacts" / "chaos-replicas-figures.txt").write_text(figures + "\n")

    assert migrations == 1 and versions == 1 and admins == 1, "one migration, one admin token"
    assert set(shapes.values()) == {"tuned"} and len(shapes) == N_SHAPES, "every shape tuned"
    assert duplicated == 0 and not lost, f"duplicated {duplicated}, lost {sorted(lost)[:10]}"
    assert not exited and set(codes.values()) == {0}, (exited, codes)
    assert not not_503, f"5xx other than 503: {sorted(set(not_503))}"
    assert statuses.count(503) > 0 and private_pg.kills == N_OUTAGES, "the outages must have been felt"
    assert tracebacks == 0, [t[t.index("Traceback") - 500:][:3000] for t in server_logs if "Traceback" in t][0]
    assert workers.swept == N_SWEPT and expired >= N_SWEPT, "sweepers must have had expired leases to end"
