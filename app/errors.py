"""Domain errors and their HTTP form: {"title", "status", "detail", "field"}; busy databases are 503s."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from sqlalchemy.exc import OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger("aiter_tuner")


class DomainError(Exception):
    status = 400
    title = "bad request"

    def __init__(self, detail: str, field: str | None = None):
        super().__init__(detail)
        self.detail, self.field = detail, field


class Invalid(DomainError):
    status, title = 422, "invalid input"


class NotFound(DomainError):
    status, title = 404, "not found"


class Conflict(DomainError):
    status, title = 409, "conflict"


class Unauthorized(DomainError):
    status, title = 401, "unauthorized"


class Forbidden(DomainError):
    status, title = 403, "forbidden"


_TYPE_TAGS = {"str", "int", "float", "bool", "none", "constrained-str", "list", "dict", "is-instance"}


def field_of(loc: Sequence[Any]) -> str | None:
    """A validation error's location as a dotted field name, without pydantic's union member tags."""
    parts = [str(p) for p in loc if str(p) not in _TYPE_TAGS and "[" not in str(p)]
    if parts and parts[0] in ("body", "path", "query", "header"):
        parts = parts[1:]
    return ".".join(parts) or None


def _problem(status: int, title: str, detail: str, field: str | None, headers: dict | None = None) -> JSONResponse:
    return JSONResponse({"title": title, "status": status, "detail": detail, "field": field}, status_code=status,
                        headers=headers, media_type="application/problem+json")


def problem_response(exc: DomainError) -> JSONResponse:
    return _problem(exc.status, exc.title, exc.detail, exc.field)


def _is_busy(exc: OperationalError) -> bool:
    msg = str(exc.orig).lower()
    return "database is locked" in msg or "database is busy" in msg or "could not serialize" in msg


def _is_page(req: Request) -> bool:
    """A dashboard page (HTML errors), not an API route (JSON problems)."""
    path = req.url.path
    return not path.startswith(("/v1/", "/metrics", "/healthz", "/openapi.json"))


def install(app: FastAPI, retry_after_s: int,
            page: Callable[[Request, int, str], Response] | None = None) -> None:
    """page(request, status, detail): the HTML answer of a dashboard page for 401, 403 (a sign-in form) and 404
    (unknown campaign, unknown path); API routes keep their JSON problems."""
    def _page(req: Request, status: int, detail: str) -> Response | None:
        return page(req, status, detail) if page is not None and status in (401, 403, 404) and _is_page(req) else None

    @app.exception_handler(DomainError)
    async def _domain(req: Request, exc: DomainError) -> Response:
        return _page(req, exc.status, exc.detail) or _problem(exc.status, exc.title, exc.detail, exc.field)

    @app.exception_handler(StarletteHTTPException)
    async def _http(req: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code == 404 and (html := _page(req, 404, f"There is no page at {req.url.path}.")):
            return html
        title = {404: "not found", 405: "method not allowed", 400: "bad request"}.get(exc.status_code, "error")
        return _problem(exc.status_code, title, str(exc.detail), None, dict(exc.headers or {}) or None)

    @app.exception_handler(RequestValidationError)
    async def _validation(_req: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid"}
        field = field_of(first.get("loc", ()))
        return _problem(422, "invalid input", f"{field}: {first.get('msg')}" if field else str(first.get("msg")),
                        field)

    @app.exception_handler(OperationalError)
    async def _db(_req: Request, exc: OperationalError) -> JSONResponse:
        """Busy, locked or unreachable: the database is unavailable, never the client's fault; workers wait."""
        if not _is_busy(exc):
            log.warning("database unavailable: %s", str(exc.orig)[:300])
        return _problem(503, "database unavailable", "the database is busy or unavailable; retry", None,
                        {"Retry-After": str(retry_after_s)})

    @app.exception_handler(PoolTimeout)
    async def _pool(_req: Request, exc: PoolTimeout) -> JSONResponse:
        """Every pooled connection in use past the pool's timeout (QueuePool): busy, as a locked database is."""
        log.warning("database pool exhausted: %s", str(exc)[:300])
        return _problem(503, "database unavailable", "every database connection is in use; retry", None,
                        {"Retry-After": str(retry_after_s)})
