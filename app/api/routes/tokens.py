"""Admin: API tokens over HTTP (create, list, revoke), beside the `aiter-tuner token` CLI."""

from __future__ import annotations

from fastapi import APIRouter, Request

from app.api.deps import DbDep
from app.schemas import TokenIn, TokenOut
from app.auth import AdminAuth
from app.errors import Forbidden
from app.services import tokens

router = APIRouter(tags=["tokens"])


@router.post("/v1/tokens", response_model=TokenOut, status_code=201)
def create_token(body: TokenIn, db: DbDep, who: AdminAuth) -> TokenOut:
    """A digest-scoped admin makes tokens scoped to its own images only (never a wider one)."""
    if not who.covers(body.digests):
        raise Forbidden(f"digests: token {who.name!r} may only make tokens scoped to its images "
                        f"({', '.join(who.digests or ())})", "digests")
    with db.session() as s:
        tok, secret = tokens.create(s, body.name, body.role, body.digests)
        return TokenOut(**tokens.row(tok), token=secret)


@router.get("/v1/tokens", response_model=list[TokenOut])
def list_tokens(db: DbDep, who: AdminAuth) -> list[dict]:
    with db.session(write=False) as s:
        return [t for t in tokens.listing(s) if who.covers(t["digests"])]


@router.delete("/v1/tokens/{token_id}", response_model=TokenOut)
def revoke_token(token_id: int, request: Request, db: DbDep, who: AdminAuth) -> TokenOut:
    with db.session() as s:
        tok = tokens.revoke_keeping_an_admin(s, token_id, who.covers)
        out, key = TokenOut(**tokens.row(tok)), tok.token_hash
    request.app.state.token_cache.pop(key)  # committed: refused at once here (other processes: within the TTL)
    return out
