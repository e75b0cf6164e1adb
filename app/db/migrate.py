"""Run Alembic migrations programmatically (the server upgrades its database at start).

The migration scripts ship inside the package (app/migrations/, package data), so an installed wheel migrates
without a checkout; Alembic is configured here in code, without alembic.ini (which only serves the `alembic`
command run from a checkout, and points at the same folder)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

SCRIPTS = Path(__file__).resolve().parents[1] / "migrations"


def alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(SCRIPTS))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    cfg.attributes["configure_logger"] = False
    return cfg


def upgrade(url: str, rev: str = "head") -> None:
    command.upgrade(alembic_config(url), rev)


def downgrade(url: str, rev: str) -> None:
    command.downgrade(alembic_config(url), rev)
