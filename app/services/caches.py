"""The caches a service keeps, in one object the app creates (create_app: app.state.caches) and hangs on its
database (Database.state), where the services reach it through the session or Plain they are given. Two apps in
one process (a restart in a test, a replica) keep their own, as two processes do; every cache is kept for one
process's view, and what another process writes shows within each cache's TTL."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.orm import Session

from app.db.dialect import Rows
from app.db.session import Database
from app.services.page_totals import PageTotals
from app.slot_cache import SlotCache
from app.ttl_cache import TTLCache

# Built overlays, weighed by Overlay.weight_kb (app/services/overlays.py: ROW_KB): the least recently used go
# first past this.
OVERLAYS_MAX_MB = 512


def _weigh(ov: Any) -> int:  # an overlays.Overlay (this module is below overlays.py, which reads it as one)
    return ov.weight_kb()  # type: ignore[no-any-return]


@dataclass
class Caches:
    # image_tables: the headers every lease and result reads, per (database, image, family, kind), and each
    # image's kernel catalog; a PUT of the image's tables clears it (image_tables.tables_changed)
    headers: TTLCache = field(default_factory=lambda: TTLCache(30.0))
    # leasing: the measured cost per shape (campaign, backend), dropped on each result of the campaign
    costs: TTLCache = field(default_factory=lambda: TTLCache(10.0))
    # leasing: per database, when a lease request last swept (_sweep_due)
    last_sweep: dict[object, float] = field(default_factory=dict)
    # overlays: the built overlay per (database, image, family, serving gfx) (overlays.build)
    built: SlotCache[Any] = field(default_factory=lambda: SlotCache(OVERLAYS_MAX_MB * 1000, _weigh))
    # page_totals: a large campaign's engagement totals, counted off the request (the page's and the report's)
    totals: PageTotals = field(default_factory=PageTotals)


def caches_of(where: Session | Rows | Database) -> Caches:
    """The caches of the database `where` reads: those its app installed, else (a database opened outside an app:
    the CLI, a test's own) ones made for it on first use. A session or Plain made off any Database (a bare
    engine's session) gets new, empty ones: nothing is cached for it."""
    state: dict[str, Any] = (where.info.get("state", {}) if isinstance(where, Session) else where.state)
    found = state.get("caches")
    if found is None:
        found = state.setdefault("caches", Caches())  # two first users at once: one Caches is kept
    return found  # type: ignore[no-any-return]


def install(db: Database) -> Caches:
    """New caches for the app that opened db (create_app)."""
    db.state["caches"] = caches = Caches()
    return caches
