"""How background work yields to searches: each unit of a worker's work (an ingest batch, a step of
the space, OCR or photo pass) runs inside ``pace.unit(stop)``.

``Pace`` itself never waits: a worker given none runs at full speed (``memstore worker``, tests).
The process's foreground controller (``memstore.services.foreground``) is a ``Pace`` that, while
searches run slower than their target, holds units back before they start (none while its share of
capacity is zero), spaces them out (a unit that took t seconds is followed by a pause of
t x (1 - share) / share) and lets only so many run at once (the background's database connections).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class Unit:
    """One unit of background work; the worker says how much it did (``did``: 0 when nothing was
    due, so an idle poll is not counted as background work)."""

    __slots__ = ("work",)

    def __init__(self) -> None:
        self.work = 0

    def did(self, work: int) -> None:
        self.work += int(work)


class Pace:
    """No pacing: every unit runs at once."""

    def share(self) -> float:
        """The fraction of capacity background work may use now (1: all of it)."""
        return 1.0

    @contextmanager
    def unit(self, stop: threading.Event, kind: str = "work") -> Iterator[Unit]:
        yield Unit()

    @contextmanager
    def working(self, kind: str = "work") -> Iterator[Unit]:
        """Background work that is never held back here: it waits its own way before it starts (the
        maintenance worker's back-off on search latency) and cannot be paused once under way (a
        VACUUM, an index build). It is still counted as background work, so that search latency read
        while it runs is not taken for the idle baseline, in this process or (a follower) in the
        search servers it reports to."""
        yield Unit()


FULL_SPEED = Pace()
