"""Run Alembic migrations programmatically (the server upgrades its database at start).

The migration scripts ship inside the package (app/migrations/, package data), so an installed wheel migrates
without a checkout; Alembic is configured here in code, without alembic.ini (which only serves the `alembic`
command run from a checkout, and points at the same folder)."""

from __future__ import annotations

import sys
from pathlib import Path

from alembic import command
from alembic.config import Config

from app.db.dialect import start_lock

SCRIPTS = Path(__file__).resolve().parents[1] / "migrations"


def alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(SCRIPTS))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    cfg.attributes["configure_logger"] = False
    return cfg


def upgrade(url: str, rev: str = "head") -> list[str]:
    """Under the start-up lock: replicas started together on an empty database migrate it once (the others wait,
    then find it at head) instead of racing to create the same tables. Returns the revisions this call ran, and
    says so on stderr (an operator sees which replica migrated)."""
    cfg = alembic_config(url)
    applied: list[str] = cfg.attributes.setdefault("applied", [])
    with start_lock(url):
        command.upgrade(cfg, rev)
    if applied:
        print(f"aiter-tuner: database migrated to {applied[-1]} ({len(applied)} revisions)", file=sys.stderr,
              flush=True)
    return applied


def downgrade(url: str, rev: str) -> None:
    with start_lock(url):
        command.downgrade(alembic_config(url), rev)
