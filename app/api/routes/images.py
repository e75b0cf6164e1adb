"""Image lineage: an upgrade inherits its parent image's campaigns and tuning (app/services/upgrades.py)."""

from __future__ import annotations

from fastapi import APIRouter

from app.api.deps import DbDep
from app.api.responses import Inherited, Lineage
from app.api.routes.overlays import _digest
from app.schemas import InheritIn
from app.auth import AdminAuth, ReadAuth
from app.errors import Forbidden
from app.services import lineage as lineages, upgrades

router = APIRouter(tags=["images"])


@router.post("/v1/images/{image_digest}/inherit", status_code=201, response_model=Inherited)
def inherit(image_digest: str, body: InheritIn, db: DbDep, who: AdminAuth) -> dict:
    """The new image's campaigns (every gfx/cu_num/family of `from`), its shapes, calls and served steps, and each
    verified row of `from` triaged: carried (served at once, confirmed by a short race), now shipped, or re-raced.
    One transaction: a refusal writes nothing."""
    new = _digest(image_digest)
    who.check_digest(new)
    if not who.may_see(body.from_):
        raise Forbidden(f"from: token {who.name!r} is not scoped to {body.from_}", "from")
    with db.session() as s:
        return upgrades.inherit(s, new, body.from_)


@router.get("/v1/images/{image_digest}/lineage", response_model=Lineage)
def lineage(image_digest: str, db: DbDep, who: ReadAuth) -> dict:
    """The image's parent, its children, and (while it has no parent) the images its hosts ran before it."""
    digest = _digest(image_digest)
    who.check_digest(digest)
    with db.session(write=False) as s:
        return lineages.lineage(s, digest, who.may_see)
