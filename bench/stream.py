"""``python -m bench.stream --json``: streams of upsert batches, memstore's write path against raw pgvector.

Clients send batches of a few hundred to a few thousand rows, again and again. In one run, on one
server, with the same rows (``--rows`` x ``--dim`` Gaussian mixture, seed fixed, or ``--data
FILE.npz`` with ``base`` and ``queries``):

1. ``copy_build_parallel`` / ``copy_build_serial``: COPY every row into a bare table, then one
   CREATE INDEX, with the server's ``max_parallel_maintenance_workers`` or with 0; built ``--builds``
   times each, in turns, for the spread between builds. The parallel builds' mean time is the
   reference of every ratio, and their recall the fresh build's;
2. ``segments_python_<batch>`` / ``segments_rest_<batch>``: what memstore ships for streams
   (``write_path="segments"``, ``bench.stream_memstore``): batches of ``--batches`` rows through the
   Python API and of ``--rest-batch`` through REST into a new segmented collection, sealed at the end:
   end-to-end rows/s until every row is in a graph, recall@10 with the stream's graphs and after the
   merge, search latency during the stream against after it;
3. ``memstore_upsert``: ``upsert_items`` per batch into a collection with one live graph
   (``write_path="graph"``, each batch below ``MEMSTORE_BULK_MIN_ROWS``), then the same collection
   after a ``REINDEX`` (``memstore_reindexed``);
4. with ``--peers chroma,lancedb,qdrant_local``, the same streams (``--batches``) into those embedded
   stores where they are installed (``bench.stream_peers``: each reported as skipped otherwise);
5. with ``--designs``, the designs measured before one was chosen: ``live_copy_*`` (COPY per batch
   into a bare table that has its HNSW index, rows in the given order, shuffled, and grouped by
   cluster) and the unindexed-tail prototypes ``watermark_*`` / ``segments_*`` (``bench.stream_tail``)
   sealed at tail fractions ``--fractions`` of the indexed rows.

Recall@10 at ef_search 40 and 80 over ``--queries`` queries, against exact answers (numpy). The last
line printed is one JSON object; ``--plot`` draws rows/s and recall per option.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
from psycopg import sql
from tqdm import tqdm

from bench import stream_memstore, stream_peers
from bench import stream_sql as db
from bench.api import Server
from bench.data import clustered, exact_neighbours, load_npz
from bench.databases import scratch_dir, server_url
from bench.stream_plot import plot
from bench.stream_tail import TailTable, ingest
from memstore.access import keys
from memstore.db import migrate
from memstore.db.core import create_engine
from memstore.models import ItemIn
from memstore.settings import Settings
from memstore.store import VectorStore

PREFIX = "bench_stream_"
COPY_TABLE = PREFIX + "copy"
COLLECTION = PREFIX + "memstore"


def summary(seconds: float, rows: int, recall: dict[str, float], **extra: Any) -> dict[str, Any]:
    return {"seconds": round(seconds, 3), "rows_per_s": round(rows / seconds, 1), "recall_at_10": recall, **extra}


def mean_recall(recalls: list[dict[str, float]]) -> dict[str, float]:
    return {ef: round(float(np.mean([r[ef] for r in recalls])), 4) for ef in recalls[0]}


# -- 1. COPY, then one build ---------------------------------------------------------------------------


def copy_then_build(
    conn: psycopg.Connection[Any], url: str, settings: Settings, data: dict[str, Any], batch: int, builds: int
) -> dict[str, Any]:
    """COPY once; then serial and parallel builds in turns (a parallel one last: the latency reference)."""
    base, n = data["base"], len(data["base"])
    db.create_table(conn, COPY_TABLE, base.shape[1])
    t0 = time.perf_counter()
    for start in range(0, n, batch):
        ids = np.arange(start, min(n, start + batch))
        db.copy_rows(conn, COPY_TABLE, ids, ids + 1, base[ids])
    copy_s = time.perf_counter() - t0
    conn.execute(sql.SQL("ANALYZE {}").format(sql.Identifier(COPY_TABLE)))
    statement = sql.SQL("CREATE INDEX bench_stream_copy_hnsw ON {} {}").format(
        sql.Identifier(COPY_TABLE), db.hnsw_clause(settings)
    )
    runs: dict[str, list[dict[str, Any]]] = {"serial": [], "parallel": []}
    for _ in tqdm(range(builds), desc="COPY + CREATE INDEX, serial and parallel", file=sys.stderr):
        for mode, workers in (("serial", 0), ("parallel", None)):
            conn.execute("DROP INDEX IF EXISTS bench_stream_copy_hnsw")
            seconds, seen = db.build(conn, url, settings, statement, workers=workers)
            recall = db.recall_by_ef(conn, db.plain_search(COPY_TABLE), data["queries"], data["truth"])
            runs[mode].append({"build_s": round(seconds, 3), "workers_seen": seen, "recall_at_10": recall})
    out = {}
    for mode, builds_done in runs.items():
        build_s = float(np.mean([b["build_s"] for b in builds_done]))
        recalls = [b["recall_at_10"] for b in builds_done]
        out[f"copy_build_{mode}"] = summary(
            copy_s + build_s, n, mean_recall(recalls), copy_s=round(copy_s, 3), builds=builds_done
        )
    return out


# -- 2. memstore today ----------------------------------------------------------------------------------


def memstore_upsert(
    store: VectorStore, conn: psycopg.Connection[Any], url: str, data: dict[str, Any], batch: int
) -> dict[str, Any]:
    """``upsert_items`` per batch (the items made beforehand: the store's time, not the client's)."""
    base = data["base"]
    with contextlib.suppress(LookupError):
        store.drop_collection(name=COLLECTION)
    c = store.create_collection(name=COLLECTION, dimensions=base.shape[1])
    batches = [
        [ItemIn(vector=base[i], external_id=str(i)) for i in range(start, min(len(base), start + batch))]
        for start in range(0, len(base), batch)
    ]
    t0 = time.perf_counter()
    for items in tqdm(batches, desc="memstore upsert_items", file=sys.stderr):
        store.upsert_items(collection=COLLECTION, items=items)
    seconds = time.perf_counter() - t0
    statement = db.plain_search(c.table_name, key="external_id")
    live = summary(seconds, len(base), db.recall_by_ef(conn, statement, data["queries"], data["truth"]))
    reindex_s, _ = db.build(conn, url, store.settings, sql.SQL("REINDEX INDEX {}").format(sql.Identifier(c.index_name)))
    rebuilt = db.recall_by_ef(conn, statement, data["queries"], data["truth"])
    store.drop_collection(name=COLLECTION)
    return {"memstore_upsert": live, "memstore_reindexed": summary(seconds + reindex_s, len(base), rebuilt)}


# -- 3. batches into a live graph ----------------------------------------------------------------------


def live_copy(
    conn: psycopg.Connection[Any], settings: Settings, name: str, data: dict[str, Any], order: np.ndarray, batch: int
) -> dict[str, Any]:
    """COPY per batch into a table whose HNSW index exists from the start (pgvector's per-row insert)."""
    base, table = data["base"], PREFIX + name
    db.create_table(conn, table, base.shape[1])
    conn.execute(sql.SQL("CREATE INDEX ON {} {}").format(sql.Identifier(table), db.hnsw_clause(settings)))
    t0 = time.perf_counter()
    for start in tqdm(range(0, len(order), batch), desc=name, file=sys.stderr):
        ids = order[start : start + batch]
        db.copy_rows(conn, table, ids, np.arange(start + 1, start + len(ids) + 1), base[ids])
    seconds = time.perf_counter() - t0
    out = summary(seconds, len(base), db.recall_by_ef(conn, db.plain_search(table), data["queries"], data["truth"]))
    conn.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(table)))
    return out


def cluster_order(base: np.ndarray, seed: int, groups: int = 100) -> np.ndarray:
    """Rows grouped by their nearest of ``groups`` random rows: a stream where neighbours come together
    (a document's chunks, one user's photos), the order least like the random one a build sees."""
    rng = np.random.default_rng(seed)
    unit = base / np.linalg.norm(base, axis=1, keepdims=True)
    anchors = unit[rng.choice(len(base), size=min(groups, len(base)), replace=False)]
    return np.argsort(np.argmax(unit @ anchors.T, axis=1), kind="stable")


# -- 4. the unindexed tail -----------------------------------------------------------------------------


def latency_vs_raw(
    conn: psycopg.Connection[Any], statement: sql.Composed, raw: psycopg.Connection[Any], queries: np.ndarray
) -> dict[str, float]:
    """This search and the parallel build's plain one, taking turns of 25 queries at the default ef."""
    tail = db.Side("tail", db.searcher(conn, statement))
    return db.timed_pair(tail, db.Side("raw", db.searcher(raw, db.plain_search(COPY_TABLE))), queries)


def tail_option(
    conn: psycopg.Connection[Any],
    raw: psycopg.Connection[Any],
    url: str,
    settings: Settings,
    data: dict[str, Any],
    *,
    fraction: float,
    merge: bool,
    args: argparse.Namespace,
) -> dict[str, Any]:
    name = f"{'watermark' if merge else 'segments'}_{fraction:g}"
    store = TailTable(conn, url, settings, PREFIX + name.replace(".", "_"), fraction, merge, args.min_seal)
    store.create(data["base"].shape[1])
    latency_queries = data["queries"][: args.latency_queries]
    largest: dict[str, Any] = {"tail_rows": -1}

    def at_largest_tail(s: TailTable) -> None:
        if s.tail >= largest["tail_rows"]:  # equal: a later one has an index beside it
            db.set_ef(conn, settings.default_ef_search)
            largest.update(tail_rows=s.tail, segments=len(s.segments), plan_uses_partial_indexes=None)
            if s.segments:
                largest["plan_uses_partial_indexes"] = s.plan_uses_every_index(latency_queries[0])
            largest.update(latency_vs_raw(conn, s.statement(), raw, latency_queries))

    order = np.arange(len(data["base"]))
    acked_s = ingest(store, data["base"], order, args.batch, at_largest_tail)
    with_tail = db.recall_by_ef(conn, store.statement(), data["queries"], data["truth"])
    tail_at_end, t0 = store.tail, time.perf_counter()
    if store.tail:
        store.seal()
    indexed_s = acked_s + time.perf_counter() - t0
    db.set_ef(conn, settings.default_ef_search)
    no_tail: dict[str, Any] = {
        "segments": len(store.segments),
        "plan_uses_partial_indexes": store.plan_uses_every_index(latency_queries[0]),
    }
    no_tail |= latency_vs_raw(conn, store.statement(), raw, latency_queries)
    n = len(data["base"])
    out = summary(
        acked_s,
        n,
        with_tail,
        tail_rows_at_end=tail_at_end,
        indexed=summary(indexed_s, n, db.recall_by_ef(conn, store.statement(), data["queries"], data["truth"])),
        rows_built=sum(s.rows_indexed for s in store.seals),
        seals=[vars(s) | {"seconds": round(s.seconds, 3)} for s in store.seals],
        latency_largest_tail=largest,
        latency_no_tail=no_tail,
    )
    conn.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(store.table)))
    return {name: out}


# -- the run -------------------------------------------------------------------------------------------


def load_data(args: argparse.Namespace) -> dict[str, Any]:
    if args.data:
        base, queries = load_npz(args.data)
        base, queries = base[: args.rows or len(base)], queries[: args.queries]
        name = args.data.stem
    else:
        every = clustered(args.rows + args.queries, args.dim, seed=args.seed)
        base, queries, name = every[: args.rows], every[args.rows :], f"clustered-{args.dim}d-seed{args.seed}"
    truth = [set(row.tolist()) for row in exact_neighbours(base, queries, db.K)]
    return {"name": name, "base": np.ascontiguousarray(base), "queries": queries, "truth": truth}


def run(url: str, settings: Settings, data: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    migrate.upgrade(url)
    engine = create_engine(url)
    store = VectorStore(engine, settings=settings)
    options: dict[str, Any] = {}
    with db.connect(url, settings) as conn, db.connect(url, settings) as raw:
        options |= copy_then_build(conn, url, settings, data, args.batch, args.builds)
        # Searched in turns with each stream's collection: what the machine's load alone costs a search.
        quiet = stream_memstore.quiet_collection(store, data)
        for batch in args.batches:
            streaming = VectorStore(engine, settings=settings)  # its sealer's record is this stream's alone
            options[f"segments_python_{batch}"] = stream_memstore.stream(
                streaming, data, url=url, batch=batch, quiet=quiet
            )
            streaming.sealer.close()
        if args.rest_batch:
            server = Server(url, workers=0)
            try:
                _, secret = keys.create_key(store.db, name=f"bench-stream-{time.time_ns()}", scopes=["admin"])
                rest = (f"http://127.0.0.1:{server.port}", secret)
                options[f"segments_rest_{args.rest_batch}"] = stream_memstore.stream(
                    store, data, url=url, batch=args.rest_batch, rest=rest, quiet=quiet
                )
            finally:
                server.stop()
        for name in args.peers:
            for batch in args.batches:
                options[f"peer_{name}_{batch}"] = stream_peers.stream(name, data, batch=batch)
        if not args.no_graph:
            options |= memstore_upsert(store, conn, url, data, args.batch)
        if args.designs:
            given = np.arange(len(data["base"]))
            shuffled = np.random.default_rng(args.seed + 1).permutation(len(data["base"]))
            orders = (("given", given), ("shuffled", shuffled), ("clustered", cluster_order(data["base"], 1)))
            for name, order in orders:
                options[f"live_copy_{name}"] = live_copy(conn, settings, f"live_copy_{name}", data, order, args.batch)
            db.set_ef(raw, settings.default_ef_search)
            for fraction in args.fractions:
                for merge in (True, False):
                    options |= tail_option(conn, raw, url, settings, data, fraction=fraction, merge=merge, args=args)
        conn.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(COPY_TABLE)))
        store.drop_collection(name=quiet)
    store.sealer.close()
    engine.dispose()
    reference = options["copy_build_parallel"]["rows_per_s"]
    for o in options.values():
        if "rows_per_s" not in o:  # a peer that was skipped
            continue
        o["ratio_vs_copy_build"] = round(o["rows_per_s"] / reference, 3)
        if "indexed" in o:
            o["indexed"]["ratio_vs_copy_build"] = round(o["indexed"]["rows_per_s"] / reference, 3)
    return options


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.stream", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, help="an .npz with arrays base and queries (default: synthetic)")
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument(
        "--batches",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[500, 5_000],
        help="rows per upsert batch of the segmented streams through the Python API",
    )
    parser.add_argument("--rest-batch", type=int, default=500, help="rows per REST upsert (0: no REST stream)")
    parser.add_argument("--batch", type=int, default=5_000, help="rows per batch of the other options")
    parser.add_argument("--no-graph", action="store_true", help="leave out memstore_upsert (the one live graph)")
    parser.add_argument("--designs", action="store_true", help="also the designs measured before the choice")
    parser.add_argument(
        "--peers",
        type=lambda s: [p for p in s.split(",") if p],
        default=[],
        help=f"the same streams (--batches) into these embedded stores where installed: {','.join(stream_peers.PEERS)}",
    )
    parser.add_argument("--queries", type=int, default=1000, help="queries for recall")
    parser.add_argument("--latency-queries", type=int, default=300, help="queries timed per latency measurement")
    parser.add_argument("--builds", type=int, default=3, help="serial and parallel builds each, in turns")
    parser.add_argument("--fractions", type=lambda s: [float(x) for x in s.split(",")], default=[0.25, 1.0])
    parser.add_argument("--min-seal", type=int, default=4_000, help="the smallest tail a seal indexes")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--database-url", help="an empty database to use (default: a temporary embedded server)")
    parser.add_argument("--plot", type=Path, default=Path("bench-stream.png"))
    parser.add_argument("--json", action="store_true", help="(the last line is always the JSON result)")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.peers) - set(stream_peers.PEERS))
    if unknown:
        parser.error(f"unknown peers {', '.join(unknown)}: choose among {', '.join(stream_peers.PEERS)}")
    started = time.perf_counter()
    data = load_data(args)
    settings = Settings()
    with scratch_dir(prefix="memstore-bench-") as tmp:
        url = server_url(args.database_url or settings.database_url, Path(tmp), settings)
        settings = Settings(database_url=url)
        options = run(url, settings, data, args)
    result: dict[str, Any] = {
        "dataset": data["name"],
        "rows": len(data["base"]),
        "dims": int(data["base"].shape[1]),
        "batch": args.batch,
        "queries": len(data["queries"]),
        "k": db.K,
        "hnsw": {"m": settings.default_hnsw_m, "ef_construction": settings.default_hnsw_ef_construction},
        "max_parallel_maintenance_workers": settings.max_parallel_maintenance_workers,
        "min_seal": args.min_seal,
        "options": options,
    }
    result["plot"] = str(plot(result, args.plot))
    result["elapsed_s"] = round(time.perf_counter() - started, 1)
    if not args.json:
        print(json.dumps(result, indent=2))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
