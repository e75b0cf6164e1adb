"""Alembic environment: one migration tree for SQLite and PostgreSQL."""

from __future__ import annotations

import os
from logging.config import fileConfig

from alembic import context
from sqlalchemy import create_engine

from app.db.models import Base

config = context.config
if config.config_file_name and config.attributes.get("configure_logger", True):
    fileConfig(config.config_file_name)

url = os.environ.get("DATABASE_URL") if config.attributes.get("configure_logger", True) else None
url = url or config.get_main_option("sqlalchemy.url")
if url.startswith("postgresql://"):
    url = "postgresql+psycopg://" + url.removeprefix("postgresql://")


def run() -> None:
    if url.startswith("sqlite"):
        path = url.split("///", 1)[-1]
        if path and path != ":memory:":
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    engine = create_engine(url)
    with engine.connect() as conn:
        applied = config.attributes.get("applied")  # app.db.migrate.upgrade's record of the revisions it ran
        context.configure(connection=conn, target_metadata=Base.metadata, compare_type=True,
                          render_as_batch=conn.dialect.name == "sqlite",
                          on_version_apply=(lambda step, **_kw: applied.append(step.up_revision_id))
                          if applied is not None else ())
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


run()
