"""Maintenance treats each embedding space's index as a target of its own: it is listed, its recall
is measured on its own vectors (the API's query samples belong to the default space), and it is
rebuilt online like any other index."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import psycopg
import pytest

from maintenance.recall import measure_recall
from maintenance.targets import targets_for
from maintenance.worker import MaintenanceWorker
from memstore.catalog.collections import Collection
from memstore.models import ItemIn
from memstore.store import VectorStore
from memstore.workers.space_pass import SpacePass
from tests.maintenance.maint_helpers import clustered, index_oid


def _ready_space(store: VectorStore, c: Collection, dims: int) -> Collection:
    """A space given every item's vector (they were stored as vectors), indexed by the space pass."""
    store.create_space(collection=c.name, name="other", model="some-model", dimensions=dims)
    ids = store.find_external_ids(collection=c.name, external_ids=[f"e{i}" for i in range(2000)])
    vectors = clustered(len(ids), dims, seed=7)
    store.put_space_vectors(collection=c.name, name="other", vectors=dict(zip(ids, vectors, strict=True)))
    spaces = SpacePass(store.db, settings=store.settings)
    try:
        for _ in range(20):
            spaces.step(now=True)
            fresh = store.get_collection(name=c.name, fresh=True)
            if fresh.spaces[0].state == "ready":
                return fresh
    finally:
        spaces.close()
    raise AssertionError("the space never became ready")


def test_a_space_is_a_target_probed_and_rebuilt_on_its_own_vectors(
    conn: psycopg.Connection[Any],
    store: VectorStore,
    make_collection: Callable[..., Collection],
    make_worker: Callable[..., MaintenanceWorker],
) -> None:
    c = _ready_space(store, make_collection(800, 16), dims=12)
    space = c.spaces[0]
    targets = targets_for(conn, c)
    assert [(t.table, t.index, t.space) for t in targets] == [
        (c.table_name, f"{c.table_name}_hnsw", None),
        (space.table_name, space.index_name, space),
    ]
    side = targets[1]
    assert side.label == f"{c.name}/other" and side.vectors.dimensions == 12
    # Recall on the space's own 12-d vectors (the 16-d query samples of the default space are not used).
    result = measure_recall(
        conn, side, k=10, sample=20, budget_s=30, ef_search=40, max_scan_tuples=20_000, queries=None
    )
    assert result.source == "stand_ins" and result.recall is not None and result.recall > 0.8

    worker = make_worker()
    [(own, _), (side_probe, _)] = worker.probe(with_recall=True)
    assert (own.table, side_probe.table) == (c.table_name, space.table_name)
    assert side_probe.recall is not None and side_probe.recall.recall is not None
    before = index_oid(conn, space.index_name)
    outcome = worker.act(side, "rebuild", reason="test")
    assert outcome.outcome == "ok", outcome.error
    assert index_oid(conn, space.index_name) != before
    query = np.asarray(clustered(1, 12, seed=7)[0])
    hits = store.search(collection=c.name, vector=query, using="other", k=3)
    assert len(hits) == 3


def test_one_space_in_trouble_does_not_hold_up_the_others(
    store: VectorStore, make_collection: Callable[..., Collection], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pass steps every filling space; an error on one (here its index build keeps hitting a lock
    timeout) is logged for that space, and the spaces after it still fill and turn ready."""
    from memstore.workers import space_pass

    first = make_collection(300, 8)
    second_name = f"{first.name}_b"
    store.create_collection(name=second_name, dimensions=8)
    store.upsert_items(
        collection=second_name, items=[ItemIn(vector=v, external_id=f"e{i}") for i, v in enumerate(clustered(300, 8))]
    )
    try:
        for name in (first.name, second_name):  # the first's space has the lower id: it is stepped first
            store.create_space(collection=name, name="other", model="some-model", dimensions=6)
            ids = store.find_external_ids(collection=name, external_ids=[f"e{i}" for i in range(300)])
            vectors = dict(zip(ids, clustered(len(ids), 6, seed=3), strict=True))
            store.put_space_vectors(collection=name, name="other", vectors=vectors)
        stuck = store.get_collection(name=first.name, fresh=True).spaces[0].id
        build = space_pass.lifecycle.build_index

        def build_or_time_out(conn: psycopg.Connection[Any], c: Collection, space: Any, **options: Any) -> bool:
            if space.id == stuck:
                raise psycopg.errors.LockNotAvailable("canceling statement due to lock timeout")
            return build(conn, c, space, **options)

        monkeypatch.setattr(space_pass.lifecycle, "build_index", build_or_time_out)
        passer = SpacePass(store.db, settings=store.settings)
        try:
            for _ in range(10):
                passer.step(now=True)
                if store.get_collection(name=second_name, fresh=True).spaces[0].state == "ready":
                    break
        finally:
            passer.close()
        assert store.get_collection(name=second_name, fresh=True).spaces[0].state == "ready"
        assert store.get_collection(name=first.name, fresh=True).spaces[0].state == "filling"
    finally:
        store.drop_collection(name=second_name)
