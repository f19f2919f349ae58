"""bench.peers' systems on PostgreSQL: memstore's Python API and raw pgvector, on the same server."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np
import psycopg
from pgvector.psycopg import register_vector
from psycopg import sql
from tqdm import tqdm

from bench.peers_measure import K
from maintenance.config import MaintenanceConfig
from maintenance.worker import MaintenanceWorker
from memstore.db import online_ddl
from memstore.db.core import libpq_url
from memstore.models import ItemIn
from memstore.services.query_sampler import QuerySampler
from memstore.settings import Settings
from memstore.store import VectorStore

BATCH_ROWS = 10_000


def _batches(n: int, size: int) -> Iterator[slice]:
    for start in range(0, n, size):
        yield slice(start, min(n, start + size))


def maintenance_pass(store: VectorStore, collection: str) -> str:
    """One pass of the maintenance worker on ``collection``, as ``memstore-maint run --once`` runs it;
    returns its decisions (e.g. ``rebuild:ok``)."""
    worker = MaintenanceWorker(store.db, settings=store.settings, config=MaintenanceConfig(), collections=[collection])
    try:
        if worker.run_once() != 0:
            raise RuntimeError(f"the maintenance pass on {collection} failed: {worker.last_outcomes}")
        return ", ".join(f"{o.decision}:{o.outcome}" for o in worker.last_outcomes)
    finally:
        worker.close()


def sample_queries(store: VectorStore, collection: str, queries: np.ndarray) -> None:
    """The users' searches, kept the way the API keeps them, for the maintenance worker's recall probes."""
    sampler = QuerySampler(store.db, rate=1.0)
    cid = store.get_collection(name=collection).id
    for q in queries:
        sampler.offer(cid, q)
    sampler.close()


class MemstorePython:
    """``VectorStore``: ``bulk_load`` where the store has it (else ``upsert_items`` in batches) and ``search``."""

    name = "memstore_python"
    label = "memstore (Python API)"

    def __init__(self, store: VectorStore, dims: int, representation: str, collection: str = "bench_peers_py") -> None:
        self.store, self.collection = store, collection
        with contextlib.suppress(LookupError):
            store.drop_collection(name=collection)
        store.create_collection(
            name=collection, dimensions=dims, hnsw_m=16, hnsw_ef_construction=64, representation=representation
        )
        self.ef = store.settings.default_ef_search
        self.bulk_load = getattr(store, "bulk_load", None)
        self.ingest_path = "bulk_load" if self.bulk_load is not None else "upsert_items"
        self.cleanup_name = "maintenance pass (memstore-maint run --once)"

    def ingest(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        items = (ItemIn(vector=v, external_id=str(i)) for i, v in zip(ids.tolist(), vectors, strict=True))
        if self.bulk_load is not None:
            bar = tqdm(items, total=len(ids), desc=f"{self.name}: bulk_load", file=sys.stderr, leave=False)
            self.bulk_load(collection=self.collection, items=bar, batch_rows=BATCH_ROWS, progress=False)
            return
        self._upsert(list(items), "upsert_items")

    def _upsert(self, items: list[ItemIn], desc: str) -> None:
        with tqdm(total=len(items), desc=f"{self.name}: {desc}", file=sys.stderr, leave=False) as bar:
            for part in _batches(len(items), BATCH_ROWS):
                self.store.upsert_items(collection=self.collection, items=items[part])
                bar.update(part.stop - part.start)

    def set_ef(self, ef: int) -> None:
        self.ef = ef

    def search(self, query: np.ndarray) -> list[int]:
        hits = self.store.search(collection=self.collection, vector=query, k=K, ef_search=self.ef)
        return [int(h.external_id) for h in hits]

    def update(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        items = [ItemIn(vector=v, external_id=str(i)) for i, v in zip(ids.tolist(), vectors, strict=True)]
        self._upsert(items, "update (upsert_items)")

    def delete(self, ids: np.ndarray) -> None:
        for part in _batches(len(ids), BATCH_ROWS):
            self.store.delete_items(collection=self.collection, external_ids=[str(i) for i in ids[part].tolist()])

    def cleanup(self) -> str:
        # Closing the pooled connections flushes their statistics (dead tuples), which the policy reads.
        self.store.db.engine.dispose()
        return maintenance_pass(self.store, self.collection)

    def close(self) -> None:
        with contextlib.suppress(LookupError):
            self.store.drop_collection(name=self.collection)


class RawPgvector:
    """What the same server does without memstore: ``COPY`` (binary) into a bare table, then one parallel
    ``CREATE INDEX``; a search is one prepared statement (``hnsw.ef_search`` set once per session)."""

    name = "raw_pgvector"
    label = "raw pgvector, same server"
    ingest_path = "COPY BINARY, then CREATE INDEX (parallel build)"
    cleanup_name = "VACUUM, then REINDEX"

    def __init__(self, url: str, dims: int, settings: Settings, halfvec: bool, table: str = "bench_peers_raw") -> None:
        self.conn = psycopg.connect(libpq_url(url), autocommit=True)
        register_vector(self.conn)
        self.settings = settings
        self.kind = "halfvec" if halfvec else "vector"
        self.table = sql.Identifier(table)
        self.conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(self.table))
        self.conn.execute(
            sql.SQL("CREATE TABLE {} (id bigint PRIMARY KEY, embedding {}({}) NOT NULL)").format(
                self.table, sql.SQL(self.kind), sql.Literal(dims)
            )
        )
        self.query = sql.SQL("SELECT id FROM {} ORDER BY embedding <=> %s::{} LIMIT {}").format(
            self.table, sql.SQL(self.kind), sql.Literal(K)
        )

    def _maintenance_settings(self) -> None:
        """The memory and parallel workers memstore's own builds get (memstore.settings)."""
        online_ddl.build_resources(self.conn, self.settings)

    def _copy(self, ids: np.ndarray, vectors: np.ndarray, staging: sql.Composable) -> None:
        statement = sql.SQL("COPY {} (id, embedding) FROM STDIN (FORMAT BINARY)").format(staging)
        rows = tqdm(zip(ids.tolist(), vectors, strict=True), total=len(ids), file=sys.stderr, leave=False)
        rows.set_description(f"{self.name}: COPY")
        with self.conn.cursor() as cur, cur.copy(statement) as copy:
            copy.set_types(["int8", "vector"])
            for row in rows:
                copy.write_row(row)

    def ingest(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        with self.conn.transaction():
            if self.kind == "vector":
                self._copy(ids, vectors, self.table)
            else:  # halfvec has no binary COPY from numpy here: stage as vector, convert in one INSERT
                self.conn.execute("CREATE TEMP TABLE peers_stage (id bigint, embedding vector) ON COMMIT DROP")
                self._copy(ids, vectors, sql.Identifier("peers_stage"))
                self.conn.execute(
                    sql.SQL("INSERT INTO {} SELECT id, embedding::halfvec FROM peers_stage").format(self.table)
                )
        self._maintenance_settings()
        self.conn.execute(
            sql.SQL("CREATE INDEX ON {} USING hnsw (embedding {}) WITH (m = 16, ef_construction = 64)").format(
                self.table, sql.SQL(f"{self.kind}_cosine_ops")
            )
        )
        self.conn.execute(sql.SQL("ANALYZE {}").format(self.table))

    def set_ef(self, ef: int) -> None:
        self.conn.execute(sql.SQL("SET hnsw.ef_search = {}").format(sql.Literal(int(ef))))

    def search(self, query: np.ndarray) -> list[int]:
        return [r[0] for r in self.conn.execute(self.query, (query,), prepare=True).fetchall()]

    def update(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        with self.conn.transaction():
            self.conn.execute("CREATE TEMP TABLE peers_stage (id bigint, embedding vector) ON COMMIT DROP")
            self._copy(ids, vectors, sql.Identifier("peers_stage"))
            self.conn.execute(
                sql.SQL(
                    "UPDATE {} AS t SET embedding = s.embedding::{} FROM peers_stage AS s WHERE t.id = s.id"
                ).format(self.table, sql.SQL(self.kind))
            )

    def delete(self, ids: np.ndarray) -> None:
        self.conn.execute(sql.SQL("DELETE FROM {} WHERE id = ANY(%s)").format(self.table), (ids.tolist(),))

    def cleanup(self) -> str:
        self._maintenance_settings()
        self.conn.execute(sql.SQL("VACUUM {}").format(self.table))
        self.conn.execute(sql.SQL("REINDEX TABLE {}").format(self.table))
        return ""

    def close(self) -> None:
        self.conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(self.table))
        self.conn.close()


def server_settings(conn: psycopg.Connection[Any]) -> dict[str, str]:
    names = ["maintenance_work_mem", "max_parallel_maintenance_workers", "shared_buffers", "server_version"]
    rows = conn.execute("SELECT name, current_setting(name) FROM unnest(%s::text[]) AS name", (names,)).fetchall()
    return dict(rows)
