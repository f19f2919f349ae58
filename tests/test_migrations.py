"""Migrations: idempotent, safe when several processes upgrade at once, reversible."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator

import psycopg
import pytest
import sqlalchemy as sa
from alembic.script import ScriptDirectory
from psycopg import sql

from memstore import migrate
from memstore.db import libpq_url


@pytest.fixture
def empty_database(server_url: str) -> Iterator[str]:
    name = f"memstore_mig_{uuid.uuid4().hex[:8]}"
    admin = libpq_url(server_url)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    yield sa.make_url(server_url).set(database=name).render_as_string(hide_password=False)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def test_one_head() -> None:
    heads = ScriptDirectory.from_config(migrate.alembic_config()).get_heads()
    assert len(heads) == 1, f"migrations have several heads: {heads}"


def test_concurrent_upgrades_from_several_processes_all_succeed(empty_database: str) -> None:
    """API, workers and a migrate job may all upgrade at start; the advisory lock serialises them."""
    script = "import sys; from memstore import migrate; migrate.upgrade(sys.argv[1])"
    procs = [
        subprocess.Popen([sys.executable, "-c", script, empty_database], stderr=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    outcomes = [(p.wait(timeout=120), p.stderr.read() if p.stderr else "") for p in procs]
    assert all(code == 0 for code, _ in outcomes), outcomes
    head = ScriptDirectory.from_config(migrate.alembic_config()).get_current_head()
    assert migrate.current_revision(empty_database) == head


def test_downgrade_to_base_removes_registry_tables(empty_database: str) -> None:
    migrate.upgrade(empty_database)
    from alembic import command

    command.downgrade(migrate.alembic_config(empty_database), "base")
    with psycopg.connect(libpq_url(empty_database)) as conn:
        left = conn.execute(
            "SELECT tablename FROM pg_tables WHERE tablename LIKE 'memstore_%%' AND tablename <> %s",
            (migrate.VERSION_TABLE,),
        ).fetchall()
    assert left == []
    migrate.upgrade(empty_database)
    assert migrate.current_revision(empty_database) is not None
