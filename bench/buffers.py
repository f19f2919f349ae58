"""``python -m bench.buffers --json``: search latency against the embedded server's ``shared_buffers``.

One data folder, one table of ``--rows`` x ``--dims`` clustered vectors (bench.data) with its HNSW
index (m 16, ef_construction 64). The server is then started once per entry of ``--sizes`` (in turns,
``--rounds`` times: A, B, A, B...) through memstore's own ``start_embedded_server(shared_buffers=...)``,
each start in a child process so that the server really stops between them. In each: one warm-up
pass over the queries (the kernel's cache is warm for every size alike), then ``--passes`` timed
passes of one prepared ``SELECT id ... ORDER BY embedding <=> $1 LIMIT 10`` per query, at each
``--ef`` value. Reports p50/p99/mean per size and ef, the index's bytes, and each size's mean over the
first size's (``ratio_vs_first``: below 1 is faster).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
from pgvector.psycopg import register_vector
from tqdm import tqdm

from bench.data import clustered
from bench.databases import scratch_dir
from memstore.db.core import libpq_url
from memstore.db.embedded import start_embedded_server

TABLE = "bench_buffers"
QUERY = f"SELECT id FROM {TABLE} ORDER BY embedding <=> %s LIMIT 10"


def _connect(data_dir: Path, shared_buffers: str) -> psycopg.Connection[Any]:
    url = start_embedded_server(
        data_dir, maintenance_work_mem="2GB", max_parallel_maintenance_workers=1, shared_buffers=shared_buffers
    )
    conn = psycopg.connect(libpq_url(url), autocommit=True)
    conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
    register_vector(conn)
    return conn


def _vectors(args: argparse.Namespace) -> np.ndarray:
    """The rows, then the queries: one draw of the mixture, so that both come from the same clusters."""
    return clustered(args.rows + args.queries, args.dims, seed=args.seed).astype(np.float32)


def load(data_dir: Path, vectors: np.ndarray) -> dict[str, Any]:
    """The table and its index (run in a child: the server stops when it exits)."""
    with _connect(data_dir, "auto") as conn:
        conn.execute(f"CREATE TABLE {TABLE} (id bigint PRIMARY KEY, embedding vector({vectors.shape[1]}))")
        with conn.cursor() as cur, cur.copy(f"COPY {TABLE} (id, embedding) FROM STDIN (FORMAT BINARY)") as copy:
            copy.set_types(["int8", "vector"])
            for i, v in enumerate(tqdm(vectors, desc="COPY", file=sys.stderr, leave=False)):
                copy.write_row((i, v))
        t0 = time.perf_counter()
        conn.execute(
            f"CREATE INDEX ON {TABLE} USING hnsw (embedding vector_cosine_ops) WITH (m = 16, ef_construction = 64)"
        )
        build_s = time.perf_counter() - t0
        row = conn.execute(f"SELECT pg_relation_size('{TABLE}_embedding_idx'), pg_relation_size('{TABLE}')").fetchone()
    assert row is not None
    return {"build_s": round(build_s, 1), "index_bytes": int(row[0]), "table_bytes": int(row[1])}


def measure(data_dir: Path, shared_buffers: str, queries: np.ndarray, efs: list[int], passes: int) -> dict[str, Any]:
    """Latencies at each ef with the server started under ``shared_buffers`` (run in a child)."""
    out: dict[str, Any] = {}
    with _connect(data_dir, shared_buffers) as conn:
        row = conn.execute("SELECT current_setting('shared_buffers')").fetchone()
        assert row is not None
        out["shared_buffers"] = row[0]
        for ef in efs:
            conn.execute(f"SET hnsw.ef_search = {int(ef)}")
            for q in queries:  # warm-up
                conn.execute(QUERY, (q,), prepare=True).fetchall()
            latencies = []
            for _ in range(passes):
                for q in queries:
                    t0 = time.perf_counter()
                    conn.execute(QUERY, (q,), prepare=True).fetchall()
                    latencies.append(time.perf_counter() - t0)
            ms = np.array(latencies) * 1000
            out[str(ef)] = {
                "p50_ms": round(float(np.percentile(ms, 50)), 3),
                "p99_ms": round(float(np.percentile(ms, 99)), 3),
                "mean_ms": round(float(ms.mean()), 3),
            }
    return out


def _child(args: list[str]) -> Any:
    done = subprocess.run([sys.executable, "-m", "bench.buffers", "--child", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"bench.buffers child failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout)


def run(args: argparse.Namespace, data_dir: Path) -> dict[str, Any]:
    common = [f"--rows={args.rows}", f"--dims={args.dims}", f"--seed={args.seed}", f"--queries={args.queries}"]
    built = _child(["load", str(data_dir), *common])
    runs: dict[str, list[dict[str, Any]]] = {size: [] for size in args.sizes}
    efs = ",".join(str(ef) for ef in args.ef)
    for _ in tqdm(range(args.rounds), desc="rounds", file=sys.stderr):
        for size in args.sizes:
            child = ["measure", str(data_dir), *common, "--buffers", size, "--ef", efs]
            runs[size].append(_child([*child, "--passes", str(args.passes)]))
    summary: dict[str, dict[str, Any]] = {}
    for size, measured in runs.items():
        summary[size] = {}
        for ef in map(str, args.ef):
            summary[size][ef] = {
                key: round(float(np.mean([m[ef][key] for m in measured])), 3) for key in measured[0][ef]
            }
    first = args.sizes[0]
    for size in args.sizes:
        for ef in args.ef:
            base = summary[first][str(ef)]["mean_ms"]
            summary[size][str(ef)]["ratio_vs_first"] = round(summary[size][str(ef)]["mean_ms"] / base, 3)
    return {"rows": args.rows, "dims": args.dims, "queries": args.queries, **built, "runs": runs, "summary": summary}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.buffers", description=__doc__)
    p.add_argument("--json", action="store_true", help="print only one JSON document on stdout")
    p.add_argument("--rows", type=int, default=300_000)
    p.add_argument("--dims", type=int, default=128)
    p.add_argument("--queries", type=int, default=300)
    p.add_argument("--sizes", type=lambda t: t.split(","), default=["128MB", "1GB"], help="comma-separated")
    p.add_argument("--ef", type=lambda t: [int(v) for v in t.split(",")], default=[40, 200], help="comma-separated")
    p.add_argument("--rounds", type=int, default=2, help="starts per size, in turns")
    p.add_argument("--passes", type=int, default=3, help="timed passes over the queries per start")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--child", nargs=2, metavar=("STEP", "DATA_DIR"), help=argparse.SUPPRESS)
    p.add_argument("--buffers", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        step, data_dir = args.child[0], Path(args.child[1])
        if step == "load":
            print(json.dumps(load(data_dir, _vectors(args)[: args.rows])))
        else:
            queries = _vectors(args)[args.rows :]
            print(json.dumps(measure(data_dir, args.buffers, queries, args.ef, args.passes)))
        return 0
    with scratch_dir(prefix="memstore-buffers-") as tmp:
        result = run(args, Path(tmp))
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
