"""Databases of their own on the test server, for tests that must not share the run's database (a
queue nobody else touches, a schema moved between revisions, a command run on a fresh database)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import sqlalchemy as sa
from psycopg import sql

from memstore.db import migrate
from memstore.db.core import libpq_url


def create_database(server_url: str, prefix: str, *, migrated: bool = True) -> str:
    """A new database named ``prefix`` plus a random suffix on ``server_url``'s server, migrated to head
    unless ``migrated`` is False; its URL."""
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(libpq_url(server_url), autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = sa.make_url(server_url).set(database=name).render_as_string(hide_password=False)
    if migrated:
        migrate.upgrade(url)
    return url


def drop_database(server_url: str, url: str) -> None:
    """Drop the database ``url`` names, whoever is still connected to it."""
    with psycopg.connect(libpq_url(server_url), autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(sa.make_url(url).database))
        )


@contextmanager
def scratch_database(server_url: str, prefix: str, *, migrated: bool = True) -> Iterator[str]:
    """``create_database`` for the block, dropped after it."""
    url = create_database(server_url, prefix, migrated=migrated)
    try:
        yield url
    finally:
        drop_database(server_url, url)
