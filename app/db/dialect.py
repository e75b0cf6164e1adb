"""The only place that knows SQLite from PostgreSQL: the bulk shape upsert and the lease lock."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from functools import lru_cache

from sqlalchemy import Select, func, select
from sqlalchemy.orm import Session

from app.db.models import CampaignShape

# (shape_key, shape as a dict, calls, flops of one call, default_us estimate, priority)
ShapeRow = tuple[str, dict, int, float, float, float]

_COLS = ("campaign_id, shape_key, shape, calls, flops, default_us, priority, default_measured, state, attempts, "
         "updated_at")
# a shape seen again adds its calls; served.priority in SQL: (steps, else calls) x the default's time
_ON_CONFLICT = ("ON CONFLICT (campaign_id, shape_key) DO UPDATE SET calls = shapes.calls + excluded.calls, "
                "priority = coalesce(shapes.steps, shapes.calls + excluded.calls) * shapes.default_us, "
                "updated_at = excluded.updated_at")


@lru_cache
def _bind(dialect_name: str):  # type: ignore[no-untyped-def]
    """The driver values SQLAlchemy would bind for updated_at (SQLite stores a formatted string)."""
    from sqlalchemy.dialects import postgresql, sqlite
    d = postgresql.psycopg.dialect() if dialect_name == "postgresql" else sqlite.pysqlite.dialect()
    proc = CampaignShape.__table__.c.updated_at.type.bind_processor(d)
    return proc or (lambda v: v)


def add_shape_calls(s: Session, campaign_id: int, rows: Sequence[ShapeRow], now: datetime) -> int:
    """Insert shapes, or add their call counts to the ones already there (concurrent captures included),
    with one statement through the driver's bulk path. Returns how many shapes were new."""
    if not rows:
        return 0
    conn = s.connection()
    dbapi = conn.connection.dbapi_connection
    if conn.dialect.name == "postgresql":
        return _pg_copy_upsert(dbapi, campaign_id, rows, now)
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


def _pg_copy_upsert(dbapi, campaign_id: int, rows: Sequence[ShapeRow], now: datetime) -> int:  # type: ignore[no-untyped-def]
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
        new = cur.fetchone()[0]
        cur.execute("DROP TABLE shape_in")
    return int(new)


def lock_for_lease(q: Select) -> Select:
    """Rows a lease takes: SKIP LOCKED on PostgreSQL; SQLite serialises writers with BEGIN IMMEDIATE."""
    return q.with_for_update(skip_locked=True)
