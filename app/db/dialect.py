"""The only place that knows SQLite from PostgreSQL: upserts and the lease lock."""

from __future__ import annotations

from sqlalchemy import Select, func
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from app.db.models import CampaignShape


def add_shape_calls(s: Session, rows: list[dict]) -> None:
    """Insert shapes, or add their call counts to the ones already there (concurrent captures included)."""
    if not rows:
        return
    mod = postgresql if s.get_bind().dialect.name == "postgresql" else sqlite
    stmt = mod.insert(CampaignShape).values(rows)
    t = CampaignShape.__table__
    stmt = stmt.on_conflict_do_update(
        index_elements=[t.c.campaign_id, t.c.shape_key],
        set_={"calls": t.c.calls + stmt.excluded.calls,
              # served.priority in SQL: (steps, else calls) x the default's time
              "priority": func.coalesce(t.c.steps, t.c.calls + stmt.excluded.calls) * t.c.default_us})
    s.execute(stmt)


def lock_for_lease(q: Select) -> Select:
    """Rows a lease takes: SKIP LOCKED on PostgreSQL; SQLite serialises writers with BEGIN IMMEDIATE."""
    return q.with_for_update(skip_locked=True)
