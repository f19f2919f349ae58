"""Sampled recall: recall@k of an index against exact search, at the collection's search settings.

Queries are, in order of preference: the ones given, real recent queries sampled by the API
(``memstore_query_samples``), or random stored vectors. The exact searches are the expensive part,
so the probe stops adding queries once its time budget is spent (after at least ``MIN_QUERIES``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import psycopg
from psycopg.pq import TransactionStatus

from maintenance import sqlfiles
from maintenance.targets import Target
from memstore.items import SETTINGS_SQL, search_settings

MIN_QUERIES = 5
# The index's answers must come from the index: on a small table the planner rightly prefers a
# sequential scan (exact, so the probe would read recall 1.0 whatever state the graph is in).
INDEX_SETTINGS_SQL = SETTINGS_SQL + ", set_config('enable_seqscan', 'off', true)"
# And back for the brute-force searches, which share the index searches' transaction.
EXACT_SETTINGS_SQL = SETTINGS_SQL + ", set_config('enable_seqscan', 'on', true)"
# Distances equal to the k-th exact one count as hits: ties must not cost recall.
TIE_EPSILON = 1e-6


@dataclass(frozen=True)
class RecallResult:
    recall: float | None  # None when there was nothing to query (empty table)
    k: int
    queries: int
    ef_search: int
    source: str  # "given", "query_samples" or "stored"
    seconds: float
    hits: int = 0  # index answers among the exact ones, all queries together
    expected: int = 0  # exact answers, all queries together
    found: list[list[int]] = field(default_factory=list, repr=False)
    exact: list[list[int]] = field(default_factory=list, repr=False)

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
        )


def sample_queries(
    conn: psycopg.Connection[Any], target: Target, n: int, *, skip: int = 0
) -> tuple[list[np.ndarray], str]:
    """``n`` query vectors: the API's most recent samples (past the newest ``skip``), else random stored ones."""
    params = {"collection_id": target.collection.id, "n": n, "skip": skip}
    rows = conn.cursor(binary=True).execute(sqlfiles.text("sample_queries"), params).fetchall()
    dims = target.collection.dimensions
    vectors = [v for v in (as_numpy(r[0]) for r in rows) if v.shape == (dims,)]
    if vectors:
        return vectors, "query_samples"
    rows = conn.cursor(binary=True).execute(sqlfiles.composed("sample_stored", table=target.table), {"n": n}).fetchall()
    return [as_numpy(r[0]) for r in rows], "stored"


def as_numpy(value: Any) -> np.ndarray:
    """pgvector's loader gives ``Vector`` objects (or arrays, depending on the version)."""
    return np.asarray(value.to_numpy() if hasattr(value, "to_numpy") else value, dtype=np.float32)


def hits(found: Sequence[tuple[int, float]], exact: Sequence[tuple[int, float]], k: int) -> int:
    """How many of the index's answers are among the true k nearest (ties at the k-th distance count)."""
    if not exact:
        return 0
    exact_ids = {i for i, _ in exact}
    kth = exact[min(k, len(exact)) - 1][1]
    return min(sum(1 for i, d in found if i in exact_ids or d <= kth + TIE_EPSILON), len(exact))


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
    skip: int = 0,
) -> RecallResult:
    t0 = time.perf_counter()
    if queries is not None:
        vectors, source = list(queries), "given"
    else:
        vectors, source = sample_queries(conn, target, sample, skip=skip)
    op = target.collection.spec.operator
    index_sql = sqlfiles.composed("index_search", table=target.table, op=op)
    exact_sql = sqlfiles.composed("exact_search", table=target.table, op=op)
    approx = search_settings(ef_search=ef_search, exact=False, max_scan_tuples=max_scan_tuples)
    brute = search_settings(ef_search=ef_search, exact=True, max_scan_tuples=max_scan_tuples)
    found: list[list[tuple[int, float]]] = []
    exact: list[list[tuple[int, float]]] = []
    # One transaction and one snapshot for all the searches, so that rows written meanwhile are seen
    # by both the index and the exact answers or by neither; the settings are transaction-local.
    outer = conn.info.transaction_status != TransactionStatus.IDLE  # then its snapshot rules
    with conn.transaction(), conn.cursor() as cur:
        if not outer:
            cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        for n, q in enumerate(vectors):
            if n >= MIN_QUERIES and time.perf_counter() - t0 > budget_s:
                break
            cur.execute(INDEX_SETTINGS_SQL, approx)
            found.append([(int(i), float(d)) for i, d in cur.execute(index_sql, {"q": q, "k": k}).fetchall()])
            cur.execute(EXACT_SETTINGS_SQL, brute)
            exact.append([(int(i), float(d)) for i, d in cur.execute(exact_sql, {"q": q, "k": k}).fetchall()])
    total_hits = sum(hits(f, e, k) for f, e in zip(found, exact, strict=True))
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
    )
