"""The plan of one search: which statement runs, under which settings, with which values.

Planning is pure (no statement runs), except on a compact index, where the query vector is projected
on the connection the search will run on. Both runners (``memstore.search.runner``) run these plans,
so a search answers the same on the blocking path and on the event loop.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import psycopg

from memstore.catalog import index_spec as compact_spec
from memstore.catalog import keywords, segments
from memstore.catalog.collections import Collection, Space
from memstore.errors import InvalidInputError
from memstore.items.vectors import as_vector
from memstore.search import compact as compact_search
from memstore.search import statements
from memstore.search.filter_language import CompiledFilter
from memstore.search.request import SearchQuery
from memstore.search.statements import SearchSettings


class SearchPlan(NamedTuple):
    """What one search runs (a tuple: every search builds one, and a frozen dataclass cost more)."""

    statement: statements.Statement
    settings: SearchSettings
    params: dict[str, Any]
    # How psycopg runs the statement (``statements.run_search``): True prepared (a generic plan kept),
    # False planned with its values each time, None psycopg's default.
    prepare: bool | None = None
    # The settings to run the statement again with when it answers fewer than ``wanted`` rows (a
    # search without pgvector's iterative scan, whose candidates dead tuples may thin out); None: one run.
    fallback: SearchSettings | None = None
    wanted: int = 0

    def second_walk(self, rows: list[Any]) -> SearchSettings | None:
        """The fallback when ``rows`` call for it (fewer than asked, from a scan that stopped early),
        else None. A collection with fewer rows than asked is searched twice (both walks are short)."""
        return self.fallback if len(rows) < self.wanted else None


def plan(
    c: Collection,
    q: SearchQuery,
    *,
    ef_search: int | None,
    exact: bool,
    max_scan_tuples: int,
    conn: psycopg.Connection[Any] | None = None,
) -> SearchPlan:
    """The statement, settings and parameters of one search. ``conn`` (where the search will run)
    is needed on a compact index only, to project the query vector."""
    where = q.filter.where if q.filter else None
    if q.mode == "keyword":
        assert q.text is not None
        params: dict[str, Any] = {
            **keywords.query_params(q.text),
            "k": q.k,
            "offset": q.offset,
            **(q.filter.params if q.filter else {}),
        }
        settings = SearchSettings(ef_search=ef_search_of(c, ef_search), exact=exact, max_scan_tuples=max_scan_tuples)
        assert q.text is not None
        statement = statements.keyword_statement(c, q.text, where=where)
        return SearchPlan(statement, settings, params, prepare=False if where is not None else None)
    # The vector list: as long as the answer in a vector search, the candidates in a hybrid one.
    depth = q.window if q.mode == "vector" else q.candidates
    nearest = _vector_plan(c, q, depth, ef_search=ef_search, exact=exact, max_scan_tuples=max_scan_tuples, conn=conn)
    if q.mode == "vector":
        return nearest
    assert q.text is not None
    params = {
        **nearest.params,
        **keywords.query_params(q.text),
        "hits": q.k,
        "offset": q.offset,
        "wv": q.weights.vector,
        "wk": q.weights.keyword,
    }
    statement = statements.hybrid_statement(c, q.text, nearest=nearest.statement, where=where, space=c.space(q.using))
    return SearchPlan(statement, nearest.settings, params, prepare=False if where is not None else None)


def _vector_plan(
    c: Collection,
    q: SearchQuery,
    depth: int,
    *,
    ef_search: int | None,
    exact: bool,
    max_scan_tuples: int,
    conn: psycopg.Connection[Any] | None,
) -> SearchPlan:
    """The ``depth`` nearest rows to the query vector, on whatever the searched space's index holds."""
    space = c.space(q.using)
    efs = ef_search_of(space, ef_search)
    if q.mode == "hybrid":
        # The graph search must reach as deep as the list it feeds into the fusion.
        efs = min(1000, max(efs, depth))
    if space.side:
        return SearchPlan(
            statements.space_search_statement(c, space, exact=exact, where=q.filter.where if q.filter else None),
            SearchSettings(ef_search=efs, exact=exact, max_scan_tuples=max_scan_tuples),
            search_params(space, q.vector, depth, q.filter),
        )
    spec = compact_spec.index_spec(c)
    if spec.compact and not exact:
        if conn is None:
            raise ValueError("a search on a compact index is planned on its connection")
        params = search_params(c, q.vector, depth, q.filter)
        params["pool"] = spec.pool(depth, q.pool)
        params["c"] = compact_search.compact_query(conn, spec, params["q"])
        statement = compact_search.statement(c, spec, where=q.filter.where if q.filter else None)
        settings = compact_search.settings(
            ef_search=min(1000, max(efs, params["pool"])), max_scan_tuples=max_scan_tuples
        )
        return SearchPlan(statement, settings, params)
    return plain_plan(
        c,
        vector=q.vector,
        k=depth,
        filter=q.filter,
        ef_search=efs,
        exact=exact,
        max_scan_tuples=max_scan_tuples,
        alone=q.mode == "vector",
    )


def plain_plan(
    c: Collection,
    *,
    vector: Any,
    k: int,
    filter: CompiledFilter | None,
    ef_search: int | None,
    exact: bool,
    max_scan_tuples: int,
    alone: bool = False,
) -> SearchPlan:
    """The statement, settings and parameters of a search on the full-precision index (or exact).

    Without a filter, ``k`` is written into the statement and it runs prepared, on the generic
    plan PostgreSQL keeps for it; a filtered one is planned with its values every time
    (``memstore.search.statements``).

    ``alone``: the statement's rows are the whole answer (not one list of a hybrid search). Then an
    unfiltered index search of an unpartitioned collection whose ``k`` rows (offset included) fit
    in the ``ef_search`` candidates of one graph walk runs without pgvector's iterative scan. Only
    rows the search cannot see (deleted or replaced and not vacuumed yet, not committed) can leave
    it short, or a collection with fewer than ``k`` rows with vectors; the plan's ``fallback``
    runs it again with the scan then (``SearchPlan.second_walk``). A partitioned collection keeps the
    scan, and so does a segmented one (its graphs are merged as partitions are): the merge of the
    walks would fill a short walk's place with another walk's farther rows, and the answer would come
    back complete but worse."""
    efs = segments.walk_ef(c, ef_search_of(c, ef_search), k)
    graphs = segments.search_ranges(c)
    walk_once = alone and filter is None and not exact and k <= efs and c.partitions == 1 and graphs is None
    settings = statements.search_settings(
        ef_search=efs, exact=exact, max_scan_tuples=max_scan_tuples, iterative=not walk_once
    )
    return SearchPlan(
        statements.search_statement(
            c.table_name,
            c.spec.operator,
            exact=exact,
            where=filter.where if filter else None,
            limit=None if filter else k,
            graphs=graphs,
        ),
        settings,
        search_params(c, vector, k, filter),
        prepare=filter is None,
        fallback=statements.search_settings(ef_search=efs, exact=False, max_scan_tuples=max_scan_tuples)
        if walk_once
        else None,
        wanted=k,
    )


def search_params(c: Collection | Space, vector: Any, k: int, filter: CompiledFilter | None) -> dict[str, Any]:
    """The query vector (checked against the collection or space searched), k and the filter's values,
    as every search binds them."""
    params: dict[str, Any] = {"q": as_vector(vector, dimensions=c.dimensions, metric=c.metric), "k": k}
    if filter:
        params.update(filter.params)
    return params


def ef_search_of(c: Collection | Space, ef_search: int | None) -> int:
    """The ef_search a search runs with: the one it names, else the collection's or space's default."""
    efs = c.default_ef_search if ef_search is None else ef_search
    if not isinstance(efs, int) or isinstance(efs, bool) or not 1 <= efs <= 1000:
        raise InvalidInputError(f"ef_search must be an integer between 1 and 1000, not {efs!r}")
    return efs
