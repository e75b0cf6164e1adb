"""Chaos: a real server on a SQLite file and three real CPU workers (torch backend, GEMMs of 0.01-0.4 s) tune 200 shapes
while workers are SIGKILLed (and restarted) and SIGSTOPped (and continued) at random, the server is killed -9
and restarted on the same database, and another process holds the database's write lock for 75 s.

Afterwards: every shape tuned exactly once (one verified result each), no finished result lost (each one a
worker logged as spooled is in the database: as the shape's result, or as a record when its lease had died and
another lease had the shape meanwhile), no shape parked, every worker alive until asked to stop, and no 5xx
from the server but 503 (database busy).
Select it with `-m chaos`; TUNER_CHAOS_SEED replays a run.

Each phase starts from the campaign's progress, never from a sleep: the server dies once KILL_AT shapes are tuned,
the lock begins once LOCK_AT are (well short of N_SHAPES, so most of the work is still ahead of it however fast or
loaded the machine), and chaos stops only after the lock and a few kills and stops. Timeouts only guard against a
hang: a wait fails when the tuned count has not moved for STALL_S.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import sqlite3
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from tests.conftest import WORKER, DIGEST, ROOT, start_server, wait_for
from workers.identity import cpu_count
from workers.spool import Spool

pytestmark = [pytest.mark.e2e, pytest.mark.chaos, pytest.mark.timeout(1800)]  # ~3 min on a 2-core VM; a hang guard

N_SHAPES, N_WORKERS, LOCK_S = 200, 3, 75.0
KILL_AT, LOCK_AT, STALL_S = N_SHAPES // 20, N_SHAPES // 8, 240.0  # tuned counts that start the phases
SERVER_ENV = {"TUNER_LEASE_TTL_S": "4", "TUNER_LEASE_GRACE_S": "20", "TUNER_MIN_IMPROVEMENT_PCT": "-100",
              "TUNER_MAX_ATTEMPTS": "30"}  # chaos costs tries; none of it may park a shape
FINISHED = re.compile(r"shape (\d+) finished \((\w+)\) for lease ([0-9a-f-]+), spooled")
DELIVERED = re.compile(r"result for shape (\d+) \(lease ([0-9a-f-]+)\) delivered: result (\d+)")
SUPERSEDED = re.compile(r"result for shape (\d+) \(lease ([0-9a-f-]+)\) superseded")
ACCESS = re.compile(r'"[A-Z]+ (\S+) HTTP/[\d.]+" (\d{3})')


@dataclass
class Worker:
    wid: str
    proc: subprocess.Popen
    log: Path
    stopped: bool = False

    def has_finished_a_shape(self) -> bool:
        """This start of the worker finished a shape: killing it now cannot starve the campaign, however long a
        start takes on a loaded machine (kills at a fixed pace could outrun slow starts and stop all progress)."""
        return FINISHED.search(self.log.read_text()) is not None


def cpu_worker(url: str, token: str, digest: str, wid: str, spool: Path, log: Path, *extra: str
               ) -> subprocess.Popen:
    """A chaos worker: the torch backend on the CPU, 2 s turns of small races, every winner a row; a restart with
    the same id and spool delivers what the killed one left."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", TUNER_TOKEN=token, OMP_NUM_THREADS="1")
    return subprocess.Popen(
        [*WORKER, "--service", url, "--backend", "torch", "--image-digest", digest,
         "--worker-id", wid, "--budget-s", "2", "--repeats", "3", "--poll-s", "0.2", "--compile-budget-s", "0",
         "--min-improvement-pct", "-100", "--spool-dir", str(spool), *extra],
        cwd=ROOT, env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT)


@dataclass
class Fleet:
    """Worker processes by id; each (re)start logs to its own file, a restart keeps the id and its spool."""
    url: str
    token: str
    tmp: Path
    workers: dict[str, Worker] = field(default_factory=dict)
    logs: list[Path] = field(default_factory=list)
    kills: int = 0
    stops: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def spool(self, wid: str) -> Path:
        return self.tmp / "spool" / wid

    def start(self, wid: str) -> None:
        log = self.tmp / f"{wid}-{len(self.logs)}.log"
        self.logs.append(log)
        proc = cpu_worker(self.url, self.token, DIGEST, wid, self.spool(wid), log)
        self.workers[wid] = Worker(wid, proc, log)

    def kill_and_restart(self, rng: random.Random) -> None:
        with self.lock:
            ready = [w for w in self.workers.values() if not w.stopped and w.has_finished_a_shape()]
            if not ready:
                return
            w = rng.choice(ready)
            w.proc.send_signal(signal.SIGKILL)
            w.proc.wait()
            self.kills += 1
        time.sleep(rng.uniform(0.2, 1.5))
        with self.lock:
            self.start(w.wid)

    def stop_and_continue(self, rng: random.Random) -> None:
        with self.lock:
            running = [w for w in self.workers.values() if not w.stopped]
            if not running:
                return
            w = rng.choice(running)
            w.proc.send_signal(signal.SIGSTOP)
            w.stopped, self.stops = True, self.stops + 1
        time.sleep(rng.uniform(1.0, 9.0))  # past the 4 s lease TTL about half the time
        with self.lock:
            w.proc.send_signal(signal.SIGCONT)
            w.stopped = False

    def continue_all(self) -> None:
        with self.lock:
            for w in self.workers.values():
                w.proc.send_signal(signal.SIGCONT)
                w.stopped = False


def holds_sigterm(pid: int) -> bool:
    """The process has a SIGTERM handler installed (SigCgt in /proc/PID/status)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True  # gone: nothing to wait for
    caught = next(ln.split()[1] for ln in status.splitlines() if ln.startswith("SigCgt:"))
    return bool(int(caught, 16) & (1 << (signal.SIGTERM - 1)))


def chaos(fleet: Fleet, rng: random.Random, until: threading.Event) -> None:
    """A worker SIGKILLed (one that has finished a shape since its start) or SIGSTOPped every 2-5 s, from several
    threads, so stops and kills overlap."""
    threads = []
    while not until.wait(rng.uniform(2.0, 5.0)):
        act = fleet.kill_and_restart if rng.random() < 0.5 else fleet.stop_and_continue
        t = threading.Thread(target=act, args=(random.Random(rng.random()),), daemon=True)
        t.start()
        threads.append(t)
    for t in threads:
        t.join()


def hold_write_lock(db: str, seconds: float, held: threading.Event, tuned_at: list[int]) -> None:
    """Another process's writer: BEGIN EXCLUSIVE for `seconds` (WAL readers go on, every writer waits); tuned_at
    gets the tuned count the lock froze (read inside it, so no write slips in between)."""
    conn = sqlite3.connect(db, timeout=120, isolation_level=None, check_same_thread=False)  # waits out a writer
    conn.execute("BEGIN EXCLUSIVE")
    tuned_at.append(conn.execute("SELECT count(*) FROM shapes WHERE state = 'tuned'").fetchone()[0])
    held.set()
    time.sleep(seconds)
    conn.execute("ROLLBACK")
    conn.close()


def spooled(d: Path) -> list:
    """A worker's results still waiting for the service (read beside the running worker, as its next start would)."""
    spool = Spool(d)
    try:
        return spool.pending()
    finally:
        spool.close()


def progress(url: str, cid: int) -> dict:
    try:
        with httpx.Client(base_url=url, timeout=3) as c:
            return c.get(f"/v1/campaigns/{cid}").json()
    except (httpx.HTTPError, ValueError):
        return {}


def wait_tuned(url: str, cid: int, enough) -> int:  # type: ignore[no-untyped-def]
    """Poll the campaign until enough(tuned); fails only when the tuned count stalls for STALL_S (a hang), so a
    slow or loaded machine merely takes longer."""
    last, moved = -1, time.monotonic()
    while True:
        tuned = progress(url, cid).get("tuned")
        if tuned is not None and enough(tuned):
            return tuned
        if tuned is not None and tuned != last:
            last, moved = tuned, time.monotonic()
        assert time.monotonic() - moved < STALL_S, f"no shape tuned for {STALL_S:.0f} s (stuck at {last})"
        time.sleep(0.2)


def test_chaos_every_shape_tuned_once_nothing_lost(tmp_path, capsys):
    seed = int(os.environ.get("TUNER_CHAOS_SEED") or random.randrange(2**32))
    rng, t0 = random.Random(seed), time.monotonic()
    db = tmp_path / "tuner.db"
    srv = start_server(f"sqlite:///{db}", tmp_path / "server-0.log", SERVER_ENV, args=("--access-log",))
    port, server_logs, restarts = int(srv.url.rsplit(":", 1)[1]), [tmp_path / "server-0.log"], 0
    with srv.client() as c:
        r = c.post("/v1/captures", json={"image_digest": DIGEST, "family": "bf16_gemm", "gfx": "cpu",
                                         "cu_num": cpu_count(), "host": "chaos",
                                         "shapes": [{"M": m, "N": 512, "K": 512} for m in range(1, N_SHAPES + 1)]})
        assert r.status_code == 201, r.text
        cid = r.json()["campaign_id"]
    fleet = Fleet(srv.url, srv.token("worker", "chaos-pool", DIGEST), tmp_path)  # one token shared by the pool
    for i in range(N_WORKERS):
        fleet.start(f"chaos-{i}")
    stop_chaos, lock_held, tuned_at = threading.Event(), threading.Event(), []
    chaos_thread = threading.Thread(target=chaos, args=(fleet, random.Random(rng.random()), stop_chaos))
    locker = None
    try:
        wait_tuned(srv.url, cid, lambda n: n >= 5)
        chaos_thread.start()
        tuned_at_kill = wait_tuned(srv.url, cid, lambda n: n >= KILL_AT)
        phases = {"killed": time.monotonic() - t0}
        srv.proc.send_signal(signal.SIGKILL)  # the server dies mid-flight, restarts on the same file and port
        srv.proc.wait()
        time.sleep(1.5)
        server_logs.append(tmp_path / "server-1.log")
        srv = start_server(f"sqlite:///{db}", server_logs[-1], SERVER_ENV, port=port, args=("--access-log",))
        restarts += 1
        wait_tuned(srv.url, cid, lambda n: n >= LOCK_AT)  # the restarted server has taken results again
        locker = threading.Thread(target=hold_write_lock, args=(str(db), LOCK_S, lock_held, tuned_at), daemon=True)
        locker.start()
        phases["locked"] = time.monotonic() - t0
        locker.join(timeout=LOCK_S + 300)  # a hang guard: the lock thread waits out a writer, then holds LOCK_S
        assert lock_held.is_set() and not locker.is_alive(), "the write lock was never taken"
        tuned_at_lock = tuned_at[0]
        time.sleep(8)  # chaos goes on a while after the lock too
        wait_for(lambda: fleet.kills >= 3 and fleet.stops >= 3, timeout=600, every=0.5)  # a hang guard only
        stop_chaos.set()
        chaos_thread.join()
        fleet.continue_all()
        wait_tuned(srv.url, cid, lambda n: n == N_SHAPES)
        phases["all tuned"] = time.monotonic() - t0
        # spooled results of killed workers go out on their successors' next turns
        wait_for(lambda: not any(spooled(d) for d in (tmp_path / "spool").iterdir()), timeout=STALL_S, every=0.5)
        alive = {w.wid: w.proc.poll() is None for w in fleet.workers.values()}
        # a worker restarted a moment ago may still be starting: the SIGTERM waits until it holds the signal (its
        # first act, tests/e2e/test_worker_errors.py), else the interpreter's own start would die of it (-15)
        wait_for(lambda: all(not alive[w.wid] or w.proc.poll() is not None or holds_sigterm(w.proc.pid)
                             for w in fleet.workers.values()), timeout=120, every=0.05)
        for w in fleet.workers.values():
            w.proc.send_signal(signal.SIGTERM)
        codes = {w.wid: w.proc.wait(timeout=60) for w in fleet.workers.values()}
    finally:
        stop_chaos.set()
        fleet.continue_all()
        for w in fleet.workers.values():
            if w.proc.poll() is None:
                w.proc.kill()
        srv.proc.terminate()
        srv.proc.wait(timeout=30)
    wall = time.monotonic() - t0

    logs = "\n".join(p.read_text() for p in fleet.logs)
    finished = {(int(s), lid) for s, _st, lid in FINISHED.findall(logs)}
    delivered = {(int(s), lid) for s, lid, _r in DELIVERED.findall(logs)}
    superseded = {(int(s), lid) for s, lid in SUPERSEDED.findall(logs)}
    statuses = [int(code) for text in (p.read_text() for p in server_logs) for _path, code in ACCESS.findall(text)]
    errors_5xx = [c for c in statuses if c >= 500]
    with sqlite3.connect(db) as conn:
        shapes = dict(conn.execute("SELECT id, state FROM shapes").fetchall())
        max_attempts = conn.execute("SELECT max(attempts) FROM shapes").fetchone()[0]
        stored = {(s, lid) for s, lid in conn.execute("SELECT shape_id, lease_id FROM results")}
        records = conn.execute("SELECT count(*) FROM results WHERE status = 'superseded'").fetchone()[0]
        tuned_by = conn.execute("SELECT shape_id, count(*) FROM results WHERE verified = 1 OR status = 'default_best' "
                                "GROUP BY shape_id").fetchall()
        verified = dict(conn.execute("SELECT shape_id, count(*) FROM results WHERE verified = 1 "
                                     "GROUP BY shape_id").fetchall())
    lost = (finished | delivered) - stored
    duplicates = sum(n - 1 for _s, n in tuned_by if n > 1)
    figures = (f"chaos figures (seed {seed}; {os.cpu_count()} CPUs, no GPU, torch on the CPU):\n"
               f"  shapes {len(shapes)}, tuned {sum(st == 'tuned' for st in shapes.values())}, "
               f"parked {sum(st == 'failed' for st in shapes.values())}, max attempts on a shape {max_attempts}\n"
               f"  results stored {len(stored)}, verified {sum(verified.values())}, duplicates {duplicates}, "
               f"finished by workers {len(finished)}, of them kept as records only (lease dead, shape taken "
               f"by another) {records}, lost {len(lost)}\n"
               f"  workers {N_WORKERS}: SIGKILLs {fleet.kills} (each restarted), SIGSTOPs {fleet.stops}, worker starts "
               f"{len(fleet.logs)}, alive at the end {sum(alive.values())}/{N_WORKERS}, exit codes on SIGTERM "
               f"{sorted(codes.values())}\n"
               f"  server kill -9 + restarts {restarts} (tuned when killed {tuned_at_kill}), write lock held "
               f"{LOCK_S:.0f} s (tuned when it began {tuned_at_lock}), requests {len(statuses)}, 5xx {len(errors_5xx)} (all 503: "
               f"{all(c == 503 for c in errors_5xx)})\n"
               f"  wall time {wall:.0f} s ({', '.join(f'{k} at {v:.0f} s' for k, v in phases.items())})")
    with capsys.disabled():  # shown in every run (.ci/run included), and kept for the closing note
        print("\n" + figures)
    (ROOT / "test-artifacts").mkdir(exist_ok=True)
    (ROOT / "test-artifacts" / "chaos-figures.txt").write_text(figures + "\n")

    assert set(shapes.values()) == {"tuned"} and len(shapes) == N_SHAPES, "every shape tuned, none parked"
    assert all(verified.get(sid) == 1 for sid in shapes) and duplicates == 0, "one verified result per shape"
    assert not lost, f"finished results not in the database: {sorted(lost)[:10]}"
    assert superseded <= stored, "a superseded result is kept as a record"
    assert all(alive.values()) and set(codes.values()) == {0}, (alive, codes)
    assert all(c == 503 for c in errors_5xx), f"5xx other than 503: {sorted(set(errors_5xx))}"
    assert errors_5xx, "the write lock must have been felt (503s)"
    assert tuned_at_lock < N_SHAPES, "the lock must begin mid-campaign (workers finish shapes while it holds)"
    assert fleet.kills >= 3 and fleet.stops >= 3 and "refused the result" not in logs
    with_json = [json.loads(line) for line in logs.splitlines() if line.startswith('{"worker_id"')]
    assert len(with_json) == N_WORKERS  # each surviving worker printed its summary
