"""PostgreSQL connections kept in the pool: a request does not ping its connection (a round trip each), yet a
database restart is survived: a connection idle a while is pinged and replaced if dead, one that dies in use
answers 503 once and never goes back into the pool."""

from __future__ import annotations

import asyncio
import time

import pytest
from sqlalchemy.exc import DBAPIError

from app.db import session as db_session
from tests.conftest import PG_URL

pytestmark = pytest.mark.skipif(not PG_URL, reason="PostgreSQL only (scripts/test.sh starts one): "
                                                    "SQLite has no server connection to lose")


def _kill_backends(url: str) -> int:
    """What a database restart does to the pool's connections: every other backend of the database ends."""
    import psycopg
    with psycopg.connect(url, autocommit=True) as conn:
        return len(conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = "
                                "current_database() AND pid <> pg_backend_pid()").fetchall())


def _sync(db) -> int:  # type: ignore[no-untyped-def]
    with db.plain() as p:
        return p.rows("worker_exists", {"wid": "nobody"}) == [] and 1


def _on_the_loop(db) -> int:  # type: ignore[no-untyped-def]
    """The same through the event loop's connections (Database.aplain: the lease routes on PostgreSQL)."""
    from app.db.dialect import ask

    async def one() -> int:
        async with db.aplain() as p:
            return await p.drive(ask("worker_exists", {"wid": "nobody"})) == [] and 1
    return asyncio.run(one())


@pytest.fixture(params=[_sync, _on_the_loop])
def one(request):  # type: ignore[no-untyped-def]
    return request.param


@pytest.fixture
def db():  # type: ignore[no-untyped-def]
    from tests.conftest import _pg_database
    url = _pg_database()
    from app.db import migrate
    migrate.upgrade(url)
    d = db_session.Database(url)
    yield d
    asyncio.run(d.loop_conns.close())
    d.dispose()


def test_an_idle_connection_is_pinged_and_replaced_after_a_restart(db, one, monkeypatch):
    monkeypatch.setattr(db_session, "IDLE_PING_S", 0.2)
    assert one(db)
    assert _kill_backends(db.url) >= 1
    time.sleep(0.3)
    assert one(db)  # pinged on checkout, found dead, a fresh one taken: the request never saw it


def test_a_connection_used_moments_ago_is_not_pinged_and_one_dead_in_use_is_dropped(db, one, monkeypatch):
    monkeypatch.setattr(db_session, "IDLE_PING_S", 3600)
    assert one(db)
    assert _kill_backends(db.url) >= 1
    with pytest.raises(DBAPIError):  # no ping: the request finds it dead (the route answers 503)
        one(db)
    assert one(db)  # ... and it did not go back into the pool
