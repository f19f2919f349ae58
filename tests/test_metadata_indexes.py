"""Typed metadata indexes: built online on plain and partitioned collections, used by the planner for
selective range filters (custom and generic plans), listed, dropped, rebuilt after a failed build."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from psycopg import sql

from memstore.catalog import metadata_indexes
from memstore.catalog.collections import Collection
from memstore.catalog.metadata_indexes import MAX_FIELD_LENGTH, check_field, check_type, index_name, lists_index_name
from memstore.catalog.metadata_sql import typed_expression
from memstore.db import locks
from memstore.db.core import dedicated_connection
from memstore.errors import ConflictError, InvalidInputError
from memstore.search.filter_language import compile_filter
from memstore.settings import Settings
from memstore.store import VectorStore

ROWS = 4000


@pytest.fixture(scope="module")
def module_store(engine: sa.Engine, settings: Settings) -> VectorStore:
    return VectorStore(engine, settings=settings)


@pytest.fixture(scope="module")
def conn(engine: sa.Engine) -> Iterator[psycopg.Connection[Any]]:
    with dedicated_connection(engine, application_name="test-metadata-indexes") as c:
        yield c


def collection(store: VectorStore, partitions: int = 1) -> Collection:
    return store.create_collection(name=f"t_{uuid.uuid4().hex[:12]}", dimensions=2, partitions=partitions)


def fill(conn: psycopg.Connection[Any], c: Collection, extra: dict[str, Any] | None = None) -> None:
    """ROWS rows: price i, taken one hour apart from 2024-01-01, sku "sku00000"...; ``extra`` on each."""
    conn.execute(
        sql.SQL(
            """
            INSERT INTO {} (external_id, metadata)
            SELECT i::text, jsonb_build_object(
                'price', i,
                'taken', to_char(timestamp '2024-01-01' + i * interval '1 hour', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'),
                'sku', 'sku' || lpad(i::text, 5, '0')) || %s::jsonb
            FROM generate_series(0, %s - 1) AS i
            """
        ).format(c.table),
        (json.dumps(extra or {}), ROWS),
    )


def plan_nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from plan_nodes(child)


def explain(conn: psycopg.Connection[Any], c: Collection, flt: dict[str, Any]) -> list[dict[str, Any]]:
    compiled = compile_filter(flt)
    query = sql.SQL("EXPLAIN (FORMAT JSON) SELECT id FROM {} WHERE {}").format(c.table, compiled.where)
    row = conn.execute(query, compiled.params).fetchone()
    assert row is not None
    return list(plan_nodes(row[0][0]["Plan"]))


def indexes_scanned(nodes: list[dict[str, Any]]) -> set[str]:
    return {n["Index Name"] for n in nodes if n["Node Type"] in ("Index Scan", "Bitmap Index Scan")}


def count(conn: psycopg.Connection[Any], c: Collection, flt: dict[str, Any]) -> int:
    compiled = compile_filter(flt)
    row = conn.execute(
        sql.SQL("SELECT count(*) FROM {} WHERE {}").format(c.table, compiled.where), compiled.params
    ).fetchone()
    assert row is not None
    return int(row[0])


def expected_indexes(c: Collection, field: str, kind: Any) -> set[str]:
    """What a range on ``field`` scans: its typed index and the field's lists index (each partition's)."""
    if c.partitions == 1:
        return {index_name(c, field, kind), lists_index_name(c, field)}
    return {index_name(c, field, kind, partition=i) for i in range(c.partitions)} | {
        lists_index_name(c, field, partition=i) for i in range(c.partitions)
    }


# A 0.5%-selective range on each type (20 of 4,000 rows).
RANGES: list[tuple[str, Any, dict[str, Any]]] = [
    ("price", "number", {"price": {"$gte": 1000, "$lt": 1020}}),
    ("taken", "timestamp", {"taken": {"$gte": "2024-02-12T16:00:00Z", "$lt": "2024-02-13T12:00:00+00:00"}}),
    ("sku", "keyword", {"sku": {"$gte": "sku01000", "$lt": "sku01020"}}),
]


@pytest.mark.parametrize("partitions", [1, 3])
def test_the_planner_uses_a_typed_index_for_a_selective_range(
    module_store: VectorStore, conn: psycopg.Connection[Any], partitions: int
) -> None:
    c = collection(module_store, partitions)
    fill(conn, c)
    for field, kind, flt in RANGES:
        assert indexes_scanned(explain(conn, c, flt)) == set()
        index = metadata_indexes.create(conn, c, field, kind)
        assert (index.field, index.type, index.valid) == (field, kind, True)
        assert index.size_bytes > 0
        assert indexes_scanned(explain(conn, c, flt)) == expected_indexes(c, field, kind)
        assert count(conn, c, flt) == 20


@pytest.mark.parametrize("partitions", [1, 3])
def test_a_range_on_a_sparse_field_scans_its_indexes_not_the_table(
    module_store: VectorStore, conn: psycopg.Connection[Any], partitions: int
) -> None:
    """A field most rows lack (a photo's date taken among notes): the range's list branch is served by
    the lists index beside the typed one, so both branches are index scans, and lists still match."""
    c = collection(module_store, partitions)
    conn.execute(
        sql.SQL(
            "INSERT INTO {} (external_id, metadata) SELECT i::text, CASE WHEN i % 100 = 0 "
            "THEN jsonb_build_object('price', i) WHEN i % 997 = 1 THEN jsonb_build_object('price', "
            "jsonb_build_array(i, i + 1)) ELSE '{{}}'::jsonb END FROM generate_series(0, 19999) AS i"
        ).format(c.table)
    )
    flt = {"price": {"$gte": 1000, "$lt": 3000}}
    metadata_indexes.create(conn, c, "price", "number")
    assert indexes_scanned(explain(conn, c, flt)) == expected_indexes(c, "price", "number")
    expected = {str(i) for i in range(1000, 3000, 100)} | {
        str(i) for i in range(0, 20000) if i % 997 == 1 and 999 <= i < 3000
    }
    rows = conn.execute(
        sql.SQL("SELECT external_id FROM {} WHERE {}").format(c.table, compile_filter(flt).where),
        compile_filter(flt).params,
    ).fetchall()
    assert {r[0] for r in rows} == expected


def test_a_generic_plan_uses_the_typed_index_too(module_store: VectorStore, conn: psycopg.Connection[Any]) -> None:
    """Field names are literals in the SQL, so the expression matches the index's even when the
    values are unknown at planning time (a prepared statement's generic plan)."""
    c = collection(module_store)
    fill(conn, c)
    index = metadata_indexes.create(conn, c, "price", "number")
    compiled = compile_filter({"price": {"$gte": 1000, "$lt": 1020}})
    text = compiled.where.as_string(conn)
    for n, name in enumerate(compiled.params, start=1):
        text = text.replace(f"%({name})s", f"${n}")
    name = f"p_{uuid.uuid4().hex[:8]}"
    prepare = sql.SQL("PREPARE {} AS SELECT id FROM {} WHERE {}")
    conn.execute(prepare.format(sql.Identifier(name), c.table, sql.SQL(text)))
    with conn.transaction():
        conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        row = conn.execute(
            sql.SQL("EXPLAIN (FORMAT JSON) EXECUTE {}(1000, 1020)").format(sql.Identifier(name))
        ).fetchone()
    assert row is not None
    nodes = list(plan_nodes(row[0][0]["Plan"]))
    assert indexes_scanned(nodes) == {index.name, lists_index_name(c, "price")}
    assert any("$1" in node.get("Index Cond", "") for node in nodes), nodes


@pytest.mark.parametrize("partitions", [1, 2])
def test_indexes_are_listed_and_dropped(
    module_store: VectorStore, conn: psycopg.Connection[Any], partitions: int
) -> None:
    c = collection(module_store, partitions)
    fill(conn, c)
    metadata_indexes.create(conn, c, "taken", "timestamp")
    metadata_indexes.create(conn, c, "price", "number")
    listed = metadata_indexes.list(conn, c)
    assert sorted((i.field, i.type, i.valid) for i in listed) == [
        ("price", "number", True),
        ("taken", "timestamp", True),
    ]
    assert all(i.size_bytes > 0 for i in listed)
    assert metadata_indexes.drop(conn, c, "price", "number") is True
    assert [(i.field, i.type) for i in metadata_indexes.list(conn, c)] == [("taken", "timestamp")]
    assert metadata_indexes.drop(conn, c, "price", "number") is False
    left = conn.execute(
        "SELECT count(*) FROM pg_class WHERE relname = ANY(%s)",
        ([index_name(c, "price", "number"), *expected_indexes(c, "price", "number")],),
    ).fetchone()
    assert left == (0,)
    assert lists_index_name(c, "taken") in {r[0] for r in conn.execute("SELECT relname FROM pg_class").fetchall()}
    lists_left = conn.execute("SELECT count(*) FROM pg_class WHERE relname = %s", (lists_index_name(c, "price"),))
    assert lists_left.fetchone() == (0,)  # the field's last typed index took its lists index along
    assert indexes_scanned(explain(conn, c, RANGES[0][2])) == set()


def test_creating_a_valid_index_again_changes_nothing(module_store: VectorStore, conn: psycopg.Connection[Any]) -> None:
    c = collection(module_store)
    fill(conn, c)
    first = metadata_indexes.create(conn, c, "sku", "keyword")
    oid = conn.execute("SELECT to_regclass(%s)::oid", (first.name,)).fetchone()
    assert metadata_indexes.create(conn, c, "sku", "keyword") == first
    assert conn.execute("SELECT to_regclass(%s)::oid", (first.name,)).fetchone() == oid


def test_an_invalid_index_left_by_a_failed_build_is_listed_and_built_again(
    module_store: VectorStore, conn: psycopg.Connection[Any]
) -> None:
    c = collection(module_store)
    fill(conn, c, extra={"dup": 7})
    name = index_name(c, "dup", "number")
    expression = typed_expression("number", (sql.Literal("dup"),))
    # Every row has the same value: a unique build fails after creating its (invalid) index.
    unique = sql.SQL("CREATE UNIQUE INDEX CONCURRENTLY {} ON {} (({}))")
    with pytest.raises(psycopg.errors.UniqueViolation):
        conn.execute(unique.format(sql.Identifier(name), c.table, expression))
    [left] = metadata_indexes.list(conn, c)
    assert (left.name, left.field, left.valid) == (name, "dup", False)
    rebuilt = metadata_indexes.create(conn, c, "dup", "number")
    assert (rebuilt.name, rebuilt.valid) == (name, True)
    row = conn.execute("SELECT indisunique FROM pg_index WHERE indexrelid = to_regclass(%s)", (name,)).fetchone()
    assert row == (False,)


def test_an_interrupted_partitioned_build_is_finished(module_store: VectorStore, conn: psycopg.Connection[Any]) -> None:
    c = collection(module_store, partitions=3)
    fill(conn, c)
    expression = typed_expression("number", (sql.Literal("price"),))
    parent = index_name(c, "price", "number")
    # What a build stopped after the first partition leaves: the parent's index and one unattached.
    conn.execute(sql.SQL("CREATE INDEX {} ON ONLY {} (({}))").format(sql.Identifier(parent), c.table, expression))
    first = index_name(c, "price", "number", partition=0)
    part = sql.Identifier(c.partition_tables()[0])
    conn.execute(sql.SQL("CREATE INDEX CONCURRENTLY {} ON {} (({}))").format(sql.Identifier(first), part, expression))
    [left] = metadata_indexes.list(conn, c)
    assert (left.name, left.valid) == (parent, False)
    finished = metadata_indexes.create(conn, c, "price", "number")
    assert finished.valid
    attached = conn.execute("SELECT count(*) FROM pg_inherits WHERE inhparent = to_regclass(%s)", (parent,)).fetchone()
    assert attached == (3,)
    assert indexes_scanned(explain(conn, c, RANGES[0][2])) == expected_indexes(c, "price", "number")


@pytest.mark.parametrize(
    "field",
    [
        "x'); DROP TABLE memstore_collections; --",
        'a"b\\c',
        "50% off",
        "ünïcødé 😀",
        "f" * MAX_FIELD_LENGTH,
        "two\nlines",
    ],
)
def test_any_field_name_is_quoted_and_its_index_is_used(
    module_store: VectorStore, conn: psycopg.Connection[Any], field: str
) -> None:
    c = collection(module_store)
    fill(conn, c, extra={field: 5})
    conn.execute(
        sql.SQL("UPDATE {} SET metadata = jsonb_set(metadata, ARRAY[%s], to_jsonb(id)) WHERE id %% 100 = 0").format(
            c.table
        ),
        (field,),
    )
    index = metadata_indexes.create(conn, c, field, "number")
    assert len(index.name.encode()) <= 63
    assert [(i.field, i.type, i.valid) for i in metadata_indexes.list(conn, c)] == [(field, "number", True)]
    assert conn.execute("SELECT count(*) FROM memstore_collections").fetchone() is not None
    # A name holding "%" goes in as a parameter: a plan made for the values still uses the index.
    flt = {field: {"$gt": 5}}
    assert indexes_scanned(explain(conn, c, flt)) == {index.name, metadata_indexes.lists_index_name(c, field)}
    assert count(conn, c, flt) == ROWS // 100  # ids 100, 200, ..., 4000
    assert metadata_indexes.drop(conn, c, field, "number") is True
    assert metadata_indexes.list(conn, c) == []


def test_a_build_in_progress_elsewhere_is_a_conflict(
    module_store: VectorStore, conn: psycopg.Connection[Any], engine: sa.Engine
) -> None:
    c = collection(module_store)
    key = locks.index_key(index_name(c, "price", "number"))
    with dedicated_connection(engine, application_name="test-other-builder") as other:
        other.execute("SELECT pg_advisory_lock(hashtext(%s))", (key,))
        with pytest.raises(ConflictError, match="being built or dropped"):
            metadata_indexes.create(conn, c, "price", "number")
    assert metadata_indexes.list(conn, c) == []


def test_index_names_are_distinct_and_fit_in_63_bytes() -> None:
    c = Collection(
        id=10**18,
        name="x" * 48,
        table_name=f"c{10**18}_" + "x" * 48,
        dimensions=2,
        metric="cosine",
        hnsw_m=16,
        hnsw_ef_construction=64,
        default_ef_search=40,
        partitions=256,
    )
    fields = ["price", "Price", "p" * 20, "p" * 21, "_p", "p.q", "f" * MAX_FIELD_LENGTH, "😀"]
    names = [
        index_name(c, field, kind, partition=partition)
        for field in fields
        for kind in metadata_indexes.INDEX_TYPES
        for partition in (None, 0, 255)
    ]
    assert len(set(names)) == len(names)
    assert all(len(n.encode()) <= 63 and re.fullmatch(r"memstore_mx_c[0-9]+_[a-z0-9_]+", n) for n in names), names


@pytest.mark.parametrize("bad", ["", "f" * (MAX_FIELD_LENGTH + 1), "a\x00b", 5, None, "\ud800"])
def test_a_bad_field_is_refused(bad: Any) -> None:
    with pytest.raises(InvalidInputError, match="field"):
        check_field(bad)


@pytest.mark.parametrize("bad", ["date", "NUMBER", "", None])
def test_a_bad_type_is_refused(bad: Any) -> None:
    with pytest.raises(InvalidInputError, match="type must be one of number, timestamp, keyword"):
        check_type(bad)


def test_a_connection_inside_a_transaction_is_refused(module_store: VectorStore, engine: sa.Engine) -> None:
    c = collection(module_store)
    with (
        dedicated_connection(engine, application_name="test-not-autocommit", autocommit=False) as tx,
        pytest.raises(ValueError, match="autocommit"),
    ):
        metadata_indexes.create(tx, c, "price", "number")


@pytest.mark.parametrize("partitions", [1, 2])
def test_a_nested_field_is_indexed_by_its_path_and_serves_its_filters(
    module_store: VectorStore, conn: psycopg.Connection[Any], partitions: int
) -> None:
    """A photo's date taken (``metadata.image.taken_at``, sparse): a typed index on its path serves a
    nested range filter through the index and its lists index, and is listed by its path."""
    c = collection(module_store, partitions)
    conn.execute(
        sql.SQL(
            "INSERT INTO {} (external_id, metadata) SELECT i::text, CASE WHEN i % 50 = 0 THEN jsonb_build_object("
            "'image', jsonb_build_object('taken_at', to_char(timestamp '2024-01-01' + i * interval '1 hour', "
            "'YYYY-MM-DD\"T\"HH24:MI:SS'))) ELSE jsonb_build_object('n', i) END FROM generate_series(0, 9999) AS i"
        ).format(c.table)
    )
    index = metadata_indexes.create(conn, c, ["image", "taken_at"], "timestamp")
    assert (index.field, index.type, index.valid) == (["image", "taken_at"], "timestamp", True)
    assert [i.field for i in metadata_indexes.list(conn, c)] == [["image", "taken_at"]]
    flt = {"image": {"taken_at": {"$gte": "2024-01-05", "$lt": "2024-01-07"}}}
    scanned = indexes_scanned(explain(conn, c, flt))
    if partitions == 1:
        assert scanned == {index.name, lists_index_name(c, ["image", "taken_at"])}
    else:
        assert scanned == {index_name(c, ["image", "taken_at"], "timestamp", partition=i) for i in range(2)} | {
            lists_index_name(c, ["image", "taken_at"], partition=i) for i in range(2)
        }
    assert count(conn, c, flt) == len([i for i in range(0, 10000, 50) if 96 <= i < 144])
    # A top-level key that merely contains a dot is another field, with another index name.
    assert index_name(c, "image.taken_at", "timestamp") != index.name
    assert metadata_indexes.drop(conn, c, ["image", "taken_at"], "timestamp") is True
    assert metadata_indexes.list(conn, c) == []
    left = conn.execute("SELECT count(*) FROM pg_class WHERE relname LIKE %s", (f"memstore_mx_c{c.id}_%",)).fetchone()
    assert left == (0,)


@pytest.mark.parametrize("bad", [[], ["a"] * 9, ["a", ""], ["a", 5], [["a"]]])
def test_a_bad_path_is_refused(bad: Any) -> None:
    with pytest.raises(InvalidInputError):
        check_field(bad)


def test_a_field_is_named_as_a_filter_names_it() -> None:
    """A string is a key or a dotted path (``field_paths.split_names``), a list its keys each whole;
    the API shows a path as a list, and a key as itself only when a string of it names it."""
    check, shown = metadata_indexes.check_field, metadata_indexes._shown
    assert check("taken") == ("taken",) and shown(("taken",)) == "taken"
    assert check("image.taken_at") == check(["image", "taken_at"]) == ("image", "taken_at")
    assert check("price\\.usd") == check(["price.usd"]) == ("price.usd",)
    assert shown(("price.usd",)) == ["price.usd"] and shown(("image", "taken_at")) == ["image", "taken_at"]
    assert shown(("a\\b",)) == "a\\b" and check("a\\b") == ("a\\b",)  # a backslash not before a dot
    for name in ("taken", "a\\b", "price.usd", "a.", "$x", "a.$b"):
        path = (name,)
        assert check(shown(path)) == path, name  # what is shown names the same field again
    longest = ".".join(["\\." * MAX_FIELD_LENGTH] * 8)  # eight keys of dots, escaped: the longest path
    assert check(longest) == ("." * MAX_FIELD_LENGTH,) * 8
    for bad in ("a..b", "a.", "x" * (8 * (2 * MAX_FIELD_LENGTH + 1) + 1), ".".join(["k"] * 9)):
        with pytest.raises(InvalidInputError):
            check(bad)
