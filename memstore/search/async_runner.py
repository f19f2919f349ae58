"""Vector searches on the caller's event loop, on search connections of their own
(``memstore.db.core.async_search_connections``).

`VectorStore.search` is blocking, so an async server has to hand each search to a thread and back.
On a small machine that hop, and the interpreter lock it makes two threads fight over, costs more
than the search's own Python work. `AsyncSearcher` runs the same statements (built by
`VectorStore.plain_search`, so results are identical) without leaving the event loop. It covers the
full-precision index and exact search; a collection on a compact index answers None, and the caller
uses the blocking path for it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial
from typing import Any

import psycopg

from memstore.catalog import index_spec as compact_spec
from memstore.catalog.collections import Collection
from memstore.db.core import connection_lost
from memstore.errors import CollectionNotFoundError
from memstore.models import SearchResult
from memstore.search import request
from memstore.search.request import SearchQuery
from memstore.search.statements import SESSION_SETTINGS_SQL, SearchSettings, search_session
from memstore.store import SearchPlan, VectorStore

log = logging.getLogger(__name__)


class AsyncSearcher:
    def __init__(
        self,
        store: VectorStore,
        *,
        max_connections: int = 8,
        run_blocking: Callable[[Callable[[], Any]], Any] | None = None,
    ) -> None:
        """`run_blocking(fn)` awaits fn() off the event loop (registry reads on a cache miss)."""
        self.store = store
        self._run_blocking = run_blocking
        # Autocommit, and the settings at session level: these connections run searches only, each
        # under the settings it needs (see _run). None is opened before the first search.
        self.connections = store.db.async_search_connections(max_size=max_connections)

    async def close(self) -> None:
        await self.connections.close()

    async def search(
        self, *, collection: str, query: SearchQuery, ef_search: int | None = None, exact: bool = False
    ) -> list[SearchResult] | None:
        """What `VectorStore.search` answers for ``query`` (``memstore.search.request.check_query``), or
        None when the collection needs the blocking path (a compact index)."""
        if self.store.db.replicas:
            return None  # reads go to the replicas, through the blocking path (its pools are theirs)
        for attempt in range(2):
            c = await self._collection(collection, fresh=attempt > 0)
            if compact_spec.index_spec(c).compact and not exact and query.mode != "keyword":
                return None
            plan = self.store.plan(c, query, ef_search=ef_search, exact=exact)
            try:
                rows = await self.connections.run(partial(_run, plan=plan, on_second_walk=self.store.count_second_walk))
                return request.results(c, query, rows)
            except psycopg.errors.UndefinedTable:
                # The cached registry row names a table that is gone: read the registry afresh.
                self.store.forget_collection(collection)
                if attempt:
                    raise CollectionNotFoundError(collection) from None
            except psycopg.OperationalError as exc:
                # A connection that broke under the search (a database restart): it is closed, not
                # handed out again; a read is safe to send once more on a fresh one. A statement the
                # server cancelled or timed out is not run again.
                if attempt or not connection_lost(exc):
                    raise
                log.info("search connection lost; retrying once on a fresh one")
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


async def _run(
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
    """One round trip: the search alone when the connection already holds ``settings``, else the
    settings and the search pipelined (autocommit: no transaction to commit afterwards)."""
    session = search_session(conn)
    try:
        if session.held == settings:
            cur = await session.cursor.execute(plan.statement, plan.params, prepare=plan.prepare)
        else:
            session.held = None
            async with conn.pipeline():
                await conn.execute(SESSION_SETTINGS_SQL, settings.values())
                cur = await conn.execute(plan.statement, plan.params, prepare=plan.prepare)
            session.held = settings
        return await cur.fetchall()
    except BaseException:
        session.held = None  # whatever failed, the next search on it sets everything again
        raise
