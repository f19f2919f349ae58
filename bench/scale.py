"""How costs grow with the number of rows: ``python -m bench.scale --json [--sizes 10000,100000,1000000]``.

For each size, on a fresh collection of clustered synthetic vectors (128 dimensions by default, ``--dims``):

- bulk ingest: rows/s of the store's bulk path (``VectorStore.bulk_load`` where the store has it; else the
  collection's HNSW index dropped and ``upsert_items`` in batches of ``--batch`` rows, which stage through
  COPY), against a raw ``COPY ... FORMAT BINARY`` into a same-shaped table on the same server (the reference);
- index build: seconds of one ``CREATE INDEX`` of the collection's HNSW index after the load (and, up to
  ``--reference-build-max`` rows, the same statement on the raw table, as a reference), and the index's
  bytes per row;
- search: recall@10 of ``VectorStore.search`` against exact neighbours (numpy, in blocks) for
  ``--queries`` queries at each ``ef_search`` of ``--ef-grid``; at the lowest that reaches 0.95,
  queries/s and p50/p99 latency of one client over ``--search-rounds`` rounds; the same figures at the
  collection's default ``ef_search`` (``at_default_ef``);
- maintenance: 2% churn (60% updates, 20% deletes, 20% inserts, as ``bench.churn``), then plain
  ``VACUUM``; 2% churn again, then one pass of the maintenance policy (``MaintenanceWorker.run_once``);
  ``cost`` is the policy's seconds over VACUUM's (VACUUM first, so the policy never inherits garbage
  VACUUM would have cleaned).

By default a temporary embedded server is started (``--maintenance-work-mem``: a 1M x 128 graph needs
about 1 GB to build in memory). ``--include FILE`` merges the sizes of an earlier run's JSON (a large
size run once, the small ones again) before the exponents are fitted and ``--plot`` is drawn.
The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
from pgvector.psycopg import register_vector
from psycopg import sql
from tqdm import tqdm

from bench.churn import Mirror, churn_round, sample_user_queries
from bench.churn_data import Dataset, synthetic
from bench.databases import scratch_dir
from bench.scale_report import fit_and_check, plot
from maintenance.config import MaintenanceConfig
from maintenance.progress import Progress, Watch
from maintenance.worker import MaintenanceWorker
from memstore.db import migrate, online_ddl
from memstore.db.core import create_engine, libpq_url, normalise_url
from memstore.db.embedded import start_embedded_server
from memstore.models import ItemIn
from memstore.settings import Settings
from memstore.store import VectorStore

K = 10
RECALL_GOAL = 0.95
USER_QUERIES = 200  # the users' earlier searches the worker's recall probe replays
EF_GRID = "10,20,40,60,80,100,120,160,200,300,400,600,800"
SEED = 20261201


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _connect(url: str, settings: Settings) -> psycopg.Connection[Any]:
    conn = psycopg.connect(libpq_url(url), autocommit=True)
    online_ddl.build_resources(conn, settings)
    register_vector(conn)
    return conn


def _batches(base: np.ndarray, batch_rows: int) -> Iterator[tuple[int, np.ndarray]]:
    for start in range(0, len(base), batch_rows):
        yield start, base[start : start + batch_rows]


def upsert_in_batches(
    store: VectorStore, *, collection: str, items: np.ndarray, batch_rows: int, progress: Callable[[int], None]
) -> None:
    """Load rows without an index: ``upsert_items`` per batch (COPY staging above its threshold).

    The row with index ``i`` gets external_id ``str(i)``. The caller drops the index before and builds it after.
    """
    for start, rows in _batches(items, batch_rows):
        store.upsert_items(
            collection=collection,
            items=[ItemIn(vector=r, external_id=str(start + i), metadata={}) for i, r in enumerate(rows)],
        )
        progress(len(rows))


def _raw_copy(conn: psycopg.Connection[Any], table: str, base: np.ndarray, batch_rows: int) -> float:
    statement = sql.SQL("COPY {} (external_id, embedding, metadata) FROM STDIN (FORMAT BINARY)").format(
        sql.Identifier(table)
    )
    empty = psycopg.types.json.Jsonb({})
    t0 = time.perf_counter()
    for start, rows in tqdm(list(_batches(base, batch_rows)), desc="raw COPY", file=sys.stderr, leave=False):
        with conn.transaction(), conn.cursor() as cur, cur.copy(statement) as copy:
            copy.set_types(["text", "vector", "jsonb"])
            for i, row in enumerate(rows):
                copy.write_row((str(start + i), row, empty))
    return time.perf_counter() - t0


def _index_definition(conn: psycopg.Connection[Any], index: str) -> str:
    row = conn.execute("SELECT pg_get_indexdef(%s::regclass)", (sql.Identifier(index).as_string(conn),)).fetchone()
    assert row is not None
    return str(row[0])


def _timed_build(conn: psycopg.Connection[Any], url: str, settings: Settings, definition: str, label: str) -> float:
    """Run ``definition`` (a CREATE INDEX) with a progress bar fed by ``pg_stat_progress_create_index``."""
    bar = tqdm(desc=f"build {label}", file=sys.stderr, leave=False, unit="")

    def on_progress(p: Progress) -> None:
        bar.set_postfix_str(p.phase, refresh=False)
        bar.total = max(p.total, 1)
        bar.n = min(p.done, bar.total)
        bar.refresh()

    t0 = time.perf_counter()
    with Watch(
        conn,
        lambda: _connect(url, settings),
        kind="create_index",
        label=label,
        stop=threading.Event(),
        on_progress=on_progress,
        interval_s=2.0,
    ):
        conn.execute(definition)  # the server's own pg_get_indexdef text
    bar.close()
    return time.perf_counter() - t0


def store_bulk_ingest(
    store: VectorStore, conn: psycopg.Connection[Any], url: str, name: str, base: np.ndarray, batch_rows: int
) -> tuple[float, float, str]:
    """Load ``base`` into the empty collection ``name`` and build its index: (load s, build s, how).

    ``VectorStore.bulk_load`` into an empty collection loads without the index and builds it after;
    its result splits the two times. Should it go into the live index instead (another process holds
    the collection), the build time is 0 and the path says so.
    """
    items = (ItemIn(vector=r, external_id=str(i), metadata={}) for i, r in enumerate(base))
    result = store.bulk_load(collection=name, items=items, batch_rows=batch_rows, total=len(base), progress=True)
    return result.load_s, result.build_s, "bulk_load" if result.deferred_index else "bulk_load (live index)"


def _index_bytes(conn: psycopg.Connection[Any], index: str) -> int:
    row = conn.execute("SELECT pg_relation_size(%s::regclass)", (sql.Identifier(index).as_string(conn),)).fetchone()
    return int(row[0]) if row else 0


def exact_topk(base: np.ndarray, queries: np.ndarray, k: int, block: int = 32) -> np.ndarray:
    """Row indices of the k nearest rows of ``base`` (unit vectors: cosine = dot), queries in blocks."""
    out = np.empty((len(queries), k), dtype=np.int64)
    for start in range(0, len(queries), block):
        sims = queries[start : start + block] @ base.T
        top = np.argpartition(-sims, k, axis=1)[:, :k]
        order = np.argsort(-np.take_along_axis(sims, top, axis=1), axis=1)
        out[start : start + block] = np.take_along_axis(top, order, axis=1)
    return out


def _recall(found: list[list[int]], truth: list[set[int]]) -> float:
    return sum(len(set(f) & t) for f, t in zip(found, truth, strict=True)) / (K * len(truth))


def _search_ids(store: VectorStore, name: str, queries: np.ndarray, ef: int) -> list[list[int]]:
    return [[int(r.external_id) for r in store.search(collection=name, vector=q, k=K, ef_search=ef)] for q in queries]


def sweep_ef(
    store: VectorStore, name: str, queries: np.ndarray, truth: list[set[int]], grid: list[int]
) -> tuple[int | None, dict[int, float]]:
    """Recall at each ef_search of ``grid`` (ascending) until one reaches the goal; that one, or None."""
    recalls: dict[int, float] = {}
    for ef in tqdm(grid, desc="ef_search sweep", file=sys.stderr, leave=False):
        recalls[ef] = round(_recall(_search_ids(store, name, queries, ef), truth), 4)
        if recalls[ef] >= RECALL_GOAL:
            return ef, recalls
    return None, recalls


def time_searches(store: VectorStore, name: str, queries: np.ndarray, ef: int, rounds: int) -> dict[str, float]:
    store.search(collection=name, vector=queries[0], k=K, ef_search=ef)  # the first search loads the catalog
    latencies: list[float] = []
    for _ in tqdm(range(rounds), desc=f"search at ef {ef}", file=sys.stderr, leave=False):
        for q in queries:
            t0 = time.perf_counter()
            store.search(collection=name, vector=q, k=K, ef_search=ef)
            latencies.append(time.perf_counter() - t0)
    ms = np.asarray(latencies) * 1000
    return {
        "search_qps": round(len(ms) / (ms.sum() / 1000), 1),
        "search_p50_ms": round(float(np.percentile(ms, 50)), 3),
        "search_p99_ms": round(float(np.percentile(ms, 99)), 3),
    }


def measure_maintenance(
    store: VectorStore, conn: psycopg.Connection[Any], name: str, mirror: Mirror, fraction: float, seed: int
) -> dict[str, Any]:
    """VACUUM after one round of churn, then the policy after another; seconds of each and their ratio."""
    c = store.get_collection(name=name)
    worker = MaintenanceWorker(store.db, settings=store.settings, config=MaintenanceConfig(), collections=[name])
    worker.session()  # opened up front: the connection is not part of the policy's cost
    _log(f"{name}: churn {fraction:.0%}, then VACUUM")
    churn_round(conn, c.table_name, mirror, fraction, np.random.default_rng(seed))
    t0 = time.perf_counter()
    conn.execute(sql.SQL("VACUUM {}").format(sql.Identifier(c.table_name)))
    vacuum_s = time.perf_counter() - t0
    _log(f"{name}: VACUUM {vacuum_s:.2f}s; churn {fraction:.0%} again, then the policy")
    churn_round(conn, c.table_name, mirror, fraction, np.random.default_rng(seed + 1))
    t0 = time.perf_counter()
    failed = worker.run_once()
    policy_s = time.perf_counter() - t0
    decisions = [f"{o.decision}:{o.outcome}" for o in worker.last_outcomes]
    _log(f"{name}: policy {policy_s:.2f}s ({', '.join(decisions) or 'nothing to do'})")
    if failed:
        raise RuntimeError(f"the maintenance pass failed: {worker.last_outcomes}")
    return {
        "churn_fraction": fraction,
        "vacuum_s": round(vacuum_s, 3),
        "policy_s": round(policy_s, 3),
        "policy_decisions": decisions,
        "cost": round(policy_s / vacuum_s, 4),
    }


def size_dataset(n: int, args: argparse.Namespace) -> Dataset:
    """What one size draws: its ``n`` rows and, after them, the spare vectors that feed the churn's
    updates and inserts (0.8 x fraction per round, two rounds); the ``--queries`` queries with exact
    answers, then the users' earlier searches. ``bench.scale_reference`` builds the same rows."""
    spare = int(n * args.churn * 2) + 10
    return synthetic(n + spare, dims=args.dims, queries=args.queries + USER_QUERIES, seed=args.seed)


def measure_size(store: VectorStore, url: str, n: int, args: argparse.Namespace) -> dict[str, Any]:
    ds = size_dataset(n, args)
    base, queries, user_queries = ds.base[:n], ds.queries[: args.queries], ds.queries[args.queries :]
    truth = [set(row.tolist()) for row in exact_topk(base, queries, K)]
    name, raw_name = f"bench_scale_{n}", f"bench_scale_{n}_raw"
    settings = store.settings
    out: dict[str, Any] = {"rows": n, "dims": args.dims, "queries": len(queries)}
    with _connect(url, settings) as conn:
        for stale in (name, raw_name):
            with contextlib.suppress(LookupError):
                store.drop_collection(name=stale)
        graph = {"hnsw_m": args.m, "hnsw_ef_construction": args.ef_construction}  # None: the collection defaults
        collections = {x: store.create_collection(name=x, dimensions=args.dims, **graph) for x in (name, raw_name)}
        c, raw = collections[name], collections[raw_name]
        out["hnsw"] = {"m": c.hnsw_m, "ef_construction": c.hnsw_ef_construction}  # as the collection was made
        raw_definition = _index_definition(conn, raw.index_name)
        conn.execute(sql.SQL("DROP INDEX {}").format(sql.Identifier(raw.index_name)))
        for x in (c, raw):  # the policy and VACUUM below must be the only maintenance
            conn.execute(
                sql.SQL("ALTER TABLE {} SET (autovacuum_enabled = false)").format(sql.Identifier(x.table_name))
            )

        raw_s = _raw_copy(conn, raw.table_name, base, args.batch)
        if n <= args.reference_build_max:
            out["reference_build_s"] = round(_timed_build(conn, url, settings, raw_definition, raw_name), 3)
        store.drop_collection(name=raw_name)

        load_s, build_s, out["ingest_path"] = store_bulk_ingest(store, conn, url, name, base, args.batch)
        conn.execute("SELECT pg_stat_force_next_flush()")
        conn.execute(sql.SQL("VACUUM ANALYZE {}").format(sql.Identifier(c.table_name)))
        index_bytes = _index_bytes(conn, c.index_name)
        out.update(
            ingest_rows_per_s=round(n / load_s, 1),
            ingest_rows_per_s_raw_copy=round(n / raw_s, 1),
            ingest_ratio=round(raw_s / load_s, 4),
            build_s=round(build_s, 3),
            index_bytes=index_bytes,
            index_bytes_per_row=round(index_bytes / n, 2),
        )
        _log(f"{name}: ingest {n / load_s:,.0f} rows/s (raw COPY {n / raw_s:,.0f}), build {build_s:.1f}s")

        ef, recalls = sweep_ef(store, name, queries, truth, args.ef_grid)
        out.update(recall_by_ef=recalls, ef_search=ef, recall_at_10=recalls[ef] if ef else None)
        if ef is None:
            _log(f"{name}: no ef_search of {args.ef_grid} reaches recall {RECALL_GOAL}: {recalls}")
        else:
            out.update(time_searches(store, name, queries, ef, args.search_rounds))
            _log(
                f"{name}: ef_search {ef}: recall {recalls[ef]}, {out['search_qps']} q/s, p99 {out['search_p99_ms']} ms"
            )
        # The same at the collection's default ef_search: how the search itself grows with the rows,
        # apart from how much deeper the data needs it to go for the same recall.
        default_ef = store.get_collection(name=name).default_ef_search
        out["at_default_ef"] = {
            "ef_search": default_ef,
            "recall_at_10": round(_recall(_search_ids(store, name, queries, default_ef), truth), 4),
            **time_searches(store, name, queries, default_ef, args.search_rounds),
        }

        if args.maintenance:
            out["maintenance"] = _maintenance_after_churn(store, conn, name, ds.base, queries, user_queries, ef, args)
        store.drop_collection(name=name)
    return out


def _maintenance_after_churn(
    store: VectorStore,
    conn: psycopg.Connection[Any],
    name: str,
    every: np.ndarray,
    queries: np.ndarray,
    user_queries: np.ndarray,
    ef: int | None,
    args: argparse.Namespace,
) -> dict[str, Any]:
    """``measure_maintenance`` on the loaded collection, whose row ``i`` of ``every`` has external_id ``i``
    (the rows past the table's feed the churn), then recall at ``ef`` against the data as it is now."""
    c = store.get_collection(name=name)
    rows = sql.SQL("SELECT id, external_id FROM {}").format(sql.Identifier(c.table_name))
    slots = {int(i): int(e) for i, e in conn.execute(rows)}
    mirror = Mirror(every, len(slots), args.seed)
    mirror.slots = slots
    sample_user_queries(store, name, user_queries)
    out = measure_maintenance(store, conn, name, mirror, args.churn, args.seed)
    if ef is not None:
        with mirror.lock:
            ids = np.fromiter(mirror.slots.keys(), dtype=np.int64)
            vectors = every[np.fromiter(mirror.slots.values(), dtype=np.int64)]
        truth = [set(ids[row].tolist()) for row in exact_topk(vectors, queries, K)]
        found = [[int(r.id) for r in store.search(collection=name, vector=q, k=K, ef_search=ef)] for q in queries]
        out["recall_after_policy"] = round(_recall(found, truth), 4)
    return out


def _sizes(text: str) -> list[int]:
    return sorted(int(s.replace("_", "")) for s in text.split(",") if s.strip())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.scale", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", type=_sizes, default=_sizes("10000,100000,1000000"), help="rows, comma-separated")
    parser.add_argument("--dims", type=int, default=128)
    parser.add_argument("--queries", type=int, default=300, help="queries with exact answers (recall, latency)")
    parser.add_argument("--ef-grid", type=_sizes, default=_sizes(EF_GRID))
    parser.add_argument("--search-rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=20_000, help="rows per bulk-ingest batch")
    parser.add_argument("--churn", type=float, default=0.02, help="fraction of the rows changed before maintenance")
    parser.add_argument(
        "--maintenance",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="churn and compare the policy with VACUUM (--no-maintenance: ingest, build and search only)",
    )
    parser.add_argument("--m", type=int, help="the graph's m (default: the collections' default, 16)")
    parser.add_argument(
        "--ef-construction", type=int, help="the graph's ef_construction (default: the collections' default, 64)"
    )
    parser.add_argument("--reference-build-max", type=int, default=100_000, help="largest size also built raw")
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--database-url", help="a database to use (default: a temporary embedded server)")
    parser.add_argument("--maintenance-work-mem", default="2GB")
    parser.add_argument("--max-parallel-maintenance-workers", type=int, default=1)
    parser.add_argument("--include", type=Path, action="append", default=[], help="an earlier run's JSON to merge")
    parser.add_argument("--plot", type=Path, help="write the curves to this PNG")
    parser.add_argument("--json", action="store_true", help="(the last line is always the JSON result)")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    with scratch_dir(prefix="memstore-scale-") as tmp:
        url = normalise_url(args.database_url) if args.database_url else ""
        if not url:
            url = start_embedded_server(
                Path(tmp),
                maintenance_work_mem=args.maintenance_work_mem,
                max_parallel_maintenance_workers=args.max_parallel_maintenance_workers,
            )
        migrate.upgrade(url)
        settings = Settings(
            database_url=url,
            maintenance_work_mem=args.maintenance_work_mem,
            max_parallel_maintenance_workers=args.max_parallel_maintenance_workers,
            bulk_min_rows=1,  # every size is an initial import: loaded without the index, then built
        )
        engine = create_engine(url)
        store = VectorStore(engine, settings=settings)
        measured = []
        for n in args.sizes:
            _log(f"--- {n:,} rows ---")
            measured.append(measure_size(store, url, n, args))
            _log(json.dumps(measured[-1]))  # each size as soon as it is done: a long run keeps what finished
        engine.dispose()
    earlier = [row for path in args.include for row in json.loads(path.read_text().strip().splitlines()[-1])["sizes"]]
    by_size = {row["rows"]: row for row in [*earlier, *measured]}
    rows = [by_size[n] for n in sorted(by_size)]
    result: dict[str, Any] = {
        "dataset": f"synthetic-{args.dims}d-clustered",
        "k": K,
        "recall_goal": RECALL_GOAL,
        "hnsw": measured[0]["hnsw"] if measured else None,  # as this run's collections were made
        "maintenance_work_mem": args.maintenance_work_mem,
        "max_parallel_maintenance_workers": args.max_parallel_maintenance_workers,
        "sizes": rows,
        **fit_and_check(rows),
        "elapsed_s": round(time.perf_counter() - started, 1),
    }
    if args.plot:
        try:
            result["plot"] = str(plot(result, args.plot))
        except Exception as exc:  # a run of an hour is not lost to its picture: the figures still print
            _log(f"the plot failed ({exc!r}); python -m bench.scale_report RESULT.json --plot OUT draws it again")
            result["plot_error"] = repr(exc)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
