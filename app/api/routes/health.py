from __future__ import annotations

import time

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from sqlalchemy import text

from app.api.deps import DbDep, SettingsDep
from app.api.responses import Health, errors
from app.errors import _problem

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health, responses=errors(503))
def healthz(db: DbDep, settings: SettingsDep) -> dict | JSONResponse:
    """200 while the database answers and takes writes. A write that failed because the database takes none (disk
    full, read-only, I/O error) makes this 503 with its reason, until a write commits a change again; past
    health_write_hold_s without one, this probes with a write of its own (one row rewritten as it is)."""
    failed = db.write_failure
    if failed is not None and time.monotonic() - failed[1] >= settings.health_write_hold_s:
        try:
            with db.session() as s:
                s.execute(text("UPDATE alembic_version SET version_num = version_num"))
        except Exception:  # noqa: BLE001 - noted by the session (db.write_failure) when it says writes fail
            pass
        failed = db.write_failure
    if failed is not None:
        return _problem(503, "database takes no writes", f"the last write failed: {failed[0]}", None,
                        {"Retry-After": str(settings.retry_after_s)})
    with db.session(write=False) as s:
        s.execute(text("SELECT 1"))
    return {"ok": True}
