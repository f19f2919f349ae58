"""Foreground first: one controller per process sets the share of capacity background work may use,
from the latency of the searches this process answers.

Every ``tick_s`` (a quarter of ``MEMSTORE_FOREGROUND_WINDOW_S``) it reads the p99 of the searches of
the last window (as the search route records them, ``memstore.services.latency``) and compares it
with a target: ``MEMSTORE_SEARCH_P99_SLO_MS``, or, unset, ``MEMSTORE_FOREGROUND_BASELINE_FACTOR`` x
the median p99 of recent windows in which no background work ran. ``decide`` (a pure function) turns
that into the next share, AIMD with hysteresis:

- over the target: the share is cut at once, to at most half and at most target / p99 of what it
  was (below ``floor``: zero). Only searches answered after a cut judge the next one, so one slow
  moment cuts once;
- at most ``relax`` x the target (or no searches at all) for ``calm_ticks`` ticks in a row: the share
  grows by ``step`` a tick, back to 1;
- in between: held.

The share is used by three levers, each checked between units of work:

- the ingest workers and their passes (ingest batches, the space pass's re-embedding, OCR, photo
  facts) run each unit in ``unit()``: none starts while the share is zero; a unit that took t
  seconds is followed by a pause of t x (1 - share) / share in that thread;
- at most ceil(share x ``MEMSTORE_BACKGROUND_CONNECTIONS``) units run at once (each holds one
  database connection at a time): the background's connections and statements;
- the encoder in this process (``encoder.engine.EmbeddingEngine.background_share``): micro-batches
  of background work alone are spaced the same way, so the model's time goes to searches first.
"""

from __future__ import annotations

import collections
import math
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Self

from encoder.scheduling import background_pause
from memstore.services.latency import p99
from memstore.settings import Settings
from memstore.workers.pacing import Pace, Unit

BASELINE_WINDOWS = 60  # idle windows the baseline is the median of


@dataclass(frozen=True)
class Tuning:
    decrease: float = 0.5  # a back-off keeps at most this fraction of the share
    floor: float = 0.05  # a share cut below this is zero
    step: float = 0.1  # added per calm tick
    relax: float = 0.8  # calm: p99 at most this x the target
    calm_ticks: int = 2  # calm ticks in a row before capacity is taken back
    min_samples: int = 3  # fewer searches than this judge nothing (held)


@dataclass(frozen=True)
class Decision:
    share: float
    calm: int  # calm ticks in a row, after this one
    backed_off: bool


def decide(
    share: float, calm: int, p99_ms: float | None, samples: int, target_ms: float | None, tuning: Tuning = Tuning()
) -> Decision:
    """The next share from the current one and the last window's searches (``samples`` of them,
    their ``p99_ms``) against ``target_ms`` (None: no target yet, full share)."""
    share = min(1.0, max(0.0, share))
    if target_ms is None:
        return Decision(1.0, 0, False)
    if samples == 0 or (p99_ms is not None and samples >= tuning.min_samples and p99_ms <= tuning.relax * target_ms):
        calm += 1
        if calm >= tuning.calm_ticks:
            return Decision(min(1.0, share + tuning.step), calm, False)
        return Decision(share, calm, False)
    if p99_ms is None or samples < tuning.min_samples or p99_ms <= target_ms:
        return Decision(share, 0, False)
    cut = share * min(tuning.decrease, target_ms / p99_ms)
    if cut < tuning.floor:
        cut = 0.0
    return Decision(cut, 0, share > 0.0)


@dataclass
class _Turn:
    """A thread's last unit: when it ended and how long it ran."""

    ended: float = 0.0
    busy: float = 0.0


@dataclass
class ForegroundController(Pace):
    """The process's one controller: ``start`` its thread, ``close`` it; workers run their units in
    ``unit()``; an encoder in this process is handed over with ``attach_encoder``.

    ``samples(since)``: (time.monotonic(), seconds) of the searches answered since then."""

    samples: Callable[[float], list[tuple[float, float]]]
    slo_ms: float | None = None
    window_s: float = 1.0
    baseline_factor: float = 2.0
    connections: int = 2
    enabled: bool = True
    tuning: Tuning = field(default_factory=Tuning)
    clock: Callable[[], float] = time.monotonic
    backoffs: int = 0
    last_backoff: dict[str, Any] | None = None
    _share: float = 1.0
    _calm: int = 0
    _judged_from: float = 0.0  # searches before this (the last back-off) judge no more
    _p99_ms: float | None = None
    _baseline: collections.deque[float] = field(default_factory=lambda: collections.deque(maxlen=BASELINE_WINDOWS))
    _active: int = 0  # units running
    _unpaced: int = 0  # work running that is counted but never held back (``working``)
    _waiting: int = 0  # units held back
    _work_ended: float = -math.inf  # when the last unit that did something ended
    _elsewhere_ended: float = -math.inf  # the same in the processes that follow this one's share
    _units: collections.Counter[str] = field(default_factory=collections.Counter)
    _turns: threading.local = field(default_factory=threading.local)
    _cond: threading.Condition = field(default_factory=threading.Condition)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _encoders: list[Any] = field(default_factory=list)
    _forced: bool = False  # held by force(), not the control loop
    # Called after every tick of the loop (memstore.services.foreground_signal.SharePublisher: the
    # share written for background work in other processes); its close() runs with the controller's.
    publisher: Callable[[ForegroundController], None] | None = None

    @classmethod
    def from_settings(
        cls, settings: Settings, samples: Callable[[float], list[tuple[float, float]]]
    ) -> ForegroundController:
        return cls(
            samples,
            slo_ms=settings.search_p99_slo_ms,
            window_s=settings.foreground_window_s,
            baseline_factor=settings.foreground_baseline_factor,
            connections=settings.background_connections,
            enabled=settings.foreground,
        )

    @property
    def tick_s(self) -> float:
        return self.window_s / 4

    # -- the control loop ---------------------------------------------------------------------------
    def start(self) -> Self:
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="foreground", daemon=True)
            self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2)
            self._thread = None
        self._set_share(1.0, forced=True)  # nothing waits on a closed controller
        closer = getattr(self.publisher, "close", None)
        if closer is not None:
            closer()

    def _run(self) -> None:
        while not self._stop.wait(self.tick_s):
            self.tick()
            if self.publisher is not None:
                self.publisher(self)

    def target_ms(self) -> float | None:
        if self.slo_ms is not None:
            return self.slo_ms
        if not self._baseline:
            return None
        return self.baseline_factor * statistics.median(self._baseline)

    def tick(self) -> Decision:
        """Read the last window's searches and set the share (the thread calls this every tick_s)."""
        now = self.clock()
        window = self.samples(now - self.window_s)
        judged = [s for t, s in window if t >= self._judged_from]
        self._p99_ms = None if not window else 1000.0 * (p99([s for _, s in window]) or 0.0)
        with self._cond:
            idle = self._running() == 0 and now - max(self._work_ended, self._elsewhere_ended) >= self.window_s
        if idle and len(window) >= self.tuning.min_samples and self._p99_ms is not None:
            self._baseline.append(self._p99_ms)  # a window without background work
        target = self.target_ms()
        if not self.enabled:
            decision = Decision(1.0, 0, False)
        elif window and not judged:  # searches, but none answered since the last back-off: wait for them
            decision = Decision(self._share, 0, False)
        else:
            judged_p99 = p99(judged)
            p99_ms = None if judged_p99 is None else 1000.0 * judged_p99
            decision = decide(self._share, self._calm, p99_ms, len(judged), target, self.tuning)
            if decision.backed_off:
                self._judged_from = now
                self._record_backoff(p99_ms, target, decision.share)
        self._calm = decision.calm
        self._set_share(decision.share)
        return decision

    def _record_backoff(self, p99_ms: float | None, target_ms: float | None, share_after: float) -> None:
        """A cut of the share from its current value to ``share_after``, counted and kept for /health."""
        self.backoffs += 1
        self.last_backoff = {
            "at": time.time(),
            "p99_ms": None if p99_ms is None else round(p99_ms, 3),
            "target_ms": None if target_ms is None else round(target_ms, 3),
            "share_before": round(self._share, 4),
            "share_after": round(share_after, 4),
        }

    def background_elsewhere(self, ago_s: float | None) -> None:
        """Background work in a process that follows this one's share last ran ``ago_s`` seconds ago
        (0: it runs now; None: none known): the windows around it are not idle ones. The news is up to
        two windows late (the follower writes once a window, this process reads once a window), so it
        counts as work until two windows after it."""
        if ago_s is not None:
            with self._cond:
                ended = self.clock() - max(0.0, ago_s) + 2 * self.window_s
                self._elsewhere_ended = max(self._elsewhere_ended, ended)

    def force(self, share: float | None) -> None:
        """Tests and benchmarks: hold the share at ``share`` (None: back to the control loop)."""
        if share is None:
            self.enabled = True
            return
        self.enabled = False
        self._set_share(share, forced=True)

    def _set_share(self, share: float, *, forced: bool = False) -> None:
        with self._cond:
            if not self.enabled and not forced:
                share = self._share if self._forced else 1.0
            else:
                self._forced = forced
            changed = share != self._share
            self._share = share
            if changed:
                self._cond.notify_all()
        if changed:
            for engine in self._encoders:
                engine.background_share = share

    def attach_encoder(self, backend: Any) -> None:
        """An encoder in this process that spaces out its background micro-batches by the share."""
        if hasattr(backend, "background_share"):
            self._encoders.append(backend)
            backend.background_share = self._share

    # -- the workers' side --------------------------------------------------------------------------
    def share(self) -> float:
        return self._share

    def _limit(self, share: float) -> int:
        return 0 if share <= 0 else max(1, math.ceil(share * self.connections - 1e-9))

    @contextmanager
    def unit(self, stop: threading.Event, kind: str = "work") -> Iterator[Unit]:
        turn: _Turn = getattr(self._turns, "turn", None) or _Turn()
        self._turns.turn = turn
        with self._cond:
            self._waiting += 1
            try:
                while not stop.is_set() and not self._stop.is_set():
                    share = self._share
                    due = turn.ended + background_pause(turn.busy, share)
                    now = self.clock()
                    if share > 0 and now >= due and self._active < self._limit(share):
                        break
                    self._cond.wait(0.1 if share <= 0 or now >= due else min(0.1, due - now))
            finally:
                self._waiting -= 1
            self._active += 1
        unit = Unit()
        started = self.clock()
        try:
            yield unit
        finally:
            ended = self.clock()
            with self._cond:
                self._active -= 1
                if self._count_done(unit, kind, ended):
                    turn.ended, turn.busy = ended, ended - started
                self._cond.notify_all()

    @contextmanager
    def working(self, kind: str = "work") -> Iterator[Unit]:
        with self._cond:
            self._unpaced += 1
        unit = Unit()
        try:
            yield unit
        finally:
            ended = self.clock()
            with self._cond:
                self._unpaced -= 1
                self._count_done(unit, kind, ended)

    def _count_done(self, unit: Unit, kind: str, ended: float) -> bool:
        """A unit (paced or not) that ended at ``ended``: counted, and its end the last work's, when
        it did something. Under ``_cond``."""
        if unit.work:
            self._work_ended = ended
            self._units[kind] += 1
        return bool(unit.work)

    def _running(self) -> int:
        """Background work under way in this process, paced or not. Under ``_cond``."""
        return self._active + self._unpaced

    # -- what /health and /metrics show --------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        target = self.target_ms()
        with self._cond:
            active, waiting, units, unpaced = self._active, self._waiting, dict(self._units), self._unpaced
        return {
            "enabled": self.enabled,
            "background_share": round(self._share, 4),
            "search_p99_ms": None if self._p99_ms is None else round(self._p99_ms, 3),
            "target_p99_ms": None if target is None else round(target, 3),
            "slo_ms": self.slo_ms,
            "target_from": "MEMSTORE_SEARCH_P99_SLO_MS" if self.slo_ms is not None else "baseline",
            "baseline_windows": len(self._baseline),
            "window_s": self.window_s,
            "background_connections": self._limit(self._share),
            "units_running": active,
            "units_waiting": waiting,
            "unpaced_running": unpaced,
            "units_done": units,
            "backoffs": self.backoffs,
            "last_backoff": self.last_backoff,
        }
