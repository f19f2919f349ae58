"""Recall@k: the true nearest rows for a set of queries (one bounded scan), and which of a search's
answers are among them. Shared by the compact-index checks and the maintenance worker's probes, so
both measure the same way."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import psycopg

from memstore.search.statements import exact_within_statement, search_statement

# Distances equal to the k-th exact one count as hits: ties (duplicate vectors) must not cost recall.
TIE_EPSILON = 1e-6


def recall_hits(found: Sequence[tuple[int, float]], exact: Sequence[tuple[int, float]]) -> int:
    """How many of ``found`` (id, distance) are among ``exact``, the true k nearest, nearest first."""
    if not exact:
        return 0
    truth = {i for i, _ in exact}
    kth = exact[-1][1]
    return min(len(exact), sum(1 for i, d in found if i in truth or d <= kth + TIE_EPSILON))


def exact_answers(
    cur: psycopg.Cursor[Any],
    *,
    table: str,
    operator: str,
    dimensions: int,
    queries: Sequence[np.ndarray],
    found: Sequence[Sequence[tuple[int, float]]],
    k: int,
) -> list[list[tuple[int, float]]]:
    """The true k nearest rows of ``table`` to every query, from one scan for all of them (run under
    exact search settings).

    The index's k answers to a query are k real rows, so the true k nearest lie within the distance
    of its k-th answer: the scan returns only rows inside some query's bound, and each query's
    answer is ranked here among them. A query without such a bound (the index found fewer than k
    rows), or whose bound no longer holds k rows (a caller's read-committed transaction saw rows
    deleted in between), is asked of the server directly.
    """
    answers: list[list[tuple[int, float]]] = [[] for _ in queries]
    bounded = [i for i, f in enumerate(found) if len(f) >= k]
    if bounded:
        bounds = [found[i][k - 1][1] + TIE_EPSILON for i in bounded]
        params: dict[str, Any] = {"dims": dimensions}
        for j, i in enumerate(bounded):
            params[f"q{j}"], params[f"b{j}"] = queries[i], bounds[j]
        statement = exact_within_statement(table, operator, len(bounded))
        rows = [(int(i), [float(x) for x in d]) for i, d in cur.execute(statement, params).fetchall()]
        for j, (i, bound) in enumerate(zip(bounded, bounds, strict=True)):
            if sum(1 for _, d in rows if d[j] <= bound) >= k:
                answers[i] = sorted(((rid, d[j]) for rid, d in rows), key=lambda a: (a[1], a[0]))[:k]
    exact_sql = search_statement(table, operator, exact=True, ids_only=True)
    for i, q in enumerate(queries):
        if len(answers[i]) < k:
            answers[i] = [(int(r), float(d)) for r, d in cur.execute(exact_sql, {"q": q, "k": k}).fetchall()]
    return answers
