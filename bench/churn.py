"""Churn benchmark: how each maintenance strategy keeps an HNSW index's recall and size under churn.

    python -m bench.churn --json [--data FILE.npz] [--rows N] [--rounds R] [--churn F] [--plot FILE.png]
                         [--recall-target T]

Per strategy (none, vacuum, compact, policy) on the same data: load ``rows`` vectors, build the index,
then R rounds of churn (a fraction F of the table: 60% updates with new vectors, 20% deletes, 20%
inserts), each followed by the strategy's maintenance, with searches and inserts running throughout.
After each round: recall@k against exact (numpy) at the default ef_search over ``--queries`` queries
(1000 by default: the minimum over rounds must not be a draw of noise), and the index size. At the end
the index is rebuilt from scratch ``--fresh-builds`` times (3) to give the fresh size and the fresh
recall on the final data (the mean: one build's recall varies by about 0.01 on the synthetic data).
The default data is clustered synthetic (``--rows`` 100,000, 128 dimensions, seed fixed); ``--data``
takes any npz with ``base`` and ``queries`` (``python -m bench.churn_data`` makes one from bge-m3).
The concurrent searches are the users' searches: they use the queries past the first ``--queries``
(the recall ones) when the data has that many more (synthetic data does; bge-m3's 100 held-out queries
serve both), and the searches users ran before are sampled into ``memstore_query_samples`` the way the
API samples them, so the worker's recall probes see real queries as they do behind the API.
Autovacuum is disabled on the benchmark tables so that each strategy is the only maintenance.
With ``--recall-target T`` the policy's collection asks for recall T and the worker tunes its
ef_search on its passes: the policy's recall at its tuned ef on held-out queries per round, against
the fixed ef that would have held T at every round (``bench.churn_target``); the plot is then the
target's.
The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.churn_data import Dataset, load_npz, synthetic
from bench.churn_db import connect, exact_topk, fetch_topk, index_bytes, recall_at
from bench.churn_load import Load
from bench.churn_plot import plot, plot_target
from bench.churn_target import (
    LADDER,
    fixed_ef,
    held_out,
    recall_by_ef,
    split_queries,
    summary,
    time_tuned_vs_fixed,
)
from maintenance.config import MaintenanceConfig
from maintenance.worker import MaintenanceWorker
from memstore.db import migrate
from memstore.db.core import get_engine, resolve_database_url
from memstore.services.query_sampler import QuerySampler
from memstore.settings import get_settings
from memstore.store import VectorStore

STRATEGIES = ("none", "vacuum", "compact", "policy")
K = 10


class Mirror:
    """Which vector (a row of ``base``) each table id holds, and the pool of vectors not in the table."""

    def __init__(self, base: np.ndarray, rows: int, seed: int) -> None:
        self.base = base
        self.slots: dict[int, int] = {}
        self.pool = list(np.random.default_rng(seed).permutation(np.arange(rows, len(base))))
        self.lock = threading.Lock()

    def take(self) -> int | None:
        with self.lock:
            return self.pool.pop() if self.pool else None

    def give(self, slot: int) -> None:
        with self.lock:
            self.pool.insert(0, slot)

    def take_vector(self) -> tuple[int, np.ndarray] | None:
        slot = self.take()
        return None if slot is None else (slot, self.base[slot])

    def truth(self, queries: np.ndarray) -> list[set[int]]:
        with self.lock:
            ids = np.fromiter(self.slots.keys(), dtype=np.int64)
            vectors = self.base[np.fromiter(self.slots.values(), dtype=np.int64)]
        return exact_topk(vectors, ids, queries, K)


def _stage(conn: Any, pairs: list[tuple[str, np.ndarray]]) -> None:
    conn.execute("CREATE TEMP TABLE IF NOT EXISTS churn_stage (key text, embedding vector)")
    conn.execute("TRUNCATE churn_stage")
    with conn.cursor() as cur, cur.copy("COPY churn_stage (key, embedding) FROM STDIN (FORMAT BINARY)") as copy:
        copy.set_types(["text", "vector"])
        for key, v in pairs:
            copy.write_row((key, v))


def _insert(conn: Any, table: str, mirror: Mirror, slots: list[int]) -> None:
    _stage(conn, [(f"s{s}-{time.time_ns()}", mirror.base[s]) for s in slots])
    rows = conn.execute(
        f'INSERT INTO "{table}" (external_id, embedding) '
        "SELECT key, embedding FROM churn_stage RETURNING id, external_id"
    ).fetchall()
    with mirror.lock:
        for row_id, key in rows:
            mirror.slots[int(row_id)] = int(key[1:].split("-")[0])


def churn_round(conn: Any, table: str, mirror: Mirror, fraction: float, rng: np.random.Generator) -> None:
    with mirror.lock:
        ids = np.fromiter(mirror.slots.keys(), dtype=np.int64)
    n = int(len(ids) * fraction)
    n_upd, n_del = int(n * 0.6), int(n * 0.2)
    picked = rng.choice(ids, size=n_upd + n_del, replace=False)
    upd, dele = picked[:n_upd], picked[n_upd:]
    new = [mirror.take() for _ in range(n_upd)]
    pairs = [(str(i), s) for i, s in zip(upd.tolist(), new, strict=True) if s is not None]
    _stage(conn, [(k, mirror.base[s]) for k, s in pairs])
    conn.execute(
        f'UPDATE "{table}" AS t SET embedding = s.embedding, updated_at = now() '
        f"FROM churn_stage AS s WHERE t.id = s.key::bigint"
    )
    for key, s in pairs:
        old = mirror.slots[int(key)]
        mirror.slots[int(key)] = s
        mirror.give(old)
    conn.execute(f'DELETE FROM "{table}" WHERE id = ANY(%s)', (dele.tolist(),))
    for i in dele.tolist():
        mirror.give(mirror.slots.pop(int(i)))
    _insert(conn, table, mirror, [s for s in (mirror.take() for _ in range(n - n_upd - n_del)) if s is not None])
    conn.execute("SELECT pg_stat_force_next_flush()")  # the worker reads these counters


def setup_collection(
    store: VectorStore, name: str, ds: Dataset, rows: int, seed: int
) -> tuple[str, str, Mirror, float]:
    with contextlib.suppress(LookupError):
        store.drop_collection(name=name)
    c = store.create_collection(name=name, dimensions=int(ds.base.shape[1]))
    mirror = Mirror(ds.base, rows, seed)
    with connect() as conn:
        conn.execute(f'DROP INDEX "{c.index_name}"')  # bulk load, then one build: minutes faster than inserts
        conn.execute(f'ALTER TABLE "{c.table_name}" SET (autovacuum_enabled = false)')
        for start in range(0, rows, 20_000):
            _insert(conn, c.table_name, mirror, list(range(start, min(rows, start + 20_000))))
        t0 = time.perf_counter()
        conn.execute(
            f'CREATE INDEX "{c.index_name}" ON "{c.table_name}" USING hnsw (embedding {c.spec.opclass}) '
            f"WITH (m = {c.hnsw_m}, ef_construction = {c.hnsw_ef_construction})"
        )
        build = time.perf_counter() - t0
        # Flush this backend's insert counts before VACUUM sets the live-row estimate, or they are
        # added on top of it later (and every strategy's probes would see twice the rows).
        conn.execute("SELECT pg_stat_force_next_flush()")
        conn.execute("SELECT 1")
        conn.execute(f'VACUUM ANALYZE "{c.table_name}"')
    return c.table_name, c.index_name, mirror, build


def sample_user_queries(store: VectorStore, name: str, queries: np.ndarray) -> None:
    """The users' earlier searches, kept by the API's own sampler (at rate 1: the table keeps the most
    recent thousand per collection either way)."""
    sampler = QuerySampler(store.db, rate=1.0)
    collection_id = store.get_collection(name=name).id
    for q in queries:
        sampler.offer(collection_id, q)
    sampler.close()  # flushed


def record_target(t: dict[str, Any], c: Any, conn: Any, table: str, queries: np.ndarray, truth: list[set[int]]) -> None:
    """After a pass: the collection's ef_search, recall at it and at every ladder ef, and its tuning."""
    ladder = recall_by_ef(conn, table, queries, truth, (*LADDER, c.default_ef_search))
    t["ef_search"].append(c.default_ef_search)
    t["recall"].append(ladder[c.default_ef_search])
    t["ladder"].append({str(e): v for e, v in ladder.items()})
    tuning = c.recall_tuning or {}
    t["tuning"].append({k: tuning.get(k) for k in ("ef", "recall", "lower", "queries", "source", "ladder")})


def actions(worker: MaintenanceWorker) -> list[dict[str, Any]]:
    """What a pass did (its "nothing" verdicts left out), with why and how long."""
    return [
        {"action": o.decision, "outcome": o.outcome, "reason": o.reason, "seconds": round(o.duration_s, 3)}
        for o in worker.last_outcomes
        if o.outcome != "nothing"
    ]


def finish_target(t: dict[str, Any], target: float, table: str, queries: np.ndarray, tuned: int) -> None:
    """The fixed ef that held ``target`` at every round, and both efs timed on the final data."""
    ladders = [{int(e): v for e, v in ladder.items() if int(e) in LADDER} for ladder in t["ladder"]]
    fixed = fixed_ef(ladders, target)
    t["fixed_ef"] = fixed if fixed is not None else max(LADDER)
    t["fixed_ef_holds"] = fixed is not None
    t["timing"] = time_tuned_vs_fixed(table, queries, tuned=tuned, fixed=t["fixed_ef"])


def run_strategy(strategy: str, ds: Dataset, args: argparse.Namespace, store: VectorStore) -> dict[str, Any]:
    name = f"bench_churn_{strategy}"
    table, index, mirror, build = setup_collection(store, name, ds, args.rows, args.seed)
    ef = store.settings.default_ef_search
    targeted = strategy == "policy" and args.recall_target is not None
    queries, user_queries = split_queries(ds.queries, args.queries, apart=targeted)
    sample_user_queries(store, name, user_queries)
    if targeted:
        store.set_recall_target(collection=name, target=args.recall_target)
    worker = MaintenanceWorker(store.db, settings=store.settings, config=MaintenanceConfig(), collections=[name])
    worker.session()  # the worker's connection is opened up front, like the other strategies' connection
    out: dict[str, Any] = {
        "recall": [],
        "index_bytes": [],
        "live_rows": [],
        "maint_seconds_per_round": [],
        "churn_seconds": 0.0,
        "build_seconds": round(build, 2),
        "decisions": [],
    }
    if targeted:
        out["target"] = {"ef_search": [], "recall": [], "ladder": [], "tuning": [], "actions": []}

    def tuned_ef() -> int:
        return store.get_collection(name=name, fresh=True).default_ef_search

    with connect() as conn:

        def measure() -> None:
            truth = mirror.truth(queries)
            out["recall"].append(recall_at(fetch_topk(conn, table, queries, K, ef_search=ef), truth))
            out["index_bytes"].append(index_bytes(conn, index))
            out["live_rows"].append(len(mirror.slots))
            if targeted:
                record_target(out["target"], store.get_collection(name=name, fresh=True), conn, table, queries, truth)

        measure()
        load = Load(
            table,
            user_queries,
            ef_search=ef,
            take_vector=mirror.take_vector,
            on_insert=lambda i, s: mirror.slots.__setitem__(i, s),
        )
        for r in range(args.rounds):
            if targeted:
                load.ef_search = tuned_ef()  # the users' default searches run at the tuned ef
            load.start()
            t0 = time.perf_counter()
            churn_round(conn, table, mirror, args.churn, np.random.default_rng(args.seed * 1000 + r))
            out["churn_seconds"] += time.perf_counter() - t0
            t0 = time.perf_counter()
            if strategy == "vacuum":
                conn.execute(f'VACUUM "{table}"')
            elif strategy == "compact":
                conn.execute(f'REINDEX INDEX CONCURRENTLY "{index}"')
                conn.execute(f'VACUUM "{table}"')
            elif strategy == "policy":
                if worker.run_once() != 0:
                    load.errors.append(f"round {r}: maintenance pass failed: {worker.last_outcomes}")
                out["decisions"].append([f"{o.decision}:{o.outcome}" for o in worker.last_outcomes])
                if targeted:
                    out["target"]["actions"].append(actions(worker))
            out["maint_seconds_per_round"].append(round(time.perf_counter() - t0, 3))
            load.stop()
            measure()
            print(
                f"{strategy} round {r + 1}: recall {out['recall'][-1]:.4f} "
                f"index {out['index_bytes'][-1] / 2**20:.1f} MB "
                f"maint {out['maint_seconds_per_round'][-1]:.2f}s",
                file=sys.stderr,
                flush=True,
            )
        if targeted:
            finish_target(out["target"], args.recall_target, table, queries, tuned_ef())
            out["target"]["held_out"] = held_out(conn, store.get_collection(name=name).id, queries, user_queries)
        # Fresh builds on the final data, for reference: a build's recall varies by about 0.01 from one
        # build to the next (its graph levels are drawn at random), so the reference is their mean.
        truth = mirror.truth(queries)
        out["fresh_recalls"] = []
        for _ in range(args.fresh_builds):
            conn.execute(f'REINDEX INDEX "{index}"')
            out["fresh_recalls"].append(recall_at(fetch_topk(conn, table, queries, K, ef_search=ef), truth))
        out["fresh_index_bytes"] = index_bytes(conn, index)
        out["fresh_recall"] = round(float(np.mean(out["fresh_recalls"])), 4)
    fresh_per_row = out["fresh_index_bytes"] / max(len(mirror.slots), 1)
    after = list(zip(out["recall"][1:], out["index_bytes"][1:], out["live_rows"][1:], strict=True))
    out.update(
        min_recall=min(r for r, _, _ in after) if after else out["recall"][0],
        maint_seconds=round(sum(out["maint_seconds_per_round"]), 3),
        # Against a fresh build of the same number of rows (the concurrent inserts grow the table).
        size_ratio_max=round(max((b / (fresh_per_row * n) for _, b, n in after), default=1.0), 4),
        query_p99_ms_during=None if load.p99_ms() is None else round(load.p99_ms() or 0, 2),
        searches_during=len(load.latencies_ms),
        inserts_during=load.inserts,
        errors=len(load.errors),
        error_samples=load.errors[:5],
        churn_seconds=round(out["churn_seconds"], 2),
    )
    store.drop_collection(name=name)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.churn", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, help="npz with arrays base and queries (default: synthetic)")
    parser.add_argument("--rows", type=int, help="rows in the table (default 100,000 synthetic; 80%% of base)")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--churn", type=float, default=0.02, help="fraction of the table changed per round")
    parser.add_argument("--queries", type=int, default=1000, help="queries used for recall")
    parser.add_argument("--fresh-builds", type=int, default=3, help="fresh builds averaged for the reference recall")
    parser.add_argument("--strategies", default=",".join(STRATEGIES))
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--plot", type=Path, default=Path("bench-churn.png"))
    parser.add_argument(
        "--recall-target",
        type=float,
        help="the policy's collection asks for this recall@10 (e.g. 0.95): the worker tunes its ef_search",
    )
    parser.add_argument("--json", action="store_true", help="(the last line is always the JSON result)")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    if args.data:
        ds = load_npz(args.data)
        args.rows = args.rows or int(len(ds.base) * 0.8)
        if args.rows >= len(ds.base):
            parser.error(f"--rows must be below the {len(ds.base)} base vectors (the rest feed inserts and updates)")
    else:
        args.rows = args.rows or 100_000
        ds = synthetic(int(args.rows * 1.3), queries=2 * args.queries)  # recall queries, then users' queries
    # The configured database (the embedded server by default), brought up to the current schema.
    migrate.upgrade(resolve_database_url(get_settings()))
    store = VectorStore(get_engine(get_settings()), settings=get_settings())
    strategies = {s: run_strategy(s, ds, args, store) for s in args.strategies.split(",")}
    result: dict[str, Any] = {
        "dataset": ds.name,
        "rows": args.rows,
        "dims": int(ds.base.shape[1]),
        "rounds": args.rounds,
        "churn_fraction": args.churn,
        "k": K,
        "ef_search": store.settings.default_ef_search,
        "queries": min(args.queries, len(ds.queries)),
        "policy_config": MaintenanceConfig().model_dump(),
        "strategies": strategies,
    }
    if "policy" in strategies:
        p = strategies["policy"]
        vacuum = strategies.get("vacuum")
        result.update(
            cost_ratio_policy_vs_vacuum=round(p["maint_seconds"] / vacuum["maint_seconds"], 4) if vacuum else None,
            size_ratio_policy_max=p["size_ratio_max"],
            min_recall_policy=p["min_recall"],
            fresh_recall=p["fresh_recall"],
        )
        result["goals"] = {
            "min_recall_policy>=0.95": p["min_recall"] >= 0.95,
            "min_recall_policy>=fresh_recall-0.01": p["min_recall"] >= p["fresh_recall"] - 0.01,
            "cost_ratio_policy_vs_vacuum<=0.25": vacuum is not None and result["cost_ratio_policy_vs_vacuum"] <= 0.25,
            "size_ratio_policy_max<=1.1": p["size_ratio_max"] <= 1.1,
            "zero_errors": all(s["errors"] == 0 for s in strategies.values()),
        }
        if args.recall_target is not None:
            result["recall_target"] = summary(p, args.recall_target, result["cost_ratio_policy_vs_vacuum"])
            result["plot"] = str(plot_target(result, args.plot))
        elif len(strategies) == len(STRATEGIES):
            result["plot"] = str(plot(result, args.plot))
    result["elapsed_s"] = round(time.perf_counter() - started, 1)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
