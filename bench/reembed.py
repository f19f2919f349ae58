"""``python -m bench.reembed --json``: re-embedding a stored image collection into a second space.

    python -m bench.reembed --json [--images N] [--rounds N] [--workers N] [--batch-size N]
                                   [--search-rate R] [--baseline-s S] [--database-url URL]

All in one run, on a database of its own (the embedded server unless ``--database-url``), with one
encoder engine running both offline models on CPU (``memstore-tiny``, 64-d, the collection's own;
``memstore-tiny-wide``, 96-d, the new spaces'), built as ``memstore serve`` builds it from
``MEMSTORE_MODEL`` and ``MEMSTORE_MODELS``:

1. ``--images`` photo-like JPEGs of varied sizes (``bench.image_set``: thumbnails to a few
   megapixels) are stored and embedded into the default space by real ``IngestWorker`` threads
   (``--workers``, as ``memstore serve --workers``).
2. Then ``--rounds`` times, each round re-embedding the whole collection into a new space
   (``wide1``, ``wide2``, ...), so that each round's ratios compare neighbours in time and a moment
   of contention on a shared machine decides no more than one round (the medians are reported):

   a. the encoder alone on the first half of the images: ``embed_images`` in the workers' order and
      batch size, the wide model at the background priority, no database;
   b. a stream of vector searches on the default space (``bench.search_stream``:
      ``VectorStore.search`` at ``--search-rate`` a second, open loop) alone for ``--baseline-s``;
   c. under the same stream, the re-embedding: ``VectorStore.create_space`` of the wide model; the
      workers' space pass queues the backlog, the workers claim and embed it, and the space's HNSW
      index is built once it is full. Timed from the space's creation to its last vector written
      (``reembed_items_per_s``) and to the state ``ready`` (``ready_s``, with the index build),
      both watched in the database;
   d. the encoder alone on the other half.
3. The last space is activated; every item must have exactly one vector in it.

Reported (medians over the rounds, each round's figures in ``per_round``): ``reembed_per_s_ratio``,
re-embedding items/s over the encoder's own images/s on the same inputs (goal >= 0.8: what the
queue, the workers and the database cost around the model); ``search_p99_ratio_during``, the
stream's p99 from the space's creation until it is ready over its p99 just before (goal <= 2);
``errors``, failed searches + failed queue rows (goal 0); ``exactly_one_vector``; and the load
average before and after, since the other processes of a shared machine move every figure. Progress
goes to stderr; the last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from statistics import median
from typing import Any

import numpy as np
import psycopg
from pgvector.psycopg import register_vector
from psycopg import sql
from tqdm import tqdm

from bench.databases import drop_database, new_database, scratch_dir
from bench.image_set import LARGEST, describe, image_set, image_sizes
from bench.search_stream import SearchStream
from encoder.engine import EmbeddingEngine
from encoder.settings import EncoderSettings
from encoder.types import Priority
from memstore.catalog.collections import Collection, Space
from memstore.db.core import Database, create_engine, libpq_url, normalise_url
from memstore.db.embedded import start_embedded_server
from memstore.queue import jobs
from memstore.queue.jobs import PendingItem
from memstore.services.encoder_host import EncoderChoice, open_backend
from memstore.settings import IngestSettings, Settings
from memstore.store import VectorStore
from memstore.workers.ingest import IngestWorker

TINY, WIDE = "memstore-tiny", "memstore-tiny-wide"
COLLECTION = "photos"
SPACE = "wide"  # the spaces are wide1, wide2, ... (one per round)
POLL_S = 0.1  # how often the re-embedding's end is looked for (a count of a small table)


def log(msg: str) -> None:
    print(f"[bench.reembed] {msg}", file=sys.stderr, flush=True)


def open_engine(batch_size: int, threads: int | None) -> tuple[EmbeddingEngine, Callable[[], None]]:
    """Both offline models in one engine on CPU, built as ``memstore serve`` builds its own from
    ``MEMSTORE_MODEL`` and ``MEMSTORE_MODELS`` (``threads``: MEMSTORE_ENCODER_TORCH_THREADS)."""
    os.environ.update(
        {
            "MEMSTORE_MODEL": TINY,
            "MEMSTORE_PRETRAINED": "none",
            "MEMSTORE_MODELS": f"{WIDE}=none",
            "MEMSTORE_ENCODER_DEVICE": "cpu",
            "MEMSTORE_ENCODER_BATCH_SIZE": str(batch_size),
        }
    )
    if threads is not None:
        os.environ["MEMSTORE_ENCODER_TORCH_THREADS"] = str(threads)
    backend, close = open_backend(EncoderChoice(mode="local"))
    assert isinstance(backend, EmbeddingEngine)
    return backend, close


@contextmanager
def ingest_workers(db: Database, backend: EmbeddingEngine, n: int, batch_size: int) -> Iterator[list[IngestWorker]]:
    """``n`` real ingest workers in threads (as ``memstore serve --workers n`` runs them)."""
    settings = IngestSettings(batch_size=batch_size)
    workers = [IngestWorker(db, backend, settings=settings, name=f"ingest-{i}") for i in range(n)]
    threads = [threading.Thread(target=w.run, name=w.name, daemon=True) for w in workers]
    for t in threads:
        t.start()
    try:
        yield workers
    finally:
        for w in workers:
            w.stop()
        for t in threads:
            t.join(60)


def watch(conn: psycopg.Connection[Any], query: sql.Composed, until: int, desc: str) -> float:
    """Poll ``query`` (one count) until it reaches ``until``; returns time.monotonic() when it did."""
    with tqdm(total=until, desc=desc, file=sys.stderr, leave=False) as bar:
        while True:
            row = conn.execute(query).fetchone()
            now = time.monotonic()
            done = int(row[0]) if row else 0
            bar.update(done - bar.n)
            if done >= until:
                return now
            time.sleep(POLL_S)


def store_images(
    store: VectorStore, conn: psycopg.Connection[Any], images: list[bytes], *, ocr: bool = False
) -> Collection:
    """Create the collection (reading text in its images when ``ocr``) and queue every image (in id
    order); the running workers embed them."""
    c = store.create_collection(name=COLLECTION, dimensions=64, model=TINY, ocr=ocr)
    queue_images(store, c, images, prefix="p", desc="store")
    ready = sql.SQL("SELECT count(*) FROM {} WHERE embedding IS NOT NULL").format(c.table)
    watch(conn, ready, len(images), "embed (default space)")
    return c


def queue_images(store: VectorStore, c: Collection, images: list[bytes], *, prefix: str, desc: str = "") -> None:
    """Queue ``images`` (JPEGs) into ``c`` as items ``{prefix}000000``, ``{prefix}000001``, ..., 64 to
    a transaction."""
    step = 64
    for start in tqdm(range(0, len(images), step), desc=desc, file=sys.stderr, leave=False, disable=not desc):
        chunk = images[start : start + step]
        items = [
            PendingItem(content=b, content_type="image/jpeg", external_id=f"{prefix}{start + i:06d}")
            for i, b in enumerate(chunk)
        ]
        jobs.enqueue(store.db, c, items)


def encoder_alone(backend: EmbeddingEngine, images: list[bytes], batch_size: int, desc: str) -> float:
    """Seconds the encoder takes for ``images`` as the workers ask for them: the wide model, background
    priority, one batch after the other."""
    t0 = time.perf_counter()
    for start in tqdm(range(0, len(images), batch_size), desc=desc, file=sys.stderr, leave=False):
        backend.embed_images(images[start : start + batch_size], priority=Priority.BACKGROUND, model=WIDE)
    return time.perf_counter() - t0


def stored_queries(conn: psycopg.Connection[Any], c: Collection, n: int) -> np.ndarray:
    """The default-space vectors of ``n`` stored items, as the stream's queries (they have neighbours)."""
    rows = conn.execute(
        sql.SQL("SELECT embedding FROM {} WHERE embedding IS NOT NULL ORDER BY id LIMIT %s").format(c.table), (n,)
    ).fetchall()
    return np.stack([np.asarray(getattr(r[0], "to_numpy", lambda v=r[0]: v)(), dtype=np.float32) for r in rows])


def reembed(store: VectorStore, conn: psycopg.Connection[Any], name: str, n: int) -> tuple[Space, float, float, float]:
    """Create a space of the wide model and wait for its last vector and for its index:
    (space, created, filled, ready), as time.monotonic() values."""
    t0 = time.monotonic()
    space = store.create_space(collection=COLLECTION, name=name, model=WIDE, dimensions=96)
    filled = watch(conn, sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(space.table_name)), n, "re-embed")
    state = sql.SQL("SELECT count(*) FROM memstore_spaces WHERE id = {} AND state = 'ready'").format(
        sql.Literal(space.id)
    )
    ready = watch(conn, state, 1, "index build")
    return space, t0, filled, ready


@dataclass
class Round:
    """One re-embedding with the encoder alone measured around it and the stream before and during it."""

    space: Space
    encoder_s: float
    reembed_s: float
    ready_s: float
    before: dict[str, Any]
    during: dict[str, Any]
    errors: list[str]

    def figures(self, n: int) -> dict[str, Any]:
        encoder_rate, reembed_rate = n / self.encoder_s, n / self.reembed_s
        p99 = self.during["p99_ms"], self.before["p99_ms"]
        return {
            "space": self.space.name,
            "encoder_images_per_s": round(encoder_rate, 2),
            "reembed_items_per_s": round(reembed_rate, 2),
            "reembed_s": round(self.reembed_s, 2),
            "ready_s": round(self.ready_s, 2),
            "reembed_per_s_ratio": round(reembed_rate / encoder_rate, 3),
            "search_before": self.before,
            "search_during": self.during,
            "search_p99_ratio_during": round(p99[0] / p99[1], 3) if p99[0] and p99[1] else None,
            "failed_searches": self.before["failed"] + self.during["failed"],
        }


def one_round(
    args: argparse.Namespace, store: VectorStore, conn: psycopg.Connection[Any], backend: EmbeddingEngine,
    images: list[bytes], queries: np.ndarray, r: int,
) -> Round:  # fmt: skip
    """The encoder alone on the first half of the images (whole batches), the stream alone, the
    re-embedding under the stream, the encoder alone on the rest: each ratio compares neighbours in time."""
    half = (len(images) // 2) // args.batch_size * args.batch_size
    alone_s = encoder_alone(backend, images[:half], args.batch_size, f"encoder alone {r}a")
    stream = SearchStream(store, COLLECTION, queries, rate_per_s=args.search_rate).start()
    try:
        start = time.monotonic()
        time.sleep(args.baseline_s)
        space, t0, filled, ready = reembed(store, conn, f"{SPACE}{r}", len(images))
        time.sleep(0.5)  # the searches due before ``ready`` finish
    finally:
        stream.stop()
    alone_s += encoder_alone(backend, images[half:], args.batch_size, f"encoder alone {r}b")
    # The stream's first second warms its connection; "during" runs until the space is ready.
    before, during = stream.window(start + 1.0, t0), stream.window(t0, ready)
    return Round(space, alone_s, filled - t0, ready - t0, before, during, stream.errors[:5])


def exactly_one_vector(conn: psycopg.Connection[Any], c: Collection, space: Space) -> dict[str, Any]:
    """After activation: one side row per item (the primary key allows no second), none missing."""
    side = sql.Identifier(space.table_name)
    row = conn.execute(
        sql.SQL(
            "SELECT (SELECT count(*) FROM {t}), (SELECT count(*) FROM {side}), "
            "(SELECT count(DISTINCT id) FROM {side}), "
            "(SELECT count(*) FROM {t} t WHERE NOT EXISTS (SELECT 1 FROM {side} s WHERE s.id = t.id))"
        ).format(t=c.table, side=side)
    ).fetchone()
    assert row is not None
    items, vectors, distinct, missing = (int(v) for v in row)
    return {
        "items": items,
        "side_rows": vectors,
        "duplicates": vectors - distinct,
        "items_without_vector": missing,
        "exactly_one_vector": vectors == items == distinct and missing == 0,
    }


def queue_errors(conn: psycopg.Connection[Any]) -> tuple[int, int]:
    """(failed, still pending) queue rows, every space."""
    row = conn.execute(
        "SELECT count(*) FILTER (WHERE status = 'failed'), count(*) FILTER (WHERE status = 'pending') "
        "FROM memstore_ingest_queue"
    ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def run(args: argparse.Namespace, url: str, images: list[bytes]) -> dict[str, Any]:
    n = len(images)
    load_before = round(os.getloadavg()[0], 2)
    engine = create_engine(url, pool_size=args.workers + 4)
    store = VectorStore(engine, settings=Settings(database_url=url))
    backend, close_backend = open_engine(args.encoder_batch_size, args.torch_threads)
    conn = psycopg.connect(libpq_url(url), autocommit=True)
    register_vector(conn)
    try:
        with ingest_workers(store.db, backend, args.workers, args.batch_size) as workers:
            t = time.perf_counter()
            c = store_images(store, conn, images)
            log(f"{n} images stored and embedded into the default space in {time.perf_counter() - t:.1f}s")
            backend.embed_images(images[: args.batch_size], priority=Priority.BACKGROUND, model=WIDE)  # warm-up
            queries = stored_queries(conn, c, 200)
            rounds = []
            for r in range(1, args.rounds + 1):
                rounds.append(one_round(args, store, conn, backend, images, queries, r))
                log(f"round {r}: {json.dumps(rounds[-1].figures(n))}")
            written = sum(w.totals.written for w in workers)
        last = rounds[-1].space
        store.activate_space(collection=COLLECTION, name=last.name)
        checks = [exactly_one_vector(conn, c, r.space) for r in rounds]
        failed_rows, pending_rows = queue_errors(conn)
    finally:
        close_backend()
        conn.close()
        engine.dispose()
    per_round = [r.figures(n) for r in rounds]
    ratio = median(f["reembed_per_s_ratio"] for f in per_round)
    p99s = [f["search_p99_ratio_during"] for f in per_round]
    p99_ratio = None if None in p99s else median(p99s)
    failed_searches = sum(f["failed_searches"] for f in per_round)
    errors = failed_searches + failed_rows
    result: dict[str, Any] = {
        "images": n,
        "image_set": describe(images, image_sizes(n, args.seed, largest=args.largest)),
        "workers": args.workers,
        "batch_size": args.batch_size,
        "rounds": args.rounds,
        "reembed_per_s_ratio": round(ratio, 3),
        "search_p99_ratio_during": None if p99_ratio is None else round(p99_ratio, 3),
        "errors": errors,
        "exactly_one_vector": all(ch["exactly_one_vector"] for ch in checks),
        "encoder_images_per_s": round(median(f["encoder_images_per_s"] for f in per_round), 2),
        "reembed_items_per_s": round(median(f["reembed_items_per_s"] for f in per_round), 2),
        "ready_s": round(median(f["ready_s"] for f in per_round), 2),
        "search_rate_per_s": args.search_rate,
        "load_average": {"before": load_before, "after": round(os.getloadavg()[0], 2)},
        "failed_searches": failed_searches,
        "search_error_samples": [e for r in rounds for e in r.errors][:5],
        "failed_queue_rows": failed_rows,
        "pending_queue_rows": pending_rows,
        "vectors_written_by_workers": written,
        "activated": last.name,
        "after_activation": checks[-1],
        "per_round": per_round,
    }
    result["goals"] = {
        "reembed_per_s_ratio>=0.8": ratio >= 0.8,
        "search_p99_ratio_during<=2": p99_ratio is not None and p99_ratio <= 2.0,
        "errors==0": errors == 0,
        "exactly_one_vector": result["exactly_one_vector"],
    }
    result["goals_met"] = all(result["goals"].values())
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.reembed", description=__doc__.split("\n")[0])
    p.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    p.add_argument("--database-url", help="server to create the benchmark database on (default: embedded)")
    p.add_argument("--images", type=int, default=2000, help="stored images (default: about 5 minutes on 2 cores)")
    p.add_argument("--largest", type=int, default=LARGEST, help="long side of the largest image, pixels")
    p.add_argument("--workers", type=int, default=1, help="ingest worker threads (as memstore serve --workers)")
    p.add_argument("--batch-size", type=int, default=IngestSettings.model_fields["batch_size"].default,
                   help="queue rows a worker claims at a time (MEMSTORE_INGEST_BATCH_SIZE's default)")  # fmt: skip
    p.add_argument("--encoder-batch-size", type=int, default=EncoderSettings.model_fields["batch_size"].default,
                   help="the encoder's micro-batch (MEMSTORE_ENCODER_BATCH_SIZE's default)")  # fmt: skip
    p.add_argument("--torch-threads", type=int, help="the encoder's torch threads (default: as serve, cores - 1)")
    p.add_argument("--rounds", type=int, default=3, help="re-embeddings, each into a new space (medians reported)")
    p.add_argument("--search-rate", type=float, default=20.0, help="searches a second in the stream")
    p.add_argument("--baseline-s", type=float, default=10.0, help="the stream alone before the re-embedding")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.images < 2 * args.batch_size:
        p.error(f"--images must be at least twice --batch-size ({2 * args.batch_size})")
    images = image_set(args.images, args.seed, largest=args.largest)
    with scratch_dir(prefix="memstore-bench-") as tmp:
        server = (
            normalise_url(args.database_url)
            if args.database_url
            else start_embedded_server(Path(tmp), maintenance_work_mem="512MB", max_parallel_maintenance_workers=1)
        )
        url = new_database(server, "bench_reembed")
        try:
            result = run(args, url, images)
        finally:
            drop_database(url)
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
