"""A hypothesis state machine drives the store against a brute-force numpy model.

Upserts, deletes (by id and by filter), metadata updates, searches, VACUUM and compaction (a
concurrent rebuild, then VACUUM) run in random order. After every step the database must agree with
the model: the same items with exactly the same metadata and vectors; exact search equal to numpy's;
index search within a recall bound of it.
"""

from __future__ import annotations

import uuid
from typing import Any

import numpy as np
import psycopg
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from psycopg import sql

from memstore.db.core import libpq_url
from memstore.errors import ItemNotFoundError
from memstore.models import ItemIn
from memstore.store import VectorStore

DIMS = 8
IDS = [f"k{i}" for i in range(40)]
TAGS = ["red", "green", "blue"]
# On tables this small the planner may answer from the heap (exact); the index path must do at least this well.
MIN_RECALL = 0.8

vectors = st.lists(st.floats(-10, 10, allow_nan=False, width=32), min_size=DIMS, max_size=DIMS).filter(
    lambda v: float(np.linalg.norm(v)) > 1e-3
)
items = st.lists(st.tuples(st.sampled_from(IDS), vectors, st.sampled_from(TAGS)), min_size=1, max_size=40)


def _cosine_distances(matrix: np.ndarray, q: np.ndarray) -> np.ndarray:
    m = matrix.astype(np.float64)
    qq = q.astype(np.float64)
    return 1.0 - (m @ qq) / (np.linalg.norm(m, axis=1) * np.linalg.norm(qq))


class StoreMachine(RuleBasedStateMachine):
    store: VectorStore
    admin_url: str

    def __init__(self) -> None:
        super().__init__()
        self.name = f"m_{uuid.uuid4().hex[:12]}"
        self.collection = self.store.create_collection(name=self.name, dimensions=DIMS, partitions=2)
        self.model: dict[str, tuple[np.ndarray, dict[str, Any]]] = {}

    def teardown(self) -> None:
        self.store.drop_collection(name=self.name)

    @rule(batch=items)
    def upsert(self, batch: list[tuple[str, list[float], str]]) -> None:
        results = self.store.upsert_items(
            collection=self.name,
            items=[ItemIn(vector=v, external_id=eid, metadata={"tag": tag}) for eid, v, tag in batch],
        )
        assert [r.external_id for r in results] == [eid for eid, _, _ in batch]
        for eid, v, tag in batch:
            self.model[eid] = (np.asarray(v, dtype=np.float32), {"tag": tag})

    @precondition(lambda self: bool(self.model))
    @rule(data=st.data())
    def delete_some(self, data: st.DataObject) -> None:
        chosen = data.draw(st.lists(st.sampled_from(sorted(self.model)), min_size=1, max_size=5, unique=True))
        removed = self.store.delete_items(collection=self.name, external_ids=chosen)
        assert removed == len(chosen)
        for eid in chosen:
            del self.model[eid]

    @rule(tag=st.sampled_from(TAGS))
    def delete_by_filter(self, tag: str) -> None:
        expected = [eid for eid, (_, meta) in self.model.items() if meta["tag"] == tag]
        assert self.store.delete_items(collection=self.name, filter={"tag": tag}) == len(expected)
        for eid in expected:
            del self.model[eid]

    @rule(eid=st.sampled_from(IDS), extra=st.integers(0, 5))
    def merge_metadata(self, eid: str, extra: int) -> None:
        if eid not in self.model:
            with pytest.raises(ItemNotFoundError):
                self.store.update_item(
                    collection=self.name, external_id=eid, metadata={"n": extra}, merge_metadata=True
                )
            return
        item = self.store.update_item(collection=self.name, external_id=eid, metadata={"n": extra}, merge_metadata=True)
        vec, meta = self.model[eid]
        self.model[eid] = (vec, {**meta, "n": extra})
        assert item.metadata == self.model[eid][1]

    @rule(q=vectors, k=st.integers(1, 15), tag=st.none() | st.sampled_from(TAGS))
    def search(self, q: list[float], k: int, tag: str | None) -> None:
        query = np.asarray(q, dtype=np.float32)
        candidates = [(eid, v) for eid, (v, meta) in self.model.items() if tag is None or meta["tag"] == tag]
        flt = None if tag is None else {"tag": tag}
        exact = self.store.search(collection=self.name, vector=query, k=k, filter=flt, exact=True)
        indexed = self.store.search(collection=self.name, vector=query, k=k, filter=flt)
        expected_n = min(k, len(candidates))
        assert len(exact) == expected_n
        if not candidates:
            assert indexed == []
            return
        ids = [eid for eid, _ in candidates]
        dists = _cosine_distances(np.stack([v for _, v in candidates]), query)
        order = np.argsort(dists, kind="stable")
        kth = dists[order[expected_n - 1]]
        # Exact search returns the k nearest: every returned distance is within the k-th (ties allowed).
        for r in exact:
            assert r.distance == pytest.approx(dists[ids.index(r.external_id)], abs=1e-5)
            assert r.distance <= kth + 1e-5
            assert r.metadata == self.model[r.external_id][1]
        truth = {ids[i] for i in order[:expected_n]}
        got = {r.external_id for r in indexed}
        assert all(eid in self.model for eid in got)
        assert len(got & truth) >= MIN_RECALL * expected_n - 1e-9

    @rule()
    def vectors_are_stored_exactly(self) -> None:
        for eid, (vec, _) in self.model.items():
            item = self.store.get_item(collection=self.name, external_id=eid, with_vector=True)
            assert item.vector is not None
            assert np.array_equal(item.vector, vec)

    @rule()
    def vacuum(self) -> None:
        self._maintenance("VACUUM {}")

    @rule()
    def compact(self) -> None:
        for part in self.collection.partition_tables():
            self._maintenance("REINDEX INDEX CONCURRENTLY {}", f"{part}_hnsw")
        self._maintenance("VACUUM {}")

    def _maintenance(self, statement: str, target: str | None = None) -> None:
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(sql.SQL(statement).format(sql.Identifier(target or self.collection.table_name)))

    @invariant()
    def stored_set_equals_model(self) -> None:
        stored = {}
        after = 0
        while True:
            page = self.store.list_items(collection=self.name, after_id=after, limit=100)
            if not page:
                break
            for item in page:
                stored[item.external_id] = item.metadata
            after = page[-1].id
        assert stored == {eid: meta for eid, (_, meta) in self.model.items()}


@pytest.mark.slow
def test_store_agrees_with_a_numpy_model(store: VectorStore, database_url: str) -> None:
    StoreMachine.store = store
    StoreMachine.admin_url = libpq_url(database_url)
    runner = StoreMachine.TestCase
    runner.settings = settings(
        max_examples=12,
        stateful_step_count=25,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    runner().runTest()
