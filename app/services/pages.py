"""Keyset pages over a campaign's shapes in served-time order (priority DESC, id): an opaque cursor names the
last row given, so every page costs the same wherever it starts and rows landing meanwhile never shift it."""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterable
from typing import TypeVar

from sqlalchemy import ColumnElement, Row, Select, and_, or_
from sqlalchemy.orm import Session

from app.db.models import CampaignShape
from app.domain.lease_states import ShapeState
from app.errors import Invalid

DEFAULT_LIMIT = 200  # a page of shapes stays well under 1 MB in any family
MAX_LIMIT = 2000
T = TypeVar("T")


def check_limit(limit: int) -> int:
    if not 1 <= limit <= MAX_LIMIT:
        raise Invalid(f"limit: between 1 and {MAX_LIMIT}", "limit")
    return limit


def cursor(priority: float, shape_id: int) -> str:
    return base64.urlsafe_b64encode(f"{priority!r}:{shape_id}".encode()).decode().rstrip("=")


def position(after: str | None) -> tuple[float, int] | None:
    """The (priority, id) a cursor names; 422 naming `after` for anything this service did not hand out."""
    if not after:
        return None
    try:
        pri, _, sid = base64.urlsafe_b64decode(after + "=" * (-len(after) % 4)).decode().partition(":")
        return float(pri), int(sid)
    except ValueError:
        raise Invalid("after: not a cursor this service handed out (take `next` from the previous page)",
                      "after") from None


def after_clause(pos: tuple[float, int]) -> ColumnElement[bool]:
    """Rows past pos in (priority DESC, id) order."""
    pri, sid = pos
    return or_(CampaignShape.priority < pri, and_(CampaignShape.priority == pri, CampaignShape.id > sid))


def page(items: Iterable[T], key: Callable[[T], tuple[float, int]], limit: int, after: str | None
         ) -> tuple[list[T], str | None]:
    """One page of items already in (priority DESC, id) order, and the cursor of the next (None: the last)."""
    pos = position(after)
    out: list[T] = []
    for it in items:
        k = key(it)
        if pos is not None and (k[0] > pos[0] or (k[0] == pos[0] and k[1] <= pos[1])):
            continue
        if len(out) == limit:
            last = key(out[-1])
            return out, cursor(*last)
        out.append(it)
    return out, None


def keyset(s: Session, q: Select, limit: int, after: str | None) -> tuple[list[Row], str | None]:
    """One page of q (columns of one campaign's shapes, id and priority among them) in served-time order, and
    the next page's cursor: each state's rows come from ix_shapes_queue in this order already, so it is a
    few index seeks, merged, whatever the campaign's size."""
    pos = position(after)
    rows: list[Row] = []
    for state in ShapeState:
        one = (q.where(CampaignShape.state == state.value)
               .order_by(CampaignShape.priority.desc(), CampaignShape.id).limit(limit + 1))
        rows += s.execute(one.where(after_clause(pos)) if pos else one).all()
    rows.sort(key=lambda x: (-x.priority, x.id))
    return page(rows, lambda x: (x.priority, x.id), limit, None)
