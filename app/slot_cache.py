"""An in-process cache of values that are costly to build (seconds) and exactly determined by a cheap version.

Each slot (e.g. an image's family in one database) holds one value with the version it was built at (everything
that determines it, read fresh by the caller on each request); a request at another version rebuilds it, so a
value is never served once an input changed. Slots past max_weight go least recently used first. Callers that
ask for a (slot, version) being built wait for that build (single-flight) instead of repeating it. Per process:
each worker process of the service builds its own.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from typing import Generic, TypeVar

V = TypeVar("V")


class SlotCache(Generic[V]):
    def __init__(self, max_weight: int, weigh: Callable[[V], int] = lambda v: 1):
        self.max_weight, self._weigh = max_weight, weigh
        self._slots: OrderedDict[Hashable, tuple[Hashable, V, int]] = OrderedDict()  # slot: (version, value, weight)
        self._weight = 0
        self._building: dict[tuple[Hashable, Hashable], Future[V]] = {}
        self._lock = threading.Lock()
        self.builds = 0  # how many times a value was built (for tests and benchmarks)

    def get(self, slot: Hashable, version: Hashable, build: Callable[[], V]) -> V:
        """The slot's value at version: kept, being built by another caller (waited for), or built here."""
        with self._lock:
            hit = self._slots.get(slot)
            if hit is not None and hit[0] == version:
                self._slots.move_to_end(slot)
                return hit[1]
            running = self._building.get((slot, version))
            if running is None:
                mine: Future[V] = Future()
                self._building[(slot, version)] = mine
        if running is not None:
            return running.result()  # the builder's value, or its exception
        try:
            value = build()
        except BaseException as e:
            with self._lock:
                del self._building[(slot, version)]
            mine.set_exception(e)
            raise
        weight = self._weigh(value)
        with self._lock:
            del self._building[(slot, version)]
            self.builds += 1
            old = self._slots.pop(slot, None)
            if old is not None:
                self._weight -= old[2]
            if weight <= self.max_weight:
                self._slots[slot] = (version, value, weight)
                self._weight += weight
                while self._weight > self.max_weight:
                    self._weight -= self._slots.popitem(last=False)[1][2]
        mine.set_result(value)
        return value

    def kept(self, slot: Hashable) -> V | None:
        """The value the slot holds at whichever version (not counted as a use), for a build to start from."""
        with self._lock:
            hit = self._slots.get(slot)
        return None if hit is None else hit[1]

    def clear(self) -> None:
        with self._lock:
            self._slots.clear()
            self._weight = 0

    @property
    def weight(self) -> int:
        """The weight of what is kept."""
        return self._weight

    def __len__(self) -> int:
        return len(self._slots)
