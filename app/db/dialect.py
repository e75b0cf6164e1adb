"""The only place that knows SQLite from PostgreSQL: the bulk shape upsert, the lease lock, the start-up lock, and
the lease routes' statements as each driver runs them."""

from __future__ import annotations

import fcntl
import json
import os
import re
from collections.abc import Callable, Generator, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timezone
from enum import StrEnum
from functools import lru_cache
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar, cast

from sqlalchemy import Engine, func, make_url, select, text
from sqlalchemy.engine.interfaces import DBAPIConnection
from sqlalchemy.orm import Session

from app.db.models import CampaignShape
from app.domain.lease_states import LeaseState, ShapeState

if TYPE_CHECKING:
    import psycopg

# (shape_key, shape as a dict, calls, flops of one call, default_us estimate, priority)
ShapeRow = tuple[str, dict[str, Any], int, float, float, float]

_COLS = ("campaign_id, shape_key, shape, calls, flops, default_us, priority, default_measured, state, attempts, "
         "updated_at")
# a shape seen again adds its calls; served.priority in SQL: (steps, else calls) x the default's time
_ON_CONFLICT = ("ON CONFLICT (campaign_id, shape_key) DO UPDATE SET calls = shapes.calls + excluded.calls, "
                "priority = coalesce(shapes.steps, shapes.calls + excluded.calls) * shapes.default_us, "
                "updated_at = excluded.updated_at")


@lru_cache
def _bind(dialect_name: str) -> Callable[[Any], Any]:
    """The driver values SQLAlchemy would bind for updated_at (SQLite stores a formatted string)."""
    from sqlalchemy.dialects import postgresql, sqlite
    # SQLAlchemy's dialect classes declare no types on their constructors
    d = (postgresql.psycopg.dialect() if dialect_name == "postgresql"  # type: ignore[no-untyped-call]
         else sqlite.pysqlite.dialect())
    proc = CampaignShape.__table__.c.updated_at.type.bind_processor(d)
    return proc or (lambda v: v)


def add_shape_calls(s: Session, campaign_id: int, rows: Sequence[ShapeRow], now: datetime) -> int:
    """Insert shapes, or add their call counts to the ones already there (concurrent captures included),
    with one statement through the driver's bulk path. Returns how many shapes were new."""
    if not rows:
        return 0
    conn = s.connection()
    dbapi = cast(DBAPIConnection, conn.connection.dbapi_connection)  # the session's: never None
    if conn.dialect.name == "postgresql":
        return _pg_copy_upsert(cast("psycopg.Connection[Any]", dbapi), campaign_id, rows, now)  # psycopg's there
    # SQLite: BEGIN IMMEDIATE holds the only write lock, so counting before and after is exact
    count = select(func.count()).select_from(CampaignShape).where(CampaignShape.campaign_id == campaign_id)
    before = s.scalar(count) or 0
    when = _bind("sqlite")(now)
    cur = dbapi.cursor()
    try:
        cur.executemany(f"INSERT INTO shapes ({_COLS}) VALUES (?, ?, ?, ?, ?, ?, ?, 0, 'queued', 0, ?) "
                        f"{_ON_CONFLICT}", [(campaign_id, key, json.dumps(shape), calls, f, us, pri, when)
                                            for key, shape, calls, f, us, pri in rows])
    finally:
        cur.close()
    return (s.scalar(count) or 0) - before


def _pg_copy_upsert(dbapi: psycopg.Connection[Any], campaign_id: int, rows: Sequence[ShapeRow], now: datetime
                    ) -> int:
    """COPY into a temporary table, then one INSERT ... SELECT ... ON CONFLICT; xmax = 0 marks a new row.
    Rows go in key order so concurrent captures of overlapping shapes lock them in the same order."""
    with dbapi.cursor() as cur:
        cur.execute("CREATE TEMP TABLE shape_in (shape_key text, shape text, calls bigint, flops float8, "
                    "default_us float8, priority float8) ON COMMIT DROP")
        with cur.copy("COPY shape_in FROM STDIN") as cp:
            for key, shape, calls, f, us, pri in rows:
                cp.write_row((key, json.dumps(shape), calls, f, us, pri))
        cur.execute(f"WITH up AS (INSERT INTO shapes ({_COLS}) SELECT %s, shape_key, shape::json, calls, flops, "
                    f"default_us, priority, false, 'queued', 0, %s FROM shape_in ORDER BY shape_key {_ON_CONFLICT} "
                    "RETURNING xmax = 0 AS new) SELECT count(*) FILTER (WHERE new) FROM up", (campaign_id, now))
        row = cur.fetchone()
        assert row is not None, "count(*) answers one row"
        new = row[0]
        cur.execute("DROP TABLE shape_in")
    return int(new)


def insert_shapes_absent(s: Session, rows: Sequence[dict[str, Any]]) -> set[str]:
    """Insert shapes whose (campaign_id, shape_key) is not there yet; a shape a concurrent capture inserted first is
    left as it is (the caller merges into it). Key order, as captures take their row locks. Returns the keys
    inserted here."""
    if not rows:
        return set()
    from sqlalchemy.dialects import postgresql, sqlite
    ins = (postgresql.insert if s.connection().dialect.name == "postgresql" else sqlite.insert)(CampaignShape)
    out: set[str] = set()
    ordered = sorted(rows, key=lambda r: r["shape_key"])
    for i in range(0, len(ordered), 500):
        stmt = ins.values(ordered[i:i + 500]).on_conflict_do_nothing(
            index_elements=["campaign_id", "shape_key"]).returning(CampaignShape.shape_key)
        out.update(s.scalars(stmt).all())
    return out


# pg_advisory_xact_lock's key for image lineage changes (inherits): any constant all replicas share
LINEAGE_LOCK_KEY = 0x4C494E45  # "LINE"


def lineage_lock(s: Session) -> None:
    """Lineage changes one at a time across replicas, for the rest of the session's transaction: PostgreSQL's
    transaction-scoped advisory lock (freed at commit or rollback, or with a dead replica's connection); on SQLite
    the write session's BEGIN IMMEDIATE already holds the database's only write lock."""
    if s.connection().dialect.name == "postgresql":
        s.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": LINEAGE_LOCK_KEY})


# pg_advisory_lock's key for start-up work (migrations, the bootstrap admin token): any constant all replicas share
START_LOCK_KEY = 0x41495445  # "AITE"


@contextmanager
def start_lock(url: str) -> Iterator[None]:
    """One process at a time, across every replica on this database, in what each does once at start
    (migrations, the bootstrap admin token): PostgreSQL's advisory lock, held on a connection of its own (a
    replica that dies holding it frees it with its connection); SQLite's, an flock on a file beside the database
    (freed with the process too). The others wait for it, then find the work done."""
    if url.startswith("sqlite"):
        path = url.split("///", 1)[-1].split("?", 1)[0]
        if not path or path == ":memory:":
            yield
            return
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path + ".start-lock", "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            yield  # closing the file frees the lock
        return
    import psycopg
    conninfo = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", (START_LOCK_KEY,))
        yield  # the connection's end frees the lock


def db_key(engine: Engine) -> str:
    """One name per database, whichever engine (SQLite's reader or writer) reaches it."""
    return engine.url.render_as_string()


# ---- the lease routes' statements as the driver runs them ------------------------------------------------------
# A statement through SQLAlchemy costs ~50 us of Python around a ~2 us SQLite call, and a lease+release is nine
# of them: the lease, heartbeat, release and sweep paths run these instead (app/services/leasing.py), written
# once with :name placeholders; ${...} marks what differs by engine.

class Sql(StrEnum):
    """PLAIN_SQL's statements by name: a misspelt one is a type error, not a KeyError on the fleet's hottest path."""
    TOUCH_WORKER = "touch_worker"
    TOUCH_OWN_WORKER = "touch_own_worker"
    WORKER_EXISTS = "worker_exists"
    ADD_WORKER = "add_worker"
    WORKER_SEEN = "worker_seen"
    CAMPAIGNS = "campaigns"
    PICK = "pick"
    HELD = "held"
    WRITE_SHAPE = "write_shape"
    ADD_LEASE = "add_lease"
    LEASE = "lease"
    DEAD_LEASES = "dead_leases"
    END_LEASE = "end_lease"
    BEAT = "beat"
    SHAPE = "shape"
    SET_OUTCOME = "set_outcome"
    MEASURED_DEFAULT = "measured_default"
    ADD_RESULT = "add_result"
    RESULT_OF = "result_of"
    COSTS = "costs"
    HEADERS = "headers"
    CATALOG = "catalog"


# Typed rows of the statements' answers; each statement's column list is made from its row type's fields (one
# source for both), and Rows converts the values (states to lease_states' enums, times, JSON documents).
class ShapeFactsRow(NamedTuple):
    """A shape as the lease routes read it ("pick", "held", "shape")."""
    id: int
    shape: dict[str, Any]
    calls: int
    state: ShapeState
    attempts: int
    attempts_base: int | None
    lease_id: str | None
    last_error: str | None
    campaign_id: int
    steps: float | None
    # the last three: an inherited shape's confirmation race (app/domain/upgrade.py)
    triage: str | None
    outcome: str | None
    finalists: list[str] | None


class LeaseRow(NamedTuple):
    """A lease as the sweeper reads it ("dead_leases")."""
    id: str
    state: LeaseState
    expires_at: datetime
    hard_deadline: datetime
    token_id: int | None
    worker_id: str
    campaign_id: int


class CampaignLeaseRow(NamedTuple):
    """A lease with its campaign's facts ("lease": the token's image scope, a result's checks)."""
    id: str
    state: LeaseState
    expires_at: datetime
    hard_deadline: datetime
    token_id: int | None
    worker_id: str
    campaign_id: int
    # its campaign's
    family: str
    image_digest: str
    gfx: str
    cu_num: int


class CampaignRow(NamedTuple):
    """An identity's campaign with its top queued shape's priority ("campaigns"; None: nothing queued)."""
    id: int
    family: str
    image_digest: str
    gfx: str
    cu_num: int
    top: float | None


class PostedRow(NamedTuple):
    """A result already posted for a lease's shape ("result_of")."""
    id: int
    verified: bool


_SHAPE_FACTS = ", ".join(ShapeFactsRow._fields)
_LEASE_COLS = ", ".join(LeaseRow._fields)
_LEASE_OF_CAMPAIGN = ", ".join([f"l.{c}" for c in LeaseRow._fields] +
                               [f"c.{c}" for c in CampaignLeaseRow._fields[len(LeaseRow._fields):]])
_QUEUED, _LEASED, _ACTIVE = ShapeState.QUEUED.value, ShapeState.LEASED.value, LeaseState.ACTIVE.value
_WORKER_SEEN = ("image_digest = :image_digest, gfx = :gfx, cu_num = :cu_num, host = :host, "
                "backends = ${json:backends}, aiter_commit = :aiter_commit, last_seen_at = :now")
PLAIN_SQL: dict[Sql, str] = {
    Sql.TOUCH_WORKER: f"UPDATE workers SET {_WORKER_SEEN} WHERE id = :wid",
    Sql.TOUCH_OWN_WORKER: f"UPDATE workers SET {_WORKER_SEEN} WHERE id = :wid AND (token_id IS NULL OR "
                          "token_id = :tok)",
    Sql.WORKER_EXISTS: "SELECT 1 FROM workers WHERE id = :wid",
    # DO NOTHING: another request's first lease won
    Sql.ADD_WORKER: "INSERT INTO workers (id, image_digest, gfx, cu_num, host, backends, aiter_commit, "
                    "first_seen_at, last_seen_at, token_id) VALUES (:wid, :image_digest, :gfx, :cu_num, :host, "
                    "${json:backends}, :aiter_commit, :now, :now, :tok) ON CONFLICT (id) DO NOTHING",
    Sql.WORKER_SEEN: "UPDATE workers SET last_seen_at = :now WHERE id = :wid",
    # an identity's campaigns, each with its top queued priority: one ix_shapes_queue seek per campaign
    Sql.CAMPAIGNS: f"SELECT {', '.join('c.' + c for c in CampaignRow._fields[:-1])}, (SELECT s.priority FROM "
                   f"shapes s WHERE s.campaign_id = c.id AND s.state = '{_QUEUED}' ORDER BY s.priority DESC "
                   "LIMIT 1) AS top FROM campaigns c WHERE c.image_digest = :digest AND c.gfx = :gfx AND "
                   "c.cu_num = :cu",
    # the next n of a campaign's queue: one ix_shapes_queue range
    Sql.PICK: f"SELECT {_SHAPE_FACTS} FROM shapes WHERE campaign_id = :cid AND state = '{_QUEUED}' "
              "ORDER BY priority DESC, id LIMIT :n${skip_locked}",
    Sql.HELD: f"SELECT {_SHAPE_FACTS} FROM shapes WHERE lease_id = :lid AND state = '{_LEASED}'",
    # one shape's transition, guarded by the state and the lease it was read in
    Sql.WRITE_SHAPE: "UPDATE shapes SET state = :state, attempts = :attempts, attempts_base = :base, "
                     "lease_id = :lease, last_error = :error, updated_at = :now WHERE id = :id AND state = :was "
                     "AND lease_id ${is} :was_lease",
    Sql.ADD_LEASE: "INSERT INTO leases (id, worker_id, campaign_id, backend, token_id, budget_s, created_at, "
                   "heartbeat_at, hard_deadline, expires_at, state) VALUES (:id, :wid, :cid, :backend, :tok, "
                   ":budget_s, :now, :now, :hard, :exp, :state)",
    # a lease with its campaign's facts (the token's image scope, a result's checks): one primary-key join
    Sql.LEASE: f"SELECT {_LEASE_OF_CAMPAIGN} FROM leases l JOIN campaigns c ON c.id = l.campaign_id "
               "WHERE l.id = :lid",
    Sql.DEAD_LEASES: f"SELECT {_LEASE_COLS} FROM leases WHERE state = '{_ACTIVE}' AND expires_at < :now "
                     "ORDER BY id",
    Sql.END_LEASE: f"UPDATE leases SET state = :state, end_reason = :why WHERE id = :lid AND state = '{_ACTIVE}'",
    Sql.BEAT: f"UPDATE leases SET heartbeat_at = :now, expires_at = :exp WHERE id = :lid AND state = '{_ACTIVE}'",
    Sql.SHAPE: f"SELECT {_SHAPE_FACTS} FROM shapes WHERE id = :sid",
    # how an inherited shape's confirmation ended; finalists NULL: raced in full from now on
    Sql.SET_OUTCOME: "UPDATE shapes SET outcome = :outcome, finalists = ${json:finalists} WHERE id = :sid",
    Sql.MEASURED_DEFAULT: "UPDATE shapes SET default_us = :us, default_measured = TRUE, priority = :priority "
                          "WHERE id = :sid",
    Sql.ADD_RESULT: "INSERT INTO results (shape_id, lease_id, worker_id, backend, image_digest, aiter_commit, "
                    "status, us, err_ratio, verified, kernel_name, default_us, row, candidates, error, confidence, "
                    "spread, timing, elapsed_s, started_at, finished_at, created_at) VALUES (:sid, :lid, :wid, "
                    ":backend, :digest, :aiter_commit, :status, :us, :err_ratio, :verified, :kernel_name, "
                    ":default_us, ${json:row}, ${json:candidates}, :error, :confidence, :spread, ${json:timing}, "
                    ":elapsed_s, :started_at, :finished_at, :now) RETURNING id",
    Sql.RESULT_OF: f"SELECT {', '.join(PostedRow._fields)} FROM results WHERE lease_id = :lid AND shape_id = :sid",
    # TODO(#36, s36c): the statuses from wire.ResultStatus once it lands
    Sql.COSTS: "SELECT r.elapsed_s FROM results r JOIN shapes s ON s.id = r.shape_id WHERE s.campaign_id = :cid "
               "AND r.backend = :backend AND r.elapsed_s IS NOT NULL AND r.status IN ('ok', 'default_best') "
               "ORDER BY r.id DESC LIMIT 200",  # a failed try's seconds say nothing of a shape's cost
    Sql.HEADERS: "SELECT path, header FROM image_tables WHERE image_digest = :digest AND family = :family "
                 "AND kind = :kind ORDER BY path",
    Sql.CATALOG: "SELECT kernel_catalog FROM images WHERE digest = :digest",
}


def _render(sql: str, pg: bool) -> str:
    sql = sql.replace("${skip_locked}", " FOR UPDATE SKIP LOCKED" if pg else "")
    sql = sql.replace("${is}", "IS NOT DISTINCT FROM" if pg else "IS")  # equal, NULL equal to NULL
    sql = re.sub(r"\$\{json:(\w+)\}", r"CAST(:\1 AS json)" if pg else r":\1", sql)
    return re.sub(r":(\w+)", r"%(\1)s", sql) if pg else sql


_RENDERED = {pg: {k: _render(v, pg) for k, v in PLAIN_SQL.items()} for pg in (False, True)}


Row = tuple[Any, ...]  # a row as the driver answers it


class Sent(NamedTuple):
    """One statement of a batch: its rows (None for a write) and how many rows it changed."""
    rows: list[Row] | None
    count: int  # type: ignore[assignment]  # the rows it changed; shadows tuple.count on purpose

    @property
    def answer(self) -> list[Row]:
        """The rows of a statement that answers rows (_ANSWERS: a SELECT, or a write RETURNING them)."""
        assert self.rows is not None, "a write answers no rows"
        return self.rows


Stmt = tuple[Sql, dict[str, Any]]
T = TypeVar("T")
# Use-case logic written once for both drivers (sans-IO, as psycopg's own core is): a generator that yields each
# batch of statements it needs at once and is sent their Sents back; its return value is the answer. Plain.drive
# runs it on a thread's connection, AsyncPlain.drive on the event loop's.
Steps = Generator[tuple[Stmt, ...], list[Sent], T]


def ask(name: Sql, params: dict[str, Any]) -> Steps[list[Row]]:
    """One statement's rows (a step of its own)."""
    (sent,) = yield ((name, params),)
    return sent.answer


def change(name: Sql, params: dict[str, Any]) -> Steps[int]:
    """Rows one statement changed."""
    (sent,) = yield ((name, params),)
    return sent.count


# the statements that answer rows (a SELECT, or a write RETURNING them): known by name, where asking psycopg's
# cursor (its description) builds a column object per column of every statement
_ANSWERS = frozenset(k for k, v in PLAIN_SQL.items() if v.startswith("SELECT") or " RETURNING " in v)


class Rows:
    """The value conversions SQLAlchemy's column types would do, for PLAIN_SQL's rows on either driver: SQLite
    keeps UTC datetimes as 'YYYY-MM-DD HH:MM:SS.ffffff' text and JSON as text, PostgreSQL's driver converts both
    itself. key: names the database, for per-database caches. state: what the app keeps per database
    (Database.state; app/services/caches.py), shared by every Plain of that database."""

    def __init__(self, pg: bool, key: str, state: dict[str, Any] | None = None):
        self.pg, self.key = pg, key
        self.state: dict[str, Any] = {} if state is None else state

    def stamp(self, when: datetime | None) -> object:
        return when if self.pg else _bind("sqlite")(when)

    def when(self, value: Any) -> datetime:
        """A time as the driver answers it (PostgreSQL's a datetime, SQLite's text)."""
        return value if self.pg else datetime.fromisoformat(value).replace(tzinfo=timezone.utc)

    def doc(self, value: Any) -> Any:
        """A JSON document as the driver answers it (PostgreSQL's decoded, SQLite's text)."""
        return value if self.pg or value is None else json.loads(value)

    def to_doc(self, value: object) -> str:
        return json.dumps(value)

    # typed rows of rows a batch read
    def as_leases(self, rows: list[Row]) -> list[CampaignLeaseRow]:
        """Of "lease"."""
        return [CampaignLeaseRow(r[0], LeaseState(r[1]), self.when(r[2]), self.when(r[3]), *r[4:]) for r in rows]

    def as_lease_rows(self, rows: list[Row]) -> list[LeaseRow]:
        """Of "dead_leases"."""
        return [LeaseRow(r[0], LeaseState(r[1]), self.when(r[2]), self.when(r[3]), *r[4:]) for r in rows]

    def as_shapes(self, rows: list[Row]) -> list[ShapeFactsRow]:
        return [ShapeFactsRow(r[0], self.doc(r[1]), r[2], ShapeState(r[3]), r[4], r[5], r[6], r[7], r[8], r[9],
                              r[10], r[11], self.doc(r[12])) for r in rows]

    @staticmethod
    def as_campaigns(rows: list[Row]) -> list[CampaignRow]:
        return [CampaignRow(*r) for r in rows]

    @staticmethod
    def as_posted(rows: list[Row]) -> list[PostedRow]:
        return [PostedRow(*r) for r in rows]

    def lease_steps(self, name: Sql, params: dict[str, Any]) -> Steps[list[CampaignLeaseRow]]:
        return self.as_leases((yield from ask(name, params)))

    def shape_steps(self, name: Sql, params: dict[str, Any]) -> Steps[list[ShapeFactsRow]]:
        return self.as_shapes((yield from ask(name, params)))


class Plain(Rows):
    """PLAIN_SQL on a driver connection inside one transaction (Database.plain's, which on PostgreSQL the Plain
    opens itself, or a session's own, Plain.of)."""

    def __init__(self, dbapi: Any, pg: bool, key: str, begin: bool = False, state: dict[str, Any] | None = None):
        """begin (PostgreSQL, a connection in autocommit): this Plain opens its transaction itself, with a BEGIN
        sent together with its first statements (psycopg's own BEGIN, even in a pipeline, waits for its answer:
        a round trip of its own). dbapi: a sqlite3 or psycopg connection (pipeline() only on PostgreSQL)."""
        super().__init__(pg, key, state)
        self.dbapi, self._sql, self._begin = dbapi, _RENDERED[pg], begin

    @classmethod
    def of(cls, s: Session | Plain) -> Plain:
        """In the session's transaction (flush the session first where it holds changes these statements read)."""
        if isinstance(s, Plain):
            return s
        conn = s.connection()
        return cls(conn.connection.dbapi_connection, conn.dialect.name == "postgresql", db_key(conn.engine),
                   state=s.info.get("state"))  # a Database's session carries its state (Database.__init__)

    def batch(self, *stmts: Stmt) -> list[Sent]:
        """Statements that do not need each other's answers, sent at once (on PostgreSQL in one round trip,
        psycopg's pipeline mode): each one's rows (None for a write) and the rows it changed. A failing one fails
        the batch (and, raised, its transaction). Each statement's wait for the server, not its work, was most
        of a lease's time on PostgreSQL (a lease and its release took 13 round trips; now 7)."""
        curs = [self.dbapi.cursor() for _ in stmts]
        try:
            if self.pg and (len(stmts) > 1 or self._begin):
                with self.dbapi.pipeline():
                    if self._begin:
                        self.dbapi.execute("BEGIN")
                        self._begin = False
                    for cur, (name, params) in zip(curs, stmts):
                        cur.execute(self._sql[name], params)
            else:
                for cur, (name, params) in zip(curs, stmts):
                    cur.execute(self._sql[name], params)
            return [Sent(cur.fetchall() if name in _ANSWERS else None, cur.rowcount)
                    for cur, (name, _p) in zip(curs, stmts)]
        finally:
            for cur in curs:
                cur.close()

    def drive(self, steps: Steps[T]) -> T:
        """Steps run here, each batch as it comes."""
        try:
            stmts = next(steps)
            while True:
                stmts = steps.send(self.batch(*stmts))
        except StopIteration as done:
            answer: T = done.value
            return answer

    def rows(self, name: Sql, params: dict[str, Any]) -> list[Row]:
        return self.batch((name, params))[0].answer

    def run(self, name: Sql, params: dict[str, Any]) -> int:
        """Rows the statement changed."""
        return self.batch((name, params))[0].count

    def shape_rows(self, name: Sql, params: dict[str, Any]) -> list[ShapeFactsRow]:
        return self.as_shapes(self.rows(name, params))


class AsyncPlain(Rows):
    """The same on psycopg's async connection, on the event loop (PostgreSQL; Database.aplain): the lease routes'
    steps without a thread hop. The connection is in autocommit and this opens the transaction with its first
    batch, as Plain does."""

    def __init__(self, conn: psycopg.AsyncConnection[Any], key: str, state: dict[str, Any] | None = None):
        super().__init__(True, key, state)
        self.conn, self._sql, self._begin = conn, _RENDERED[True], True

    async def batch(self, *stmts: Stmt) -> list[Sent]:
        curs = [self.conn.cursor() for _ in stmts]
        try:
            if len(stmts) > 1 or self._begin:
                async with self.conn.pipeline():
                    if self._begin:
                        await self.conn.execute("BEGIN")
                        self._begin = False
                    for cur, (name, params) in zip(curs, stmts):
                        await cur.execute(self._sql[name], params)
            else:
                await curs[0].execute(self._sql[stmts[0][0]], stmts[0][1])
            return [Sent(await cur.fetchall() if name in _ANSWERS else None, cur.rowcount)
                    for cur, (name, _p) in zip(curs, stmts)]
        finally:
            for cur in curs:
                await cur.close()

    async def drive(self, steps: Steps[T]) -> T:
        try:
            stmts = next(steps)
            while True:
                stmts = steps.send(await self.batch(*stmts))
        except StopIteration as done:
            answer: T = done.value
            return answer
