"""Image upgrades: what a new image inherits from the image it replaces, row by row (pure rules, no SQL).

AITER releases about every 15 days and keeps almost every winner (tests/fixtures/aiter-history/DIFF.md), so a new
image starts from its parent's tuning instead of from zero. Each verified row of the parent is triaged against
the new image's own tables and kernel catalog:
- its merge key is shipped by the new image: never served beside the shipped row (AITER's merge raises on a
  repeated key, aiter/jit/core.py:340-366); ours is raced against the shipped kernel, the faster kept;
- its kernel is not in the new image's catalog (removed or renamed), or the new release's header has columns
  the row lacks: raced in full, as a new shape;
- otherwise carried: served at once in a provisional overlay, and leased as a confirmation race (the default,
  the incumbent and the parent race's top kernels). A carried row that loses is withdrawn and its shape raced
  in full.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Any
from enum import StrEnum

from app.domain.lease_states import ResultKind

TOP = 3  # the parent race's best kernels a confirmation race runs beside the incumbent and the default


class Triage(StrEnum):
    CARRIED = "carried"
    NOW_SHIPPED = "now_shipped"
    KERNEL_GONE = "kernel_gone"
    HEADER_CHANGED = "header_changed"
    # the parent's race found nothing that beat the default: no row to carry, and the verdict is confirmed by a
    # short race (the default as incumbent, the parent race's top kernels), not a full one
    DEFAULT_BEST = "default_best"


class Outcome(StrEnum):
    CONFIRMED = "confirmed"  # the incumbent won its confirmation race: the carried row stays (now measured here)
    OVERTURNED = "overturned"  # something else won: the carried row withdrawn, the shape raced in full
    RE_RACED = "re_raced"  # a full race where the kernel (or the header) was gone
    SHIPPED_KEPT = "shipped_kept"  # the new image's shipped row was as fast: ours dropped
    OURS_KEPT = "ours_kept"  # ours beat the shipped row in the same race: kept where ours win (the merged form)


def kernel_gone(kernel: str | None, catalog: Collection[str] | None) -> bool:
    """A row's kernel (fmoe's are two, joined by '+') that the image's catalog lacks; None: no catalog reported
    for the family, so nothing is known gone."""
    if catalog is None or not kernel:
        return False
    return any(k not in catalog for k in kernel.split("+"))


def triage(kernel: str | None, row: dict[str, str], header: Iterable[str], shipped: bool,
           catalog: Collection[str] | None, default_best: bool = False) -> Triage:
    """One verified parent row against the new image: shipped first (a shipped key is never served twice), then
    its kernel, then the header. default_best: the parent tuned the shape as "the default is best" (no row)."""
    if shipped:
        return Triage.NOW_SHIPPED
    if default_best:
        return Triage.DEFAULT_BEST
    if kernel_gone(kernel, catalog):
        return Triage.KERNEL_GONE
    if any(c not in row for c in header):
        return Triage.HEADER_CHANGED
    return Triage.CARRIED


def finalists(incumbent: str | None, candidates: Iterable[dict[str, Any]], top: int = TOP,
              catalog: Collection[str] | None = None) -> list[str]:
    """The confirmation race's kernels, the incumbent first, then the parent race's `top` fastest others that
    finished without an error (and that the new image still has)."""
    timed = sorted((c for c in candidates if c.get("name") and c.get("us") and not c.get("error")),
                   key=lambda c: float(c["us"]))
    out = [incumbent] if incumbent else []
    for c in timed:
        name = str(c["name"])
        if name not in out and not kernel_gone(name, catalog):
            out.append(name)
        if len(out) >= top + bool(incumbent):
            break
    return out


def incumbent(finalists: list[str] | None) -> str | None:
    """The kernel a confirmation race confirms: the first of a shape's finalists (None: a full race)."""
    return finalists[0] if finalists else None


def settled(verdict: Triage, kernel: str | None, shipped_kernel: str | None) -> Outcome | None:
    """What triage alone decides: the new image ships the key with the very kernel ours runs (AITER upstreams
    tuned rows; 2,505 of 2,552 a8w8 bpreshuffle keys between v0.1.19 and v0.1.20), so there is nothing to race."""
    if verdict is Triage.NOW_SHIPPED and kernel and kernel == shipped_kernel:
        return Outcome.SHIPPED_KEPT
    return None


@dataclass(frozen=True)
class Confirmation:
    outcome: Outcome | None  # None: nothing decided yet (a failed try: the confirmation race goes on)
    full_race: bool = False  # the shape goes back to the queue for a full race


def confirm(verdict: Triage, incumbent: str | None, kind: ResultKind, kernel: str | None) -> Confirmation:
    """What a tuned result of an inherited shape decides (kind: the result as leasing judged it)."""
    if kind not in (ResultKind.VERIFIED, ResultKind.DEFAULT_BEST):
        return Confirmation(None)
    won = kind is ResultKind.VERIFIED and bool(incumbent) and kernel == incumbent
    if verdict is Triage.CARRIED:
        return Confirmation(Outcome.CONFIRMED) if won else Confirmation(Outcome.OVERTURNED, full_race=True)
    if verdict is Triage.DEFAULT_BEST:  # still nothing beats the default: confirmed; else a full race finds the best
        return (Confirmation(Outcome.CONFIRMED) if kind is ResultKind.DEFAULT_BEST
                else Confirmation(Outcome.OVERTURNED, full_race=True))
    if verdict is Triage.NOW_SHIPPED:
        # the incumbent here is the shipped kernel: ours is kept only if something else won outright
        shipped_won = won or kind is ResultKind.DEFAULT_BEST
        return Confirmation(Outcome.SHIPPED_KEPT if shipped_won else Outcome.OURS_KEPT)
    return Confirmation(Outcome.RE_RACED)


class LineageError(ValueError):
    """An inherit that cannot be done: field names what is wrong; conflict: it clashes with the lineage there is
    (409), else the request itself is wrong (422)."""

    def __init__(self, field: str, detail: str, conflict: bool = True):
        super().__init__(f"{field}: {detail}")
        self.field, self.conflict = field, conflict


def check_lineage(new: str, old: str, parents: dict[str, str | None]) -> None:
    """new may inherit from old: not itself, not twice, not from its own descendant (parents: digest -> its
    parent, for every image known)."""
    if new == old:
        raise LineageError("from", "an image cannot inherit from itself", conflict=False)
    if parents.get(new):
        raise LineageError("image_digest", f"{new} already inherits from {parents[new]}")
    seen: set[str] = set()
    at: str | None = old
    while at is not None and at not in seen:
        if at == new:
            raise LineageError("from", f"{old} descends from {new}; inheriting would make a cycle")
        seen.add(at)
        at = parents.get(at)
