"""bench.peers' optional systems, the embedded stores a Python user would pick instead of memstore:
Chroma, LanceDB and hnswlib (``pip install -e '.[peers]'``). Each is measured only where it imports;
otherwise it is reported as skipped, with the reason."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from bench.peers_measure import K, System


def _progress(total: int, desc: str) -> tqdm[Any]:
    return tqdm(total=total, desc=desc, file=sys.stderr, leave=False)


class Chroma:
    """Chroma's persistent client (its HNSW: ``max_neighbors`` 16, ``ef_construction`` 64)."""

    name = "chroma"
    label = "Chroma"
    ingest_path = "collection.add in the client's largest batches"
    cleanup_name = "none (Chroma has no clean-up call; deleted entries stay in its graph)"

    def __init__(self, folder: Path, dims: int) -> None:
        import chromadb

        self.label = f"Chroma {chromadb.__version__}"
        self.folder = folder / "chroma"
        self.client = self._open()
        hnsw: Any = {"space": "cosine", "max_neighbors": 16, "ef_construction": 64, "ef_search": 10}
        self.collection: Any = self.client.create_collection(
            "peers",
            configuration={"hnsw": hnsw},
            embedding_function=None,
        )
        self.batch = int(self.client.get_max_batch_size())

    def _open(self) -> Any:
        import chromadb

        # Typed as Any: the optional libraries' own types are checked only where they are installed.
        client: Any = chromadb.PersistentClient(
            path=str(self.folder), settings=chromadb.Settings(anonymized_telemetry=False)
        )
        return client

    def _write(self, ids: np.ndarray, vectors: np.ndarray, call: Callable[..., Any], desc: str) -> None:
        with _progress(len(ids), f"{self.name}: {desc}") as bar:
            for start in range(0, len(ids), self.batch):
                part = slice(start, start + self.batch)
                call(ids=[str(i) for i in ids[part].tolist()], embeddings=vectors[part])
                bar.update(len(ids[part]))

    def ingest(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        self._write(ids, vectors, self.collection.add, "add")

    def set_ef(self, ef: int) -> None:
        self.collection.modify(configuration={"hnsw": {"ef_search": ef}})
        # A loaded index keeps the ef it was opened with (measured: recall did not move with it):
        # reopen the client so that the new setting is what searches use.
        self.client.clear_system_cache()
        self.client = self._open()
        self.collection = self.client.get_collection("peers")

    def search(self, query: np.ndarray) -> list[int]:
        out = self.collection.query(query_embeddings=[query], n_results=K, include=[])
        return [int(i) for i in out["ids"][0]]

    def update(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        self._write(ids, vectors, self.collection.update, "update")

    def delete(self, ids: np.ndarray) -> None:
        for start in range(0, len(ids), self.batch):
            self.collection.delete(ids=[str(i) for i in ids[start : start + self.batch].tolist()])

    def cleanup(self) -> str:
        return ""

    def close(self) -> None:
        self.client.delete_collection("peers")


class LanceDB:
    """LanceDB's HNSW (``IVF_HNSW_FLAT`` with one partition: a plain HNSW graph, m 16, ef_construction 64)."""

    name = "lancedb"
    label = "LanceDB"
    ingest_path = "table.add in batches, then create_index"
    cleanup_name = "table.optimize() (compaction, and the new rows into the index)"

    def __init__(self, folder: Path, dims: int) -> None:
        import lancedb
        import pyarrow as pa

        self.label = f"LanceDB {lancedb.__version__}"
        self.pa = pa
        self.dims = dims
        self.db: Any = lancedb.connect(str(folder / "lancedb"))
        self.table: Any = None
        self.ef = 10

    def _arrow(self, ids: np.ndarray, vectors: np.ndarray) -> Any:
        flat = self.pa.array(np.ascontiguousarray(vectors, dtype=np.float32).ravel())
        column = self.pa.FixedSizeListArray.from_arrays(flat, self.dims)
        return self.pa.table({"id": self.pa.array(ids, type=self.pa.int64()), "vector": column})

    def ingest(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        step = 10_000
        with _progress(len(ids), f"{self.name}: add") as bar:
            for start in range(0, len(ids), step):
                part = self._arrow(ids[start : start + step], vectors[start : start + step])
                if self.table is None:
                    self.table = self.db.create_table("peers", data=part)
                else:
                    self.table.add(part)
                bar.update(part.num_rows)
        self.table.create_index(metric="cosine", index_type="IVF_HNSW_FLAT", num_partitions=1, m=16, ef_construction=64)

    def set_ef(self, ef: int) -> None:
        self.ef = ef

    def search(self, query: np.ndarray) -> list[int]:
        q = self.table.search(query).distance_type("cosine").ef(self.ef).limit(K).select(["id", "_distance"])
        return [int(i) for i in q.to_arrow()["id"].to_pylist()]

    def update(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        merge = self.table.merge_insert("id").when_matched_update_all().when_not_matched_insert_all()
        merge.execute(self._arrow(ids, vectors))

    def delete(self, ids: np.ndarray) -> None:
        for start in range(0, len(ids), 5000):
            self.table.delete(f"id IN ({', '.join(str(i) for i in ids[start : start + 5000].tolist())})")

    def cleanup(self) -> str:
        self.table.optimize()
        return ""

    def close(self) -> None:
        if self.table is not None:
            self.db.drop_table("peers")


class Hnswlib:
    """hnswlib in this process, no database: the limit (M 16, ef_construction 64, every core building)."""

    name = "hnswlib"
    label = "hnswlib (in process, no database)"
    ingest_path = "add_items (all cores)"
    cleanup_name = "none (mark_deleted; updates replace vectors in place)"

    def __init__(self, folder: Path, dims: int) -> None:
        import hnswlib

        self.index: Any = hnswlib.Index(space="cosine", dim=dims)
        self.capacity = 0

    def ingest(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        self.index.init_index(max_elements=len(ids), ef_construction=64, M=16, allow_replace_deleted=True)
        step = 10_000
        with _progress(len(ids), f"{self.name}: add_items") as bar:
            for start in range(0, len(ids), step):
                self.index.add_items(vectors[start : start + step], ids[start : start + step])
                bar.update(len(ids[start : start + step]))

    def set_ef(self, ef: int) -> None:
        self.index.set_ef(ef)

    def search(self, query: np.ndarray) -> list[int]:
        labels, _ = self.index.knn_query(query, k=K, num_threads=1)
        return [int(i) for i in labels[0]]

    def update(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        self.index.add_items(vectors, ids)  # an existing label: its vector is replaced and relinked

    def delete(self, ids: np.ndarray) -> None:
        for i in ids.tolist():
            self.index.mark_deleted(i)

    def cleanup(self) -> str:
        return ""

    def close(self) -> None:
        del self.index


OPTIONAL: dict[str, tuple[str, type[Chroma] | type[LanceDB] | type[Hnswlib]]] = {
    "chroma": ("chromadb", Chroma),
    "lancedb": ("lancedb", LanceDB),
    "hnswlib": ("hnswlib", Hnswlib),
}


def optional_systems(names: list[str], folder: Path, dims: int) -> tuple[list[System], dict[str, str]]:
    """The optional systems asked for that import here, and a reason for each that does not."""
    found: list[System] = []
    skipped: dict[str, str] = {}
    for name in names:
        module, cls = OPTIONAL[name]
        try:
            importlib.import_module(module)
        except ImportError as exc:
            skipped[name] = f"not installed ({exc}); pip install -e '.[peers]'"
            continue
        try:
            found.append(cls(folder, dims))
        except Exception as exc:  # a library that imports but cannot start here is reported, not fatal
            skipped[name] = f"could not start: {type(exc).__name__}: {exc}"
    return found, skipped
