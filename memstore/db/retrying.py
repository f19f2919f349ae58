"""Retry strategies (tenacity), one per kind of transient failure, so that no module writes its own
loop. The ingest queue's own schedule for items whose embedding failed is different: it is stored in
the queue rows (``memstore.queue.claims.backoff_seconds``), since it must survive the worker.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import psycopg
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential,
    wait_incrementing,
)


def lock_timeouts(
    *,
    attempts: int,
    first_s: float,
    max_s: float = 60.0,
    sleep: Callable[[float], None] = time.sleep,
    before_sleep: Callable[[RetryCallState], None] | None = None,
) -> Retrying:
    """A statement that hit ``lock_timeout`` waited and changed nothing: run it again after a pause
    that doubles from ``first_s`` (at most ``max_s``), ``attempts`` times in all, then re-raise."""
    return Retrying(
        retry=retry_if_exception_type(psycopg.errors.LockNotAvailable),
        stop=stop_after_attempt(max(1, attempts)),
        wait=wait_exponential(multiplier=first_s, exp_base=2, max=max_s),
        sleep=sleep,
        before_sleep=before_sleep,
        reraise=True,
    )


def deadlocks(*, attempts: int) -> Retrying:
    """A transaction PostgreSQL rolled back to break a deadlock: safe to run again whole, at once
    (10 ms, 20 ms, ... apart), ``attempts`` times in all, then re-raise."""
    return Retrying(
        retry=retry_if_exception_type(psycopg.errors.DeadlockDetected),
        stop=stop_after_attempt(max(1, attempts)),
        wait=wait_incrementing(start=0.01, increment=0.01),
        reraise=True,
    )


def attempt_number(state: RetryCallState) -> int:
    return int(state.attempt_number)


def next_pause(state: RetryCallState) -> float:
    return float(state.next_action.sleep) if state.next_action is not None else 0.0
