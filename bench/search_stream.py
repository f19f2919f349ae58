"""A steady stream of vector searches in a thread, its latencies kept by the time each was due.

Searches are issued at a fixed rate through ``VectorStore.search`` (open loop: each latency is
measured from the moment the search was due, so a stall delays the searches queued behind it and
shows in their latencies too, as it would for clients arriving at that rate). Phases are read
afterwards as time windows: the same stream before and during a change gives comparable p99s.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from memstore.store import VectorStore


@dataclass
class Sample:
    due: float  # time.monotonic() when the search was due
    latency_s: float
    ok: bool


@dataclass
class SearchStream:
    store: VectorStore
    collection: str
    queries: np.ndarray
    rate_per_s: float = 20.0
    k: int = 10
    samples: list[Sample] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> SearchStream:
        self._thread = threading.Thread(target=self._run, name="search-stream", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(60)

    def _run(self) -> None:
        interval = 1.0 / self.rate_per_s
        due = time.monotonic()
        i = 0
        while not self._stop.is_set():
            wait = due - time.monotonic()
            if wait > 0 and self._stop.wait(wait):
                break
            ok = True
            try:
                self.store.search(collection=self.collection, vector=self.queries[i % len(self.queries)], k=self.k)
            except Exception as exc:  # counted, never fatal: the stream measures, it does not test
                ok = False
                self.errors.append(f"{type(exc).__name__}: {exc}")
            self.samples.append(Sample(due, time.monotonic() - due, ok))
            i += 1
            due += interval

    def window(self, start: float, end: float) -> dict[str, Any]:
        """Latency figures (ms) of the searches due in [start, end)."""
        inside = [s for s in list(self.samples) if start <= s.due < end]
        ms = np.array([s.latency_s * 1000 for s in inside if s.ok])
        if not len(ms):
            return {"searches": len(inside), "failed": len(inside), "p50_ms": None, "p99_ms": None}
        return {
            "searches": len(inside),
            "failed": sum(not s.ok for s in inside),
            "p50_ms": round(float(np.percentile(ms, 50)), 3),
            "p99_ms": round(float(np.percentile(ms, 99)), 3),
            "max_ms": round(float(ms.max()), 3),
        }
