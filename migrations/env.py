"""alembic environment: the URL comes from memstore's settings unless the caller passed a connection."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection, text

from memstore.db.core import create_engine, resolve_database_url
from memstore.db.migrate import VERSION_TABLE

# Several processes (API, workers, a migrate job) may upgrade at once; one runs, the others wait.
MIGRATION_LOCK = "SELECT pg_advisory_lock(hashtext('memstore.db.migrate'))"
MIGRATION_UNLOCK = "SELECT pg_advisory_unlock(hashtext('memstore.db.migrate'))"


def _run(conn: Connection) -> None:
    conn.execute(text(MIGRATION_LOCK))
    conn.commit()
    try:
        context.configure(connection=conn, version_table=VERSION_TABLE, transaction_per_migration=True)
        with context.begin_transaction():
            context.run_migrations()
        conn.commit()
    finally:
        conn.execute(text(MIGRATION_UNLOCK))
        conn.commit()


def run_migrations_online() -> None:
    connection = context.config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    url = context.config.get_main_option("sqlalchemy.url") or resolve_database_url()
    engine = create_engine(url, pool_size=1, max_overflow=0)
    try:
        with engine.connect() as conn:
            _run(conn)
    finally:
        engine.dispose()


def run_migrations_offline() -> None:
    context.configure(
        url=context.config.get_main_option("sqlalchemy.url") or "postgresql+psycopg://",
        literal_binds=True,
        version_table=VERSION_TABLE,
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
