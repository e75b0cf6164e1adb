"""Find-or-create and find-or-404: the one home of the lookups every service starts from (an image, a campaign,
a family by name), each refusing with the field it names or taking a concurrent writer's row."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.db.models import Campaign, Image
from app.domain.families import FAMILIES, TableFamily, UnknownFamily, get_family
from app.errors import Invalid, NotFound


def family_or_422(name: str) -> TableFamily:
    try:
        return get_family(name)
    except UnknownFamily:
        raise Invalid(f"family: unknown table family {name!r}; known: {', '.join(FAMILIES)}", "family") from None


def campaign_or_404(s: Session, campaign_id: int) -> Campaign:
    camp = s.get(Campaign, campaign_id)
    if camp is None:
        raise NotFound(f"campaign_id: no campaign {campaign_id}", "campaign_id")
    return camp


def ensure_image(s: Session, digest: str, version: str | None = None, commit: str | None = None) -> Image:
    img = s.get(Image, digest)
    if img is None:
        img = _insert_or_get(s, Image(digest=digest, aiter_version=version, aiter_commit=commit),
                             lambda: s.get(Image, digest))
    else:
        img.aiter_version = version or img.aiter_version
        img.aiter_commit = commit or img.aiter_commit
    return img


def ensure_campaign(s: Session, digest: str, gfx: str, cu_num: int, family: str) -> Campaign:
    q = select(Campaign).where(Campaign.image_digest == digest, Campaign.gfx == gfx, Campaign.cu_num == cu_num,
                               Campaign.family == family)
    camp = s.scalars(q).first()
    if camp is None:
        camp = _insert_or_get(s, Campaign(image_digest=digest, gfx=gfx, cu_num=cu_num, family=family),
                              lambda: s.scalars(q).first())
    return camp


def _insert_or_get(s: Session, obj, fetch):  # type: ignore[no-untyped-def]
    """Insert in a savepoint; if a concurrent request inserted the same row first, take theirs."""
    try:
        with s.begin_nested():
            s.add(obj)
            s.flush()
        return obj
    except IntegrityError:
        return fetch()
