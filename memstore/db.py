"""The database layer: the only module that renders the URL or opens connections.

- ``get_engine``: the process's pooled engine (SQLAlchemy's pool; pgvector's types registered on every
  new connection, dead connections dropped at checkout without a round trip);
- ``raw_connection``: a pooled psycopg connection for one transaction;
- ``dedicated_connection``: a connection of its own, outside the pool, for what must not share one
  (LISTEN, a session advisory lock, VACUUM and concurrent index builds, long DDL);
- ``async_pool``: the asyncio pool of the search fast path, on the same URL;
- ``Database``: all of that for one database, with reads and writes asked for apart (``read()``,
  ``write()``), so that read replicas can be added here alone. Today both are the primary.
"""

from __future__ import annotations

import select
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import sqlalchemy as sa
from pgvector.psycopg import register_vector
from psycopg_pool import AsyncConnectionPool
from sqlalchemy import event

from memstore.embedded import start_embedded_server
from memstore.settings import Settings, get_settings

_lock = threading.Lock()
_engines: dict[str, sa.Engine] = {}
_embedded_lock = threading.Lock()
_embedded_urls: dict[str, str] = {}


def resolve_database_url(settings: Settings | None = None) -> str:
    """``MEMSTORE_DATABASE_URL`` when set, else the embedded server (started or joined)."""
    settings = settings or get_settings()
    if settings.database_url:
        return normalise_url(settings.database_url)
    # Started (or joined) once per process and data folder, however many threads ask.
    key = str(settings.data_dir.expanduser().resolve())
    with _embedded_lock:
        url = _embedded_urls.get(key)
        if url is None:
            url = _embedded_urls[key] = start_embedded_server(
                settings.data_dir,
                maintenance_work_mem=settings.maintenance_work_mem,
                max_parallel_maintenance_workers=settings.max_parallel_maintenance_workers,
            )
    return url


def normalise_url(url: str) -> str:
    """Accept plain ``postgresql://`` URLs too; memstore always talks through psycopg 3."""
    for prefix in ("postgresql+psycopg2://", "postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


def libpq_url(url: str) -> str:
    """The same URL as libpq understands it (for psycopg.connect and command-line tools)."""
    return normalise_url(url).replace("postgresql+psycopg://", "postgresql://", 1)


def _register_vector_types(dbapi_connection: Any, _record: Any) -> None:
    conn: psycopg.Connection[Any] = dbapi_connection
    try:
        register_vector(conn)
    except psycopg.ProgrammingError:
        # The extension does not exist yet (before the first migration); nothing to register.
        conn.rollback()
    else:
        conn.commit()


def _discard_dead_connections(dbapi_connection: Any, _record: Any, _proxy: Any) -> None:
    """Refuse a pooled connection whose server end is gone, without a round trip.

    An idle connection has nothing to read; if its socket is readable the server has closed it
    (restart, crash, idle timeout) or sent an error. Raising DisconnectionError makes the pool
    discard it and hand out a fresh one, so a database restart costs no failed request.
    """
    if server_went_away(dbapi_connection):
        raise sa.exc.DisconnectionError("the server closed this connection")


def server_went_away(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    """True when an idle connection is closed, broken, or has something to read (the server's goodbye)."""
    try:
        return conn.closed or conn.broken or bool(select.select([conn.fileno()], [], [], 0)[0])
    except (OSError, ValueError, psycopg.Error):
        return True


def create_engine(url: str, *, pool_size: int = 8, max_overflow: int = 8) -> sa.Engine:
    engine = sa.create_engine(
        normalise_url(url),
        pool_size=pool_size,
        max_overflow=max_overflow,
        # No ping per checkout (a round trip on every search); a connection that fails is
        # invalidated by raw_connection instead, and the pool opens a new one next time.
        pool_pre_ping=False,
    )
    event.listen(engine, "connect", _register_vector_types)
    event.listen(engine, "checkout", _discard_dead_connections)
    return engine


def get_engine(settings: Settings | None = None) -> sa.Engine:
    """The process's engine for the configured database (created on first use)."""
    settings = settings or get_settings()
    url = resolve_database_url(settings)
    with _lock:
        engine = _engines.get(url)
        if engine is None:
            engine = create_engine(url, pool_size=settings.pool_size, max_overflow=settings.pool_max_overflow)
            _engines[url] = engine
        return engine


def _dsn(engine: sa.Engine) -> str:
    """The engine's URL as libpq takes it, password included: never logged, never leaves this module."""
    return libpq_url(engine.url.render_as_string(hide_password=False))


def dedicated_connection(
    engine: sa.Engine, *, application_name: str, autocommit: bool = True, vector_types: bool = True
) -> psycopg.Connection[Any]:
    """A new connection to the engine's database, outside its pool; the caller closes it."""
    conn = psycopg.connect(_dsn(engine), autocommit=autocommit, application_name=application_name)
    if vector_types:
        try:
            register_vector(conn)
        except psycopg.ProgrammingError:  # no extension yet (before the first migration)
            if not autocommit:
                conn.rollback()
    return conn


def async_pool(
    engine: sa.Engine,
    *,
    max_size: int,
    name: str,
    configure: Any,
    check: Any,
) -> AsyncConnectionPool[psycopg.AsyncConnection[Any]]:
    """An asyncio pool (not yet open) of autocommit connections to the engine's database."""
    return AsyncConnectionPool(
        _dsn(engine),
        min_size=1,
        max_size=max_size,
        open=False,
        configure=configure,
        check=check,
        kwargs={"autocommit": True},
        name=name,
    )


@contextmanager
def raw_connection(engine: sa.Engine) -> Iterator[psycopg.Connection[Any]]:
    """A pooled psycopg connection; committed on success, rolled back on error, then returned."""
    proxied = engine.raw_connection()
    conn: psycopg.Connection[Any] = proxied.driver_connection  # type: ignore[assignment]
    try:
        yield conn
        conn.commit()
    except psycopg.OperationalError:
        # The server went away or the connection broke: never hand this one out again.
        proxied.invalidate()
        raise
    except BaseException:
        if not conn.closed:
            conn.rollback()
        raise
    finally:
        proxied.close()


class Database:
    """One database as this process reaches it (see the module's docstring). ``VectorStore`` takes
    one (or an engine, which it wraps)."""

    def __init__(self, engine: sa.Engine) -> None:
        self.engine = engine

    @contextmanager
    def write(self) -> Iterator[psycopg.Connection[Any]]:
        """A pooled connection to the primary for one transaction (committed on success)."""
        with raw_connection(self.engine) as conn:
            yield conn

    @contextmanager
    def read(self) -> Iterator[psycopg.Connection[Any]]:
        """A pooled connection for one read-only transaction: searches, item reads, listings. The
        primary today; a replica once replicas are configured."""
        with raw_connection(self.engine) as conn:
            yield conn

    def dedicated(
        self, *, application_name: str, autocommit: bool = True, vector_types: bool = True
    ) -> psycopg.Connection[Any]:
        return dedicated_connection(
            self.engine, application_name=application_name, autocommit=autocommit, vector_types=vector_types
        )

    def async_pool(
        self, *, max_size: int, name: str, configure: Any, check: Any
    ) -> AsyncConnectionPool[psycopg.AsyncConnection[Any]]:
        return async_pool(self.engine, max_size=max_size, name=name, configure=configure, check=check)


def as_database(target: sa.Engine | Database) -> Database:
    return target if isinstance(target, Database) else Database(target)
