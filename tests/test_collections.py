"""Collections against a real PostgreSQL: naming, parameters, layout, lifecycle."""

from __future__ import annotations

import threading
import time

import pytest
import sqlalchemy as sa
from psycopg import sql

from memstore.catalog.collections import HNSW_MAX_DIMENSIONS
from memstore.db.core import dedicated_connection
from memstore.errors import CollectionExistsError, CollectionNotFoundError, InvalidInputError
from memstore.store import VectorStore


def test_create_get_list_drop(store: VectorStore, collection_name: str) -> None:
    created = store.create_collection(name=collection_name, dimensions=4, metric="l2", hnsw_m=8)
    assert created.name == collection_name
    assert (created.dimensions, created.metric, created.hnsw_m) == (4, "l2", 8)
    assert store.get_collection(name=collection_name) == created
    assert collection_name in [c.name for c in store.list_collections()]
    store.drop_collection(name=collection_name)
    with pytest.raises(CollectionNotFoundError):
        store.get_collection(name=collection_name)
    with store.db.write() as conn:
        assert conn.execute("SELECT to_regclass(%s)", (created.table_name,)).fetchone() == (None,)


def test_a_drop_waits_for_a_writer_that_then_queues_an_item(
    store: VectorStore, engine: sa.Engine, collection_name: str
) -> None:
    """A writer that holds the table and then writes its queue row (a reference to the registry row)
    while the collection is dropped: the drop waits for it and then drops, neither fails."""
    c = store.create_collection(name=collection_name, dimensions=2)
    errors: list[BaseException] = []
    with dedicated_connection(engine, application_name="test-drop-writer", autocommit=False) as writer:
        (item_id,) = writer.execute(
            sql.SQL("INSERT INTO {} (external_id) VALUES ('a') RETURNING id").format(c.table)
        ).fetchone() or (None,)

        def drop() -> None:
            try:
                store.drop_collection(name=collection_name)
            except BaseException as e:
                errors.append(e)

        dropping = threading.Thread(target=drop)
        dropping.start()
        with dedicated_connection(engine, application_name="test-drop-watch") as watch:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:  # the drop waits on a lock (the writer's)
                waiting = watch.execute(
                    "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid) "
                    "WHERE NOT l.granted AND a.pid <> pg_backend_pid() AND a.datname = current_database()"
                ).fetchone()
                if waiting and waiting[0]:
                    break
                time.sleep(0.02)
            else:
                pytest.fail("the drop never waited for the writer")
        writer.execute("INSERT INTO memstore_ingest_queue (collection_id, item_id) VALUES (%s, %s)", (c.id, item_id))
        writer.commit()
        dropping.join(timeout=60)
    assert not dropping.is_alive()
    assert errors == []
    with pytest.raises(CollectionNotFoundError):
        store.get_collection(name=collection_name)
    with store.db.write() as conn:
        assert conn.execute("SELECT to_regclass(%s)", (c.table_name,)).fetchone() == (None,)
        assert conn.execute(
            "SELECT count(*) FROM memstore_ingest_queue WHERE collection_id = %s", (c.id,)
        ).fetchone() == (0,)


def test_duplicate_name_is_a_conflict(store: VectorStore, collection_name: str) -> None:
    store.create_collection(name=collection_name, dimensions=4)
    with pytest.raises(CollectionExistsError):
        store.create_collection(name=collection_name, dimensions=8)
    assert store.get_collection(name=collection_name).dimensions == 4


@pytest.mark.parametrize(
    "name",
    ["", "Upper", "1starts_with_digit", "has-dash", "has space", 'quote"d', "drop table x;", "é", "a" * 49, None, 7],
)
def test_invalid_names_are_refused_and_nothing_is_written(store: VectorStore, name: object) -> None:
    before = len(store.list_collections())
    with pytest.raises(InvalidInputError, match="invalid collection name"):
        store.create_collection(name=name, dimensions=4)  # type: ignore[arg-type]
    assert len(store.list_collections()) == before


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"dimensions": 0}, "positive"),
        ({"dimensions": HNSW_MAX_DIMENSIONS + 1}, "HNSW limit"),
        ({"dimensions": 4, "metric": "hamming"}, "metric"),
        ({"dimensions": 4, "hnsw_m": 1}, "hnsw_m"),
        ({"dimensions": 4, "hnsw_m": 16, "hnsw_ef_construction": 20}, "twice"),
        ({"dimensions": 4, "ef_search": 0}, "ef_search"),
        ({"dimensions": 4, "partitions": 0}, "partitions"),
    ],
)
def test_invalid_parameters_are_refused(
    store: VectorStore, collection_name: str, kwargs: dict[str, object], message: str
) -> None:
    with pytest.raises(InvalidInputError, match=message):
        store.create_collection(name=collection_name, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(CollectionNotFoundError):
        store.get_collection(name=collection_name)


def test_partitioned_layout_has_an_hnsw_index_per_partition(store: VectorStore, collection_name: str) -> None:
    c = store.create_collection(name=collection_name, dimensions=4, partitions=4)
    assert c.partition_tables() == [f"{c.table_name}_p{i}" for i in range(4)]
    with store.db.write() as conn:
        rows = conn.execute(
            """
            SELECT tbl.relname, idx.relname, am.amname, i.indisvalid
            FROM pg_index i
            JOIN pg_class idx ON idx.oid = i.indexrelid
            JOIN pg_class tbl ON tbl.oid = i.indrelid
            JOIN pg_am am ON am.oid = idx.relam
            WHERE tbl.relname = ANY(%s) AND am.amname = 'hnsw'
            """,
            (c.partition_tables(),),
        ).fetchall()
    assert sorted(r[0] for r in rows) == c.partition_tables()
    assert all(r[1] == f"{r[0]}_hnsw" and r[3] for r in rows)


def test_max_hnsw_dimensions_is_accepted(store: VectorStore, collection_name: str) -> None:
    c = store.create_collection(name=collection_name, dimensions=HNSW_MAX_DIMENSIONS)
    assert c.dimensions == HNSW_MAX_DIMENSIONS
