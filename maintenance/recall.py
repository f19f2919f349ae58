"""Sampled recall: recall@k of an index against exact search, at the collection's search settings.

Queries are, in order of preference: the ones given, a random draw of the real recent queries the
API sampled (``memstore_query_samples``), or stand-ins made from random stored vectors
(``stand_ins``: a stored vector itself reads recall near 1.0 whatever the graph). The index answers
``MIN_QUERIES``, then as many more as half the time budget pays for; then one scan of the table gives
the exact answers to all of them, bounded by the index's own answers (``exact_answers``). One scan in place of
one per query is 2 to 4.4 times cheaper (``python -m bench.recall_probe``, figures in docs/maintenance.md).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import psycopg
from psycopg import sql
from psycopg.pq import TransactionStatus

from maintenance.targets import Target
from maintenance.tuning import design_effect_of
from memstore.catalog import segments
from memstore.db import sqlfiles
from memstore.search import query_samples
from memstore.search.exact_answers import exact_answers as core_exact_answers
from memstore.search.exact_answers import recall_hits
from memstore.search.statements import SearchSettings, Statement, apply, search_statement

MIN_QUERIES = 5
# How far a stand-in query is moved from its stored vector, in nearest-neighbour distances (see stand_ins).
STAND_IN_STRETCH = 2.0


@contextmanager
def snapshot(conn: psycopg.Connection[Any]) -> Iterator[None]:
    """One transaction and one snapshot (REPEATABLE READ where it is the outermost; inside a caller's
    transaction, a savepoint under the caller's snapshot): the index's answers and the exact ones read
    in it see the same rows, and the search settings applied in it are local to it."""
    outer = conn.info.transaction_status != TransactionStatus.IDLE
    with conn.transaction():
        if not outer:
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        yield


def limit_statements(conn: psycopg.Connection[Any], seconds: float) -> None:
    """``statement_timeout`` for the rest of the caller's transaction (``seconds`` 0: no change). The
    maintenance worker's session has none (its REINDEX may take hours): a probe's or a tuning's reads,
    its exact scan above all, are bounded here."""
    if seconds > 0:
        conn.execute("SELECT set_config('statement_timeout', %s, true)", (f"{max(1, round(seconds * 1000))}ms",))


def index_settings(target: Target, *, ef_search: int, k: int, max_scan_tuples: int) -> SearchSettings:
    """The index's answers must come from the index: on a small table the planner rightly prefers a
    sequential scan (exact, so the probe would read recall 1.0 whatever state the graph is in). A
    segmented collection's graphs are walked at the ef the store's searches walk them at
    (``segments.walk_ef``), so that what a probe reads at an ef is what searches at it get."""
    if target.space is None:
        ef_search = segments.walk_ef(target.collection, ef_search, k)
    return SearchSettings(ef_search=ef_search, exact=False, max_scan_tuples=max_scan_tuples, index_only=True)


def exact_settings(*, ef_search: int, max_scan_tuples: int) -> SearchSettings:
    """Brute force, in the same transaction as the index searches (so sequential scans come back)."""
    return SearchSettings(ef_search=ef_search, exact=True, max_scan_tuples=max_scan_tuples)


def index_search(target: Target) -> Statement:
    """The index's answer as the store's filtered searches, and its unfiltered ones that one walk of the
    graph leaves short, run it (iterative scan, re-sorted), ids and distances only."""
    graphs = segments.search_ranges(target.collection) if target.space is None else None
    return search_statement(target.table, target.vectors.spec.operator, exact=False, ids_only=True, graphs=graphs)


def exact_search(target: Target) -> Statement:
    """Brute force (under exact_settings): the ground truth for one query."""
    return search_statement(target.table, target.vectors.spec.operator, exact=True, ids_only=True)


@dataclass(frozen=True)
class RecallResult:
    recall: float | None  # None when there was nothing to query (empty table)
    k: int
    queries: int
    ef_search: int
    source: str  # "given", "query_samples" or "stand_ins"
    seconds: float
    hits: int = 0  # index answers among the exact ones, all queries together
    expected: int = 0  # exact answers, all queries together
    found: list[list[int]] = field(default_factory=list, repr=False)
    exact: list[list[int]] = field(default_factory=list, repr=False)
    sample_ids: tuple[int, ...] = ()  # the API samples used (a confirming sample leaves them out)
    per_query_hits: tuple[int, ...] = field(default=(), repr=False)  # hits of each query, in order

    @property
    def design_effect(self) -> float | None:
        """How much the clustering of misses in queries widens this reading's error (``maintenance.tuning``)."""
        return design_effect_of(self.per_query_hits, [len(e) for e in self.exact[: len(self.per_query_hits)]])

    def combined(self, other: RecallResult) -> RecallResult:
        """This sample and ``other`` as one (a second sample confirming the first)."""
        hits, expected = self.hits + other.hits, self.expected + other.expected
        return replace(
            self,
            recall=hits / expected if expected else None,
            queries=self.queries + other.queries,
            source=self.source if self.source == other.source else f"{self.source}+{other.source}",
            seconds=self.seconds + other.seconds,
            hits=hits,
            expected=expected,
            found=self.found + other.found,
            exact=self.exact + other.exact,
            sample_ids=self.sample_ids + other.sample_ids,
            per_query_hits=self.per_query_hits + other.per_query_hits,
        )


def sample_queries(
    conn: psycopg.Connection[Any], target: Target, n: int, *, max_scan_tuples: int, exclude: Sequence[int] = ()
) -> tuple[list[np.ndarray], str, tuple[int, ...]]:
    """``n`` query vectors, their source and the ids of the API samples among them: a random sample
    of the API's kept samples other than ``exclude``, else (none left, or a side space: the API keeps
    queries of the default space) stand-ins made from random stored vectors (``stand_ins``)."""
    c = target.collection
    kept = [] if target.space else query_samples.draw(conn, c.id, n, dimensions=c.dimensions, exclude=exclude)
    if kept:
        return [v for _, v in kept], "query_samples", tuple(i for i, _ in kept)
    rows = conn.cursor(binary=True).execute(sqlfiles.composed("sample_stored", table=target.table), {"n": n}).fetchall()
    stored = [query_samples.as_numpy(r[0]) for r in rows]
    return stand_ins(conn, target, stored, max_scan_tuples=max_scan_tuples), "stand_ins", ()


def stand_ins(
    conn: psycopg.Connection[Any], target: Target, stored: Sequence[np.ndarray], *, max_scan_tuples: int
) -> list[np.ndarray]:
    """Queries that stand in for real ones: each stored vector moved, in a random direction, by the
    distance to its nearest other row. A stored vector itself is no fair query: the graph holds it
    as a node whose neighbour list *is* its answer, so any walk that reaches it scores 1.0 (measured
    on 3,000 clustered rows: recall 1.0 at ef_search 10 on stored vectors, 0.74 on fresh queries from
    the same distribution). Moved by ``STAND_IN_STRETCH`` nearest-neighbour distances in a random
    direction within the span of its nearest rows, a query lies between rows as a new one does
    (figures: docs/maintenance.md, "Recall target"). Real queries (the API's samples) are better
    still, and are used first."""
    if not stored:
        return []
    statement = index_search(target)
    with snapshot(conn), conn.cursor() as cur:
        apply(cur, index_settings(target, ef_search=40, k=4, max_scan_tuples=max_scan_tuples))
        near = _index_answers(conn, statement, list(stored), 4)
    return moved_apart(conn, target.table, stored, near)


def moved_apart(
    conn: psycopg.Connection[Any],
    table: str,
    stored: Sequence[np.ndarray],
    near: Sequence[Sequence[tuple[int, float]]],
) -> list[np.ndarray]:
    """``stand_ins`` of ``stored``, given the nearest rows of each (ids and distances) in ``table``; a
    vector with no other row near it is left out."""
    # The nearest rows at a distance (the vector's own row, and duplicates of it, are at about 0).
    others = [[i for i, d in answer if d > 1e-6] for answer in near]
    ids = sorted({i for o in others for i in o})
    rows = (
        conn.cursor(binary=True)
        .execute(sql.SQL("SELECT id, embedding FROM {} WHERE id = ANY(%s)").format(sql.Identifier(table)), (ids,))
        .fetchall()
    )
    vectors = {int(i): query_samples.as_numpy(v) for i, v in rows}
    rng = np.random.default_rng()
    out = []
    for v, near_ids in zip(stored, others, strict=True):
        neighbours = [vectors[i] for i in near_ids if i in vectors]
        if not neighbours:
            continue
        # A random direction in the span of the offsets to its neighbours: it stays on the data's own
        # surface (embeddings fill few of their dimensions), where a fully random one would leave it.
        offsets = np.stack([n - v for n in neighbours])
        direction = rng.normal(size=len(neighbours)) @ offsets
        direction /= np.linalg.norm(direction) or 1.0
        d1 = float(np.linalg.norm(offsets[0]))
        out.append((v + STAND_IN_STRETCH * d1 * direction).astype(np.float32))
    return out


def measure_recall(
    conn: psycopg.Connection[Any],
    target: Target,
    *,
    k: int,
    sample: int,
    budget_s: float,
    ef_search: int,
    max_scan_tuples: int,
    queries: Sequence[np.ndarray] | None = None,
    exclude: Sequence[int] = (),
    statement_timeout_s: float = 0.0,
) -> RecallResult:
    """``statement_timeout_s``: the bound of the probe's statements (``limit_statements``)."""
    t0 = time.perf_counter()
    sample_ids: tuple[int, ...] = ()
    if queries is not None:
        vectors, source = list(queries), "given"
    else:
        vectors, source, sample_ids = sample_queries(
            conn, target, sample, max_scan_tuples=max_scan_tuples, exclude=exclude
        )
    index_sql = index_search(target)
    approx = index_settings(target, ef_search=ef_search, k=k, max_scan_tuples=max_scan_tuples)
    brute = exact_settings(ef_search=ef_search, max_scan_tuples=max_scan_tuples)
    found: list[list[tuple[int, float]]] = []
    # One transaction and one snapshot for all the searches, so that rows written meanwhile are seen
    # by both the index and the exact answers or by neither; the settings are transaction-local.
    # The index's answers are pipelined: the whole probe is a few round trips, however many queries
    # it asks (the exact answers of many stream by COPY, which a pipeline cannot hold).
    with snapshot(conn), conn.cursor() as cur:
        limit_statements(conn, statement_timeout_s)
        apply(cur, approx)
        first = min(len(vectors), MIN_QUERIES)
        found += _index_answers(conn, index_sql, vectors[:first], k)
        # Then as many more as half the budget still pays for, at the first ones' cost per query:
        # the exact scan that follows costs about as much on the small tables where the budget binds
        # (a larger table's budget is a larger rebuild's).
        spent = time.perf_counter() - t0
        more = len(vectors) - first if spent <= 0 else int((budget_s / 2 - spent) * first / spent)
        found += _index_answers(conn, index_sql, vectors[first : first + max(more, 0)], k)
        apply(cur, brute)
        exact = exact_answers(cur, target, vectors[: len(found)], found, k)
    per_query = tuple(recall_hits(f, e) for f, e in zip(found, exact, strict=True))
    total_hits = sum(per_query)
    total_expected = sum(len(e) for e in exact)
    return RecallResult(
        recall=total_hits / total_expected if total_expected else None,
        k=k,
        queries=len(found),
        ef_search=ef_search,
        source=source,
        seconds=time.perf_counter() - t0,
        hits=total_hits,
        expected=total_expected,
        found=[[i for i, _ in f] for f in found],
        exact=[[i for i, _ in e] for e in exact],
        sample_ids=sample_ids[: len(found)],
        per_query_hits=per_query,
    )


def _index_answers(
    conn: psycopg.Connection[Any], statement: Statement, queries: Sequence[np.ndarray], k: int
) -> list[list[tuple[int, float]]]:
    """The index's answer to each query, all sent at once in one pipeline (a cursor of their own: in a
    pipeline, a cursor also holds the results of the statements queued on it before)."""
    if not queries:
        return []
    with conn.pipeline(), conn.cursor() as cur:
        cur.executemany(statement, [{"q": q, "k": k} for q in queries], returning=True)
        answers = []
        while True:
            answers.append([(int(i), float(d)) for i, d in cur.fetchall()])
            if not cur.nextset():
                return answers


def exact_answers(
    cur: psycopg.Cursor[Any],
    target: Target,
    queries: Sequence[np.ndarray],
    found: Sequence[Sequence[tuple[int, float]]],
    k: int,
) -> list[list[tuple[int, float]]]:
    """``memstore.search.exact_answers.exact_answers`` on one target (a collection's table or one partition)."""
    s = target.vectors
    return core_exact_answers(
        cur, table=target.table, operator=s.spec.operator, dimensions=s.dimensions, queries=queries, found=found, k=k
    )
