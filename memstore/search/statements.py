"""The search statement and its settings: one builder for the store, the async path, the compact
search and the recall probes.

A search is a settings statement and then the statement itself. A plain index search needs only the
HNSW knobs and ``jit``, which no other statement minds: a connection (a search connection of
``memstore.db.search_pool``, or a pooled one) keeps them for its session and remembers what it holds
(``run_search``), so most searches send the statement alone, as a hand-written one would. A search
that changes the planner (``exact``, ``index_only``, ``nested_loops``) sets all eight knobs for its
transaction alone, so nothing it sets outlives it.
No caller builds SQL by concatenation.

Planning. An unfiltered search has nothing for the planner to weigh but the table: its statement
takes ``k`` as a literal (``search_statement(limit=k)``) and runs as a prepared statement, so after
PostgreSQL's five custom plans it runs a cached generic plan (the same HNSW index scan) without
planning at all; with ``LIMIT $k`` a generic plan is priced for an unknown row count and never wins,
so every search was planned afresh. A filtered search is never prepared: each one is planned with
its filter's values, whose selectivity decides between the index and a scan. The HNSW knobs are
read when the scan starts, so a cached plan follows each search's ``ef_search``; the planner's
knobs (``exact``, ``index_only``) change the statement's text too, so no cached plan is shared
between searches that plan differently. PostgreSQL plans a cached statement again when its table's
statistics change (an ANALYZE, autovacuum's included; a bulk load ends with one) or its indexes do
(a rebuild, a representation switch), so a plan made while a collection was small does not outlive
the next ANALYZE.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Generic, TypeVar, overload

import psycopg
from psycopg import sql

from memstore.catalog import keywords, segments
from memstore.db import core

if TYPE_CHECKING:
    from memstore.catalog.collections import Collection, Space

_KNOBS = (
    "hnsw.ef_search",
    "hnsw.iterative_scan",
    "hnsw.max_scan_tuples",
    "enable_indexscan",
    "enable_seqscan",
    "enable_mergejoin",
    "enable_hashjoin",
    "jit",
)
_TEMPLATE = "SELECT " + ", ".join(f"set_config('{knob}', %s, {{local}})" for knob in _KNOBS)
SETTINGS_SQL = _TEMPLATE.format(local="true")
# The same settings for the whole session: only for connections that run nothing but searches, and
# that know which settings they hold (memstore.search.runner's connections).
SESSION_SETTINGS_SQL = _TEMPLATE.format(local="false")
# What a plain index search needs, for the session of a pooled connection that runs other statements
# too: none of these changes how anything but an HNSW scan runs (jit off only spares short queries
# the compilation). The planner's own knobs are never left on a shared connection.
_INDEX_KNOBS = ("hnsw.ef_search", "hnsw.iterative_scan", "hnsw.max_scan_tuples", "jit")
INDEX_SESSION_SQL = "SELECT " + ", ".join(f"set_config('{knob}', %s, false)" for knob in _INDEX_KNOBS)


_CursorT = TypeVar("_CursorT", psycopg.Cursor[Any], None)


class SearchSession(Generic[_CursorT]):
    """What a connection keeps for its searches, on the connection itself (it goes with it): the
    settings its session holds (``held``: the values of INDEX_SESSION_SQL on the blocking path, the
    ``SearchSettings`` of SESSION_SETTINGS_SQL on the async one; None: not known, send them again;
    forgotten on any error, as a failed implicit transaction takes its settings with it), and on the
    blocking path one cursor for the searches that send their statement alone. psycopg keeps what it
    looked up to send a statement's parameters and read its rows across runs of the same statement on
    one cursor; a new cursor per search looked everything up again, which cost more client time than
    anything else in a search. The async path sends such a statement straight through libpq
    (``memstore.db.direct_fetch``, which keeps its own state on the connection): no cursor."""

    __slots__ = ("cursor", "held")

    def __init__(self, cursor: _CursorT) -> None:
        self.cursor: _CursorT = cursor
        self.held: object = None


_SESSION = "_memstore_search_session"


@overload
def search_session(conn: psycopg.Connection[Any]) -> SearchSession[psycopg.Cursor[Any]]: ...
@overload
def search_session(conn: psycopg.AsyncConnection[Any]) -> SearchSession[None]: ...
def search_session(conn: Any) -> Any:
    """``conn``'s search session, made on first use (and again if its cursor was closed)."""
    found = getattr(conn, _SESSION, None)
    if found is None or (found.cursor is not None and found.cursor.closed):
        found = SearchSession(conn.cursor() if isinstance(conn, psycopg.Connection) else None)
        setattr(conn, _SESSION, found)
    return found


OPERATORS = ("<=>", "<->", "<#>")
# What a search runs: composed, or rendered once to its text (``search_statement``'s cached ones).
Statement = sql.SQL | sql.Composed


@dataclass(frozen=True)
class SearchSettings:
    """What one search runs under.

    ``exact``: no index scans, so the planner can only answer ORDER BY distance by brute force (the
    ground truth). ``index_only``: no sequential scans either, so the statement reads the index even
    where the planner would price a scan of a small table lower (the recall probes measure the graph;
    a compact search must not evaluate its cast on every row). ``nested_loops``: no merge or hash
    joins (the low-rank search's join must be driven by the side table's index scan).
    ``iterative``: pgvector's iterative scan (relaxed order), which keeps walking the graph while a
    filter or dead tuples discard candidates. Off, the scan stops after ``ef_search`` candidates, and
    a search takes about 8% less time (100,000 rows, ef_search 40): the store's unfiltered searches
    run so, and again with it on when they come back short (``memstore.search.plan.SearchPlan``).
    """

    ef_search: int
    exact: bool
    max_scan_tuples: int
    index_only: bool = False
    nested_loops: bool = False
    iterative: bool = True

    @property
    def plain(self) -> bool:
        """Leaves the planner alone: what ``INDEX_SESSION_SQL`` sets is all it needs."""
        return not (self.exact or self.index_only or self.nested_loops)

    def index_values(self) -> tuple[str, ...]:
        """The values of INDEX_SESSION_SQL's parameters (a plain search's settings)."""
        return (str(self.ef_search), self._iterative_scan(), str(self.max_scan_tuples), "off")

    def _iterative_scan(self) -> str:
        return "relaxed_order" if self.iterative and not self.exact else "off"

    def values(self) -> tuple[str, ...]:
        """The values of SETTINGS_SQL's parameters, in order (also the key of what a connection holds)."""
        return (
            str(self.ef_search),
            self._iterative_scan(),
            str(self.max_scan_tuples),
            "off" if self.exact else "on",
            "off" if self.index_only and not self.exact else "on",
            "off" if self.nested_loops else "on",
            "off" if self.nested_loops else "on",
            "off",  # JIT pays off for long analytic queries; for millisecond searches it only adds latency
        )


@lru_cache(maxsize=1024)
def search_settings(*, ef_search: int, exact: bool, max_scan_tuples: int, iterative: bool = True) -> SearchSettings:
    """``SearchSettings`` for a plain or exact search, one frozen instance per combination: a search
    asks for the same few every time, and building a frozen dataclass costs more than looking it up."""
    return SearchSettings(ef_search=ef_search, exact=exact, max_scan_tuples=max_scan_tuples, iterative=iterative)


def search_statement(
    table: str,
    operator: str,
    *,
    exact: bool,
    ids_only: bool = False,
    where: sql.Composable | None = None,
    limit: int | None = None,
    graphs: tuple[tuple[int, int], ...] | None = None,
) -> Statement:
    """The ``%(k)s`` nearest rows of ``table`` (a collection or one partition) to ``%(q)s``, nearest
    first, among those matching ``where`` (a compiled filter, ``memstore.search.filter_language``, whose
    parameters the caller binds). The MATERIALIZED CTE restores strict order after a relaxed
    iterative scan: sorted by ``distance + 0``, since PostgreSQL 17 takes a CTE's sort order from its
    ORDER BY and would drop a sort by ``distance`` itself as done, leaving the scan's relaxed order
    (pgvector's README; seen as distances out of order under load); ties go by id, so items at one
    distance (the same picture stored twice) keep their order from one page to the next. ``ids_only``: id and distance
    alone (what the recall probes compare).

    ``limit``: the ``limit`` nearest instead, with the number in the statement's text, which makes
    an unfiltered statement one whose generic plan PostgreSQL keeps (see the module's docstring).
    Statements without a filter are rendered once and kept.

    ``graphs``: the id ranges of a segmented collection's graphs (``memstore.catalog.segments``):
    each range's nearest rows from its own graph, and the tail's (above the last range) read
    exactly, merged. None: the table's one graph. An exact search reads every row either way."""
    if operator not in OPERATORS:
        raise ValueError(f"unknown distance operator {operator!r}")
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
        raise ValueError(f"limit must be a positive integer, not {limit!r}")
    if where is None:
        return _statement(table, operator, exact, ids_only, limit, graphs)
    return _build(table, operator, where, exact, ids_only, limit, graphs)


@lru_cache(maxsize=4096)
def _statement(
    table: str,
    operator: str,
    exact: bool,
    ids_only: bool,
    limit: int | None,
    graphs: tuple[tuple[int, int], ...] | None = None,
) -> sql.SQL:
    # Rendered to its text once: composing the statement again on every execution cost more than
    # the client's whole share of a search.
    return sql.SQL(_build(table, operator, None, exact, ids_only, limit, graphs).as_string())


def _build(
    table: str,
    operator: str,
    where: sql.Composable | None,
    exact: bool,
    ids_only: bool,
    limit: int | None,
    graphs: tuple[tuple[int, int], ...] | None = None,
) -> sql.Composed:
    op = sql.SQL(operator)
    columns = sql.SQL("id" if ids_only else "id, external_id, metadata")
    # A hit's own columns after its distance: whether it has an original to download.
    flag, flagged = (sql.SQL(""), sql.SQL("")) if ids_only else (sql.SQL(", " + ORIGINAL), sql.SQL(", original"))
    # An exact search reads every row anyway: ties go by id there too, so its pages tile. (An index
    # scan's order is the graph's: an id there would stop pgvector from serving the ORDER BY.)
    nearest = sql.SQL(
        "SELECT {columns}, embedding {op} %(q)s AS distance{flag} FROM {t} WHERE {where} "
        "ORDER BY embedding {op} %(q)s" + (", id" if exact else "") + " LIMIT {limit}"
    )
    t = sql.Identifier(table)
    count = sql.SQL("%(k)s") if limit is None else sql.Literal(limit)
    if exact or graphs is None:
        inner = nearest.format(columns=columns, op=op, t=t, where=_rows(where), limit=count, flag=flag)
        if exact:
            return inner
        return sql.SQL(
            "WITH c AS MATERIALIZED ({inner}) SELECT {columns}, distance{flagged} FROM c ORDER BY distance + 0, id"
        ).format(inner=inner, columns=columns, flagged=flagged)
    # One branch per graph and one for the tail (pgvector's scan of a partial index, then the
    # primary key's range and a sort): the k nearest of the union are among their k nearest each.
    branches = [
        sql.SQL("({})").format(
            nearest.format(
                columns=columns,
                op=op,
                t=t,
                where=sql.SQL("{} AND {}").format(_rows(where), segments.range_predicate(lo, hi)),
                limit=count,
                flag=flag,
            )
        )
        for lo, hi in segments.parts(graphs)
    ]
    return sql.SQL(
        "WITH c AS MATERIALIZED ({union}) SELECT {columns}, distance{flagged} FROM c "
        "ORDER BY distance + 0, id LIMIT {limit}"
    ).format(union=sql.SQL(" UNION ALL ").join(branches), columns=columns, limit=count, flagged=flagged)


def space_search_statement(
    c: Collection, space: Space, *, exact: bool, where: sql.Composable | None = None
) -> sql.Composed:
    """``search_statement`` on a side space (``memstore.spaces.lifecycle``): its HNSW index gives the nearest
    vectors in order and each is joined to its item by primary key, so a filter on the item's metadata
    keeps pgvector's iterative scan going until enough items pass, as on the item table itself."""
    op = sql.SQL(space.spec.operator)
    inner = sql.SQL(
        "SELECT t.id, t.external_id, t.metadata, s.embedding {op} %(q)s AS distance, {original} "
        "FROM {side} s JOIN {t} t ON t.id = s.id WHERE {where} ORDER BY s.embedding {op} %(q)s LIMIT %(k)s"
    ).format(
        op=op,
        side=sql.Identifier(space.table_name),
        t=c.table,
        where=where or sql.SQL("TRUE"),
        original=sql.SQL(original_of("t")),
    )
    if exact:
        return inner
    return sql.SQL(
        "WITH c AS MATERIALIZED ({inner}) SELECT id, external_id, metadata, distance, original FROM c "
        "ORDER BY distance + 0, id"
    ).format(inner=inner)


def original_of(alias: str | None = None) -> str:
    """Whether a row has an original to download (``GET .../items/{id}/content``): its file or its
    text; an item stored as a bare vector has none. Read from the null bitmap: no value is fetched."""
    at = f"{alias}." if alias else ""
    return f"({at}text IS NOT NULL OR {at}content IS NOT NULL) AS original"


ORIGINAL = original_of()


def _rows(where: sql.Composable | None) -> sql.Composable:
    """The rows a search may answer: those with a vector, matching the filter."""
    ready = sql.SQL("embedding IS NOT NULL")
    return ready if where is None else sql.SQL("{} AND ({})").format(ready, where)


# Reciprocal Rank Fusion's constant: a hit at rank r of a list adds weight / (RRF_K + r).
RRF_K = 60


def keyword_statement(c: Collection, text: str, *, where: sql.Composable | None) -> sql.Composed:
    """The ``%(k)s`` rows (after ``%(offset)s``) of ``c`` whose keywords best match ``%(text)s``, best
    first by ``ts_rank_cd``: id, external_id, metadata, NULL distance, rank, NULL vector rank, keyword
    rank. The GIN index on the keywords finds the matches; only they are ranked."""
    return sql.SQL(
        "SELECT id, external_id, metadata, NULL::float8 AS distance, score, NULL::bigint AS vector_rank, "
        "row_number() OVER (ORDER BY score DESC, id) + %(offset)s AS keyword_rank, original "
        "FROM ({matches} ORDER BY score DESC, id LIMIT %(k)s OFFSET %(offset)s) AS m ORDER BY score DESC, id"
    ).format(matches=_keyword_matches(c, text, where, sql.SQL("id, external_id, metadata"), hit=True))


def _keyword_matches(
    c: Collection, text: str, where: sql.Composable | None, columns: sql.Composable, *, hit: bool = False
) -> sql.Composed:
    """The rows whose stored keywords (``memstore.catalog.keywords``: the side table, joined by id) match
    ``%(text)s``, each with its ``ts_rank_cd`` score: at most ``keywords.RANK_LIMIT`` of them, taken as
    the index finds them after the filter, so a word in every item ranks a bounded number. ``hit``:
    with ``original`` after the columns, as a search's hits carry it."""
    query = keywords.query(c, text)
    inner, outer = columns, columns
    if hit:
        inner, outer = sql.SQL("{}, " + ORIGINAL).format(columns), sql.SQL("{}, original").format(columns)
    return sql.SQL(
        "SELECT {outer}, ts_rank_cd(words, {query})::float8 AS score FROM ("
        "SELECT {inner}, words FROM {t} JOIN {side} AS k USING (id) WHERE words @@ {query} AND {rows} "
        "LIMIT {cap}) AS ranked"
    ).format(
        outer=outer,
        inner=inner,
        query=query,
        t=c.table,
        side=keywords.table(c),
        rows=_rows(where),
        cap=sql.Literal(keywords.RANK_LIMIT),
    )


def hybrid_statement(
    c: Collection, text: str, *, nearest: sql.Composable, where: sql.Composable | None, space: Space | None = None
) -> sql.Composed:
    """Reciprocal Rank Fusion of two lists, in one statement: ``nearest`` (a vector search of this
    module or of ``memstore.compact``, its ``%(k)s`` bound to the number of candidates) and the as
    many best keyword matches of ``%(text)s`` under the same filter. A row scores ``%(wv)s / (60 + its
    vector rank) + %(wk)s / (60 + its keyword rank)`` (a list that missed it adds nothing); the
    ``%(hits)s`` best after ``%(offset)s`` are answered like ``keyword_statement``'s rows, with their
    distance (computed for keyword-only hits too) and both ranks.

    An empty keyword query (only stop words or punctuation) matches nothing, so the answer is the
    vector list's order: hybrid falls back to vector search without an error. ``space``: the side space
    ``nearest`` searched (its vectors give the distances)."""
    op = sql.SQL(c.spec.operator)
    distance = sql.SQL("t.embedding {op} %(q)s").format(op=op)
    if space is not None and space.side:
        distance = sql.SQL("(SELECT s.embedding {op} %(q)s FROM {side} s WHERE s.id = f.id)").format(
            op=sql.SQL(space.spec.operator), side=sql.Identifier(space.table_name)
        )
    matches = _keyword_matches(c, text, where, sql.SQL("id"))
    return sql.SQL(
        "WITH v AS MATERIALIZED ({nearest}), "
        "vr AS (SELECT id, row_number() OVER (ORDER BY distance + 0, id) AS r FROM v), "
        "kw AS MATERIALIZED ({matches} ORDER BY score DESC, id LIMIT %(k)s), "
        "kr AS (SELECT id, row_number() OVER (ORDER BY score DESC, id) AS r FROM kw), "
        "fused AS (SELECT coalesce(vr.id, kr.id) AS id, vr.r AS vector_rank, kr.r AS keyword_rank, "
        "coalesce(%(wv)s / ({rrf} + vr.r), 0) + coalesce(%(wk)s / ({rrf} + kr.r), 0) AS score "
        "FROM vr FULL JOIN kr ON vr.id = kr.id ORDER BY score DESC, id LIMIT %(hits)s OFFSET %(offset)s) "
        "SELECT f.id, t.external_id, t.metadata, {distance} AS distance, f.score::float8, "
        "f.vector_rank, f.keyword_rank, {original} FROM fused f JOIN {t} t ON t.id = f.id ORDER BY f.score DESC, f.id"
    ).format(
        nearest=nearest,
        matches=matches,
        rrf=sql.Literal(RRF_K),
        distance=distance,
        t=c.table,
        original=sql.SQL(original_of("t")),
    )


def duplicates_statement(c: Collection) -> sql.Composed:
    """Near-duplicate pairs among the items ``%(ids)s``: each item's ``%(per)s`` nearest (the HNSW
    index, one scan per item) within distance ``%(threshold)s`` of it, each pair once, from the side
    of its lower id, closest first."""
    op = sql.SQL(c.spec.operator)
    nearest = sql.SQL(
        "SELECT id, external_id, embedding {op} a.embedding AS distance FROM {t} WHERE embedding IS NOT NULL{more} "
        "ORDER BY embedding {op} a.embedding LIMIT %(per)s"
    )
    graphs = segments.search_ranges(c)
    if graphs is None:
        lateral: sql.Composable = nearest.format(op=op, t=c.table, more=sql.SQL(""))
    else:  # a segmented collection: each graph's and the tail's nearest, as search_statement's branches
        branches = [
            sql.SQL("({})").format(
                nearest.format(op=op, t=c.table, more=sql.SQL(" AND {}").format(segments.range_predicate(lo, hi)))
            )
            for lo, hi in segments.parts(graphs)
        ]
        lateral = sql.SQL("SELECT * FROM ({}) AS u ORDER BY distance LIMIT %(per)s").format(
            sql.SQL(" UNION ALL ").join(branches)
        )
    return sql.SQL(
        "SELECT a.id, a.external_id, b.id, b.external_id, b.distance FROM {t} a CROSS JOIN LATERAL ({lateral}) b "
        "WHERE a.id = ANY(%(ids)s) AND b.id > a.id AND b.distance <= %(threshold)s ORDER BY b.distance, a.id, b.id"
    ).format(t=c.table, lateral=lateral)


def run_search(
    conn: psycopg.Connection[Any],
    settings: SearchSettings,
    statement: Statement,
    params: dict[str, Any],
    *,
    prepare: bool | None = None,
) -> list[tuple[Any, ...]]:
    """The search under ``settings``, in one round trip.

    On a connection in no transaction, in autocommit mode (no BEGIN or COMMIT of its own): a plain
    search sends its statement alone when the connection already holds its settings (``SearchSession``),
    else the session settings and the statement pipelined up to one Sync. A search that changes the
    planner pipelines transaction-local settings with the statement: the extended protocol runs
    everything up to a Sync as one implicit transaction, so they end with it. Inside a caller's
    transaction, the local settings and the statement run in it.

    ``prepare``: as psycopg takes it (True: a prepared statement from the first run, whose generic
    plan PostgreSQL may keep; False: planned on every run; None: prepared after a few runs).
    """
    if not core.idle(conn):
        return _pipelined(conn, SETTINGS_SQL, settings.values(), statement, params, prepare)
    was_autocommit = conn.autocommit
    if not was_autocommit:
        conn.autocommit = True
    try:
        if not settings.plain:
            return _pipelined(conn, SETTINGS_SQL, settings.values(), statement, params, prepare)
        held = settings.index_values()
        session = search_session(conn)
        try:
            if session.held == held:
                return session.cursor.execute(statement, params, prepare=prepare).fetchall()
            session.held = None
            rows = _pipelined(conn, INDEX_SESSION_SQL, held, statement, params, prepare)
            session.held = held
            return rows
        except BaseException:
            session.held = None
            raise
    finally:
        if not was_autocommit and not conn.closed:
            conn.autocommit = False


def _pipelined(
    conn: psycopg.Connection[Any],
    settings_sql: str,
    values: tuple[str, ...],
    statement: Statement,
    params: dict[str, Any],
    prepare: bool | None,
) -> list[tuple[Any, ...]]:
    with conn.cursor() as cur:
        with conn.pipeline():
            cur.execute(settings_sql, values)
            cur.execute(statement, params, prepare=prepare)
        return cur.fetchall()


def apply(cur: psycopg.Cursor[Any], settings: SearchSettings) -> None:
    """Transaction-local settings on ``cur``'s connection (for callers that run several searches)."""
    cur.execute(SETTINGS_SQL, settings.values())


def exact_within_statement(table: str, operator: str, queries: int) -> sql.Composed:
    """The exact distances from every row of ``table`` to ``queries`` query vectors (``%(q0)s``...)
    in one scan, keeping the rows within some query's bound (``%(b0)s``...: the distance of the
    index's k-th answer to it; those k rows exist, so the true k nearest lie within it too).
    ``vector(embedding, %(dims)s, true)`` detoasts each stored vector once for all the queries, not
    once per distance (a 1024-d vector lives out of line)."""
    if operator not in OPERATORS:
        raise ValueError(f"unknown distance operator {operator!r}")
    distances = sql.SQL(", ").join(
        sql.SQL("e {} {}").format(sql.SQL(operator), sql.Placeholder(f"q{j}")) for j in range(queries)
    )
    within = sql.SQL(" OR ").join(
        sql.SQL("d[{}] <= {}").format(sql.Literal(j + 1), sql.Placeholder(f"b{j}")) for j in range(queries)
    )
    return sql.SQL(
        "SELECT id, d FROM (SELECT id, ARRAY[{distances}] AS d FROM (SELECT id, vector(embedding, %(dims)s, true) AS e "
        "FROM {t} WHERE embedding IS NOT NULL OFFSET 0) AS t OFFSET 0) AS s WHERE {within}"
    ).format(distances=distances, t=sql.Identifier(table), within=within)
