from __future__ import annotations

from fastapi import APIRouter
from sqlalchemy import text

from app.api.deps import DbDep
from app.api.responses import Health

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health)
def healthz(db: DbDep) -> dict:
    with db.session(write=False) as s:
        s.execute(text("SELECT 1"))
    return {"ok": True}
