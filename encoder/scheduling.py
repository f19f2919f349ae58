"""Which units go into the next micro-batch: pure functions of the queue state, no model, no clock.

`plan_batch` is the TokenFlux-style policy; `plan_fifo` is the whole-request FIFO baseline the
benchmark compares against. `ShareController` turns observed query latencies into class shares,
which enter `plan_batch` through the state, so the decision itself stays a pure function.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from .types import Modality, Priority

_CLASSES = (Priority.QUERY, Priority.SYNC_INGEST, Priority.BACKGROUND)  # service order


@dataclass(frozen=True)
class UnitRef:
    request_id: int
    unit: int  # index of the unit (text, global view or tile) within its request


@dataclass(frozen=True)
class RequestState:
    request_id: int
    priority: Priority
    modality: Modality
    deadline: float  # absolute, on the engine's monotonic clock
    seq: int  # arrival order
    ready: tuple[int, ...]  # units preprocessed and waiting, in unit order
    pending: int = 0  # units still being preprocessed
    served: int = 0  # units already handed to the model in earlier ticks
    model: str = ""  # which of the engine's models embeds it (one model per micro-batch)


# The longest pause after one unit of background work (the share is read again after it).
MAX_BACKGROUND_PAUSE_S = 5.0


def background_pause(busy_s: float, share: float) -> float:
    """The pause after a unit of background work that took ``busy_s``, so that background work takes
    ``share`` of the time: busy_s x (1 - share) / share, at most MAX_BACKGROUND_PAUSE_S (0 at share 0,
    where no unit runs at all). The encoder's background micro-batches and the process's background
    units (``memstore.services.foreground``) are spaced by the same rule."""
    return min(MAX_BACKGROUND_PAUSE_S, busy_s * (1 - share) / share) if share > 0 else 0.0


def full_query_shares() -> dict[Priority, float]:
    return {Priority.QUERY: 1.0, Priority.SYNC_INGEST: 0.0, Priority.BACKGROUND: 0.0}


@dataclass(frozen=True)
class QueueState:
    batch_size: int
    requests: tuple[RequestState, ...]
    # Fraction of each micro-batch a class may claim before lower classes get their share.
    shares: Mapping[Priority, float] = field(default_factory=full_query_shares)


Planner = Callable[[QueueState], list[UnitRef]]


def _urgency(r: RequestState) -> tuple[int, bool, float, int]:
    # Requests that have not started yet go before those already in progress, then earliest
    # deadline: under overload, a burst of old huge images cannot push new small requests out of
    # the first round just because their deadlines have become the earliest.
    return (-int(r.priority), r.served > 0, r.deadline, r.seq)


def _round_robin(requests: list[RequestState], budget: int, taken: dict[int, int]) -> int:
    """Give one unit per request per round, in urgency order, until `budget` units are given."""
    given = 0
    while given < budget:
        progressed = False
        for r in requests:
            if given == budget:
                break
            if taken.get(r.request_id, 0) < len(r.ready):
                taken[r.request_id] = taken.get(r.request_id, 0) + 1
                given += 1
                progressed = True
        if not progressed:
            break
    return given


def plan_batch(state: QueueState) -> list[UnitRef]:
    """The next micro-batch (at most batch_size units, one model and one modality).

    1. The most urgent waiting request decides the model and the modality; only requests of that
       model and modality take part (one model's tower per forward pass). Urgency: class, then
       not-yet-started before in-progress, then earliest deadline, then arrival.
    2. Pass 1: classes in priority order each claim up to floor(share * B) slots.
    3. Pass 2: slots left over go to whatever still waits, in strict priority order, so idle
       capacity always flows to bulk work.
    Within a class, slots are dealt round-robin, one unit per request per round in urgency order: a
    huge image advances a slice per tick and a one-unit request is never stuck behind it.
    """
    waiting = [r for r in state.requests if r.ready]
    if not waiting or state.batch_size < 1:
        return []
    lead = min(waiting, key=_urgency)
    pool = sorted((r for r in waiting if (r.model, r.modality) == (lead.model, lead.modality)), key=_urgency)
    by_class = {c: [r for r in pool if r.priority == c] for c in _CLASSES}
    taken: dict[int, int] = {}
    slots = state.batch_size
    for c in _CLASSES:
        quota = min(slots, math.floor(state.shares.get(c, 0.0) * state.batch_size + 1e-9))
        slots -= _round_robin(by_class[c], quota, taken)
    for c in _CLASSES:
        slots -= _round_robin(by_class[c], slots, taken)
    return [UnitRef(r.request_id, u) for r in pool for u in r.ready[: taken.get(r.request_id, 0)]]


def plan_fifo(state: QueueState) -> list[UnitRef]:
    """Baseline: whole requests in arrival order, ignoring classes and deadlines.

    Like a batcher fed by a preprocessing stage, a request joins the line once all its units are
    ready. Its units all run before the next request's; a request larger than B spans consecutive
    batches, and a change of model or modality ends the batch.
    """
    order = sorted((r for r in state.requests if r.ready and not r.pending), key=lambda r: r.seq)
    out: list[UnitRef] = []
    for r in order:
        if (r.model, r.modality) != (order[0].model, order[0].modality) or len(out) == state.batch_size:
            break
        out.extend(UnitRef(r.request_id, u) for u in r.ready[: state.batch_size - len(out)])
    return out


class ShareController:
    """Adapts the query class's share of each micro-batch to its p99 latency target.

    Over target: queries take the whole batch at once. Comfortably under (below `relax` x target,
    or no recent queries): the share decays by `decay_per_s` per second towards `min_query_share`,
    and what queries leave is split between sync ingest (`sync_share`) and background.
    Not thread-safe; the engine's scheduler thread owns it.
    """

    def __init__(
        self,
        target_p99_s: float,
        *,
        min_query_share: float = 0.5,
        sync_share: float = 0.75,
        decay_per_s: float = 0.25,
        relax: float = 0.8,
        window: int = 256,
        horizon_s: float = 30.0,
    ) -> None:
        self.target_p99_s = target_p99_s
        self.min_query_share = min_query_share
        self.sync_share = sync_share
        self.decay_per_s = decay_per_s
        self.relax = relax
        self.horizon_s = horizon_s
        self.query_share = 1.0
        self._samples: deque[tuple[float, float]] = deque(maxlen=window)
        self._last: float | None = None

    def observe(self, latency_s: float, now: float) -> None:
        self._samples.append((now, latency_s))

    def p99(self, now: float) -> float | None:
        recent = sorted(lat for t, lat in self._samples if now - t <= self.horizon_s)
        if not recent:
            return None
        return recent[min(len(recent) - 1, math.ceil(0.99 * len(recent)) - 1)]

    def update(self, now: float) -> dict[Priority, float]:
        p99 = self.p99(now)
        elapsed = 0.0 if self._last is None else max(0.0, now - self._last)
        self._last = now
        if p99 is not None and p99 > self.target_p99_s:
            self.query_share = 1.0
        elif p99 is None or p99 <= self.relax * self.target_p99_s:
            self.query_share = max(self.min_query_share, self.query_share - self.decay_per_s * elapsed)
        return self.shares()

    def shares(self) -> dict[Priority, float]:
        rest = 1.0 - self.query_share
        return {
            Priority.QUERY: self.query_share,
            Priority.SYNC_INGEST: rest * self.sync_share,
            Priority.BACKGROUND: rest * (1.0 - self.sync_share),
        }
