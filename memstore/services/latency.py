"""Recent search latencies, so maintenance can back off while foreground searches are slow."""

from __future__ import annotations

import collections
import time


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
        recent = sorted(s for t, s in list(self._samples) if t >= cutoff)
        if len(recent) < 20:
            return None
        return 1000.0 * recent[min(len(recent) - 1, int(0.99 * len(recent)))]
