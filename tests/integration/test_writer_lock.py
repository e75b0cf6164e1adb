"""SQLite: a process's writers queue on one lock (app/db/session.py), and a writer that waited past the busy
timeout is told the database is busy (a 503), as SQLite itself would."""

from __future__ import annotations

import threading
from datetime import datetime, timezone

import pytest
from sqlalchemy.exc import OperationalError

from app.db import migrate
from app.db.session import Database
from app.errors import _is_busy


def test_a_writer_queued_past_the_busy_timeout_is_busy(tmp_path):
    url = f"sqlite:///{tmp_path / 'lock.db'}"
    migrate.upgrade(url)
    db = Database(url, sqlite_busy_ms=200)
    holding, done = threading.Event(), threading.Event()

    def hold() -> None:
        with db.session():  # the process's write turn, held (no statement yet: SQLite's own lock is free)
            holding.set()
            done.wait(10)

    t = threading.Thread(target=hold)
    t.start()
    try:
        assert holding.wait(10)
        with pytest.raises(OperationalError) as e:
            with db.plain():
                pass
        assert _is_busy(e.value)
        with db.plain(write=False) as p:  # readers never queue
            assert p.rows("worker_exists", {"wid": "nobody"}) == []
    finally:
        done.set()
        t.join()
    with db.plain() as p:  # the turn is free again
        assert p.run("worker_seen", {"wid": "nobody", "now": p.stamp(datetime.now(timezone.utc))}) == 0
    db.dispose()
