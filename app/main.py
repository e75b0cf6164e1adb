"""The FastAPI application: create_app(settings) builds one with its own database."""

from __future__ import annotations

from contextlib import asynccontextmanager

from fastapi import FastAPI

from app import errors
from app.api.routes import campaigns, captures, health, leases, overlays
from app.config import Settings
from app.db import migrate
from app.db.session import Database
from app.limits import BodyLimit


def create_app(settings: Settings | None = None, run_migrations: bool = True) -> FastAPI:
    settings = settings or Settings()
    if run_migrations:
        migrate.upgrade(settings.database_url)
    db = Database(settings.database_url, settings.sqlite_busy_ms)

    @asynccontextmanager
    async def lifespan(_app: FastAPI):  # type: ignore[no-untyped-def]
        yield
        db.dispose()

    app = FastAPI(title="AITER tuning orchestrator", version="0.1.0", lifespan=lifespan)
    app.state.settings, app.state.db = settings, db
    errors.install(app, settings.retry_after_s)
    for r in (health.router, captures.router, leases.router, campaigns.router, overlays.router):
        app.include_router(r)
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    return app
