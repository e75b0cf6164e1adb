"""Engine and sessions. SQLite: WAL, busy timeout, and BEGIN IMMEDIATE so writers queue instead of
deadlocking on lock upgrade (SQLAlchemy's pysqlite recipe); PostgreSQL via DATABASE_URL."""

from __future__ import annotations

import asyncio
import math
import os
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any, cast
from contextlib import asynccontextmanager, contextmanager

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine.interfaces import DBAPIConnection
from sqlalchemy.pool import ConnectionPoolEntry, PoolProxiedConnection
from sqlalchemy.exc import DBAPIError, DisconnectionError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from app.db.dialect import AsyncPlain, Plain, db_key

if TYPE_CHECKING:
    import psycopg


# With checkpoints in the background, a request's commit still checkpoints once the WAL holds this many pages
# (~40 MB): a backstop, reached only if the background checkpointer stalls. SQLite's default is 1000.
BACKSTOP_PAGES = 10_000


def make_engine(url: str, sqlite_busy_ms: int = 5000, immediate: bool = True,
                background_checkpoints: bool = False) -> Engine:
    if url.startswith("sqlite"):
        path = url.split("///", 1)[-1]
        if path and path != ":memory:":
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": sqlite_busy_ms / 1000})

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn: sqlite3.Connection, _rec: ConnectionPoolEntry) -> None:
            dbapi_conn.isolation_level = None  # we emit BEGIN ourselves
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            # WAL + NORMAL: a commit survives the service dying (only an OS crash or power cut can lose the
            # last ones), and no fsync per lease (one per checkpoint instead)
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute(f"PRAGMA busy_timeout={int(sqlite_busy_ms)}")
            cur.execute("PRAGMA foreign_keys=ON")
            if background_checkpoints:  # see Database.checkpoint
                cur.execute(f"PRAGMA wal_autocheckpoint={BACKSTOP_PAGES}")
            cur.close()

        @event.listens_for(engine, "begin")
        def _begin(conn: Connection) -> None:
            conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

        return engine
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url.removeprefix("postgresql://")
    # as many kept connections as request threads (anyio's 40): a burst of leases never waits on a new
    # PostgreSQL backend being forked for it (64-agent lease p99 ~22 -> ~15 ms)
    engine = create_engine(url, pool_size=40, max_overflow=10)
    _ping_when_idle(engine)
    return engine


IDLE_PING_S = 2.0


def _ping_when_idle(engine: Engine) -> None:
    """pool_pre_ping's check, only for a connection that sat in the pool IDLE_PING_S or longer (a database
    restarted meanwhile is found there, and a fresh connection replaces it): pool_pre_ping would cost every
    request a round trip. A connection that dies in use is dropped (Database.plain; SQLAlchemy's own for
    sessions) and its request answers 503, which the agent retries."""
    error = engine.dialect.loaded_dbapi.Error

    @event.listens_for(engine, "checkin")
    def _back(_dbapi_conn: DBAPIConnection, rec: ConnectionPoolEntry) -> None:
        rec.info["back_at"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _out(dbapi_conn: DBAPIConnection, rec: ConnectionPoolEntry, _proxy: PoolProxiedConnection) -> None:
        if time.monotonic() - rec.info.pop("back_at", math.inf) < IDLE_PING_S:
            return
        try:
            engine.dialect.do_ping(dbapi_conn)
        except error as e:
            raise DisconnectionError(str(e)) from e  # the pool connects afresh


class LoopConnections:
    """PostgreSQL connections for the event loop (Database.aplain): psycopg AsyncConnections in autocommit, the
    last one back taken first, at most `size` in use (the others wait their turn). As the engine's pool does
    (_ping_when_idle), one that sat IDLE_PING_S or longer is pinged and replaced if dead; one that broke in use is
    closed, never reused. Not psycopg_pool: its check-out and check-in cost ~0.18 ms of CPU per request on the
    2-core VM (session 7, in-process: 3.54 ms per lease+release with it, 3.18 with a plain queue), about what
    leaving the thread saves."""

    def __init__(self, conninfo: str, size: int):
        self._conninfo, self._slots = conninfo, asyncio.Semaphore(size)
        # psycopg is imported where it is used (PostgreSQL only)
        self._idle: list[tuple[psycopg.AsyncConnection[Any], float]] = []  # with when each came back

    async def get(self) -> psycopg.AsyncConnection[Any]:
        import psycopg
        await self._slots.acquire()
        try:
            while self._idle:
                conn, back = self._idle.pop()
                if time.monotonic() - back < IDLE_PING_S:
                    return conn
                try:
                    await conn.execute("SELECT 1")
                    return conn
                except psycopg.Error:
                    await conn.close()
            return await psycopg.AsyncConnection.connect(self._conninfo, autocommit=True)
        except BaseException:
            self._slots.release()
            raise

    def put(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Back after use (a closed one is dropped)."""
        if not conn.closed:
            self._idle.append((conn, time.monotonic()))
        self._slots.release()

    async def close(self) -> None:
        while self._idle:
            await self._idle.pop()[0].close()


# what a driver says when the database takes no writes at all (SQLite's SQLITE_FULL, SQLITE_IOERR,
# SQLITE_READONLY; PostgreSQL's ENOSPC on its WAL or a table's file, a read-only server)
_CANNOT_WRITE = ("database or disk is full", "disk i/o error", "readonly database", "no space left on device",
                 "could not extend file", "could not write", "read-only transaction")


def cannot_write(e: BaseException) -> str | None:
    """The reason in a driver's error that says writes fail (None: something else, such as busy)."""
    msg = str(getattr(e, "orig", None) or e)
    low = msg.lower()
    return msg.strip().splitlines()[0][:300] if any(k in low for k in _CANNOT_WRITE) else None


class Database:
    def __init__(self, url: str, sqlite_busy_ms: int = 5000, background_checkpoints: bool = False,
                 loop_connections: int = 4):
        """background_checkpoints (SQLite): requests do not checkpoint the WAL; the serving process calls
        checkpoint() every second or so (app.main). loop_connections (PostgreSQL): Database.aplain's."""
        self.url = url
        self.engine = make_engine(url, sqlite_busy_ms, background_checkpoints=background_checkpoints)
        self.is_sqlite = url.startswith("sqlite")
        self.key = db_key(self.engine)
        # SQLite readers take no write lock (WAL lets them run beside the one writer)
        self.read_engine = (make_engine(url, sqlite_busy_ms, immediate=False,
                                        background_checkpoints=background_checkpoints)
                            if self.is_sqlite else self.engine)
        # what the app keeps per database (its caches: app/services/caches.py), reached by the services through
        # the sessions and Plains they are given: each session's info holds this very dict
        self.state: dict[str, Any] = {}
        self._factory = sessionmaker(self.engine, expire_on_commit=False, info={"state": self.state})
        self._read_factory = sessionmaker(self.read_engine, expire_on_commit=False, info={"state": self.state})
        self._writer, self._busy_s = threading.RLock(), sqlite_busy_ms / 1000
        # the last write's failure that says the database cannot take writes (disk full, read-only, I/O), with
        # when (monotonic): /healthz answers 503 with it until a write commits a change again (write_failed)
        self.write_failure: tuple[str, float] | None = None
        self.loop_conns = None if self.is_sqlite else LoopConnections(
            self.engine.url.set(drivername="postgresql").render_as_string(hide_password=False), loop_connections)

    @contextmanager
    def _one_writer(self, write: bool) -> Iterator[None]:
        """SQLite has one writer at a time: this process's writers queue on a lock and each starts the moment
        the last one ends, where SQLite's busy handler would sleep 1, 2, 5, 10 ... 100 ms between tries (the
        tail of a busy lease queue). Past the busy timeout it is busy, as SQLite would say: a 503 (app/errors.py)."""
        got = write and self.is_sqlite
        if got and not self._writer.acquire(timeout=self._busy_s):
            raise OperationalError("BEGIN IMMEDIATE", None, sqlite3.OperationalError("database is locked"))
        try:
            yield
        finally:
            if got:
                self._writer.release()

    def _note(self, e: BaseException) -> None:
        """A write failed: remembered where the error says the database takes no writes (not busy: that passes)."""
        why = cannot_write(e)
        if why is not None:
            self.write_failure = (why, time.monotonic())

    def _wrote(self, changed: bool) -> None:
        """A write transaction committed: a change it made says the database takes writes again."""
        if changed and self.write_failure is not None:
            self.write_failure = None

    @staticmethod
    def _changes(dbapi: object) -> int:
        """SQLite: rows this connection changed, ever (a write transaction that changed none proves nothing)."""
        return int(getattr(dbapi, "total_changes", 0))

    @contextmanager
    def session(self, write: bool = True) -> Iterator[Session]:
        """One transaction per use case: committed on success, rolled back on error."""
        if not write:
            with self._one_writer(write), self._read_factory() as s, s.begin():
                yield s
            return
        with self._one_writer(write), self._factory() as s:
            try:
                with s.begin():
                    dbapi = s.connection().connection.dbapi_connection if self.is_sqlite else None
                    before = self._changes(dbapi) if dbapi is not None else 0
                    yield s
                    s.flush()
                    changed = self._changes(dbapi) > before if dbapi is not None else True
            except DBAPIError as e:
                self._note(e)
                raise
            self._wrote(changed)

    @contextmanager
    def plain(self, write: bool = True) -> Iterator[Plain]:
        """One transaction on the driver's connection, for the dialect module's plain statements (the lease
        routes: no session, no unit of work, no SQLAlchemy execution context per statement)."""
        engine = self.engine if write else self.read_engine
        driver_error = engine.dialect.loaded_dbapi.Error
        with self._one_writer(write):
            try:
                fairy = engine.raw_connection()
            except driver_error as e:  # the pool's connect, unwrapped by SQLAlchemy here: refused, or starting up
                raise DBAPIError.instance(None, None, e, driver_error) from e
            conn = cast(DBAPIConnection, fairy.dbapi_connection)  # checked out: the driver's connection, never None
            try:
                before = self._changes(conn) if self.is_sqlite else 0
                if self.is_sqlite:  # as the engines' "begin" hook does: writers queue for the one write lock
                    conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
                else:  # psycopg would send its BEGIN as a round trip of its own: the Plain sends it with its first
                    conn.autocommit = True  # statements (commit and rollback still end what it began)
                yield Plain(conn, not self.is_sqlite, self.key, begin=not self.is_sqlite, state=self.state)
                fairy.commit()
                if write:
                    self._wrote(self._changes(conn) > before if self.is_sqlite else True)
            except BaseException as e:
                if write:
                    self._note(e)
                if isinstance(e, driver_error) and engine.dialect.is_disconnect(e, conn, None):
                    fairy.invalidate(e)  # dead (the database restarted): never back into the pool
                else:
                    fairy.rollback()
                if isinstance(e, driver_error):  # as SQLAlchemy raises it (busy or locked: a 503, app/errors.py)
                    raise DBAPIError.instance(None, None, e, driver_error) from e
                raise
            finally:
                if not self.is_sqlite and fairy.is_valid:
                    try:
                        conn.autocommit = False  # as the pool's other users (sessions) expect it
                    except driver_error as e:  # still in a transaction it could not end: not reused
                        fairy.invalidate(e)
                fairy.close()

    @asynccontextmanager
    async def aplain(self) -> AsyncIterator[AsyncPlain]:
        """Database.plain on the event loop (PostgreSQL): one transaction of the dialect module's statements on a
        LoopConnections connection; a driver error raised as SQLAlchemy raises it (a 503 for the route), a
        connection that broke, or a transaction left unfinished (cancelled mid-batch), closed."""
        import psycopg
        assert self.loop_conns is not None, "aplain: PostgreSQL only"
        try:
            conn = await self.loop_conns.get()
        except psycopg.Error as e:
            raise DBAPIError.instance(None, None, e, psycopg.Error) from e
        try:
            yield AsyncPlain(conn, self.key, self.state)
            await conn.commit()
            self._wrote(True)
        except Exception as e:
            self._note(e)
            if not conn.broken:
                try:
                    await conn.rollback()
                except psycopg.Error:
                    await conn.close()
            if isinstance(e, psycopg.Error):
                raise DBAPIError.instance(None, None, e, psycopg.Error) from e
            raise
        except BaseException:
            await conn.close()
            raise
        finally:
            if conn.broken:
                await conn.close()
            self.loop_conns.put(conn)

    def checkpoint(self) -> tuple[int, int]:
        """SQLite: copy the WAL's committed pages into the database file, without waiting for or blocking
        readers and writers (PASSIVE); returns (pages in the WAL, pages copied). By default the commit that
        takes the WAL past 1,000 pages does this itself, with an fsync, while it holds the one write lock (and
        every writer queued behind it waits): on the 2-core VM, moving it here took the 64-agent open loop's lease
        p99 from 13.4-17.3 to 8.2-9.5 ms (4 rounds each). A commit never fsyncs in WAL mode with
        synchronous=NORMAL, so no request waits on the disk."""
        if not self.is_sqlite:
            return 0, 0
        fairy = self.read_engine.raw_connection()
        try:
            _busy, log, done = cast(DBAPIConnection, fairy.dbapi_connection).execute(  # checked out: never None
                "PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            return log, done
        except sqlite3.Error as e:  # as SQLAlchemy raises it (as plain() does): the caller's busy or locked
            raise DBAPIError.instance(None, None, e, sqlite3.Error) from e
        finally:
            fairy.close()

    def dispose(self) -> None:
        """The engines' connections (the event loop's: LoopConnections.close, on the loop)."""
        self.engine.dispose()
        if self.read_engine is not self.engine:
            self.read_engine.dispose()
