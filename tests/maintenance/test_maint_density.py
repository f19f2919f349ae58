"""The graph chosen for the size: the density decisions (pure), a bulk load into an empty collection,
the worker's rebuild into a denser graph, and a user's graph kept with what it costs in the status."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from maintenance import history
from maintenance.actions import index_density
from maintenance.cli import main
from memstore.catalog import density
from memstore.catalog.collections import Collection
from memstore.catalog.density import DENSE, DENSE_EF_BOUND, DENSE_ROWS, Density
from memstore.models import ItemIn
from memstore.settings import get_settings, reread
from memstore.store import VectorStore
from tests.maintenance.maint_helpers import clustered


def row(**options: Any) -> Collection:
    m = options.pop("m", 16)
    efc = options.pop("efc", 64)
    return Collection(
        id=1, name="docs", table_name="c1_docs", dimensions=128, metric="cosine", hnsw_m=m,
        hnsw_ef_construction=efc, default_ef_search=80, partitions=1, options=options,
    )  # fmt: skip


def tuned(ef: int, reachable: bool = True, **kw: Any) -> dict[str, Any]:
    return {"target": 0.95, "ef": ef, "reachable": reachable} | kw


# ------------------------------------------------------------------ the decisions (no database)


def test_the_bound_is_the_measured_one() -> None:
    # docs/scale.md: 0.95 at ef 10 / 60 / 800+ (m 16) against 160 with m 32 / ef_construction 128 at 1M.
    assert DENSE_EF_BOUND == 160 and Density(32, 128) == DENSE
    assert 100_000 < DENSE_ROWS < 1_000_000


def test_an_ef_past_the_bound_or_an_unreached_target_asks_for_the_denser_graph() -> None:
    default = density.DEFAULT
    assert density.for_ef(default, 60) is None
    assert density.for_ef(default, DENSE_EF_BOUND) is None
    assert density.for_ef(default, 240) == DENSE
    assert density.for_ef(default, 40, reachable=False) == DENSE
    assert density.for_ef(DENSE, 1000, reachable=False) is None  # one step: no denser graph measured
    assert density.for_ef(Density(16, 200), 800) == Density(32, 200)


def test_the_plan_keeps_a_users_graph_and_says_what_it_costs() -> None:
    c = row(recall_target=0.95, recall_tuning=tuned(640), hnsw_explicit=False)
    want, why = density.plan(c)
    assert want == DENSE and "ef_search 640" in why
    user = row(recall_target=0.95, recall_tuning=tuned(640), hnsw_explicit=True)
    want, why = density.plan(user)
    assert want is None and "the user's" in why and "640" in why
    info = density.describe(user)
    assert info["source"] == "user" and info["ef_needed"] == 640 and info["next_rebuild"] is None
    assert density.cell(info) == "m 16/64 user's, ef 640"
    assert density.cell(density.describe(c)) == "m 16/64 -> 32/128"
    # No target, a tuning of another target, a small sample: no change.
    assert density.plan(row(recall_tuning=tuned(640)))[0] is None
    assert density.plan(row(recall_target=0.9, recall_tuning=tuned(640)))[0] is None
    limited = row(recall_target=0.95, recall_tuning=tuned(1000, False, sample_limited=True))
    assert density.plan(limited)[0] is None
    # A tuning whose reading at the bound could not be told below the target: no denser graph.
    untold = row(recall_target=0.95, recall_tuning=tuned(240, over_bound=False), hnsw_explicit=False)
    assert density.plan(untold)[0] is None
    told = row(recall_target=0.95, recall_tuning=tuned(240, over_bound=True), hnsw_explicit=False)
    assert density.plan(told)[0] == DENSE


def test_rows_from_before_the_flag_are_explicit_when_not_the_default_graph() -> None:
    assert not density.explicit(row())
    assert density.explicit(row(m=24))
    assert not density.explicit(row(m=32, efc=128, hnsw_density={"by": "maintenance"}))


def test_the_default_graph_is_this_servers(monkeypatch: pytest.MonkeyPatch) -> None:
    """A server whose new collections get m 24 takes an old row with m 24 as its default, not a choice."""
    monkeypatch.setenv("MEMSTORE_DEFAULT_HNSW_M", "24")
    reread()
    assert not density.explicit(row(m=24))
    assert density.explicit(row())  # 16 is not this server's default: someone chose it


def test_a_load_picks_the_density_for_its_size() -> None:
    assert density.for_rows(density.DEFAULT, DENSE_ROWS, 0.95) == DENSE
    assert density.for_rows(density.DEFAULT, DENSE_ROWS - 1, 0.95) is None
    assert density.for_rows(density.DEFAULT, 10 * DENSE_ROWS, None) is None
    assert density.for_rows(density.DEFAULT, 10 * DENSE_ROWS, 0.8) is None


# ------------------------------------------------------------------ with the database


def test_a_bulk_load_into_an_empty_collection_builds_the_graph_for_its_size(
    engine, settings, collection_name, conn, monkeypatch
) -> None:
    monkeypatch.setattr(density, "DENSE_ROWS", 1000)  # the bound at test size
    store = VectorStore(engine, settings=settings.model_copy(update={"bulk_min_rows": 500, "bulk_fraction": 0.5}))
    store.create_collection(name=collection_name, dimensions=16, recall_target=0.95)
    vectors = clustered(1500, 16)
    result = store.bulk_load(
        collection=collection_name, items=[ItemIn(vector=v, external_id=f"r{i}") for i, v in enumerate(vectors)]
    )
    assert result.deferred_index
    c = store.get_collection(name=collection_name, fresh=True)
    assert (c.hnsw_m, c.hnsw_ef_construction) == (32, 128)
    assert c.options[density.HNSW_DENSITY]["by"] == "bulk_load"
    assert index_density(conn, c.index_name) == DENSE
    assert store.search(collection=collection_name, vector=vectors[7], k=1)[0].external_id == "r7"
    # A user's m is kept, whatever the size.
    other = f"{collection_name}_user"
    store.create_collection(name=other, dimensions=16, recall_target=0.95, hnsw_m=12)
    store.bulk_load(collection=other, items=[ItemIn(vector=v, external_id=f"r{i}") for i, v in enumerate(vectors)])
    kept = store.get_collection(name=other, fresh=True)
    assert kept.hnsw_m == 12 and density.HNSW_DENSITY not in kept.options and kept.options["hnsw_explicit"]
    store.drop_collection(name=other)


def test_the_worker_rebuilds_into_a_denser_graph_online_and_records_it(
    store, make_collection, make_worker, collection_name, conn, database_url, monkeypatch, capsys
) -> None:
    make_collection(3000, 32)
    # A target this graph cannot reach at the largest ef the worker may set: the denser graph is planned.
    store.set_recall_target(collection=collection_name, target=0.999)
    worker = make_worker(tune_max_ef=10, tune_sample=20)
    assert worker.run_once() == 0
    c = store.get_collection(name=collection_name, fresh=True)
    assert c.recall_tuning is not None and not c.recall_tuning["reachable"]
    assert density.plan(c)[0] == DENSE
    monkeypatch.setenv("MEMSTORE_DATABASE_URL", database_url)
    monkeypatch.setenv("MEMSTORE_MAINT_SMALL_INDEX_BYTES", "65536")
    get_settings.cache_clear()
    try:
        assert main(["status", "--json", "--collection", collection_name]) == 0
        [status] = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert status["graph"]["next_rebuild"] == {"m": 32, "ef_construction": 128}
        assert status["recommendation"] == "rebuild" and "denser graph" in status["reason"]
    finally:
        get_settings.cache_clear()
    # The next pass rebuilds it, online (REINDEX CONCURRENTLY of the index with its new options).
    [target] = worker.targets(worker.session())
    old_oid = conn.execute("SELECT to_regclass(%s)::oid", (target.index,)).fetchone()
    assert worker.run_once() == 0
    [rebuild] = [o for o in worker.last_outcomes if o.decision == "rebuild"]
    assert rebuild.outcome == "ok" and "m 16 / ef_construction 64 -> m 32 / ef_construction 128" in rebuild.reason
    assert rebuild.after["hnsw_m"] == 32
    assert conn.execute("SELECT to_regclass(%s)::oid", (target.index,)).fetchone() != old_oid
    assert index_density(conn, target.index) == DENSE
    c = store.get_collection(name=collection_name, fresh=True)
    assert (c.hnsw_m, c.hnsw_ef_construction) == (32, 128)
    assert c.options[density.HNSW_DENSITY]["by"] == "maintenance"
    rows = [r for r in history.list_actions(conn, collection=collection_name) if r["action"] == "rebuild"]
    assert rows and "-> m 32 / ef_construction 128" in rows[0]["reason"]
    # Rows written after it go into the denser graph; and no further rebuild: nothing denser is planned.
    store.upsert_items(collection=collection_name, items=[ItemIn(vector=np.ones(32, np.float32), external_id="x")])
    assert store.search(collection=collection_name, vector=np.ones(32, np.float32), k=1)[0].external_id == "x"
    assert worker.run_once() == 0
    assert not [o for o in worker.last_outcomes if o.decision == "rebuild"]
    assert density.plan(store.get_collection(name=collection_name, fresh=True))[0] is None


def test_a_users_graph_is_kept_and_the_status_says_what_it_costs(
    store, make_worker, collection_name, database_url, monkeypatch, capsys
) -> None:
    store.create_collection(name=collection_name, dimensions=32, hnsw_m=8, hnsw_ef_construction=32)
    vectors = clustered(3000, 32)
    store.upsert_items(
        collection=collection_name, items=[ItemIn(vector=v, external_id=f"e{i}") for i, v in enumerate(vectors)]
    )
    store.set_recall_target(collection=collection_name, target=0.999)
    worker = make_worker(tune_max_ef=10, tune_sample=20)
    assert worker.run_once() == 0
    assert worker.run_once() == 0
    assert not [o for o in worker.last_outcomes if o.decision == "rebuild"]
    c = store.get_collection(name=collection_name, fresh=True)
    assert (c.hnsw_m, c.hnsw_ef_construction) == (8, 32) and c.options["hnsw_explicit"] is True
    monkeypatch.setenv("MEMSTORE_DATABASE_URL", database_url)
    get_settings.cache_clear()
    try:
        assert main(["status", "--collection", collection_name]) == 0
        out = capsys.readouterr()
        assert "m 8/32 user's, ef >10" in out.out
        assert "the graph is the user's" in out.err and f"ef_search {DENSE_EF_BOUND}" in out.err
    finally:
        get_settings.cache_clear()
