"""The compile lane: JIT build seconds per image and family, kept apart from race time."""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app.db.models import Build
from app.services.lookups import ensure_image, family_or_422
from app.wire import BuildIn


def record(s: Session, body: BuildIn) -> dict:
    fam = family_or_422(body.family)
    ensure_image(s, body.image_digest)
    b = Build(image_digest=body.image_digest, family=fam.name, worker_id=body.worker_id, seconds=body.seconds,
              ok=body.ok, aiter_commit=body.aiter_commit, output_tail=body.output_tail)
    s.add(b)
    s.flush()
    return {"id": b.id, "image_digest": b.image_digest, "family": b.family, "worker_id": b.worker_id,
            "seconds": b.seconds, "ok": b.ok, "created_at": b.created_at}


def seconds(s: Session, digest: str, family: str) -> tuple[float, int]:
    """(build seconds spent, builds) for an image and family, over every worker."""
    total, n = s.execute(select(func.sum(Build.seconds), func.count()).where(
        Build.image_digest == digest, Build.family == family)).one()
    return float(total or 0.0), int(n or 0)
