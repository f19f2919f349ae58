"""A random share of query vectors, kept in ``memstore_query_samples`` for the recall probes."""

from __future__ import annotations

import contextlib
import logging
import queue as stdqueue
import random
import threading

import numpy as np
import numpy.typing as npt

from memstore.db.core import Database
from memstore.search import query_samples

log = logging.getLogger(__name__)


class QuerySampler:
    """Keeps a random share of query vectors in ``memstore_query_samples``, written off the request path."""

    def __init__(self, db: Database, rate: float, *, capacity: int = 1000, keep: int = 1000) -> None:
        self.db = db
        self.rate = rate
        self.keep = keep  # samples kept per collection (the probes draw from them at random)
        self._queue: stdqueue.Queue[tuple[int, np.ndarray] | None] = stdqueue.Queue(capacity)
        self._thread: threading.Thread | None = None

    def offer(self, collection_id: int, vector: npt.ArrayLike) -> None:
        """Keep ``vector`` (converted to float32 only when it is drawn) with this sampler's rate."""
        if self.draw():
            self.keep_one(collection_id, vector)

    def draw(self) -> bool:
        """Whether this query is one of the share kept: a caller that must look something up before
        ``keep_one`` (the collection's id) draws first and looks it up for the drawn few only."""
        return self.rate > 0 and random.random() < self.rate

    def keep_one(self, collection_id: int, vector: npt.ArrayLike) -> None:
        """Keep ``vector`` (already drawn)."""
        vector = np.asarray(vector, dtype=np.float32)
        if self._thread is None:
            self._thread = threading.Thread(target=self._drain, name="query-sampler", daemon=True)
            self._thread.start()
        # Samples are best effort: never slow a search down for one.
        with contextlib.suppress(stdqueue.Full):
            self._queue.put_nowait((collection_id, vector))

    def _drain(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            batch = [first]
            while len(batch) < 100:
                try:
                    nxt = self._queue.get_nowait()
                except stdqueue.Empty:
                    break
                if nxt is None:
                    self._queue.put(None)
                    break
                batch.append(nxt)
            try:
                with self.db.write() as conn:
                    query_samples.keep(conn, batch, per_collection=self.keep)
            except Exception as exc:
                log.warning("query sampler: %s", exc)

    def close(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(5)
