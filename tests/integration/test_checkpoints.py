"""SQLite: the serving process checkpoints the WAL in the background, so no request's commit copies pages into
the database file and waits on the disk while it holds the one write lock (app/db/session.py checkpoint)."""

from __future__ import annotations

import sqlite3
import struct

import httpx

from app.db.session import Database
from tests.conftest import ADMIN, DIGEST, start_server, wait_for

PAGE = 4096


def _write_pages(db: Database, commits: int) -> None:
    """commits transactions of 4 page-sized rows each (the WAL gains at least 4 pages per commit)."""
    with db.engine.begin() as c:
        c.exec_driver_sql("CREATE TABLE IF NOT EXISTS blobs (id INTEGER PRIMARY KEY, b BLOB)")
    for _ in range(commits):
        with db.engine.begin() as c:
            for _ in range(4):
                c.exec_driver_sql("INSERT INTO blobs (b) VALUES (randomblob(?))", (PAGE,))


def _wal_pages(path) -> int:  # type: ignore[no-untyped-def]
    """Pages in the WAL since it last restarted, as a separate connection sees them (and then copies them)."""
    with sqlite3.connect(path) as c:
        return c.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()[1]


def _all_copied(path) -> bool:  # type: ignore[no-untyped-def]
    """Every WAL frame is copied into the database file (the wal-index header in the -shm file: mxFrame at byte
    16, nBackfill at byte 96, native order; sqlite.org/walformat.html), read without checkpointing anything."""
    head = (path.parent / (path.name + "-shm")).read_bytes()[:100]
    frames, copied = struct.unpack("=I", head[16:20])[0], struct.unpack("=I", head[96:100])[0]
    return frames > 0 and copied == frames


def test_requests_leave_checkpoints_to_the_background(tmp_path):
    """The same writes: by default a commit checkpoints once the WAL passes 1,000 pages (the WAL restarts after
    it); with background checkpoints the WAL keeps every page until checkpoint(), which copies them all."""
    default = Database(f"sqlite:///{tmp_path / 'default.db'}")
    _write_pages(default, 400)
    assert _wal_pages(tmp_path / "default.db") < 1000
    default.dispose()

    db = Database(f"sqlite:///{tmp_path / 'bg.db'}", background_checkpoints=True)
    _write_pages(db, 400)
    log, copied = db.checkpoint()
    assert log > 1600 and copied == log
    _write_pages(db, 1)  # the WAL restarts from its start: everything before was copied
    assert _wal_pages(tmp_path / "bg.db") < 20
    db.dispose()


def test_the_serving_process_checkpoints_every_second(tmp_path):
    path = tmp_path / "srv.db"
    srv = start_server(f"sqlite:///{path}", tmp_path / "server.log")
    try:
        head = "M,N,K,bias,dtype,outdtype,scaleAB,bpreshuffle\n"
        text = head + "".join(f"{1 + i % 4096},{64 * (1 + i // 4096)},4096,False,torch.bfloat16,torch.bfloat16,"
                              "False,False\n" for i in range(20_000))
        params = {"image_digest": DIGEST, "gfx": "gfx942", "cu_num": 304, "family": "bf16_gemm"}
        auth = {"Authorization": f"Bearer {ADMIN}"}
        r = httpx.post(srv.url + "/v1/captures", content=text, params=params, timeout=120,
                       headers={**auth, "content-type": "text/csv"})
        assert r.status_code == 201, r.text
        # the background checkpointer copies the capture's pages (over 1,000); a hang guard only, no sleep
        wait_for(lambda: _all_copied(path), timeout=120, every=0.1)
        r = httpx.post(srv.url + "/v1/captures", content=head + "1,64,8192,False,torch.bfloat16,torch.bfloat16,"
                       "False,False\n", params=params, headers={**auth, "content-type": "text/csv"}, timeout=120)
        assert r.status_code == 201, r.text
        assert _wal_pages(path) < 100  # that write restarted the WAL from its start
    finally:
        srv.proc.terminate()
        srv.proc.wait(timeout=10)
