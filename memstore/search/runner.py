"""The one search runner: a checked search, planned (``memstore.search.plan``) and run, blocking or on
the caller's event loop.

Both paths follow the same steps and the same rules:

- **the collection**: the registry's cached row; when the search finds it stale (``stale_collection``:
  a space or a table it names is gone, after a switch of representation, a drop, a space made or
  dropped by another process within the cache time) the row is read afresh and the search runs once
  more; a second failure is the caller's answer (a collection that is gone: ``CollectionNotFoundError``);
- **the connection**: a search connection, and once more on a fresh one when the first failed under
  it (``memstore.db.core``: ``Database.run_search`` and ``run_async_search``, one rule);
- **the walks**: one walk under the plan's settings, a second under its fallback when the first came
  back short (``SearchPlan.second_walk``), counted (``SecondWalks``).

`VectorStore.search` blocks, so an async server would hand each search to a thread and back; on a
small machine that hop, and the interpreter lock two threads fight over, costs more than the search's
own Python work. ``AsyncSearcher`` runs the same plans without leaving the event loop, on search
connections of its own (``memstore.db.core.async_search_connections``). It covers the full-precision
index and exact search; a collection on a compact index (whose plan projects the query on the
connection) or a deployment with read replicas answers None, and the caller takes the blocking path.
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, Protocol

import psycopg

from memstore.catalog import index_spec as compact_spec
from memstore.catalog.collections import Collection
from memstore.db.core import Database, run_async_search
from memstore.db.direct_fetch import fetch_rows
from memstore.errors import CollectionNotFoundError, SpaceNotFoundError
from memstore.models import SearchResult
from memstore.search import request, statements
from memstore.search.plan import SearchPlan, plan
from memstore.search.request import SearchQuery
from memstore.search.statements import SESSION_SETTINGS_SQL, SearchSettings, search_session
from memstore.settings import Settings


class SearchHost(Protocol):
    """What a runner needs of the store: its database, settings and registry cache."""

    db: Database
    settings: Settings
    second_walk_count: SecondWalks

    def get_collection(self, *, name: str, fresh: bool = False) -> Collection: ...

    def cached_collection(self, name: str) -> Collection | None: ...

    def forget_collection(self, name: str) -> None: ...


class SecondWalks:
    """How many searches ran a second walk (``VectorStore.second_walks`` says what a rising count means)."""

    def __init__(self) -> None:
        self.count = 0
        self._lock = threading.Lock()

    def __call__(self) -> None:
        with self._lock:  # searches run on many threads; += alone could lose counts
            self.count += 1


def stale_collection(exc: BaseException) -> bool:
    """The one retry rule for what a search's cached collection row names: a space made or dropped
    elsewhere (SpaceNotFoundError), a table that is gone (UndefinedTable), an index representation
    switched under it (LookupError). Read the registry afresh and run once more."""
    return isinstance(exc, SpaceNotFoundError | LookupError | psycopg.errors.UndefinedTable)


def _after_failure(host: SearchHost, collection: str, exc: Exception, attempt: int) -> None:
    """The retry rule applied to a failed search: returns when it may run once more (the cached row
    forgotten), raises otherwise. A second stale failure answers a space's own error as it is, else
    that the collection is gone."""
    if not stale_collection(exc):
        raise exc
    host.forget_collection(collection)
    if attempt:
        if isinstance(exc, SpaceNotFoundError):
            raise exc
        raise CollectionNotFoundError(collection) from None


def run(
    host: SearchHost, *, collection: str, query: SearchQuery, ef_search: int | None, exact: bool
) -> list[SearchResult]:
    """A checked search on the blocking path: on a search connection (a replica's when there are)."""
    for attempt in range(2):
        c = host.get_collection(name=collection, fresh=attempt > 0)
        try:
            rows = host.db.run_search(partial(_walks, host, c, query, ef_search, exact))
            return request.results(c, query, rows)
        except Exception as exc:
            _after_failure(host, collection, exc, attempt)
    raise AssertionError("unreachable")


def _walks(
    host: SearchHost, c: Collection, q: SearchQuery, ef_search: int | None, exact: bool, conn: psycopg.Connection[Any]
) -> list[tuple[Any, ...]]:
    p = plan(c, q, ef_search=ef_search, exact=exact, max_scan_tuples=host.settings.max_scan_tuples, conn=conn)
    rows = statements.run_search(conn, p.settings, p.statement, p.params, prepare=p.prepare)
    again = p.second_walk(rows)
    if again is not None:
        host.second_walk_count()
        rows = statements.run_search(conn, again, p.statement, p.params, prepare=p.prepare)
    return rows


class AsyncSearcher:
    """Checked searches on the caller's event loop (see the module's docstring)."""

    def __init__(
        self,
        store: SearchHost,
        *,
        max_connections: int = 8,
        run_blocking: Callable[[Callable[[], Any]], Awaitable[Any]] | None = None,
    ) -> None:
        """`run_blocking(fn)` awaits fn() off the event loop (registry reads on a cache miss)."""
        self.store = store
        self._run_blocking = run_blocking
        # Autocommit, and the settings at session level: these connections run searches only, each
        # under the settings it needs (see _run_under). None is opened before the first search.
        self.connections = store.db.async_search_connections(max_size=max_connections)

    async def close(self) -> None:
        await self.connections.close()

    async def search(
        self, *, collection: str, query: SearchQuery, ef_search: int | None = None, exact: bool = False
    ) -> list[SearchResult] | None:
        """What `VectorStore.search` answers for ``query`` (``memstore.search.request.check_query``), or
        None when the collection needs the blocking path."""
        if self.store.db.replicas:
            return None  # reads go to the replicas, through the blocking path (its pools are theirs)
        for attempt in range(2):
            c = await self._collection(collection, fresh=attempt > 0)
            if compact_spec.index_spec(c).compact and not exact and query.mode != "keyword":
                return None
            try:
                p = plan(
                    c, query, ef_search=ef_search, exact=exact, max_scan_tuples=self.store.settings.max_scan_tuples
                )
                rows = await run_async_search(
                    self.connections, partial(_async_walks, plan=p, on_second_walk=self.store.second_walk_count)
                )
                return request.results(c, query, rows)
            except Exception as exc:
                _after_failure(self.store, collection, exc, attempt)
        raise AssertionError("unreachable")

    async def _collection(self, name: str, *, fresh: bool) -> Collection:
        hit = None if fresh else self.store.cached_collection(name)
        if hit is not None:
            return hit

        def read() -> Collection:
            return self.store.get_collection(name=name, fresh=fresh)

        if self._run_blocking is None:
            return read()
        result: Collection = await self._run_blocking(read)
        return result


async def _async_walks(
    conn: psycopg.AsyncConnection[Any], *, plan: SearchPlan, on_second_walk: Callable[[], None]
) -> list[Any]:
    """The search, and once more under the plan's fallback settings when it came back short."""
    rows = await _run_under(conn, plan, plan.settings)
    again = plan.second_walk(rows)
    if again is not None:
        on_second_walk()
        rows = await _run_under(conn, plan, again)
    return rows


async def _run_under(conn: psycopg.AsyncConnection[Any], plan: SearchPlan, settings: SearchSettings) -> list[Any]:
    """One round trip: the search alone when the connection already holds ``settings`` (straight
    through libpq, ``memstore.db.direct_fetch``: most searches), else the settings and the search
    pipelined (autocommit: no transaction to commit afterwards)."""
    session = search_session(conn)
    try:
        if session.held == settings:
            try:
                return await fetch_rows(conn, plan.statement, plan.params, prepare=plan.prepare)
            except psycopg.errors.InvalidSqlStatementName:
                pass  # the session was reset (a DISCARD ALL): its settings are gone too; both again
        session.held = None
        async with conn.pipeline():
            await conn.execute(SESSION_SETTINGS_SQL, settings.values())
            cur = await conn.execute(plan.statement, plan.params, prepare=plan.prepare)
        session.held = settings
        return await cur.fetchall()
    except BaseException:
        session.held = None  # whatever failed, the next search on it sets everything again
        raise
