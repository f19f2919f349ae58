"""``python -m bench.compress --json``: index size, recall, speed and build time per index representation.

One table holds the rows; every representation's index is built on it the way an online switch builds
it (``CREATE INDEX CONCURRENTLY``; low-rank: fit on a 20k sample, side table filled through
``memstore_project``, then indexed), so they can all be searched from one table: each answers all
queries in a block (as a collection using it would, its working set warm), blocks rotating round by
round so drift on a noisy machine spreads over all; ``qps`` is the median block. Each search is the
SQL the store runs (compact candidates, exact re-ranking on the full vectors).

Per representation: ``index_bytes`` (the HNSW index), ``recall_at_10`` (after re-ranking, against exact
full-precision neighbours from numpy), ``qps`` (one client, sequential), ``build_seconds``. Top level:
``best_ratio_at_095`` = the smallest index_bytes / full index_bytes among representations with recall
at least 0.95, and the graph floor: the bytes per row of an HNSW index on a 1-number vector with the
same m, which no representation can go below.

Data: ``--data FILE.npz`` (arrays base, queries); ``--bge-m3 [DIR]`` (the 1,000 real bge-m3 rows:
100 random held-out queries, 900 base; ``--save-npz FILE`` writes that split); default: ``--rows``
synthetic rows from ``bench.data.low_rank`` (768 dimensions, 64 latent factors plus noise).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
from pgvector.psycopg import register_vector
from psycopg import sql
from tqdm import tqdm

from bench.data import BGE_M3_DIR, exact_neighbours, load_bge_m3, load_npz, low_rank, recall_at_k
from bench.databases import scratch_dir
from memstore.catalog import index_spec as specs
from memstore.catalog.collections import Collection
from memstore.compact import ddl
from memstore.compact import projection as proj
from memstore.db import migrate
from memstore.db.core import create_engine, libpq_url, normalise_url
from memstore.db.embedded import start_embedded_server
from memstore.models import ItemIn
from memstore.search import compact as compact_search
from memstore.search import statements
from memstore.settings import Settings
from memstore.store import VectorStore

NAME = "bench_compress"


def bge_m3(folder: Path, *, held_out: int = 100, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    try:
        rows = load_bge_m3(folder)
    except FileNotFoundError as e:
        raise SystemExit(str(e)) from None
    order = np.random.default_rng(seed).permutation(len(rows))
    return rows[order[held_out:]], rows[order[:held_out]]


def _load(store: VectorStore, conn: psycopg.Connection[Any], base: np.ndarray, storage: str) -> Collection:
    c = store.create_collection(name=NAME, dimensions=int(base.shape[1]))
    # Load without an index; every index is then built on the full table, as a switch would.
    conn.execute(sql.SQL("DROP INDEX {}").format(sql.Identifier(c.index_name)))
    if storage == "main":
        # The layout of a compact collection (vectors in the row); the full index profits from it too.
        conn.execute(specs.inline_vectors_statement(c.table))
    for start in tqdm(range(0, len(base), 5000), desc="load", file=sys.stderr):
        rows = base[start : start + 5000]
        items = [ItemIn(vector=v, external_id=str(start + i)) for i, v in enumerate(rows)]
        store.upsert_items(collection=NAME, items=items)
    conn.execute(sql.SQL("VACUUM ANALYZE {}").format(c.table))
    return c


def _index_sql(c: Collection, name: str, key: str, opclass: str) -> sql.Composed:
    statement = "CREATE INDEX CONCURRENTLY {i} ON {t} USING hnsw ({k} {o}) WITH (m = {m}, ef_construction = {e})"
    return sql.SQL(statement).format(
        i=sql.Identifier(name), t=c.table, k=sql.SQL(key), o=sql.SQL(opclass),
        m=sql.Literal(c.hnsw_m), e=sql.Literal(c.hnsw_ef_construction),
    )  # fmt: skip


def _size(conn: psycopg.Connection[Any], relation: str) -> int:
    row = conn.execute("SELECT pg_relation_size(to_regclass(%s))", (relation,)).fetchone()
    return int(row[0]) if row and row[0] is not None else 0


def graph_floor(conn: psycopg.Connection[Any], c: Collection) -> int:
    """Bytes of an HNSW index on a 1-number vector: the graph and tuple headers, next to no vector data.

    The number is the row id, so every row is its own element: pgvector stores rows with identical
    vectors as one element (up to 10 heap TIDs each), which would make the floor look lower than it is.
    """
    conn.execute(_index_sql(c, "bench_floor", "(ARRAY[id::real]::vector(1))", "vector_l2_ops"))
    size = _size(conn, "bench_floor")
    conn.execute("DROP INDEX bench_floor")
    return size


def build(
    conn: psycopg.Connection[Any], c: Collection, label: str, rank: str | None, pool_factor: float | None
) -> dict[str, Any]:
    """Build one representation's index; returns its spec (as a Collection to search) and costs."""
    representation = label.split("_")[0]
    t0 = time.perf_counter()
    extra = 0
    if representation == "lowrank":
        sample, population = proj.sample_vectors(conn, c)
        pool = specs.IndexSpec("lowrank", pool_factor=pool_factor).pool(10)
        auto = rank == "auto"
        r = proj.choose_rank(sample, metric=c.metric, pool=pool, population=population) if auto else int(rank or 64)
        p = proj.save(conn, proj.fit(sample, metric=c.metric, rank=r, collection_id=c.id))
        assert p.id is not None
        ddl.build_side(conn, c, p)
        spec = specs.IndexSpec("lowrank", rank=r, projection_id=p.id, version=p.version, pool_factor=pool_factor)
        index = specs.side_index(c.id, p.version)
        side = specs.side_table(c.id, p.version)
        extra = _size(conn, side) + _size(conn, f"{side}_pkey")
    else:
        index = f"bench_{representation}"
        key = specs.key_expression(representation, c.dimensions)
        conn.execute(_index_sql(c, index, key, specs.opclass(representation, c.metric)))
        spec = specs.IndexSpec(representation, pool_factor=pool_factor)
    seconds = time.perf_counter() - t0
    if rank == "auto":
        label = f"lowrank_auto_r{spec.rank}"
    return {
        "label": label,
        "collection": replace(c, options={specs.OPTIONS_KEY: spec.to_json()}),
        "spec": spec,
        "index": index,
        "index_bytes": _size(conn, index),
        "side_table_bytes": extra,
        "build_seconds": round(seconds, 2),
    }


def _search(conn: psycopg.Connection[Any], run: dict[str, Any], q: np.ndarray, k: int) -> list[tuple[Any, ...]]:
    """One search, as the store runs it for the representation."""
    c, spec = run["collection"], run["spec"]
    params: dict[str, Any] = {"q": q, "k": k}
    efs = c.default_ef_search
    statement: statements.Statement
    if spec.compact:
        params["pool"] = spec.pool(k)
        params["c"] = compact_search.compact_query(conn, spec, q)
        statement = compact_search.statement(c, spec, where=None)
        efs = min(1000, max(efs, params["pool"]))
    else:
        statement = statements.search_statement(c.table_name, c.spec.operator, exact=False)
    # The full search also runs with the compact planner settings (no sequential scan): on a small
    # table the planner would rather scan the table, and this compares index with index.
    rows = statements.run_search(
        conn, compact_search.settings(ef_search=efs, max_scan_tuples=20_000), statement, params
    )
    conn.commit()
    return rows


def search_all(
    conn: psycopg.Connection[Any], runs: list[dict[str, Any]], queries: np.ndarray, k: int, rounds: int
) -> None:
    """Each representation answers all queries in a block, as a collection using it would (its own
    working set warm); blocks rotate round by round so drift on a noisy machine spreads over all, and
    ``qps`` is the median block. The first block warms up and gives the answers for recall."""
    for run in runs:
        run.update(found=[], block_qps=[])
    for r in tqdm(range(rounds + 1), desc="search", file=sys.stderr):
        shift = r % len(runs)
        for run in runs[shift:] + runs[:shift]:
            t0 = time.perf_counter()
            for q in queries:
                rows = _search(conn, run, q, k)
                if r == 0:
                    run["found"].append([int(row[1]) for row in rows])
            if r > 0:
                run["block_qps"].append(len(queries) / (time.perf_counter() - t0))


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5))
    markers = "osD^vP*X"
    for i, rep in enumerate(result["representations"]):
        # In the legend, not beside the points: several often sit on top of one another.
        label = f"{rep['label']}: {rep['ratio']:.3f}, {rep['recall_at_10']:.3f}, {rep['qps']:.0f} q/s"
        ax.scatter(rep["ratio"], rep["recall_at_10"], s=45, marker=markers[i % len(markers)], label=label)
    ax.axvline(result["graph_floor_ratio"], color="grey", ls=":", lw=1, label="graph floor (1-number index)")
    ax.axhline(0.95, color="red", ls=":", lw=1, label="recall 0.95")
    ax.set_xscale("log")
    ax.set_xlabel("index bytes / full-precision index bytes (log)")
    ax.set_ylabel("recall@10 after exact re-ranking")
    ax.set_title(f"bench.compress: {result['dataset']}, {result['rows']} x {result['dimensions']}", fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5), title="ratio, recall, speed", title_fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.compress", description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", help="(the last line is always the JSON result)")
    parser.add_argument("--data", type=Path, help="an .npz with arrays base and queries")
    parser.add_argument("--bge-m3", nargs="?", const=BGE_M3_DIR, type=Path, help="the real bge-m3 rows (dir)")
    parser.add_argument("--save-npz", type=Path, help="write the data used as an .npz (base, queries) and go on")
    parser.add_argument("--rows", type=int, default=100_000, help="synthetic rows (default 100,000)")
    parser.add_argument("--dimensions", type=int, default=768)
    parser.add_argument("--latent", type=int, default=64)
    parser.add_argument("--noise", type=float, default=0.5)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--representations", default="full,halfvec,binary,lowrank")
    parser.add_argument("--ranks", default="auto,32,64,96,128", help="low-rank ranks to build ('auto': chosen)")
    parser.add_argument("--pool-factor", type=float, help="candidates per result (default: per representation)")
    parser.add_argument("--rounds", type=int, default=3, help="timed search rounds (after one warm-up round)")
    parser.add_argument(
        "--storage", choices=("main", "extended"), default="main",
        help="vectors in the row (main: how compact collections store them) or TOASTed (extended: the default)",
    )  # fmt: skip
    parser.add_argument("--plot", type=Path, default=Path("bench-compress.png"))
    parser.add_argument("--database-url", help="an empty database to use (default: a temporary embedded server)")
    args = parser.parse_args(argv)

    if args.data:
        base, queries = load_npz(args.data)
        dataset = args.data.name
    elif args.bge_m3:
        base, queries = bge_m3(args.bge_m3)
        dataset = "bge-m3 (real, 100 held-out queries)"
    else:
        every = low_rank(args.rows + args.queries, args.dimensions, latent=args.latent, noise=args.noise, seed=42)
        base, queries = every[: args.rows], every[args.rows :]
        dataset = f"low-rank synthetic ({args.latent} latent factors, noise {args.noise})"
    if args.save_npz:
        np.savez(args.save_npz, base=base, queries=queries)
    labels: list[tuple[str, str | None]] = []
    for rep in args.representations.split(","):
        if rep == "lowrank":
            labels += [(f"lowrank_r{r}", r) for r in args.ranks.split(",")]
        else:
            labels.append((rep, None))

    with scratch_dir(prefix="memstore-bench-") as tmp:
        if args.database_url:
            url = normalise_url(args.database_url)
        else:
            url = start_embedded_server(Path(tmp), maintenance_work_mem="1GB", max_parallel_maintenance_workers=1)
        migrate.upgrade(url)
        engine = create_engine(url)
        store = VectorStore(engine, settings=Settings(database_url=url))
        if NAME in {c.name for c in store.list_collections()}:
            store.drop_collection(name=NAME)
        with psycopg.connect(libpq_url(url), autocommit=True) as admin:
            register_vector(admin)
            c = _load(store, admin, base, args.storage)
            floor = graph_floor(admin, c)
            runs = []
            for label, rank in tqdm(labels, desc="build", file=sys.stderr):
                runs.append(build(admin, c, label, rank, args.pool_factor))
        with psycopg.connect(libpq_url(url)) as conn:
            register_vector(conn)
            search_all(conn, runs, queries, 10, args.rounds)
        store.drop_collection(name=NAME)
        engine.dispose()

    truth = exact_neighbours(base, queries, 10)
    full_bytes = next((r["index_bytes"] for r in runs if r["label"] == "full"), None)
    full_qps = None
    out = []
    for run in runs:
        qps = float(np.median(run["block_qps"]))
        full_qps = qps if run["label"] == "full" else full_qps
        spec: specs.IndexSpec = run["spec"]
        out.append({
            "label": run["label"], "representation": spec.representation, "rank": spec.rank,
            "pool": spec.pool(10), "index_bytes": run["index_bytes"],
            "bytes_per_row": round(run["index_bytes"] / len(base), 1),
            "ratio": round(run["index_bytes"] / full_bytes, 4) if full_bytes else None,
            "side_table_bytes": run["side_table_bytes"], "recall_at_10": round(recall_at_k(run["found"], truth), 4),
            "qps": round(qps, 1), "build_seconds": run["build_seconds"],
        })  # fmt: skip
    good = [r["ratio"] for r in out if r["ratio"] is not None and r["recall_at_10"] >= 0.95 and r["label"] != "full"]
    result = {
        "dataset": dataset,
        "rows": len(base),
        "dimensions": int(base.shape[1]),
        "queries": len(queries),
        "hnsw": {"m": c.hnsw_m, "ef_construction": c.hnsw_ef_construction, "ef_search": c.default_ef_search},
        "storage": args.storage,
        "representations": out,
        "best_ratio_at_095": min(good) if good else None,
        "graph_floor_bytes_per_row": round(floor / len(base), 1),
        "graph_floor_ratio": round(floor / full_bytes, 4) if full_bytes else None,
        "full_qps": round(full_qps, 1) if full_qps else None,
        "goals": {"best_ratio_at_095": "<= 0.2 (synthetic 768-d), <= 0.125 (bge-m3)", "qps": ">= full_qps"},
    }
    if full_bytes:
        plot(result, args.plot)
        result["plot"] = str(args.plot)
    if not args.json:
        print(json.dumps(result, indent=2))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
