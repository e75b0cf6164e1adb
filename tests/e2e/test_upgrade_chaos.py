"""Chaos during an image upgrade: a real server on a SQLite file, CPU workers (torch backend) tuning image A; once
A's first workers stopped part way (after 3 leases of 2 shapes each), image B inherits from A while workers of both
images are SIGKILLed and restarted at random. Afterwards every shape of both images is tuned, no finished result is lost, none is taken
twice (an overturned carried row's shape has exactly its confirmation and its full race), and B's provisional
overlay was downloadable before any capture for B. Select it with `-m chaos`; TUNER_CHAOS_SEED replays a run."""

from __future__ import annotations

import csv
import io
import os
import random
import re
import signal
import sqlite3
import subprocess
import threading
from collections import Counter
from pathlib import Path

import httpx
import pytest

from tests.conftest import ADMIN, DIGEST, OTHER_DIGEST, start_server, wait_for
from tests.e2e.test_chaos import cpu_worker
from workers.identity import cpu_count

pytestmark = [pytest.mark.e2e, pytest.mark.chaos, pytest.mark.timeout(600)]

N_SHAPES, KILLS = 40, 6
SERVER_ENV = {"TUNER_LEASE_TTL_S": "4", "TUNER_LEASE_GRACE_S": "20", "TUNER_MIN_IMPROVEMENT_PCT": "-100",
              "TUNER_MAX_ATTEMPTS": "30"}
FINISHED = re.compile(r"shape (\d+) finished \((\w+)\) for lease ([0-9a-f-]+), spooled")
DELIVERED = re.compile(r"result for shape (\d+) \(lease ([0-9a-f-]+)\) delivered: result (\d+)")


class Fleet:
    def __init__(self, url: str, token: str, tmp: Path):
        self.url, self.token, self.tmp = url, token, tmp
        self.procs: dict[str, tuple[str, subprocess.Popen]] = {}
        self.logs: list[Path] = []
        self.kills = 0
        self.lock = threading.Lock()

    def start(self, wid: str, digest: str, *extra: str) -> None:
        log = self.tmp / f"{wid}-{len(self.logs)}.log"
        self.logs.append(log)
        proc = cpu_worker(self.url, self.token, digest, wid, self.tmp / "spool" / wid, log, "--max-shapes", "2", *extra)
        self.procs[wid] = (digest, proc)

    def working(self) -> list[str]:
        """Workers that finished a shape since their last start (a kill then lands mid-work, on any machine)."""
        return [wid for wid, (_d, _p) in self.procs.items() if "spooled" in self.log_of(wid).read_text()]

    def log_of(self, wid: str) -> Path:
        return [p for p in self.logs if p.name.startswith(wid + "-")][-1]

    def kill_one(self, rng: random.Random) -> None:
        with self.lock:
            wid = rng.choice(sorted(self.working()) or [None])
            if wid is None:
                return
            digest, proc = self.procs[wid]
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            self.kills += 1
            self.start(wid, digest)  # a restart keeps the id and its spool

    def stop(self) -> dict[str, int]:
        """SIGTERM each, once it handles SIGTERM (a worker just restarted may still be importing torch)."""
        wait_for(lambda: all(_catches_sigterm(p.pid) for _d, p in self.procs.values()), timeout=120, every=0.2)
        with self.lock:
            for _d, p in self.procs.values():
                p.send_signal(signal.SIGTERM)
            return {wid: p.wait(timeout=60) for wid, (_d, p) in self.procs.items()}


def _catches_sigterm(pid: int) -> bool:
    """The process has its SIGTERM handler installed (the SigCgt mask of /proc/PID/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) & (1 << (signal.SIGTERM - 1)))
    return False


def campaign(url: str, digest: str) -> dict:
    try:
        with httpx.Client(base_url=url, timeout=5) as c:
            found = [x for x in c.get("/v1/campaigns").json() if x["image_digest"] == digest]
            return c.get(f"/v1/campaigns/{found[0]['campaign_id']}").json() if found else {}
    except (httpx.HTTPError, ValueError, KeyError):
        return {}


def test_an_upgrade_inherited_mid_campaign_under_kills_loses_and_doubles_nothing(tmp_path, capsys):
    seed = int(os.environ.get("TUNER_CHAOS_SEED") or random.randrange(2**32))
    rng = random.Random(seed)
    db = tmp_path / "tuner.db"
    srv = start_server(f"sqlite:///{db}", tmp_path / "server.log", SERVER_ENV)
    admin = httpx.Client(base_url=srv.url, timeout=30, headers={"Authorization": f"Bearer {ADMIN}"})
    r = admin.post("/v1/captures", json={"image_digest": DIGEST, "family": "bf16_gemm", "gfx": "cpu",
                                         "cu_num": cpu_count(), "host": "node-1",
                                         "shapes": [{"M": m, "N": 256, "K": 256} for m in range(1, N_SHAPES + 1)]})
    assert r.status_code == 201, r.text
    fleet = Fleet(srv.url, srv.token("worker", "pool"), tmp_path)
    stop_kills = threading.Event()

    def kills() -> None:  # a worker that has done some work is killed every 1-3 s, KILLS in all
        while fleet.kills < KILLS and not stop_kills.wait(rng.uniform(1.0, 3.0)):
            fleet.kill_one(rng)
    killer = threading.Thread(target=kills)
    try:
        for i in range(2):  # A's first workers stop after 3 leases of 2 shapes: the inherit lands mid-campaign
            fleet.start(f"a-{i}", DIGEST, "--max-batches", "3")
        wait_for(lambda: all(p.poll() is not None for _d, p in fleet.procs.values()), timeout=300, every=0.3)
        r = admin.post(f"/v1/images/{OTHER_DIGEST}/inherit", json={"from": DIGEST})
        for i in range(2):
            fleet.start(f"a-{i}", DIGEST)
        killer.start()
        assert r.status_code == 201, r.text
        (inherited,) = r.json()["campaigns"]
        tuned_at_inherit = inherited["with_row"]
        assert 0 < tuned_at_inherit < N_SHAPES, "inherited mid-campaign"
        ov = admin.get(f"/v1/overlays/{OTHER_DIGEST}/bf16_gemm.csv", params={"version": "latest"})  # before any capture or worker for B
        provisional = list(csv.DictReader(io.StringIO(ov.text)))
        assert ov.status_code == 200 and len(provisional) == inherited["carried"] > 0
        for i in range(2):
            fleet.start(f"b-{i}", OTHER_DIGEST)
        # two kills by progress, whatever the random killer managed: B under way, a worker that has done work killed
        wait_for(lambda: campaign(srv.url, OTHER_DIGEST).get("tuned", 0) >= 5, timeout=300, every=0.3)
        wait_for(lambda: (fleet.kill_one(rng), fleet.kills >= 2)[1], timeout=120, every=0.3)
        wait_for(lambda: all(campaign(srv.url, d).get("tuned") == N_SHAPES for d in (DIGEST, OTHER_DIGEST)),
                 timeout=480, every=0.5)  # a guard against a hang only
        stop_kills.set()
        killer.join()
        codes = fleet.stop()
        b = campaign(srv.url, OTHER_DIGEST)
    finally:
        stop_kills.set()
        for _d, p in fleet.procs.values():
            if p.poll() is None:
                p.kill()
        srv.proc.terminate()
        srv.proc.wait(timeout=30)

    logs = "\n".join(p.read_text() for p in fleet.logs)
    finished = {(int(s), lid) for s, _st, lid in FINISHED.findall(logs)}
    delivered = {(int(s), lid) for s, lid, _r in DELIVERED.findall(logs)}
    with sqlite3.connect(db) as conn:
        stored = set(conn.execute("SELECT shape_id, lease_id FROM results"))
        taken = Counter(sid for sid, in conn.execute(
            "SELECT shape_id FROM results WHERE verified = 1 OR status = 'default_best'"))
        shapes = conn.execute("SELECT s.id, c.image_digest, s.state, s.triage, s.outcome FROM shapes s "
                              "JOIN campaigns c ON c.id = s.campaign_id").fetchall()
    lost = (finished | delivered) - stored
    twice = [sid for sid, _d, _st, _t, outcome in shapes
             if taken[sid] != 1 + (outcome == "overturned")]
    up = b["upgrade"]
    figures = (f"upgrade chaos (seed {seed}; {os.cpu_count()} CPUs, torch on the CPU): {N_SHAPES} shapes per image, "
               f"inherited with {tuned_at_inherit} tuned, {fleet.kills} SIGKILLs across A's and B's workers, "
               f"carried {up['carried']} (provisional rows downloadable at once {len(provisional)}), confirmed "
               f"{up['confirmed']}, overturned {up['overturned']}, lost {len(lost)}, taken twice {len(twice)}, "
               f"B's race time {up['gpu_s']:.1f} s against A's {up['parent_gpu_s']:.1f} s")
    with capsys.disabled():
        print("\n" + figures)
    assert all(st == "tuned" for _i, _d, st, _t, _o in shapes), Counter(st for _i, _d, st, _t, _o in shapes)
    assert not lost, sorted(lost)[:10]
    assert not twice, twice[:10]
    assert up["confirmed"] + up["overturned"] == up["carried"] == tuned_at_inherit
    assert set(codes.values()) == {0}, codes
    assert fleet.kills >= 2
