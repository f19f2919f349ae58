"""Items: upsert (single and COPY BINARY bulk), idempotency, reads, updates, deletes, bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest

from memstore.errors import (
    CollectionNotFoundError,
    DimensionMismatchError,
    InvalidInputError,
    ItemNotFoundError,
)
from memstore.models import ItemIn
from memstore.store import VectorStore
from memstore.store.item_writes import COPY_THRESHOLD


@pytest.fixture(params=[1, 3], ids=["plain", "partitioned"])
def coll(request: pytest.FixtureRequest, store: VectorStore, collection_name: str) -> str:
    store.create_collection(name=collection_name, dimensions=8, partitions=request.param)
    return collection_name


def _items(n: int, seed: int = 0, prefix: str = "e") -> list[ItemIn]:
    rng = np.random.default_rng(seed)
    return [
        ItemIn(vector=rng.normal(size=8), external_id=f"{prefix}{i}", metadata={"i": i, "parity": i % 2})
        for i in range(n)
    ]


def _count(store: VectorStore, name: str) -> int:
    return store.collection_stats(name=name).items


@pytest.mark.parametrize("n", [5, COPY_THRESHOLD + 40], ids=["direct", "copy"])
def test_upsert_many_then_resend_is_idempotent(store: VectorStore, coll: str, n: int) -> None:
    first = store.upsert_items(collection=coll, items=_items(n))
    assert [r.status for r in first] == ["created"] * n
    assert [r.external_id for r in first] == [f"e{i}" for i in range(n)]
    assert len({r.id for r in first}) == n
    again = store.upsert_items(collection=coll, items=_items(n))
    assert [r.status for r in again] == ["unchanged"] * n
    assert [r.id for r in again] == [r.id for r in first]
    assert _count(store, coll) == n


def test_changed_items_are_updated_in_place(store: VectorStore, coll: str) -> None:
    items = _items(COPY_THRESHOLD + 10)
    first = store.upsert_items(collection=coll, items=items)
    changed = [ItemIn(vector=np.ones(8), external_id=it.external_id, metadata=it.metadata) for it in items[:3]]
    result = store.upsert_items(collection=coll, items=changed + items[3:])
    assert [r.status for r in result[:3]] == ["updated"] * 3
    assert all(r.status == "unchanged" for r in result[3:])
    assert [r.id for r in result] == [r.id for r in first]
    got = store.get_item(collection=coll, external_id="e0", with_vector=True)
    assert got.vector is not None and np.allclose(got.vector, 1.0)


@pytest.mark.parametrize("n", [4, COPY_THRESHOLD + 10], ids=["direct", "copy"])
def test_a_change_of_metadata_alone_is_reported_as_metadata(store: VectorStore, coll: str, n: int) -> None:
    """As for queued texts: "metadata" when the vector, the text and the original stayed as they were;
    "updated" when any of them changed; "unchanged" when nothing did."""
    items = _items(n)
    store.upsert_items(collection=coll, items=items)
    edits = [
        ItemIn(vector=items[0].vector, external_id="e0", metadata={"i": 0, "new": True}),  # metadata alone
        ItemIn(vector=items[1].vector, external_id="e1", metadata=items[1].metadata, text="now with a text"),
        ItemIn(vector=np.ones(8), external_id="e2", metadata={"i": 2, "new": True}),  # vector and metadata
        items[3],
    ]
    result = store.upsert_items(collection=coll, items=edits + items[4:])
    assert [r.status for r in result[:4]] == ["metadata", "updated", "updated", "unchanged"]
    assert all(r.status == "unchanged" for r in result[4:])
    assert store.get_item(collection=coll, external_id="e0").metadata == {"i": 0, "new": True}
    loaded = store.bulk_load(
        collection=coll, items=[ItemIn(vector=items[0].vector, external_id="e0", metadata={"i": 0, "again": 1})]
    )
    assert (loaded.created, loaded.updated, loaded.unchanged) == (0, 1, 0)  # a load counts it as a change


def test_duplicate_external_ids_in_one_batch_last_wins(store: VectorStore, coll: str) -> None:
    items = [
        ItemIn(vector=np.zeros(8) + 1, external_id="dup", metadata={"v": 1}),
        ItemIn(vector=np.zeros(8) + 2, external_id="dup", metadata={"v": 2}),
    ]
    result = store.upsert_items(collection=coll, items=items)
    assert result[0].id == result[1].id
    assert store.get_item(collection=coll, external_id="dup").metadata == {"v": 2}
    assert _count(store, coll) == 1


def test_missing_external_id_gets_a_generated_one(store: VectorStore, coll: str) -> None:
    r = store.upsert_item(collection=coll, vector=np.ones(8))
    assert len(r.external_id) == 32
    assert store.get_item(collection=coll, id=r.id).external_id == r.external_id


@pytest.mark.parametrize(
    "bad_vector, error",
    [
        (np.ones(7), DimensionMismatchError),
        (np.ones(9), DimensionMismatchError),
        ([0.0] * 7 + [math.nan], InvalidInputError),
        ([0.0] * 7 + [math.inf], InvalidInputError),
        (["x"] * 8, InvalidInputError),
    ],
)
@pytest.mark.parametrize("batch", [2, COPY_THRESHOLD + 5], ids=["direct", "copy"])
def test_one_bad_vector_refuses_the_whole_batch(
    store: VectorStore, coll: str, bad_vector: object, error: type[Exception], batch: int
) -> None:
    items = _items(batch)
    items[-1] = ItemIn(vector=bad_vector, external_id="bad")
    with pytest.raises(error):
        store.upsert_items(collection=coll, items=items)
    assert _count(store, coll) == 0


@pytest.mark.parametrize("bad_id", ["", "x" * 513, "nul\x00", 17])
def test_bad_external_ids_are_refused(store: VectorStore, coll: str, bad_id: object) -> None:
    with pytest.raises(InvalidInputError, match="external_id"):
        store.upsert_items(collection=coll, items=[ItemIn(vector=np.ones(8), external_id=bad_id)])  # type: ignore[arg-type]
    assert _count(store, coll) == 0


def test_unknown_collection(store: VectorStore) -> None:
    with pytest.raises(CollectionNotFoundError):
        store.upsert_item(collection="no_such_collection", vector=[1.0])
    with pytest.raises(InvalidInputError, match="invalid collection name"):
        store.upsert_item(collection="Robert'); DROP TABLE x;--", vector=[1.0])


def test_get_list_and_page(store: VectorStore, coll: str) -> None:
    store.upsert_items(collection=coll, items=_items(25))
    page1 = store.list_items(collection=coll, limit=10)
    page2 = store.list_items(collection=coll, limit=10, after_id=page1[-1].id)
    page3 = store.list_items(collection=coll, limit=10, after_id=page2[-1].id)
    ids = [it.id for it in page1 + page2 + page3]
    assert len(ids) == 25 and ids == sorted(ids) and len(set(ids)) == 25
    only = store.list_items(collection=coll, external_id="e7")
    assert [it.external_id for it in only] == ["e7"]
    with pytest.raises(ItemNotFoundError):
        store.get_item(collection=coll, id=10**12)


def test_update_metadata_replace_merge_and_vector(store: VectorStore, coll: str) -> None:
    r = store.upsert_item(collection=coll, vector=np.ones(8), external_id="u", metadata={"a": 1})
    assert store.update_item(collection=coll, id=r.id, metadata={"b": 2}).metadata == {"b": 2}
    assert store.update_item(collection=coll, id=r.id, metadata={"c": 3}, merge_metadata=True).metadata == {
        "b": 2,
        "c": 3,
    }
    store.update_item(collection=coll, external_id="u", vector=np.arange(8))
    got = store.get_item(collection=coll, id=r.id, with_vector=True)
    assert got.vector is not None and got.vector.tolist() == list(range(8))
    with pytest.raises(DimensionMismatchError):
        store.update_item(collection=coll, id=r.id, vector=np.ones(3))
    with pytest.raises(InvalidInputError, match="nothing to update"):
        store.update_item(collection=coll, id=r.id)
    with pytest.raises(ItemNotFoundError):
        store.update_item(collection=coll, id=10**12, metadata={})


def test_delete_by_id_external_id_and_filter(store: VectorStore, coll: str) -> None:
    results = store.upsert_items(collection=coll, items=_items(20))
    store.delete_item(collection=coll, id=results[0].id)
    store.delete_item(collection=coll, external_id="e1")
    with pytest.raises(ItemNotFoundError):
        store.delete_item(collection=coll, id=results[0].id)
    removed = store.delete_items(collection=coll, filter={"parity": 0})
    assert removed == 9  # e2, e4, ... e18
    remaining = {it.external_id for it in store.list_items(collection=coll)}
    assert remaining == {f"e{i}" for i in range(3, 20, 2)}
    with pytest.raises(InvalidInputError, match="matches every item"):
        store.delete_items(collection=coll, filter={})
    with pytest.raises(InvalidInputError, match="exactly one"):
        store.delete_items(collection=coll, ids=[1], filter={"a": 1})


def test_bulk_upsert_uses_copy_binary(store: VectorStore, coll: str) -> None:
    """The bulk path stages rows with COPY; the staging table exists on the connection afterwards."""
    store.upsert_items(collection=coll, items=_items(COPY_THRESHOLD + 1))
    with store.db.write() as conn:
        # pg_class lists the temporary tables of every session of this database.
        copies = conn.execute(
            "SELECT count(*) FROM pg_class WHERE relname = 'memstore_stage3' AND relpersistence = 't'"
        ).fetchone()
    assert copies is not None and copies[0] >= 1


def test_stats_count_exactly_then_estimate_past_the_limit(store: VectorStore, coll: str) -> None:
    """Pending and failed come from the queue; items are counted up to the limit, estimated past it."""
    from memstore.queue import jobs
    from memstore.queue.jobs import PendingItem

    store.upsert_items(collection=coll, items=_items(60))
    c = store.get_collection(name=coll)
    with store.db.write() as conn:
        # In one transaction with the enqueue: not due for an hour, so that no ingest worker still
        # running in this test session (the API tests' server) claims them while they are counted.
        jobs._enqueue(
            conn,
            c,
            {f"t{i}": PendingItem(text=f"note {i}", external_id=f"t{i}") for i in range(4)},
            jobs.PRIORITY_DEFAULT,
        )
        conn.execute(
            "UPDATE memstore_ingest_queue SET not_before = now() + interval '1 hour' WHERE collection_id = %s",
            (c.id,),
        )
        conn.execute(
            "UPDATE memstore_ingest_queue SET status = 'failed' WHERE collection_id = %s "
            "AND item_id = (SELECT min(item_id) FROM memstore_ingest_queue WHERE collection_id = %s)",
            (c.id, c.id),
        )
    exact = store.collection_stats(name=coll)
    assert (exact.items, exact.ready, exact.pending, exact.failed, exact.counts_exact) == (64, 60, 3, 1, True)
    with store.db.write() as conn:
        for table in c.partition_tables():
            conn.execute(f'ANALYZE "{table}"')
    estimated = store.collection_stats(name=coll, exact_limit=10)
    assert not estimated.counts_exact and (estimated.pending, estimated.failed) == (3, 1)
    assert estimated.items == 64 and estimated.ready == 60  # ANALYZE of a table this small reads every row


def test_a_vector_written_by_hand_is_not_overwritten_by_a_queued_embedding(
    store: VectorStore, collection_name: str
) -> None:
    """PATCHing a vector onto an item still waiting for its embedding drops the queue row: a worker
    would otherwise overwrite the caller's vector, and the item would count as pending."""
    from memstore.queue import jobs
    from memstore.queue.jobs import PendingItem

    c = store.create_collection(name=collection_name, dimensions=3)
    [done] = jobs.enqueue(store.db, c, [PendingItem(text="waiting for the encoder", external_id="w")])
    store.update_item(collection=collection_name, id=done.id, vector=[1.0, 2.0, 3.0])
    with store.db.write() as conn:
        assert jobs.counts(conn, c)["pending"] == 0
    item = store.get_item(collection=collection_name, id=done.id, with_vector=True)
    assert item.status == "ready" and item.vector is not None and item.vector.tolist() == [1.0, 2.0, 3.0]


@pytest.mark.parametrize("n", [3, COPY_THRESHOLD + 5])
def test_new_items_get_ids_in_the_order_they_were_sent(store: VectorStore, coll: str, n: int) -> None:
    """Rows are written in external id order (so that batches sharing ids lock them in one order), but
    ids follow the request: a listing in id order is the order the items were sent in."""
    sent = _items(n)[::-1]  # e{n-1}, ..., e1, e0: against the external ids' order
    sent.insert(1, ItemIn(vector=np.ones(8), external_id=sent[0].external_id))  # a repeat: the last wins
    results = store.upsert_items(collection=coll, items=sent)
    ids = {r.external_id: r.id for r in results}
    order = list(dict.fromkeys(it.external_id for it in sent))
    assert [ids[e] for e in order] == sorted(ids.values())
    assert [it.external_id for it in store.list_items(collection=coll)] == order
    # An update keeps its id; new ones in the same batch still follow the request.
    again = store.upsert_items(collection=coll, items=[*_items(2, prefix="z")[::-1], _items(1, seed=9)[0]])
    assert again[1].id > again[0].id > max(ids.values()) and again[2].id == ids["e0"]
