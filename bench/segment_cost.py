"""Where a search of a segmented collection spends its time: its graphs, their ef, and its tail.

A collection written as segments (``write_path="segments"``) is searched by one statement with a
branch per graph and one for the unindexed tail, read exactly (``memstore.search.statements``). This
benchmark builds such a collection of ``--rows`` rows in ``--graphs`` graphs of one size, then
upserts ``--tail`` rows it leaves unsealed, and times on one connection, taking turns of 25 queries
(prepared, as the store runs them), at each ``--efs``:

- ``segmented``: the store's statement, every graph and the tail, every graph walked at the ef;
- ``as_searched``: the same at the ef the store walks each graph at for a search at that ef
  (``segments.walk_ef``: lower while there are many graphs);
- ``graphs``: the same graphs without the tail (a tail just sealed);
- ``tail``: the tail's branch alone;
- ``one_graph``: the same rows bulk-loaded into a collection of one graph (what a merge leaves).

With recall@10 of ``segmented``, ``as_searched`` and ``one_graph`` against exact answers. What it answers: whether a
search during a stream pays for its graphs' walks (which a lower ef per graph would cut) or for a fixed
cost per graph and the tail's rows (which only fewer graphs and a smaller tail cut).

    python -m bench.segment_cost --json              # 65,000 x 128: 10 graphs, a 5,000-row tail
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
from psycopg import sql

from bench import stream_sql as db
from bench.data import clustered, exact_neighbours
from bench.databases import scratch_dir, server_url
from bench.peers_measure import time_searches
from memstore.catalog import segments
from memstore.db import migrate
from memstore.db.core import create_engine
from memstore.models import Collection, ItemIn
from memstore.search.statements import search_statement
from memstore.settings import Settings
from memstore.store import VectorStore

SEGMENTED, ONE_GRAPH = "bench_segment_cost_segmented", "bench_segment_cost_one_graph"


def segmented_collection(store: VectorStore, base: np.ndarray, *, graphs: int, tail: int) -> Collection:
    """``base``'s first ``len(base) - tail`` rows in ``graphs`` sealed graphs of one size, the rest in
    the tail. Each seal is asked for (the settings keep the sealer's own bound out of reach)."""
    store.create_collection(name=SEGMENTED, dimensions=base.shape[1], write_path="segments")
    indexed = len(base) - tail
    edges = np.linspace(0, indexed, graphs + 1).astype(int)
    for lo, hi in itertools.pairwise(int(e) for e in edges):
        store.upsert_items(collection=SEGMENTED, items=_items(base, lo, hi))
        store.seal(collection=SEGMENTED)
    if tail:
        store.upsert_items(collection=SEGMENTED, items=_items(base, indexed, len(base)))
    store.forget_collection(SEGMENTED)
    return store.get_collection(name=SEGMENTED, fresh=True)


def _items(base: np.ndarray, lo: int, hi: int) -> list[ItemIn]:
    return [ItemIn(vector=base[i], external_id=str(i)) for i in range(lo, hi)]


def statements(c: Collection, one: Collection, k: int) -> dict[str, sql.SQL]:
    """The four statements timed, as text (prepared once each on the benchmark's connection). The
    parts answer the columns the store's statement answers (id, external_id, metadata, distance), so
    that their times add up to its own but for the union."""
    ranges = segments.search_ranges(c)
    if ranges is None:
        raise ValueError(f"collection {c.name!r} is not written as segments")
    part = sql.SQL(
        "SELECT id, external_id, metadata, embedding <=> %(q)s AS distance FROM {t} WHERE embedding IS NOT NULL "
        "AND {r} ORDER BY embedding <=> %(q)s LIMIT {k}"
    )

    def branch(lo: int, hi: int | None) -> sql.Composed:
        return part.format(t=sql.Identifier(c.table_name), r=segments.range_predicate(lo, hi), k=sql.Literal(k))

    graphs_only = sql.SQL(
        "WITH c AS MATERIALIZED ({}) SELECT id, external_id, metadata, distance FROM c ORDER BY distance + 0 LIMIT {}"
    ).format(sql.SQL(" UNION ALL ").join(sql.SQL("({})").format(branch(lo, hi)) for lo, hi in ranges), sql.Literal(k))
    composed = {
        "segmented": search_statement(c.table_name, c.spec.operator, exact=False, limit=k, graphs=ranges),
        "graphs": graphs_only,
        "tail": branch(ranges[-1][1], None),
        "one_graph": search_statement(one.table_name, one.spec.operator, exact=False, limit=k),
    }
    return {name: sql.SQL(s.as_string()) for name, s in composed.items()}


def external_ids(conn: Any, statement: sql.SQL) -> db.Search:
    """Prepared, as the store runs it; the answer's external ids (the rows' places in ``base``)."""
    return lambda q: [int(r[1]) for r in conn.execute(statement, {"q": q}, prepare=True).fetchall()]


def measure(store: VectorStore, data: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    base, queries, truth = data["base"], data["queries"], data["truth"]
    c = segmented_collection(store, base, graphs=args.graphs, tail=args.tail)
    store.create_collection(name=ONE_GRAPH, dimensions=base.shape[1])
    store.bulk_load(collection=ONE_GRAPH, items=_items(base, 0, len(base)), total=len(base))
    one = store.get_collection(name=ONE_GRAPH, fresh=True)
    texts = statements(c, one, db.K)
    out: dict[str, Any] = {"graphs_built": len(segments.search_ranges(c) or ())}
    with (
        store.db.dedicated(application_name="bench-segment-cost") as conn,
        store.db.dedicated(application_name="bench-segment-cost-walk-ef") as walked,
    ):
        sides = {name: db.Side(name, external_ids(conn, text)) for name, text in texts.items()}
        # The store's statement at the ef the store walks each graph at (its own connection's setting).
        sides["as_searched"] = db.Side("as_searched", external_ids(walked, texts["segmented"]))
        for ef in args.efs:
            db.set_ef(conn, ef)
            walk = segments.walk_ef(c, ef, db.K)
            db.set_ef(walked, walk)
            timings = time_searches(list(sides.values()), queries, rounds=args.rounds, warmup=20)
            row: dict[str, Any] = {
                name: {"p50_ms": round(t.p50_ms, 3), "p99_ms": round(t.p99_ms, 3)}
                for name, t in zip(sides, timings, strict=True)
            }
            for name in ("segmented", "as_searched", "one_graph"):
                row[name]["recall_at_10"] = db.recall(sides[name].search, queries, truth)
            row["as_searched"]["walk_ef"] = walk
            out[str(ef)] = row
    if args.tail:
        tail_ms = [out[str(ef)]["tail"]["p50_ms"] for ef in args.efs]
        out["tail_us_per_row_p50"] = round(1000 * float(np.median(tail_ms)) / args.tail, 3)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.segment_cost", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=65_000, help="rows in all, graphs and tail")
    parser.add_argument("--graphs", type=int, default=10, help="graphs of one size the indexed rows make")
    parser.add_argument("--tail", type=int, default=5_000, help="rows left in the tail, read exactly")
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--queries", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=2, help="passes over the queries, taking turns")
    parser.add_argument("--efs", type=lambda s: [int(x) for x in s.split(",")], default=[10, 40, 80])
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--database-url", help="an empty database to use (default: a temporary embedded server)")
    parser.add_argument("--json", action="store_true", help="(the last line is always the JSON result)")
    args = parser.parse_args(argv)
    if not 0 <= args.tail < args.rows or args.graphs < 1:
        parser.error("need --graphs >= 1 and 0 <= --tail < --rows")
    started = time.perf_counter()
    every = clustered(args.rows + args.queries, args.dim, seed=args.seed)
    base, queries = np.ascontiguousarray(every[: args.rows]), every[args.rows :]
    data = {"base": base, "queries": queries, "truth": [set(r.tolist()) for r in exact_neighbours(base, queries, db.K)]}
    settings = Settings()
    with scratch_dir(prefix="memstore-bench-") as tmp:
        url = server_url(args.database_url or settings.database_url, Path(tmp), settings)
        # The sealer never seals on its own (the tail stays as left) and never merges.
        settings = Settings(
            database_url=url, seal_rows=10 * args.rows, segments_max=args.graphs + 2, segments_quiet_s=1e9
        )
        migrate.upgrade(url)
        engine = create_engine(url)
        store = VectorStore(engine, settings=settings)
        try:
            for name in (SEGMENTED, ONE_GRAPH):  # left by an interrupted run on the same database
                with contextlib.suppress(LookupError):
                    store.drop_collection(name=name)
            figures = measure(store, data, args)
        finally:
            for name in (SEGMENTED, ONE_GRAPH):
                with contextlib.suppress(LookupError):
                    store.drop_collection(name=name)
            store.sealer.close()
            engine.dispose()
    result = {
        "rows": args.rows,
        "dims": args.dim,
        "graphs": args.graphs,
        "tail": args.tail,
        "queries": len(queries),
        "k": db.K,
        **figures,
        "elapsed_s": round(time.perf_counter() - started, 1),
    }
    if not args.json:
        print(json.dumps(result, indent=2))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
