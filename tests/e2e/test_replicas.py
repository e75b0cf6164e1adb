"""Several `serve` replicas on one database (real processes): started at the same instant on an empty database they
migrate it once and make one bootstrap admin token (a generated one, or a shared TUNER_ADMIN_TOKEN), none crashes;
the first leases of one new worker id, sent at once to every replica, all answer (no duplicate-key 500)."""

from __future__ import annotations

import re
import threading
from collections import Counter
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from tests.conftest import ADMIN, DIGEST, LiveServer, spawn_server, wait_up

pytestmark = pytest.mark.e2e
MIGRATED = re.compile(r"aiter-tuner: database migrated to (\w+)")
GENERATED = "aiter-tuner: first start, admin token"


def replicas(db_url: str, tmp: Path, n: int, env: dict[str, str] | None = None) -> list[LiveServer]:
    """n replicas spawned together (none waits for another), then each waited for."""
    spawned = [spawn_server(db_url, tmp / f"replica-{i}.log", env) for i in range(n)]
    try:
        return [wait_up(s, timeout=120) for s in spawned]
    except RuntimeError:
        for s in spawned:
            s.proc.kill()
        raise


def stop(servers: list[LiveServer]) -> None:
    for s in servers:
        s.proc.terminate()
    for s in servers:
        s.proc.wait(timeout=30)


def scalar(db_url: str, sql: str) -> int:
    url = db_url.replace("postgresql://", "postgresql+psycopg://", 1)
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return conn.execute(text(sql)).scalar_one()
    finally:
        engine.dispose()


@pytest.mark.parametrize("admin", ["generated", "shared"])
def test_replicas_started_together_migrate_once_and_make_one_admin_token(db_url, tmp_path, admin):
    env = ({"TUNER_ADMIN_TOKEN": "", "TUNER_ADMIN_TOKEN_FILE": str(tmp_path / "admin_token")}
           if admin == "generated" else {"TUNER_ADMIN_TOKEN": ADMIN})
    servers = replicas(db_url, tmp_path, 3, env)  # raises if one exits (a crash while migrating)
    try:
        logs = [s.log.read_text() for s in servers]
    finally:
        stop(servers)
    assert sum(len(MIGRATED.findall(t)) for t in logs) == 1, "one replica migrates, the others find it done"
    assert scalar(db_url, "SELECT count(*) FROM alembic_version") == 1
    assert scalar(db_url, "SELECT count(*) FROM tokens WHERE role = 'admin'") == 1
    assert sum(t.count(GENERATED) for t in logs) == (1 if admin == "generated" else 0)
    assert not any("Traceback" in t for t in logs), [t[-2000:] for t in logs if "Traceback" in t]


@pytest.mark.parametrize("role", ["admin", "worker"])
def test_first_leases_of_one_new_worker_id_at_once_on_every_replica(db_url, tmp_path, role):
    servers = replicas(db_url, tmp_path, 2)
    try:
        with servers[0].client() as c:
            shapes = [{"M": m, "N": 64, "K": 64} for m in range(1, 200)]
            assert c.post("/v1/captures", json={"image_digest": DIGEST, "gfx": "gfx942", "cu_num": 304,
                                                "family": "bf16_gemm", "shapes": shapes}).status_code == 201
        token = ADMIN if role == "admin" else servers[0].token("worker", "pool", DIGEST)
        statuses: Counter = Counter()
        lock = threading.Lock()
        for round_ in range(4):  # each round a new worker id, its first leases all at once
            wid = f"new-{role}-{round_}"
            go = threading.Barrier(8)

            def first_lease(srv: LiveServer) -> None:
                body = {"worker_id": wid, "image_digest": DIGEST, "gfx": "gfx942", "cu_num": 304,
                        "backends": ["torch"], "budget_s": 60, "max_shapes": 2}
                with srv.client(token) as c:
                    go.wait()
                    r = c.post("/v1/leases", json=body)
                with lock:
                    statuses[r.status_code] += 1
            threads = [threading.Thread(target=first_lease, args=(servers[i % 2],)) for i in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        assert statuses == Counter({200: 32}), statuses
        assert scalar(db_url, "SELECT count(*) FROM workers") == 4
    finally:
        stop(servers)


@pytest.mark.parametrize("admin", ["generated", "shared"])
def test_bootstraps_at_once_on_a_migrated_database_make_one_admin_token(db_url, tmp_path, admin):
    """The bootstrap alone, at the same instant in several processes' place (threads, each with its own
    connections) on a database already migrated: one admin token, no duplicate-key crash."""
    from app.config import Settings
    from app.db import migrate
    from app.db.session import Database
    from app.main import bootstrap_admin
    migrate.upgrade(db_url)
    settings = Settings(database_url=db_url, admin_token=None if admin == "generated" else ADMIN,
                        admin_token_file=str(tmp_path / "admin_token"))
    dbs = [Database(db_url) for _ in range(6)]
    go, errors = threading.Barrier(len(dbs)), []

    def boot(db: Database) -> None:
        go.wait()
        try:
            bootstrap_admin(db, settings)
        except Exception as e:  # noqa: BLE001 - a replica that would have crashed at start
            errors.append(e)
    threads = [threading.Thread(target=boot, args=(db,)) for db in dbs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for db in dbs:
        db.dispose()
    assert not errors and scalar(db_url, "SELECT count(*) FROM tokens WHERE role = 'admin'") == 1, errors
