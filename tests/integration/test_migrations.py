"""Alembic: upgrade head on an empty database gives exactly the models' schema; the latest downgrades."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, inspect

from app.db import migrate
from app.db.models import Base
from app.db.session import make_engine


def diff(url):
    engine = make_engine(url)
    with engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"compare_type": True})
        out = compare_metadata(ctx, Base.metadata)
    engine.dispose()
    return out


def tables(url):
    engine = make_engine(url)
    names = set(inspect(engine).get_table_names()) - {"alembic_version"}
    engine.dispose()
    return names


def test_upgrade_head_matches_the_models(db_url):
    migrate.upgrade(db_url)
    assert diff(db_url) == []
    assert tables(db_url) == set(Base.metadata.tables)


def test_latest_migration_downgrades_and_upgrades_again(db_url):
    migrate.upgrade(db_url)
    script = ScriptDirectory.from_config(migrate.alembic_config(db_url))
    head = script.get_revision("head")
    migrate.downgrade(db_url, head.down_revision or "base")
    assert diff(db_url) != [], "the downgrade undid the latest migration's schema change"
    engine = make_engine(db_url)
    with engine.connect() as conn:
        assert MigrationContext.configure(conn).get_current_revision() == head.down_revision
    engine.dispose()
    migrate.upgrade(db_url)
    assert diff(db_url) == []


def test_engine_url_forms():
    assert create_engine("sqlite://").dialect.name == "sqlite"
    assert make_engine("postgresql://u:p@127.0.0.1:1/x").dialect.driver == "psycopg"
