"""An image's lineage: the image it upgrades (its parent), the images that upgrade it, and the image its hosts ran
before it (the suggestion a first capture's note and the lineage page carry)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app.db.models import Campaign, Capture, Image
from app.errors import NotFound


def lineage(s: Session, digest: str, may_see: Any = lambda d: True) -> dict[str, Any]:
    img = s.get(Image, digest)
    if img is None:
        raise NotFound(f"image_digest: no image {digest} is known here", "image_digest")
    children = [d for d, in s.execute(select(Image.digest).where(Image.parent_digest == digest)) if may_see(d)]
    return {"image_digest": digest, "parent": img.parent_digest if img.parent_digest and may_see(img.parent_digest)
            else None, "children": children,
            "suggested_from": [d for d in suggestions(s, digest) if may_see(d)] if not img.parent_digest else []}


def suggestions(s: Session, digest: str) -> list[str]:
    """The digests the hosts now capturing digest reported last before it: the image it most likely upgrades."""
    hosts = [h for h, in s.execute(select(Capture.host).join(Campaign, Campaign.id == Capture.campaign_id)
                                   .where(Campaign.image_digest == digest, Capture.host.is_not(None)).distinct())]
    out: list[str] = []
    for host in hosts[:20]:
        first = s.scalar(select(func.min(Capture.id)).join(Campaign, Campaign.id == Capture.campaign_id)
                         .where(Campaign.image_digest == digest, Capture.host == host))
        prev = s.scalar(select(Campaign.image_digest).join(Capture, Capture.campaign_id == Campaign.id)
                        .where(Capture.host == host, Capture.id < first, Campaign.image_digest != digest)
                        .order_by(Capture.id.desc()).limit(1))
        if prev and prev not in out:
            out.append(prev)
    return out


def suggestion_note(s: Session, digest: str, may_see: Any = lambda d: True) -> str | None:
    """A capture note for an image seen for the first time from a host that ran another image before (one the
    caller's token may see: the host is the client's word, so the note must not name digests it is not scoped to)."""
    img = s.get(Image, digest)
    if img is None or img.parent_digest:
        return None
    found = [d for d in suggestions(s, digest) if may_see(d)]
    if not found:
        return None
    return (f"image {digest} is new here and its host last ran {found[0]}: an admin can carry that image's tuning "
            f"over with POST /v1/images/{digest}/inherit {{\"from\": \"{found[0]}\"}} (or `aiter-tuner inherit`)")
