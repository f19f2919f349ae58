"""A database of the benchmark's own on a server (the embedded one, or one given with --database-url),
migrated to head, so that a run never touches a user's data."""

from __future__ import annotations

import shutil
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import sqlalchemy as sa
from psycopg import sql

from memstore.db import migrate
from memstore.db.core import libpq_url, normalise_url
from memstore.db.embedded import start_embedded_server, stop_embedded_servers_under
from memstore.settings import Settings


@contextmanager
def scratch_dir(prefix: str = "memstore-bench-") -> Iterator[Path]:
    """A temporary folder for a run's embedded server: the server stops before the folder is removed
    (a TemporaryDirectory removed the folder under a running server, which then failed to stop)."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield folder
    finally:
        stop_embedded_servers_under(folder)
        shutil.rmtree(folder, ignore_errors=True)


def server_url(database_url: str | None, folder: Path, settings: Settings, *, shared_buffers: str = "auto") -> str:
    """``database_url`` when given, else a temporary embedded server under ``folder`` started with
    memstore's build settings (the memory and parallel workers every baseline's build gets too)."""
    if database_url:
        return normalise_url(database_url)
    return start_embedded_server(
        folder,
        maintenance_work_mem=settings.maintenance_work_mem,
        max_parallel_maintenance_workers=settings.max_parallel_maintenance_workers,
        shared_buffers=shared_buffers,
    )


def new_database(server_url: str, prefix: str) -> str:
    """A new database ``prefix`` plus a random suffix on ``server_url``'s server, migrated; its URL."""
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(libpq_url(server_url), autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = sa.make_url(server_url).set(database=name).render_as_string(hide_password=False)
    migrate.upgrade(url)
    return url


def drop_database(url: str) -> None:
    """Drop the database ``url`` names (connecting to the server's ``postgres`` database to do it)."""
    admin = sa.make_url(url).set(database="postgres").render_as_string(hide_password=False)
    with psycopg.connect(libpq_url(admin), autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(str(sa.make_url(url).database)))
        )
