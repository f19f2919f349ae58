"""A small thread pool whose queue is ordered by urgency, not arrival.

Preprocessing a burst of huge images must not delay decoding a query's thumbnail: jobs carry the
same (class, deadline) key the scheduler uses, so the pool never becomes a FIFO in front of it.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)
_STOP = (float("-inf"),)  # sorts before every job key, so shutdown is prompt


class PriorityPool:
    def __init__(self, workers: int, name: str = "encoder-prep") -> None:
        self._queue: queue.PriorityQueue[tuple[Any, int, Callable[..., None] | None, tuple[Any, ...]]] = (
            queue.PriorityQueue()
        )
        self._seq = itertools.count()
        self._threads = [threading.Thread(target=self._run, name=f"{name}-{i}", daemon=True) for i in range(workers)]
        for t in self._threads:
            t.start()

    def submit(self, key: tuple[Any, ...], fn: Callable[..., None], *args: Any) -> None:
        """Run fn(*args) on a worker; lower keys first, ties in submission order."""
        self._queue.put((key, next(self._seq), fn, args))

    def _run(self) -> None:
        while True:
            _, _, fn, args = self._queue.get()
            if fn is None:
                return
            try:
                fn(*args)
            except Exception:  # jobs report their own errors; this only keeps the worker alive
                log.exception("preprocessing job failed")

    def shutdown(self, timeout: float = 5.0) -> None:
        for _ in self._threads:
            self._queue.put((_STOP, next(self._seq), None, ()))
        for t in self._threads:
            t.join(timeout)
