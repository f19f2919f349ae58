"""Fixtures for the maintenance tests: small collections, churn with flushed statistics, workers."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from pgvector.psycopg import register_vector

from maintenance.config import MaintenanceConfig
from maintenance.worker import MaintenanceWorker
from memstore.collections import Collection
from memstore.db import libpq_url
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


@pytest.fixture
def make_collection(store: VectorStore, collection_name: str) -> Callable[..., Collection]:
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
        # The store's pooled connections flush their statistics lazily; ANALYZE sets the live count now.
        with store.engine.connect() as sa_conn:
            sa_conn.exec_driver_sql(f'ANALYZE "{c.table_name}"')
            sa_conn.commit()
        return c

    return make


@pytest.fixture
def make_worker(engine: sa.Engine, settings: Settings, collection_name: str) -> Callable[..., MaintenanceWorker]:
    def make(**overrides: Any) -> MaintenanceWorker:
        latency = overrides.pop("latency_source", None)
        config = MaintenanceConfig(_env_file=None, **(TEST_CONFIG | overrides))  # type: ignore[call-arg]
        return MaintenanceWorker(
            engine, settings=settings, config=config, collections=[collection_name], latency_source=latency
        )

    return make
