"""The campaign page's totals over every shape: predicted hits, and disagreements with the latest proof.

Each needs AITER's lookup rebuilt for every captured shape (seconds at 100k shapes), so a large campaign's page
never waits for them: they are counted in a background thread (one count at a time per process), kept per
campaign version (its shape counts and latest proof: a capture, result or proof moves it), and recounted at
most every REFRESH_S while someone views the page. Until the first count lands the page says "counting"; the
live refresh (every 5 s) shows it when it does. A small campaign is counted within the request.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from app.db.session import Database
from app.services import engagement

log = logging.getLogger(__name__)
INLINE_MAX = 1000  # shapes counted within the request (~0.1 s)
REFRESH_S = 30.0


@dataclass(frozen=True)
class Count:
    version: tuple
    at: float  # time.monotonic() when counted
    hits: int
    disagreements: int | None  # None: no proof to disagree with


class PageTotals:
    def __init__(self) -> None:
        self._last: dict[tuple, Count] = {}  # (database, campaign): its latest count
        self._running: set[tuple] = set()
        self._lock = threading.Lock()
        self._one = threading.Semaphore(1)  # one count at a time: it is a core's worth of work

    def fill(self, verdict: dict, db: Database, campaign_id: int, version: tuple) -> Callable[[], None] | None:
        """Put the totals into a page's verdict (engagement.page_summary with `listed`): the count of this
        version, else the last one with its age ("stale_s"), else None ("counting"). Returns what starts a
        count when one is due: run it after the page is sent, so the count does not slow the page down."""
        key = (db.key, campaign_id)
        last = self._last.get(key)
        fresh = last is not None and last.version == version
        start = None
        if not fresh and (last is None or time.monotonic() - last.at >= REFRESH_S):
            def start() -> None:
                self._start(db, campaign_id, version, key)
        verdict["stale_s"] = None if fresh or last is None else time.monotonic() - last.at
        if last is not None:
            verdict["predicted_hits"] = last.hits
            if verdict["proof"] is not None:
                verdict["proof"]["disagreements"] = last.disagreements
        return start

    def _start(self, db: Database, campaign_id: int, version: tuple, key: tuple) -> None:
        with self._lock:
            if key in self._running:
                return
            self._running.add(key)
        threading.Thread(target=self._count, args=(db, campaign_id, version, key), daemon=True,
                         name=f"page-totals-{campaign_id}").start()

    def _count(self, db: Database, campaign_id: int, version: tuple, key: tuple) -> None:
        try:
            with self._one, db.session(write=False) as s:
                v = engagement.page_summary(s, campaign_id)
            proof = v["proof"]
            self._last[key] = Count(version, time.monotonic(), v["predicted_hits"],
                                    proof["disagreements"] if proof else None)
        except Exception as e:  # a busy or closing database: the page keeps saying "counting"; a later view retries
            log.warning("campaign %s: counting the page's totals failed: %s", campaign_id, e)
        finally:
            with self._lock:
                self._running.discard(key)
