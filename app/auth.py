"""Who may do what: bearer tokens with a role, optionally scoped to image digests.

capture: POST captures and post-deploy logs. worker: lease, heartbeat, results, image tables. admin: all of
it plus campaign management. read: overlays, reports and the dashboard when reads are not open.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from starlette.concurrency import run_in_threadpool

from app.errors import DomainError, Forbidden, Unauthorized, problem_response
from app.services import tokens
from app.ttl_cache import TTLCache


@dataclass(frozen=True)
class Principal:
    token_id: int | None
    role: str
    name: str
    digests: tuple[str, ...] | None  # None: every image

    def may_see(self, digest: str) -> bool:
        return self.digests is None or digest in self.digests

    def check_digest(self, digest: str) -> None:
        if self.digests is not None and digest not in self.digests:
            # "this image", never the digest: a campaign or lease id must not reveal another image's digest
            raise Forbidden(f"image_digest: token {self.name!r} is not scoped to this image", "image_digest")

    def covers(self, digests: Collection[str] | None) -> bool:
        """Whether a token scoped to `digests` (None: every image) reaches only images this one may act on."""
        return self.digests is None or (bool(digests) and set(digests or ()) <= set(self.digests))


OPEN = Principal(None, "admin", "auth disabled", None)


COOKIE = "tuner_token"  # the dashboard's sign-in (reads closed): browsers send it with page loads, GET only


async def _principal(request: Request) -> Principal | None:
    header = request.headers.get("authorization", "")
    if not header:  # a browser signed in at /signin; a write always needs the header (no cross-site forms)
        cookie = request.cookies.get(COOKIE) if request.method in ("GET", "HEAD") else None
        return await resolve(request, cookie) if cookie else None
    scheme, _, secret = header.partition(" ")
    if scheme.lower() != "bearer" or not secret.strip():
        raise Unauthorized("authorization: expected 'Bearer <token>'", "authorization")
    return await resolve(request, secret)


async def resolve(request: Request, secret: str) -> Principal:
    """The live token with this secret (401 if none)."""
    key = tokens.digest_of(secret.strip())
    cache: TTLCache = request.app.state.token_cache  # known tokens only: a new token works at once
    p = cache.get(key)
    if p is None:  # the database only on a miss, and off the event loop
        p = cache.put(key, await run_in_threadpool(_lookup, request.app.state.db, key))
    return p


def _lookup(db, key: str) -> Principal:  # type: ignore[no-untyped-def]
    with db.session(write=False) as s:
        tok = tokens.find_digest(s, key)
        if tok is None:
            raise Unauthorized("authorization: unknown or revoked token", "authorization")
        return Principal(tok.id, tok.role, tok.name, tuple(tok.digests) if tok.digests else None)


async def authorize(request: Request, roles: tuple[str, ...], read: bool = False) -> Principal:
    """The caller, if one of these roles (or an admin) may act; async: a cached token costs no thread hop."""
    settings = request.app.state.settings
    if not settings.auth or (read and settings.read_open):
        return OPEN if not settings.auth else (await _principal(request) or OPEN)
    p = await _principal(request)
    if p is None:
        raise Unauthorized(f"authorization: a {' or '.join(roles)} token is required", "authorization")
    if p.role != "admin" and p.role not in roles:
        raise Forbidden(f"authorization: role {p.role!r} may not do this; needs {' or '.join(roles)}",
                        "authorization")
    return p


def require(*roles: str, read: bool = False):  # type: ignore[no-untyped-def]
    async def dep(request: Request) -> Principal:
        return await authorize(request, roles, read)
    return Depends(dep)


CaptureAuth = Annotated[Principal, require("capture")]
WorkerAuth = Annotated[Principal, require("worker")]
AdminAuth = Annotated[Principal, require("admin")]
ReadAuth = Annotated[Principal, require("read", "capture", "worker", read=True)]


class ClosedDocs:
    """With reads closed, the API document, its UIs and static files need a token too (/healthz stays open)."""

    PATHS = ("/docs", "/redoc", "/openapi.json", "/static")

    def __init__(self, app, settings):  # type: ignore[no-untyped-def]
        self.app, self.settings = app, settings

    async def __call__(self, scope, receive, send):  # type: ignore[no-untyped-def]
        if (scope["type"] == "http" and self.settings.auth and not self.settings.read_open
                and scope["path"].startswith(self.PATHS)):
            try:
                if await _principal(Request(scope)) is None:
                    raise Unauthorized("authorization: a token is required", "authorization")
            except DomainError as e:
                return await problem_response(e)(scope, receive, send)
        await self.app(scope, receive, send)
