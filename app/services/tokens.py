"""API tokens: create (the secret is shown once), list, revoke, and resolve a presented token."""

from __future__ import annotations

import hashlib
import secrets

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.db.models import Token, utcnow

ROLES = ("capture", "worker", "admin", "read")


def digest_of(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def create(s: Session, name: str, role: str, digests: list[str] | None = None, secret: str | None = None
           ) -> tuple[Token, str]:
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}")
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


def listing(s: Session) -> list[dict]:
    return [{"id": t.id, "name": t.name, "role": t.role, "digests": t.digests, "created_at": t.created_at.isoformat(),
             "revoked": t.revoked_at is not None} for t in s.scalars(select(Token).order_by(Token.id))]


def has_admin(s: Session) -> bool:
    return s.scalars(select(Token.id).where(Token.role == "admin", Token.revoked_at.is_(None))).first() is not None
