"""The FastAPI application: create_app(settings) builds one with its own database."""

from __future__ import annotations

import asyncio
import functools
import gc
import logging
import math
import os
import sys
import threading
import time
from typing import Any
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
from fastapi import FastAPI, Response, routing
from fastapi.staticfiles import StaticFiles
from fastapi_offline import FastAPIOffline
from prometheus_client import CONTENT_TYPE_LATEST
from sqlalchemy.orm import configure_mappers

from app import errors
from app.api import responses
from app.api.routes import campaigns, captures, health, images, leases, overlays, tokens as token_routes
from app.api.routes import ab as ab_routes
from app.config import Settings
from app.db import migrate
from app.db.dialect import start_lock
from app.db.session import Database
from app.limits import BodyLimit
from app.auth import ClosedDocs, ReadAuth
from app.metrics import LatencyMiddleware, Metrics, exposition
from app.web import routes as web
from app.services import caches, leasing, tokens
from app.ttl_cache import TTLCache

log = logging.getLogger("aiter_tuner")


async def _every(seconds: float, work, name: str, failures) -> None:  # type: ignore[no-untyped-def]
    """work() every `seconds`, on a thread of the shared pool, for as long as the app serves. A round that fails
    is counted (failures: Metrics.background_failures) and the next one runs: a busy database skips a round
    quietly, anything else is logged, at most once a minute. Ending here would stop the sweep of dead workers'
    leases (or SQLite's checkpoints) until a restart, with no request failing to show it."""
    from sqlalchemy.exc import OperationalError

    logged = -math.inf
    while True:
        await asyncio.sleep(seconds)
        try:
            await anyio.to_thread.run_sync(work)
        except OperationalError:  # busy or locked (app/errors.py): the next round does what this one did not
            failures.labels(name, "busy").inc()
        except Exception:
            failures.labels(name, "error").inc()
            if time.monotonic() - logged >= 60:
                logged = time.monotonic()
                log.exception("background %s failed; it runs again in %.0f s", name, seconds)


def _sweep(db: Database, settings: Settings) -> None:
    """Requeue the shapes of dead workers' leases promptly, so pages and metrics show them queued again
    (lease requests sweep too; this covers an idle queue)."""
    with db.plain() as p:
        p.drive(leasing.sweep_expired(p, settings))


CHECKPOINT_EVERY_S = 1.0  # SQLite's WAL checkpoints, off the requests (Database.checkpoint)


def bootstrap_admin(db: Database, settings: Settings) -> None:
    """First start: an admin token from TUNER_ADMIN_TOKEN, or a generated one printed and saved (0600). Under the
    start-up lock: of replicas started together on an empty database, one makes it and the others find it."""
    path = Path(settings.admin_token_file)
    if path.exists():  # an admin token file readable by others is fixed at every start
        os.chmod(path, 0o600)
    with start_lock(settings.database_url), db.session() as s:
        if tokens.has_admin(s):
            return
        _, secret = tokens.create(s, "bootstrap-admin", "admin", secret=settings.admin_token)
    if settings.admin_token:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secret + "\n")
    print(f"aiter-tuner: first start, admin token (also in {path}): {secret}", file=sys.stderr, flush=True)


def _bearer_in_openapi(app: FastAPI) -> None:
    """The bearer scheme in the OpenAPI document, so /docs has an Authorize button. Optional per the document
    (`{}`): reads may be open (TUNER_READ_OPEN); each route's role is checked in app/auth.py, not declared here."""
    made = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = made()
            schema.setdefault("components", {}).setdefault("securitySchemes", {})["bearer"] = {
                "type": "http", "scheme": "bearer",
                "description": "an API token (`aiter-tuner token create`, or the admin token at start)"}
            schema["security"] = [{"bearer": []}, {}]
        assert app.openapi_schema is not None  # made() keeps the schema it builds there
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


REDOC_LOGO = "https://cdn.redoc.ly/redoc/logo-mini.svg"  # ReDoc's "API docs by Redocly" badge, in its bundle


@functools.cache
def _redoc_js() -> bytes:
    """fastapi-offline's ReDoc bundle with its one remote image pointed at our favicon."""
    import fastapi_offline
    js = (Path(fastapi_offline.__file__).parent / "static" / "redoc.standalone.js").read_bytes()
    return js.replace(REDOC_LOGO.encode(), b"/static/favicon.svg")


def _offline_redoc(app: FastAPI) -> None:
    """/redoc from the app alone: fastapi-offline's page loads Google Fonts' CSS off and its bundle's badge
    from a CDN; this one neither."""
    from fastapi.openapi.docs import get_redoc_html

    @app.get("/redoc", include_in_schema=False)
    def redoc() -> Response:
        return get_redoc_html(openapi_url=app.openapi_url or "/openapi.json", title=f"{app.title} - ReDoc",
                              redoc_js_url="/docs-assets/redoc.standalone.js",
                              redoc_favicon_url="/static/favicon.svg", with_google_fonts=False)

    @app.get("/docs-assets/redoc.standalone.js", include_in_schema=False)
    def redoc_js() -> Response:
        return Response(_redoc_js(), media_type="application/javascript")


def create_app(settings: Settings | None = None, run_migrations: bool = True) -> FastAPI:
    settings = settings or Settings()
    if run_migrations:
        migrate.upgrade(settings.database_url)
    db = Database(settings.database_url, settings.sqlite_busy_ms, background_checkpoints=True,
                  loop_connections=settings.lease_threads or 40)
    if settings.auth:
        bootstrap_admin(db, settings)

    @asynccontextmanager
    async def lifespan(_app: FastAPI):  # type: ignore[no-untyped-def]
        failures = _app.state.metrics.background_failures
        tasks = [asyncio.create_task(_every(max(1.0, settings.lease_ttl_s / 3), lambda: _sweep(db, settings),
                                            "sweep", failures))]
        if db.is_sqlite:
            tasks.append(asyncio.create_task(_every(CHECKPOINT_EVERY_S, db.checkpoint, "checkpoint", failures)))
        yield
        for t in tasks:
            t.cancel()
        if db.loop_conns is not None:
            await db.loop_conns.close()
        db.dispose()

    # /docs and /redoc load Swagger UI and ReDoc from the fastapi-offline package, not a CDN: they work offline
    app = FastAPIOffline(title="AITER tuning orchestrator", version="0.1.0", lifespan=lifespan,
                         favicon_url="/static/favicon.svg", redoc_url=None,  # _offline_redoc: no CDN logo
                         responses=responses.errors(400, 401, 403, 404, 409, 413, 422, 503))
    app.state.settings, app.state.db = settings, db
    app.state.caches = caches.install(db)  # the services' caches, this app's own (app/services/caches.py)
    _bearer_in_openapi(app)
    _offline_redoc(app)
    app.state.lease_limiter = (anyio.CapacityLimiter(settings.lease_threads)
                               if settings.lease_threads > 0 and not db.is_sqlite else None)
    app.state.token_cache = TTLCache(settings.token_cache_s)
    errors.install(app, settings.retry_after_s, web.error_page)
    # the lease routes first: the fleet's requests match at the first routes tried
    for r in (leases.router, health.router, captures.router, campaigns.router, overlays.router, images.router,
              token_routes.router, ab_routes.router,
              web.router):
        app.include_router(r)
    app.mount("/static", StaticFiles(directory=str(web.STATIC)), name="static")
    app.state.metrics = metrics = Metrics(db)

    @app.get("/metrics", include_in_schema=False)
    def prometheus(who: ReadAuth) -> Response:  # with reads closed, a token is needed here too
        return Response(exposition(metrics, db, settings.default_shape_cost_s, who.digests),
                        media_type=CONTENT_TYPE_LATEST)

    app.add_middleware(LatencyMiddleware, metrics=metrics)
    app.add_middleware(ClosedDocs, settings=settings)
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    return app


def ready_to_serve(app: FastAPI) -> threading.Thread:
    """Once, in the serving process before its first request, what that request would otherwise pay for.
    FastAPI builds an included router's request handling (its routes' parameter models) the first time a request
    walks that router; the dashboard's router is the last one, so a server's first campaign page built them all:
    80-260 ms of that page on the 2-core VM. SQLAlchemy configures the ORM on its first query. Then gc.freeze():
    what start-up made (modules, routes, the ORM: ~140k objects) lives as long as the process, and a full
    collection, which runs inside whichever request allocated last, no longer walks it. Last, the newest
    campaigns' pages are made once in a thread (web.warm_pages), which it returns."""
    for _ in getattr(routing, "iter_route_contexts", lambda routes: ())(app.routes):  # built eagerly before 0.16x
        pass
    configure_mappers()
    gc.collect()
    gc.freeze()
    warm = threading.Thread(target=web.warm_pages, args=(app.state.db, app.state.settings), daemon=True,
                            name="warm-pages")
    warm.start()
    return warm
