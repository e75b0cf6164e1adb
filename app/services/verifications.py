"""Post-deploy verification runs: AITER's --run_config replay of an overlay inside the image."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.schemas import VerificationIn
from app.db.models import Verification
from app.services.lookups import ensure_image, family_or_422


def record(s: Session, body: VerificationIn) -> dict:
    fam = family_or_422(body.family)
    ensure_image(s, body.image_digest)
    v = Verification(image_digest=body.image_digest, family=fam.name, worker_id=body.worker_id,
                     aiter_commit=body.aiter_commit, rows=body.rows, exit_code=body.exit_code,
                     passed=body.exit_code == 0 and body.rows > 0, command=body.command,
                     output_tail=body.output_tail)
    s.add(v)
    s.flush()
    return as_dict(v)


def as_dict(v: Verification) -> dict:
    return {"id": v.id, "image_digest": v.image_digest, "family": v.family, "worker_id": v.worker_id,
            "aiter_commit": v.aiter_commit, "rows": v.rows, "exit_code": v.exit_code, "passed": v.passed,
            "command": v.command, "output_tail": v.output_tail, "created_at": v.created_at.isoformat()}


def listing(s: Session, digest: str, family: str) -> list[dict]:
    q = (select(Verification).where(Verification.image_digest == digest, Verification.family == family)
         .order_by(Verification.id.desc()))
    return [as_dict(v) for v in s.scalars(q)]
