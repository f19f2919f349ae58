"""Migrations: idempotent, safe when several processes upgrade at once, reversible."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from alembic.script import ScriptDirectory

from memstore.db import migrate
from memstore.db.core import libpq_url
from tests.databases import scratch_database


@pytest.fixture
def empty_database(server_url: str) -> Iterator[str]:
    with scratch_database(server_url, "memstore_mig", migrated=False) as url:
        yield url


def test_one_head() -> None:
    heads = ScriptDirectory.from_config(migrate.alembic_config()).get_heads()
    assert len(heads) == 1, f"migrations have several heads: {heads}"


def test_concurrent_upgrades_from_several_processes_all_succeed(empty_database: str) -> None:
    """API, workers and a migrate job may all upgrade at start; the advisory lock serialises them."""
    script = "import sys; from memstore.db import migrate; migrate.upgrade(sys.argv[1])"
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


def test_collections_made_before_the_revisions_get_their_schema_back(empty_database: str) -> None:
    """Collections (plain and partitioned, two with OCR on) made at head, the schema taken down to
    revision 0005 and brought up again: revisions 0006 to head rebuild what they add to a collection's
    tables, the same as those tables had (but for the names PostgreSQL chose for partitions' indexes;
    OCR is turned off for the round trip, as revision 0009's downgrade asks, and on again after it).
    Revision 0006 builds the keyword index of every existing collection (concurrently) and takes the
    pending list off its GIN indexes; revision 0012 stores their keywords in side tables and drops
    those indexes; searches by keyword work on the old rows at once."""
    import numpy as np
    from alembic import command

    from memstore.db.core import create_engine
    from memstore.models import ItemIn
    from memstore.settings import Settings
    from memstore.store import VectorStore

    migrate.upgrade(empty_database)
    engine = create_engine(empty_database)
    shapes = {"before_plain": (1, False), "before_parts": (2, False), "ocr_plain": (1, True), "ocr_parts": (3, True)}
    try:
        store = VectorStore(engine, settings=Settings(database_url=empty_database))
        rng = np.random.default_rng(0)
        tables = []
        for name, (partitions, ocr) in shapes.items():
            c = store.create_collection(name=name, dimensions=4, partitions=partitions)
            store.upsert_items(
                collection=name,
                items=[ItemIn(vector=rng.normal(size=4), external_id=str(i), text=f"row code-{i}") for i in range(50)],
            )
            if ocr:
                store.set_keywords(collection=name, ocr=True, grace_s=0)
            tables += [f"{c.table_name}%", f"memstore_kw_c{c.id}\\_%"]
        with psycopg.connect(libpq_url(empty_database)) as conn:
            before = catalog(conn, tables)
        for name, (_, ocr) in shapes.items():
            if ocr:  # revision 0009's downgrade refuses while a collection reads its images
                store.set_keywords(collection=name, ocr=False, grace_s=0)
        engine.dispose()
        command.downgrade(migrate.alembic_config(empty_database), "0005")
        with psycopg.connect(libpq_url(empty_database)) as conn:
            assert conn.execute("SELECT count(*) FROM pg_class WHERE relname LIKE '%%_keywords'").fetchone() == (0,)
        migrate.upgrade(empty_database)
        store = VectorStore(engine, settings=Settings(database_url=empty_database))
        for name, (_, ocr) in shapes.items():
            if ocr:
                store.set_keywords(collection=name, ocr=True, grace_s=0)
            hits = store.search(collection=name, text="code-17", mode="keyword", k=3)
            assert [h.external_id for h in hits] == ["17"], name
        with psycopg.connect(libpq_url(empty_database)) as conn:
            after = catalog(conn, tables)
            rows = conn.execute(
                "SELECT c.relname, x.indisvalid, coalesce(c.reloptions, '{}') FROM pg_index x "
                "JOIN pg_class c ON c.oid = x.indexrelid JOIN pg_am am ON am.oid = c.relam "
                "WHERE am.amname = 'gin' AND c.relkind = 'i'"
            ).fetchall()
        assert _normalised(after) == _normalised(before)
        keyword_indexes = [r for r in rows if r[0].startswith("memstore_kw_c") and r[0].endswith("_words")]
        assert len(keyword_indexes) == len(shapes)  # each collection's side table's
        assert not [r for r in rows if r[0].endswith("_keywords")]  # the expression indexes are gone
        assert all(valid for _, valid, _ in rows)
        assert all("fastupdate=off" in options for _, _, options in rows), rows
    finally:
        engine.dispose()


def _normalised(lines: list[str]) -> list[str]:
    """``catalog``'s lines with the names of partitions' indexes left out: PostgreSQL names the index of
    a partition made after its parent's index (``<partition>_<column>_idx<n>``), a revision that builds
    one partition by partition names it itself."""
    partitions = {line.split()[1] for line in lines if line.startswith("table ") and not line.endswith("bound=''")}
    out = []
    for line in lines:
        words = line.split(" ", 5)
        if words[0] == "index" and words[1] in partitions:
            at = 4 if words[3] == "INDEX" else 5 if words[4] == "INDEX" else None
            if at is not None:
                line = " ".join([*line.split(" ")[:at], "<name>", *line.split(" ")[at + 1 :]])
        out.append(line)
    return sorted(out)


# The schema a fresh database gets from the revisions, as text: compared with tests/data/schema_snapshot.txt,
# so that a change to an old revision (or to anything it used to import) cannot change it unseen.
SNAPSHOT = Path(__file__).resolve().parent / "data" / "schema_snapshot.txt"
# Set to write the snapshot afresh (after adding a revision), then review the difference and commit it.
UPDATE_SNAPSHOT = "MEMSTORE_UPDATE_SCHEMA_SNAPSHOT"


def catalog(conn: psycopg.Connection[Any], tables: list[str] | None = None) -> list[str]:
    """The schema of the tables whose names are LIKE one of ``tables`` (the whole public schema by
    default): tables with their columns, constraints, indexes and triggers, sequences, and (of the whole
    schema) the ``memstore_*`` functions and the extensions; one line each (a function's definition on
    several), sorted, with no oids."""
    like = tables or ["%"]
    lines: list[str] = []
    for name, kind, bound, key in conn.execute(
        "SELECT c.relname, c.relkind, coalesce(pg_get_expr(c.relpartbound, c.oid), ''), "
        "coalesce(pg_get_partkeydef(c.oid), '') FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p') AND c.relname LIKE ANY(%s)",
        (like,),
    ):
        lines.append(f"table {name} kind={kind} partition_key={key!r} bound={bound!r}")
    for table, column, type_, notnull, default, identity, generated in conn.execute(
        "SELECT c.relname, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull, "
        "coalesce(pg_get_expr(d.adbin, d.adrelid), ''), a.attidentity, a.attgenerated "
        "FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace "
        "LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum "
        "WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p') AND c.relname LIKE ANY(%s) "
        "AND a.attnum > 0 AND NOT a.attisdropped",
        (like,),
    ):
        extra = f" default={default!r}" if default else ""
        extra += f" identity={identity}" if identity else ""
        extra += f" generated={generated}" if generated else ""
        lines.append(f"column {table}.{column} {type_}{' not null' if notnull else ''}{extra}")
    for table, name, definition in conn.execute(
        "SELECT c.relname, k.conname, pg_get_constraintdef(k.oid) FROM pg_constraint k "
        "JOIN pg_class c ON c.oid = k.conrelid JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = 'public' AND c.relname LIKE ANY(%s)",
        (like,),
    ):
        lines.append(f"constraint {table}.{name} {definition}")
    for table, definition, valid, options in conn.execute(
        "SELECT t.relname, pg_get_indexdef(i.indexrelid), i.indisvalid, coalesce(x.reloptions, '{}') "
        "FROM pg_index i JOIN pg_class x ON x.oid = i.indexrelid JOIN pg_class t ON t.oid = i.indrelid "
        "JOIN pg_namespace n ON n.oid = t.relnamespace WHERE n.nspname = 'public' AND t.relname LIKE ANY(%s)",
        (like,),
    ):
        lines.append(f"index {table} {definition}{'' if valid else ' INVALID'} options={sorted(options)}")
    for table, definition, enabled in conn.execute(
        "SELECT c.relname, pg_get_triggerdef(g.oid), g.tgenabled FROM pg_trigger g "
        "JOIN pg_class c ON c.oid = g.tgrelid JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = 'public' AND NOT g.tgisinternal AND c.relname LIKE ANY(%s)",
        (like,),
    ):
        lines.append(f"trigger {table} {definition} enabled={enabled}")
    for (name,) in conn.execute(
        "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = 'public' AND c.relkind = 'S' AND c.relname LIKE ANY(%s)",
        (like,),
    ):
        lines.append(f"sequence {name}")
    if tables is None:
        for (definition,) in conn.execute(
            "SELECT pg_get_functiondef(p.oid) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
            "WHERE n.nspname = 'public' AND p.proname LIKE 'memstore\\_%%' AND p.prokind = 'f'"
        ):
            lines.append("function " + "\n    ".join(line.rstrip() for line in definition.strip().splitlines()))
        for (name,) in conn.execute("SELECT extname FROM pg_extension"):
            lines.append(f"extension {name}")
    return sorted(lines)


def fresh_catalog(server_url: str) -> list[str]:
    """The catalog of a new database upgraded to head."""
    with scratch_database(server_url, "memstore_schema") as url, psycopg.connect(libpq_url(url)) as conn:
        return catalog(conn)


def test_a_fresh_database_gets_the_snapshot_schema(server_url: str) -> None:
    """Revisions are frozen: the schema they give a new database is the one saved in the snapshot. A
    new revision changes it on purpose: regenerate with MEMSTORE_UPDATE_SCHEMA_SNAPSHOT=1 and review."""
    got = "\n".join(fresh_catalog(server_url)) + "\n"
    if os.environ.get(UPDATE_SNAPSHOT):
        SNAPSHOT.write_text(got)
    assert got == SNAPSHOT.read_text()


def test_a_store_made_before_the_migrations_says_so_and_works_after_them(empty_database: str) -> None:
    """The registry missing is memstore's own error naming the fix; a pooled connection opened before
    the extension existed carries vectors once it does."""
    import numpy as np

    from memstore.db.core import create_engine
    from memstore.errors import SchemaNotReadyError
    from memstore.models import ItemIn
    from memstore.store import VectorStore

    engine = create_engine(empty_database, pool_size=1, max_overflow=0)
    try:
        store = VectorStore(engine)
        with pytest.raises(SchemaNotReadyError, match="memstore db upgrade"):
            store.create_collection(name="early", dimensions=4)
        with pytest.raises(SchemaNotReadyError):
            store.list_collections()
        migrate.upgrade(empty_database)
        store.create_collection(name="later", dimensions=4)
        store.upsert_items(collection="later", items=[ItemIn(vector=np.ones(4), external_id="a")])
        assert [h.external_id for h in store.search(collection="later", vector=np.ones(4), k=1)] == ["a"]
    finally:
        engine.dispose()
