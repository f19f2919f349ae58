"""The connections that run searches and nothing else, handed out last returned first.

A search's own Python work around its statement is a few tenths of a millisecond, and taking a
connection from a general pool and giving it back was a large part of it: SQLAlchemy's pool (the
engine's, for transactions) and psycopg_pool's each cost a search 0.05 to 0.1 ms of client CPU with a
100,000-row index thrashing the caches, on the blocking path and on the event loop's alike
(``python -m bench.store``: ``search_pool_gain``). A search needs none of what they do for a
transaction: its connection is in autocommit mode, keeps the HNSW settings of its session
(``memstore.search.statements.SearchSession``) and is idle again when the search returns. Here a checkout
is a pop from a list and a check, without a round trip, that the server has not closed the
connection; a return is an append.

Last returned first, as the engine's pool (``memstore.db.core.create_engine``): searches one after
another keep to one warm backend, and the connections a burst opened stay idle. psycopg_pool hands
its connections out first in, first out, with no option for the other order.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from contextvars import ContextVar
from typing import Any, TypeVar

import psycopg
from psycopg_pool import PoolClosed, PoolTimeout

Connect = Callable[[], psycopg.Connection[Any]]
Usable = Callable[[psycopg.Connection[Any]], bool]
AsyncConnect = Callable[[], Awaitable[psycopg.AsyncConnection[Any]]]
AsyncUsable = Callable[[psycopg.AsyncConnection[Any]], bool]
T = TypeVar("T")


class Cancel:
    """What lets a search that runs on a thread be cancelled from elsewhere (its HTTP client went
    away): the set registers the connection a search holds here while the search runs on it
    (``CANCEL``, a context variable the caller sets in the context the thread runs in), and
    ``cancel()`` asks the server to cancel that connection's statement. A search that starts after
    ``cancel()`` does not run."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._conn: psycopg.Connection[Any] | None = None
        self.cancelled = False

    def cancel(self) -> None:
        """Blocking (a round trip to the server to send the cancel request): call it off the event loop."""
        with self._lock:
            self.cancelled = True
            conn = self._conn
        if conn is not None:
            conn.cancel_safe(timeout=5.0)

    def _enter(self, conn: psycopg.Connection[Any]) -> None:
        with self._lock:
            if self.cancelled:
                raise psycopg.errors.QueryCanceled("the search was cancelled before it ran (its client went away)")
            self._conn = conn

    def _leave(self) -> None:
        with self._lock:
            self._conn = None


CANCEL: ContextVar[Cancel | None] = ContextVar("memstore_search_cancel", default=None)


class _Bounded:
    """What both sets share: how many connections they open at most, how long a search waits for
    one when all are out, and how many they opened so far."""

    def __init__(self, *, max_size: int, timeout_s: float) -> None:
        if max_size < 1:
            raise ValueError(f"max_size must be at least 1, not {max_size}")
        self.max_size = max_size
        self.timeout_s = timeout_s
        self.opened = 0

    def _busy(self) -> PoolTimeout:
        """What a search that waited ``timeout_s`` in vain raises (an OperationalError: a 503)."""
        return PoolTimeout(
            f"all {self.max_size} search connections were busy for {self.timeout_s:g} s "
            "(MEMSTORE_POOL_SIZE sets how many a process keeps)"
        )


class SearchConnections(_Bounded):
    """At most ``max_size`` autocommit connections, opened when a search needs one (``connect``)
    and kept for the next. ``usable(conn)`` says, without a round trip, whether an idle one may be
    handed out again (one the server closed while it was idle is dropped and another taken)."""

    def __init__(self, connect: Connect, usable: Usable, *, max_size: int, timeout_s: float = 30.0) -> None:
        super().__init__(max_size=max_size, timeout_s=timeout_s)
        self._connect = connect
        self._usable = usable
        self._idle: list[psycopg.Connection[Any]] = []
        # One plain lock for the list and the count: a checkout takes it once and a return once. The
        # condition on it is waited on only when all max_size connections are out.
        self._lock = threading.Lock()
        self._freed = threading.Condition(self._lock)
        self._out = 0
        self._waiting = 0
        self._generation = 0  # close() ends a generation: connections out at the time close on return
        # The process the connections belong to: a forked child must not use its parent's, nor
        # close them (closing one ends the parent's session on the server).
        self._pid = os.getpid()
        self._inherited_below = 0

    def run(self, fn: Callable[[psycopg.Connection[Any]], T]) -> T:
        """``fn(conn)`` on a connection of the set (a method, not a context manager: the cheapest
        way there is to wrap a call, and every search goes through it)."""
        conn, generation = self._take()
        scope = CANCEL.get()
        try:
            if scope is None:
                return fn(conn)
            scope._enter(conn)
            try:
                return fn(conn)
            finally:
                scope._leave()
        finally:
            self._give_back(conn, generation)

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection[Any]]:
        """``run``'s connection for a block of statements."""
        conn, generation = self._take()
        try:
            yield conn
        finally:
            self._give_back(conn, generation)

    def _take(self) -> tuple[psycopg.Connection[Any], int]:
        """An idle connection that is still usable, else a new one. Waits up to ``timeout_s`` while
        all ``max_size`` are out, then raises PoolTimeout (an OperationalError: the service answers
        503)."""
        with self._lock:
            if self._pid != os.getpid():
                self._forget_inherited()
            if self._out >= self.max_size:
                self._wait_for_one()
            self._out += 1
            generation = self._generation
        try:
            while True:
                with self._lock:
                    conn = self._idle.pop() if self._idle else None
                if conn is None:
                    conn = self._connect()
                    with self._lock:
                        self.opened += 1
                    return conn, generation
                if self._usable(conn):
                    return conn, generation
                conn.close()
        except BaseException:
            self._release()
            raise

    def _wait_for_one(self) -> None:  # called with the lock held
        deadline = time.monotonic() + self.timeout_s
        self._waiting += 1
        try:
            while self._out >= self.max_size:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise self._busy()
                self._freed.wait(left)
        finally:
            self._waiting -= 1

    def _give_back(self, conn: psycopg.Connection[Any], generation: int) -> None:
        """Back to the idle list, unless the search left it broken, closed or inside a transaction
        (then it is closed, never handed out again)."""
        keep = _reusable(conn)
        with self._lock:
            if self._pid != os.getpid():
                self._forget_inherited()
            if generation < self._inherited_below:
                return  # the parent's, out when this process was forked: neither kept, closed nor counted
            keep = keep and generation == self._generation
            if keep:
                self._idle.append(conn)
            self._out -= 1
            if self._waiting:
                self._freed.notify()
        if not keep:
            conn.close()

    def _release(self) -> None:
        with self._lock:
            self._out -= 1
            if self._waiting:
                self._freed.notify()

    def idle_count(self) -> int:
        with self._lock:
            return len(self._idle)

    def close(self) -> None:
        """Close the idle connections now and those out on their return; later searches open new
        ones (as an engine's pool after ``dispose()``). In a forked child, the parent's connections
        are forgotten, not closed."""
        with self._lock:
            if self._pid != os.getpid():
                self._forget_inherited()
                return
            self._generation += 1
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def _forget_inherited(self) -> None:  # called with the lock held, in a forked child
        self._idle = []
        self._out = 0
        # Connections of earlier generations are the parent's: one the forking thread held comes
        # back to _give_back, which leaves it alone.
        self._generation += 1
        self._inherited_below = self._generation
        self._pid = os.getpid()


class AsyncSearchConnections(_Bounded):
    """``SearchConnections`` for the searches of one event loop (``memstore.search.runner``, the REST
    API's fast path). Everything runs on that loop, so the idle list needs no lock; a search waits
    only when all ``max_size`` connections are out."""

    def __init__(self, connect: AsyncConnect, usable: AsyncUsable, *, max_size: int, timeout_s: float = 30.0) -> None:
        super().__init__(max_size=max_size, timeout_s=timeout_s)
        self._connect = connect
        self._usable = usable
        self._idle: list[psycopg.AsyncConnection[Any]] = []
        self._slots = asyncio.Semaphore(max_size)
        self._closed = False

    async def run(self, fn: Callable[[psycopg.AsyncConnection[Any]], Awaitable[T]]) -> T:
        """``await fn(conn)`` on a connection of the set."""
        conn = await self._take()
        try:
            return await fn(conn)
        finally:
            await self._give_back(conn)

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """``run``'s connection for a block of statements."""
        conn = await self._take()
        try:
            yield conn
        finally:
            await self._give_back(conn)

    async def _take(self) -> psycopg.AsyncConnection[Any]:
        if self._closed:
            raise PoolClosed("the search connections are closed (the service is shutting down)")
        if self._slots.locked():
            try:
                await asyncio.wait_for(self._slots.acquire(), self.timeout_s)
            except TimeoutError:
                raise self._busy() from None
        else:
            await self._slots.acquire()  # free: returns without yielding to the loop
        try:
            if self._closed:  # closed while this search waited for a connection
                raise PoolClosed("the search connections are closed (the service is shutting down)")
            while self._idle:
                conn = self._idle.pop()
                if self._usable(conn):
                    return conn
                await conn.close()
            conn = await self._connect()
            self.opened += 1
            return conn
        except BaseException:
            self._slots.release()
            raise

    async def _give_back(self, conn: psycopg.AsyncConnection[Any]) -> None:
        try:
            if not self._closed and _reusable(conn):
                self._idle.append(conn)
            else:
                await conn.close()
        finally:
            self._slots.release()

    def idle_count(self) -> int:
        return len(self._idle)

    async def close(self) -> None:
        """Close the idle connections now and those out on their return; the set opens no more."""
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            await conn.close()


_IDLE = int(psycopg.pq.TransactionStatus.IDLE)


def _reusable(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    """A returned connection may serve the next search: open, not broken, and in no transaction (a
    search that failed half-way, or a caller that began one, leaves it otherwise)."""
    return not conn.closed and not conn.broken and conn.pgconn.transaction_status == _IDLE
