"""What is derived from an image's shipped tables, row by row, made once and kept beside them (deploy.Shipped.memo).

An image with big shipped tables (a blockscale image ships 39k rows) has every deploy form, digest and lookup
rebuilt for each new result, where nearly all of the work is the same for the shipped rows: filled and written as
AITER's merge writes them, keyed, checked. The memo keeps those per row and per table, so a rebuild costs about
the overlay's share. Rules stay where they are (tables.py, engagement.py, deploy.py): they ask the memo for a
value with everything else it depends on named in `what`, and make it themselves when it has none.

Values are kept only for objects the memo holds (the shipped tables, and the row lists made from them through
rows()), by id: a held object stays alive as long as the memo, so no other object can have its id. Anything else
(the overlay, the tables merged from it) is made again on each call. NO_MEMO holds nothing: it never keeps.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Iterable
from typing import Any, TypeVar

V = TypeVar("V")
_NONE = object()


class RowMemo:
    def __init__(self, held: Iterable[object] = ()):
        self._held: dict[int, object] = {}  # id: the object, kept alive so the id stays its own
        self._values: dict[Hashable, Any] = {}
        self._per_row: dict[Hashable, dict[int, Any]] = {}
        self._lock = threading.Lock()
        for obj in held:
            self._held[id(obj)] = obj

    def value(self, what: Hashable, of: tuple[object, ...], make: Callable[[], V]) -> V:
        """make(), kept under (what, of) when the memo holds every object in `of`; `what` names everything
        else make reads."""
        kept: V = self._kept(what, of, make, False)
        return kept

    def rows(self, what: Hashable, of: tuple[object, ...], make: Callable[[], list[dict[str, str]]]
             ) -> list[dict[str, str]]:
        """value() for a list of rows: the kept list and its rows are held too, so what is derived from them
        is kept in turn."""
        kept: list[dict[str, str]] = self._kept(what, of, make, True)
        return kept

    def _kept(self, what: Hashable, of: tuple[object, ...], make: Callable[[], Any], hold: bool) -> Any:
        held = self._held
        if not all(id(o) in held for o in of):
            return make()
        key = (what, tuple(map(id, of)))
        got = self._values.get(key, _NONE)
        if got is _NONE:
            made = make()
            with self._lock:  # two makers at once: both take the first one kept (only it is held)
                got = self._values.setdefault(key, made)
                if hold and got is made:
                    held[id(made)] = made
                    for r in made:
                        held[id(r)] = r
        return got

    def per_row(self, what: Hashable, rows: list[dict[str, str]], f: Callable[[dict[str, str]], V]) -> list[V]:
        """[f(r) for r in rows], kept for each row the memo holds; `what` names everything else f reads."""
        if not self._held:
            return [f(r) for r in rows]
        if id(rows) in self._held:  # a kept list (rows()): its values as one list, kept too
            return self.value(("per_row", what), (rows,), lambda: self._each(what, rows, f))
        return self._each(what, rows, f)

    def _each(self, what: Hashable, rows: list[dict[str, str]], f: Callable[[dict[str, str]], V]) -> list[V]:
        kept = self._per_row.get(what)
        if kept is None:
            kept = self._per_row.setdefault(what, {})
        held = self._held
        out = []
        for r in rows:
            i = id(r)
            v = kept.get(i, _NONE)
            if v is _NONE:
                v = f(r)
                if i in held:
                    kept[i] = v
            out.append(v)
        return out


NO_MEMO = RowMemo()
