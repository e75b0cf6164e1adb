"""API tokens: create (the secret is shown once), list, revoke, and resolve a presented token."""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Callable

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app.wire import DIGEST_RE
from app.db.models import Token, utcnow
from app.errors import Conflict, Forbidden, Invalid, NotFound

ROLES = ("capture", "worker", "admin", "read")


def digest_of(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def create(s: Session, name: str, role: str, digests: list[str] | None = None, secret: str | None = None
           ) -> tuple[Token, str]:
    if role not in ROLES:
        raise Invalid(f"role: must be one of {', '.join(ROLES)}", "role")
    for d in digests or ():
        if not DIGEST_RE.fullmatch(d):
            raise Invalid(f"digests: {d!r} is not an image digest (sha256: and 64 lowercase hex digits)", "digests")
    secret = secret or "atk_" + secrets.token_urlsafe(32)
    tok = Token(name=name, role=role, token_hash=digest_of(secret), digests=digests or None)
    s.add(tok)
    s.flush()
    return tok, secret


def find(s: Session, secret: str) -> Token | None:
    return find_digest(s, digest_of(secret))


def find_digest(s: Session, token_hash: str) -> Token | None:
    tok = s.scalars(select(Token).where(Token.token_hash == token_hash)).first()
    return tok if tok is not None and tok.revoked_at is None else None


def revoke(s: Session, token_id: int) -> bool:
    tok = s.get(Token, token_id)
    if tok is None or tok.revoked_at is not None:
        return False
    tok.revoked_at = utcnow()
    return True


def revoke_keeping_an_admin(s: Session, token_id: int, within: Callable[[list | None], bool] = lambda _d: True
                            ) -> Token:
    """Revoke over HTTP: the last live admin token is kept, so the service never locks its admins out
    (rotate by creating the new admin token first). within(digests): whether the revoking token's scope
    covers this token's images."""
    tok = s.get(Token, token_id)
    if tok is None or tok.revoked_at is not None:
        raise NotFound(f"token_id: no live token {token_id}", "token_id")
    if not within(tok.digests):
        raise Forbidden(f"token_id: token {token_id} reaches images outside this token's scope", "token_id")
    if tok.role == "admin" and s.scalar(select(func.count()).select_from(Token).where(
            Token.role == "admin", Token.revoked_at.is_(None))) == 1:
        raise Conflict(f"token_id: {token_id} is the last admin token; create another admin token first",
                       "token_id")
    tok.revoked_at = utcnow()
    return tok


def row(t: Token) -> dict:
    return {"id": t.id, "name": t.name, "role": t.role, "digests": t.digests, "created_at": t.created_at.isoformat(),
            "revoked": t.revoked_at is not None}


def listing(s: Session) -> list[dict]:
    return [row(t) for t in s.scalars(select(Token).order_by(Token.id))]


def has_admin(s: Session) -> bool:
    return s.scalars(select(Token.id).where(Token.role == "admin", Token.revoked_at.is_(None))).first() is not None
