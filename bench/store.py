"""``python -m bench.store --json``: the store against raw psycopg on the same rows, index and SQL.

Measured in one run on one server. The baselines are what the same server can do at best:
- ingest_ratio: rows/s of ``VectorStore.bulk_load`` (batches through COPY BINARY to a staging table,
  then an idempotent INSERT ... ON CONFLICT; into an empty collection it loads without the HNSW index
  and builds it after) over rows/s of loading first and building the index after: raw ``COPY ...
  FORMAT BINARY`` into a same-shaped table without its HNSW index, then one ``CREATE INDEX`` with
  memstore's build settings, end to end (the raw side first, then the store);
- search_ratio: queries/s of ``VectorStore.search`` over queries/s of one raw psycopg connection
  sending one prepared statement per search, the sides taking turns query by query so that drift on
  a noisy machine hits all alike (``SELECT id ... ORDER BY embedding <=> q LIMIT k`` on the
  same table and index, ``hnsw.ef_search`` set once for the session);
- search_pool_gain: the store's q/s over the same store's with its searches on the engine's general
  pool (SQLAlchemy's, as before ``memstore.db.search_pool``), in the same turns, the pool holding the
  idle connections a load's side-by-side writers leave;
- search_qps_store_statement_raw: the store's own search statement sent on the raw connection, in the
  same turns: between it and the store's q/s is the client's work around the statement;
- recall_at_10 of the index at the collection's default ef_search, against exact answers (numpy).

``python -m bench.peers`` puts the same comparison, and the stores people pick instead, in one table.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import psycopg
from pgvector.psycopg import register_vector
from psycopg import sql
from tqdm import tqdm

from bench.data import clustered, exact_neighbours, load_npz, recall_at_k
from bench.databases import scratch_dir, server_url
from bench.peers_measure import time_searches, timed
from memstore.catalog.collections import Collection
from memstore.db import migrate, online_ddl
from memstore.db.core import Database, create_engine, libpq_url
from memstore.models import ItemIn
from memstore.search.request import check_query
from memstore.settings import Settings
from memstore.store import VectorStore

T = TypeVar("T")


def _raw_copy(conn: psycopg.Connection[Any], table: str, ids: list[str], rows: np.ndarray) -> None:
    statement = f"COPY {table} (external_id, embedding, metadata) FROM STDIN (FORMAT BINARY)"
    with conn.cursor() as cur, cur.copy(statement) as copy:
        copy.set_types(["text", "vector", "jsonb"])
        for eid, row in zip(ids, rows, strict=True):
            copy.write_row((eid, row, psycopg.types.json.Jsonb({})))
    conn.commit()


def _raw_build(conn: psycopg.Connection[Any], c: Collection, settings: Settings) -> None:
    """The raw side's index, built once after the load, with the memory and workers memstore's builds get."""
    online_ddl.build_resources(conn, settings)
    conn.execute(
        sql.SQL("CREATE INDEX {} ON {} USING hnsw (embedding {}) WITH (m = {}, ef_construction = {})").format(
            sql.Identifier(c.index_name),
            c.table,
            sql.SQL(c.spec.opclass),
            sql.Literal(c.hnsw_m),
            sql.Literal(c.hnsw_ef_construction),
        )
    )
    conn.commit()


def bench_ingest(store: VectorStore, raw: psycopg.Connection[Any], base: np.ndarray, batch: int) -> dict[str, float]:
    """The store's bulk load of every row (``VectorStore.bulk_load``: into an empty collection it loads
    without the index and builds it after) against the raw load of the same batches, then one build."""
    store.create_collection(name="bench_store", dimensions=base.shape[1])
    raw_c = store.create_collection(name="bench_raw", dimensions=base.shape[1])
    raw_table = raw_c.table_name
    raw.execute(sql.SQL("DROP INDEX {}").format(sql.Identifier(raw_c.index_name)))  # loaded first, built after
    raw.commit()
    ids = [str(i) for i in range(len(base))]

    def raw_load() -> None:
        for start in tqdm(range(0, len(base), batch), desc="ingest (raw load, then build)", file=sys.stderr):
            _raw_copy(raw, raw_table, ids[start : start + batch], base[start : start + batch])
        _raw_build(raw, raw_c, store.settings)

    def store_load() -> None:
        items = (ItemIn(vector=r, external_id=e, metadata={}) for r, e in zip(base, ids, strict=True))
        store.bulk_load(collection="bench_store", items=items, batch_rows=batch, total=len(base), progress=True)

    t_raw = timed(raw_load)
    t_store = timed(store_load)
    n = len(base)
    return {"ingest_rows_per_s_store": n / t_store, "ingest_rows_per_s_raw": n / t_raw, "ingest_ratio": t_raw / t_store}


def _burst(store: VectorStore, connections: int) -> None:
    """Leave ``connections`` idle connections in the store's pool, as a load's side-by-side writers do."""
    held = [store.db.engine.raw_connection() for _ in range(connections)]  # the pool itself: SQLAlchemy's
    for proxied in held:
        proxied.close()


class _GeneralPool(Database):
    """The same database with searches on the engine's general pool: a pooled connection in a
    transaction per search, as every read, instead of a search connection."""

    def run_search(self, fn: Callable[[psycopg.Connection[Any]], T]) -> T:
        return self.run_read(fn)


def bench_search(
    store: VectorStore, raw: psycopg.Connection[Any], queries: np.ndarray, k: int, rounds: int
) -> tuple[dict[str, float], list[list[int]]]:
    """The store's searches against raw ones; and the same store with its searches on the engine's
    general pool, which holds the connections a load's writers leave behind."""
    c = store.get_collection(name="bench_store")
    general = VectorStore(_GeneralPool(store.db.engine), settings=store.settings)
    return _turns(store, general, raw, c, queries, k, rounds)


class _Side:
    """One way of searching, as ``bench.peers_measure.time_searches`` takes turns between them."""

    def __init__(self, name: str, search: Callable[[np.ndarray], list[int]]) -> None:
        self.name, self.search = name, search


def _turns(
    store: VectorStore,
    general: VectorStore,
    raw: psycopg.Connection[Any],
    c: Collection,
    queries: np.ndarray,
    k: int,
    rounds: int,
) -> tuple[dict[str, float], list[list[int]]]:
    _burst(store, min(store.settings.bulk_connections, store.settings.pool_size))
    # The least a search can cost on this server: one prepared statement (autocommit: no BEGIN or
    # COMMIT around it), the setting made once for the session.
    raw.commit()
    raw.autocommit = True
    raw.execute(sql.SQL("SET hnsw.ef_search = {}").format(sql.Literal(c.default_ef_search)))
    statement = sql.SQL("SELECT id FROM {} ORDER BY embedding {} %s LIMIT %s").format(c.table, sql.SQL(c.spec.operator))
    # memstore's own statement for this search (its columns, the CTE that restores strict order),
    # sent on the raw connection: what the statement costs, apart from the client's work around it.
    plan = store.plan(c, check_query(mode=None, vector=queries[0], text=None, k=k), ef_search=None, exact=False)

    def through(s: VectorStore) -> Callable[[np.ndarray], list[int]]:
        return lambda q: [int(x.external_id) for x in s.search(collection="bench_store", vector=q, k=k)]

    def raw_ids(q: np.ndarray) -> list[int]:
        return [r[0] for r in raw.execute(statement, (q, k), prepare=True).fetchall()]

    def statement_ids(q: np.ndarray) -> list[int]:
        return [r[0] for r in raw.execute(plan.statement, {**plan.params, "q": q}, prepare=True).fetchall()]

    sides = [
        _Side("store", through(store)),
        _Side("raw", raw_ids),
        _Side("general_pool", through(general)),
        _Side("statement", statement_ids),
    ]
    found = [sides[0].search(q) for q in queries]  # the store's answers, for recall
    # The sides take turns query by query (and who goes first rotates), so load from anything else
    # on the machine lands on all alike.
    qps = {side.name: t.qps for side, t in zip(sides, time_searches(sides, queries, rounds, turn=1), strict=True)}
    out = {
        "search_qps_store": qps["store"],
        "search_qps_raw": qps["raw"],
        "search_ratio": qps["store"] / qps["raw"],
        "search_qps_store_general_pool": qps["general_pool"],
        "search_qps_store_statement_raw": qps["statement"],
        "search_pool_gain": qps["store"] / qps["general_pool"],
    }
    return out, found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.store", description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", help="print only the JSON result (last line)")
    parser.add_argument("--data", type=Path, help="an .npz with arrays base and queries (default: synthetic)")
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--dimensions", type=int, default=128)
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=5000)
    parser.add_argument("--search-rounds", type=int, default=4)
    parser.add_argument("--database-url", help="an empty database to use (default: a temporary embedded server)")
    args = parser.parse_args(argv)

    if args.data:
        base, queries = load_npz(args.data)
    else:
        every = clustered(args.rows + args.queries, args.dimensions, seed=42)
        base, queries = every[: args.rows], every[args.rows :]
    with scratch_dir(prefix="memstore-bench-") as tmp:
        url = server_url(args.database_url, Path(tmp), Settings())
        migrate.upgrade(url)
        engine = create_engine(url)
        store = VectorStore(engine, settings=Settings(database_url=url))
        for name in ("bench_store", "bench_raw"):
            if name in {c.name for c in store.list_collections()}:
                store.drop_collection(name=name)
        with psycopg.connect(libpq_url(url)) as raw:
            register_vector(raw)
            ingest = bench_ingest(store, raw, base, args.batch)
            search, found = bench_search(store, raw, queries, 10, args.search_rounds)
        truth = exact_neighbours(base, queries, 10)
        c = store.get_collection(name="bench_store")
        for name in ("bench_store", "bench_raw"):
            store.drop_collection(name=name)
        engine.dispose()
    result = {
        "rows": len(base),
        "dimensions": int(base.shape[1]),
        "queries": len(queries),
        "hnsw": {"m": c.hnsw_m, "ef_construction": c.hnsw_ef_construction, "ef_search": c.default_ef_search},
        **{key: round(value, 3) for key, value in {**ingest, **search}.items()},
        "recall_at_10": round(recall_at_k(found, truth), 4),
        "goals": {"ingest_ratio": ">= 0.8", "search_ratio": ">= 0.85", "recall_at_10": ">= 0.95"},
    }
    if not args.json:
        print(json.dumps(result, indent=2))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
