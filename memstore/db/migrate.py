"""Apply alembic migrations programmatically (``memstore db upgrade``, tests, ``memstore serve``)."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config

from memstore.db.core import Database

# The top-level migrations/ folder, installed as the package memstore_migrations (pyproject.toml).
MIGRATIONS_DIR = Path(str(files("memstore_migrations")))
VERSION_TABLE = "memstore_alembic_version"


def alembic_config(url: str | None = None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    if url:
        # ConfigParser interpolation treats % specially.
        cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def upgrade(url: str | None = None, revision: str = "head") -> None:
    """Bring the database at ``url`` (default: the configured one) up to ``revision``."""
    command.upgrade(alembic_config(url), revision)


def current_revision(url: str) -> str | None:
    from alembic.runtime.migration import MigrationContext

    from memstore.db.core import create_engine

    engine = create_engine(url, pool_size=1, max_overflow=0)
    try:
        with engine.connect() as conn:
            ctx = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
            return ctx.get_current_revision()
    finally:
        engine.dispose()


def database_facts(db: Database) -> dict[str, Any]:
    """The server's version, pgvector's and the schema revision (what /health shows to a key)."""
    with db.write() as conn:
        row = conn.execute(
            "SELECT current_setting('server_version'), "
            "(SELECT extversion FROM pg_extension WHERE extname = 'vector'), "
            f"(SELECT version_num FROM {VERSION_TABLE})"
        ).fetchone()
    assert row is not None
    return {"server_version": row[0], "pgvector": row[1], "revision": row[2]}
