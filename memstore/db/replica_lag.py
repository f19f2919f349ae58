"""How far behind the primary a standby is, in seconds, from WAL positions rather than commit times.

A standby's own view (``now() - pg_last_xact_replay_timestamp()`` while it has WAL left to replay)
reads the age of the last *commit* it replayed. While the primary runs a long transaction (a bulk
load, an index build, a VACUUM) no commit arrives for seconds or minutes, so a standby that keeps up
read as many seconds late and served no reads: measured, a standby between a few bytes and 7 MB
behind a 20-second load on the same machine read 9 to 18 s of lag.

``PrimaryTimeline`` keeps the primary's WAL position as the replica probe reads it (once a probe,
before the standbys), each position with the time it was first seen. A standby that has replayed up
to ``replayed`` holds everything the primary had written by the last sample at or below it, and
misses what the first sample past it shows: it has been behind since that sample was taken, and its
lag is the time since then (never more than one probe interval under the true figure). A primary
that writes nothing leaves every caught-up standby at 0, whatever the last commit's age.
"""

from __future__ import annotations

from collections import deque


class PrimaryTimeline:
    """The primary's WAL positions over the last ``keep_s`` seconds (and the last one before them)."""

    def __init__(self, keep_s: float) -> None:
        self.keep_s = keep_s
        self._samples: deque[tuple[float, int]] = deque()  # (first seen at, position), both rising

    def record(self, at: float, lsn: int) -> None:
        """The primary's position ``lsn`` as read at monotonic time ``at``."""
        if self._samples and lsn <= self._samples[-1][1]:
            return  # no new WAL since the last sample: that one says since when the primary has been here
        self._samples.append((at, lsn))
        # Older samples go once a newer one is past the horizon too: the newest one before the horizon
        # stays, so a standby behind all of them still reads at least keep_s, not the age of the oldest left.
        while len(self._samples) > 1 and self._samples[1][0] < at - self.keep_s:
            self._samples.popleft()

    def lag_s(self, replayed: int, now: float) -> float | None:
        """Seconds the standby that has replayed ``replayed`` has been behind the primary (0: it has
        everything the primary had at the last sample); None before the first sample."""
        if not self._samples:
            return None
        for at, lsn in self._samples:
            if lsn > replayed:
                return max(0.0, now - at)
        return 0.0
