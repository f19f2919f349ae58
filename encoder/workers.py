"""A small thread pool whose queue is ordered by urgency, not arrival, with a lane for cheap jobs.

Preprocessing a burst of huge images must not delay decoding a query's thumbnail: jobs carry a
(class, tenant's place, deadline) key (``encoder.tenancy``), so the pool never becomes a FIFO in
front of the scheduler.

Order alone is not enough where decoding, not the model, is the bottleneck (a GPU host: ViT-B-32
runs 10,000 views a second, two threads prepared 1,000 small pictures): every thread can be inside a
huge image's decode when a small one arrives, and within one tenant the huge images came first. So
jobs are light (one view of a small, cheaply decoded picture) or heavy (tiled, large, or decoded in a
worker process). Within a class a free thread takes a light job first, with two exceptions: while
heavy jobs wait, ``workers // 2`` threads (rounded down) stay with them, and a heavy job of another
tenant goes first when its tenant's place is lower (tenants stay fair across the lanes: a tenant
flooding small pictures still waits its turn behind another tenant's first huge one). So a small
picture does not wait behind its own tenant's queue of huge decodes, only for a thread to free (no
thread is kept idle for light jobs: a burst that finds the pool idle fills it), and huge images
still progress under a steady stream of small ones where there are two threads or more. (With one
thread, a tenant's huge image waits for its own small ones to drain.) A higher class always goes
first, light or heavy.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

_Job = tuple[tuple[Any, ...], int, Callable[..., None], tuple[Any, ...], str]


class PriorityPool:
    def __init__(self, workers: int, name: str = "encoder-prep") -> None:
        if workers < 1:
            raise ValueError("a pool needs at least one worker")
        self.workers = workers
        self.heavy_reserve = workers // 2  # threads heavy jobs keep while light ones wait (0 with one)
        self._light: list[_Job] = []
        self._heavy: list[_Job] = []
        self._heavy_running = 0
        self._running = 0
        self._stopping = False
        self._cond = threading.Condition()
        self._seq = itertools.count()
        self._threads = [threading.Thread(target=self._run, name=f"{name}-{i}", daemon=True) for i in range(workers)]
        for t in self._threads:
            t.start()

    def submit(
        self, key: tuple[Any, ...], fn: Callable[..., None], *args: Any, heavy: bool = False, tenant: str = ""
    ) -> None:
        """Run fn(*args) on a worker; lower keys first (key[0] is the class, key[1] the tenant's
        place), ties in submission order."""
        with self._cond:
            if self._stopping:
                return  # dropped, as at shutdown: the engine fails the request itself
            heapq.heappush(self._heavy if heavy else self._light, (key, next(self._seq), fn, args, tenant))
            self._cond.notify()

    def _pick(self) -> tuple[_Job, bool] | None:
        """The next job and whether it is heavy (lock held); None when nothing waits."""
        light, heavy = self._light, self._heavy
        if not heavy:
            return (heapq.heappop(light), False) if light else None
        if not light:
            return heapq.heappop(heavy), True
        (light_key, *_, light_tenant), (heavy_key, *_, heavy_tenant) = light[0], heavy[0]
        if heavy_key[0] != light_key[0]:  # a higher class first
            take_heavy = heavy_key[0] < light_key[0]
        else:
            take_heavy = self._heavy_running < self.heavy_reserve or (
                heavy_tenant != light_tenant and heavy_key < light_key
            )
        return (heapq.heappop(heavy), True) if take_heavy else (heapq.heappop(light), False)

    def _run(self) -> None:
        while True:
            with self._cond:
                picked = self._pick()
                while picked is None and not self._stopping:
                    self._cond.wait()
                    picked = self._pick()
                if picked is None:
                    return  # stopping, and nothing left to take
                (_, _, fn, args, _), heavy = picked
                self._heavy_running += heavy
                self._running += 1
            try:
                fn(*args)
            except Exception:  # jobs report their own errors; this only keeps the worker alive
                log.exception("preprocessing job failed")
            finally:
                with self._cond:
                    self._heavy_running -= heavy
                    self._running -= 1

    def state(self) -> dict[str, int]:
        """Threads, and jobs waiting and running per lane (``/health`` detail and ``/metrics``)."""
        with self._cond:
            return {
                "threads": self.workers,
                "heavy_reserve": self.heavy_reserve,
                "light_waiting": len(self._light),
                "heavy_waiting": len(self._heavy),
                "light_running": self._running - self._heavy_running,
                "heavy_running": self._heavy_running,
            }

    def shutdown(self, timeout: float = 5.0) -> None:
        """Stop the workers promptly: jobs not yet started are dropped (their owners fail them)."""
        with self._cond:
            self._stopping = True
            self._light.clear()
            self._heavy.clear()
            self._cond.notify_all()
        for t in self._threads:
            t.join(timeout)
