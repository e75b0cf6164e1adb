"""Totals over every shape of a campaign that a page shows beside its own shapes: the campaign page's predicted
hits and disagreements with the latest proof, the engagement report's hits, misses, served time covered and
disagreements (app/services/engagement.py).

Each needs AITER's lookup rebuilt for every captured shape (seconds at 100k shapes), so a large campaign's page
never waits for them: they are counted in a background thread (one count at a time per app: its caches.totals,
app/services/caches.py), kept per slot (a campaign and what its verdict is on: a deploy form, or a supplied
table's hash) with the version they were counted at (everything that decides them: the caller's key), and
recounted at most every REFRESH_S while someone views the page. Until the first count of a slot lands the page
has none ("counting", or null with `totals_pending`); after that, a page of a newer version shows the last count
with its age. A small campaign is counted within the request (INLINE_MAX).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass

from sqlalchemy.orm import Session

from app.db.session import Database

log = logging.getLogger(__name__)
INLINE_MAX = 1000  # shapes counted within the request (~0.1 s)
REFRESH_S = 30.0
SLOTS = 512  # counts kept (the least recently viewed go first): a supplied table's slot is one count, ~200 B

# a count: (the version it counted, as the caller's key computes it in the count's own session; the totals)
Counter = Callable[[Session], tuple[Hashable, dict]]


@dataclass(frozen=True)
class Count:
    version: Hashable
    at: float  # time.monotonic() when counted
    totals: dict


@dataclass(frozen=True)
class Shown:
    totals: dict | None  # None: no count of this slot yet
    stale_s: float | None  # the totals are of an older version, counted that long ago (None: of this version)
    start: Callable[[], None] | None  # starts a count when one is due: run it after the page is sent

    @property
    def pending(self) -> bool:
        """The totals of the version asked about are not counted yet."""
        return self.totals is None or self.stale_s is not None


class PageTotals:
    def __init__(self) -> None:
        self._last: OrderedDict[tuple, Count] = OrderedDict()  # (database, *slot): its latest count
        self._running: set[tuple] = set()
        self._lock = threading.Lock()
        self._one = threading.Semaphore(1)  # one count at a time: it is a core's worth of work

    def get(self, db: Database, slot: tuple, version: Hashable, count: Counter) -> Shown:
        """The totals of slot (campaign id first) at version: its count if made, else the last one with its
        age, else None; and what starts `count` when one is due."""
        key = (db.key, *slot)
        with self._lock:
            last = self._last.get(key)
            if last is not None:
                self._last.move_to_end(key)
        fresh = last is not None and last.version == version
        start = None
        if not fresh and (last is None or time.monotonic() - last.at >= REFRESH_S):
            def start() -> None:
                self._start(db, key, count)
        return Shown(None if last is None else last.totals,
                     None if fresh or last is None else time.monotonic() - last.at, start)

    def _start(self, db: Database, key: tuple, count: Counter) -> None:
        with self._lock:
            if key in self._running:
                return
            self._running.add(key)
        threading.Thread(target=self._count, args=(db, key, count), daemon=True,
                         name=f"page-totals-{key[1]}").start()

    def _count(self, db: Database, key: tuple, count: Counter) -> None:
        try:
            with self._one, db.session(write=False) as s:
                version, totals = count(s)
            with self._lock:
                self._last[key] = Count(version, time.monotonic(), totals)
                self._last.move_to_end(key)
                while len(self._last) > SLOTS:
                    self._last.popitem(last=False)
        except Exception as e:  # a busy or closing database: the page keeps saying "counting"; a later view retries
            log.warning("campaign %s: counting the page's totals failed: %s", key[1], e)
        finally:
            with self._lock:
                self._running.discard(key)

