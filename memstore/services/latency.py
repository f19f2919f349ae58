"""Recent search latencies, so maintenance can back off while foreground searches are slow."""

from __future__ import annotations

import collections
import math
import time
from collections.abc import Sequence


def p99(values: Sequence[float]) -> float | None:
    """The 99th percentile by nearest rank (the value at rank ceil(0.99 n)); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]


class LatencyTracker:
    """Recent search latencies, so maintenance can back off while foreground searches are slow."""

    def __init__(self, size: int = 2048, window_s: float = 60.0) -> None:
        self._samples: collections.deque[tuple[float, float]] = collections.deque(maxlen=size)
        self.window_s = window_s

    def record(self, seconds: float) -> None:
        self._samples.append((time.monotonic(), seconds))  # deque.append is atomic: no lock needed

    def since(self, start: float) -> list[tuple[float, float]]:
        """(time.monotonic(), seconds) of the searches recorded since ``start``."""
        return [(t, s) for t, s in list(self._samples) if t >= start]

    def p99_ms(self) -> float | None:
        cutoff = time.monotonic() - self.window_s
        recent = [s for t, s in list(self._samples) if t >= cutoff]
        if len(recent) < 20:
            return None
        return 1000.0 * (p99(recent) or 0.0)
