"""Fixtures for the maintenance tests: small collections, churn with flushed statistics, workers."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from pgvector.psycopg import register_vector

from maintenance.config import MaintenanceConfig
from maintenance.worker import MaintenanceWorker
from memstore.catalog.collections import Collection
from memstore.db.core import Database, libpq_url
from memstore.models import ItemIn
from memstore.settings import Settings
from memstore.store import VectorStore
from tests.maintenance.maint_helpers import clustered

# Short waits so the lock-timeout paths run in seconds, not minutes.
TEST_CONFIG = {
    "lock_timeout_ms": 1500,
    "ddl_retries": 2,
    "retry_backoff_s": 0.2,
    "slo_max_wait_s": 0.0,
    "recall_sample": 16,
    "recall_budget_s": 5.0,
    "small_index_bytes": 64 * 1024,
}


@pytest.fixture
def dsn(database_url: str) -> str:
    return libpq_url(database_url)


@pytest.fixture
def conn(dsn: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(dsn, autocommit=True) as c:
        register_vector(c)
        yield c


def settle_live_count(dsn: str, store: VectorStore, c: Collection, inserted: int, timeout_s: float = 30.0) -> None:
    """Make the table's live-row count exact before a test reads it.

    The store's pooled connections report their insert counts lazily (up to PostgreSQL's idle
    interval later). A report that arrives after ANALYZE adds the inserts a second time, and a probe
    then sees twice the live rows (a size ratio of 0.59 where 1.2 was right). Closing the pool makes
    each backend report as it exits; ANALYZE runs once the inserts are counted.
    """
    store.db.engine.dispose()
    deadline = time.monotonic() + timeout_s
    with psycopg.connect(dsn, autocommit=True) as conn:
        while True:
            row = conn.execute(
                "SELECT coalesce(sum(n_tup_ins), 0) FROM pg_stat_user_tables WHERE relid = ANY(%s::regclass[])",
                (c.partition_tables(),),
            ).fetchone()
            if row is not None and int(row[0]) >= inserted:
                break
            if time.monotonic() > deadline:
                raise AssertionError(f"{c.table_name}: {row} inserts counted after {timeout_s} s, {inserted} made")
            time.sleep(0.05)
        conn.execute(f'ANALYZE "{c.table_name}"')


@pytest.fixture
def make_collection(dsn: str, store: VectorStore, collection_name: str) -> Callable[..., Collection]:
    def make(
        n: int,
        dims: int = 16,
        *,
        partitions: int = 1,
        metric: str = "cosine",
        ef_search: int | None = None,
        seed: int = 0,
    ) -> Collection:
        store.create_collection(
            name=collection_name, dimensions=dims, partitions=partitions, metric=metric, ef_search=ef_search
        )
        vectors = clustered(n, dims, seed=seed)
        store.upsert_items(
            collection=collection_name, items=[ItemIn(vector=v, external_id=f"e{i}") for i, v in enumerate(vectors)]
        )
        c = store.get_collection(name=collection_name, fresh=True)
        settle_live_count(dsn, store, c, n)
        return c

    return make


@pytest.fixture
def make_worker(engine: sa.Engine, settings: Settings, collection_name: str) -> Callable[..., MaintenanceWorker]:
    def make(**overrides: Any) -> MaintenanceWorker:
        latency = overrides.pop("latency_source", None)
        config = MaintenanceConfig(_env_file=None, **(TEST_CONFIG | overrides))  # type: ignore[call-arg]
        return MaintenanceWorker(
            Database(engine), settings=settings, config=config, collections=[collection_name], latency_source=latency
        )

    return make
