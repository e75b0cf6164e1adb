"""A small in-process cache whose entries expire: for look-ups every request repeats (tokens, headers, costs)."""

from __future__ import annotations

import time
from collections.abc import Hashable
from typing import Any


class TTLCache:
    """Entries live ttl_s seconds; past maxsize the cache starts over. Dict operations are atomic under the
    GIL, so request threads share it without a lock (a race costs one extra look-up, never a wrong answer)."""

    def __init__(self, ttl_s: float, maxsize: int = 4096):
        self.ttl_s, self.maxsize = ttl_s, maxsize
        self._d: dict[Hashable, tuple[float, Any]] = {}

    def get(self, key: Hashable) -> Any | None:
        hit = self._d.get(key)
        if hit is None or hit[0] < time.monotonic():
            return None
        return hit[1]

    def put(self, key: Hashable, value: Any) -> Any:
        if self.ttl_s > 0:
            if len(self._d) >= self.maxsize:
                self._d = {}
            self._d[key] = (time.monotonic() + self.ttl_s, value)
        return value

    def pop(self, key: Hashable) -> None:
        self._d.pop(key, None)

    def clear(self) -> None:
        self._d = {}
