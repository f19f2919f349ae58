"""``bench.stream --peers``: the same stream of upsert batches into the embedded stores a Python user
might pick instead, where they are installed (``pip install -e '.[peers]'``, which has qdrant-client for
Qdrant's local mode). Each is reported as skipped, with the reason, where it does not import.

Each peer takes the rows as a client streams them: one upsert call per batch, in order, while a
thread searches it (``bench.stream_memstore.Watcher``). What "indexed" means differs, and the JSON
says so per peer (``indexing``):

- **Chroma** (``collection.upsert``; HNSW m 16, ef_construction 64, ef_search 80): its local client
  puts each write into its graph before the call returns, but for an in-memory brute-force buffer of
  up to ``batch_size`` (100) rows, so the stream ends when the last call does;
- **LanceDB** (``table.add``; ``IVF_HNSW_FLAT`` with one partition: a plain HNSW graph, m 16,
  ef_construction 64): new rows are searched by a flat scan until an index covers them; its
  documented way to index rows added since the index was built is ``table.optimize()``. Here the
  index is built once the first 10% of the rows are in, and ``optimize()`` runs after the last batch
  (the end of the stream);
- **Qdrant's local mode** (``qdrant-client``'s ``QdrantClient(path=...)``, ``upsert``): an in-process
  store for tests and prototypes with no HNSW at all (every search is exact), so its rows/s is a
  write rate with nothing to build; reported for completeness, not as an index. It is not safe for
  a search during an upsert, so here the two take turns under a lock.

The searching client starts once the first batch is in (an empty store answers at once).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from bench.stream_memstore import Watcher, latency_figures, settled
from bench.stream_sql import EFS, K


class ChromaStream:
    name = "chroma"
    indexing = "every upsert goes into the graph before it returns (but for a brute-force buffer of 100 rows)"

    def __init__(self, folder: Path, dims: int) -> None:
        import chromadb

        self.label = f"Chroma {chromadb.__version__}"
        client: Any = chromadb.PersistentClient(
            path=str(folder), settings=chromadb.Settings(anonymized_telemetry=False)
        )
        self.client = client
        self.collection: Any = client.create_collection(
            "stream",
            configuration={"hnsw": {"space": "cosine", "max_neighbors": 16, "ef_construction": 64, "ef_search": 80}},
            embedding_function=None,
        )

    def write(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        self.collection.upsert(ids=[str(i) for i in ids.tolist()], embeddings=vectors)

    def finish(self) -> None:
        pass

    def search(self, q: np.ndarray, ef: int | None = None) -> list[int]:
        out = self.collection.query(query_embeddings=[q], n_results=K, include=[])
        return [int(i) for i in out["ids"][0]]

    def set_ef(self, ef: int) -> bool:
        return ef == 80  # the ef a loaded collection keeps (bench.peers_libs.Chroma reopens to change it)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.client.delete_collection("stream")


class LanceStream:
    name = "lancedb"
    indexing = "flat scan of rows added since the index; index built at 10% of the rows, optimize() at the end"

    def __init__(self, folder: Path, dims: int) -> None:
        import lancedb
        import pyarrow as pa

        self.label = f"LanceDB {lancedb.__version__}"
        self.pa, self.dims = pa, dims
        self.db: Any = lancedb.connect(str(folder))
        self.table: Any = None
        self.rows = 0
        self.index_at: int | None = None
        self.indexed = False
        self.ef = 80

    def _arrow(self, ids: np.ndarray, vectors: np.ndarray) -> Any:
        flat = self.pa.array(np.ascontiguousarray(vectors, dtype=np.float32).ravel())
        column = self.pa.FixedSizeListArray.from_arrays(flat, self.dims)
        return self.pa.table({"id": self.pa.array(ids, type=self.pa.int64()), "vector": column})

    def write(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        part = self._arrow(ids, vectors)
        if self.table is None:
            self.table = self.db.create_table("stream", data=part)
        else:
            merge = self.table.merge_insert("id").when_matched_update_all().when_not_matched_insert_all()
            merge.execute(part)
        self.rows += len(ids)
        if not self.indexed and self.index_at is not None and self.rows >= self.index_at:
            self._index()

    def _index(self) -> None:
        self.table.create_index(metric="cosine", index_type="IVF_HNSW_FLAT", num_partitions=1, m=16, ef_construction=64)
        self.indexed = True

    def finish(self) -> None:
        if not self.indexed:
            self._index()
        else:
            self.table.optimize()

    def search(self, q: np.ndarray, ef: int | None = None) -> list[int]:
        if self.table is None:
            return []
        # _distance named: Lance warns on every search whose columns leave it out.
        query = self.table.search(q).distance_type("cosine").ef(ef or self.ef).limit(K).select(["id", "_distance"])
        return [int(i) for i in query.to_arrow()["id"].to_pylist()]

    def set_ef(self, ef: int) -> bool:
        self.ef = ef
        return True

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.db.drop_table("stream")


class QdrantLocalStream:
    name = "qdrant_local"
    indexing = "none: the local mode searches every row exactly (no HNSW)"

    def __init__(self, folder: Path, dims: int) -> None:
        import qdrant_client
        from qdrant_client import models

        self.label = f"Qdrant local mode (qdrant-client {importlib.metadata.version('qdrant-client')})"
        self.models = models
        self.client: Any = qdrant_client.QdrantClient(path=str(folder))
        # The local mode is not safe for a search during an upsert (its arrays grow under the search:
        # "operands could not be broadcast"), so writes and searches take turns, as a client's must.
        self.lock = threading.Lock()
        self.client.create_collection(
            "stream", vectors_config=models.VectorParams(size=dims, distance=models.Distance.COSINE)
        )

    def write(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        with self.lock:
            self.client.upsert(
                "stream",
                points=self.models.Batch(ids=[int(i) for i in ids.tolist()], vectors=vectors.tolist()),
                wait=True,
            )

    def finish(self) -> None:
        pass

    def search(self, q: np.ndarray, ef: int | None = None) -> list[int]:
        with self.lock:
            found = self.client.query_points("stream", query=q.tolist(), limit=K).points
        return [int(p.id) for p in found]

    def set_ef(self, ef: int) -> bool:
        return ef == EFS[-1]  # exact: one reading stands for every ef

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.client.close()


PEERS: dict[str, tuple[str, Callable[[Path, int], Any]]] = {
    "chroma": ("chromadb", ChromaStream),
    "lancedb": ("lancedb", LanceStream),
    "qdrant_local": ("qdrant_client", QdrantLocalStream),
}


def _recall(peer: Any, data: dict[str, Any]) -> dict[str, float]:
    out: dict[str, float] = {}
    for ef in EFS:
        if not peer.set_ef(ef):
            continue
        hits = sum(len(set(peer.search(q, ef)) & t) for q, t in zip(data["queries"], data["truth"], strict=True))
        out[str(ef)] = round(hits / (K * len(data["truth"])), 4)
    return out


def stream(name: str, data: dict[str, Any], *, batch: int, settle_searches: int = 400) -> dict[str, Any]:
    """One stream of ``batch``-row upserts into peer ``name`` (skipped, with the reason, where it
    does not import); its figures as ``bench.stream_memstore.stream`` reports memstore's."""
    module, make = PEERS[name]
    try:
        importlib.import_module(module)
    except Exception as exc:  # an optional system: any import failure is a reason to skip it
        return {"skipped": f"{module} does not import ({type(exc).__name__}: {exc}); pip install -e '.[peers]'"}
    base = data["base"]
    folder = Path(tempfile.mkdtemp(prefix=f"bench-stream-{name}-"))
    try:
        peer = make(folder, int(base.shape[1]))
        if isinstance(peer, LanceStream):
            peer.index_at = max(1, len(base) // 10)
        batches = [np.arange(s, min(len(base), s + batch)) for s in range(0, len(base), batch)]
        progress = tqdm(total=len(batches), desc=f"{name} {batch}", file=sys.stderr)
        t0 = time.perf_counter()
        # The searching client starts once the first batch is in: an empty store answers at once.
        peer.write(batches[0], base[batches[0]])
        progress.update()
        with Watcher(lambda q: peer.search(q), data["queries"]) as during:
            for ids in batches[1:]:
                peer.write(ids, base[ids])
                progress.update()
            acked_s = time.perf_counter() - t0
            peer.finish()
            indexed_s = time.perf_counter() - t0
        progress.close()
        after = settled(lambda q: peer.search(q), data["queries"], settle_searches)
        out: dict[str, Any] = {
            "label": peer.label,
            "indexing": peer.indexing,
            "batch": batch,
            "acked_s": round(acked_s, 3),
            "seconds": round(indexed_s, 3),
            "rows_per_s": round(len(base) / indexed_s, 1),
            "recall_at_10": _recall(peer, data),
            **latency_figures(during.latencies, after.latencies),
        }
        peer.close()
        return out
    finally:
        shutil.rmtree(folder, ignore_errors=True)
