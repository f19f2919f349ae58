"""Recall@k: the true nearest rows for a set of queries, and which of a search's answers are among
them. Shared by the compact-index checks and the maintenance worker's probes and tunings, so all
measure the same way.

Two ways to the exact answers, one pass over the table either way:
- a few queries (under ``STREAM_FROM``): one scan in the server computes each row's distance to every
  query, bounded by the index's answers (``exact_within_statement``);
- more: the rows stream to the client once (``memstore.db.vector_copy``) and are ranked there in
  chunks with numpy. The server's scan costs every row one distance per query and grows faster
  than the queries (100,000 rows of 128 numbers: 0.65 s for 100 queries, 11.3 s for 1,000), while
  the stream costs one read of the table and a matrix product per chunk (0.46 s and 0.94 s; from
  about 40 queries it is the cheaper; ``python -m bench.recall_probe``, docs/maintenance.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import psycopg

from memstore.db.vector_copy import stream_vectors
from memstore.search.statements import exact_within_statement, search_statement

# Distances equal to the k-th exact one count as hits: ties (duplicate vectors) must not cost recall.
# Relative to the distance's size past 1: the server's distances and the client's (float64) differ
# in their last float32 digits.
TIE_EPSILON = 1e-6
# From this many queries the exact answers are ranked in the client (see the module's docstring).
STREAM_FROM = 64
# Scores held at once while ranking in the client (float32: 32 MB), so a chunk of rows is smaller
# the more queries there are.
STREAM_CELLS = 8_000_000
MIN_CHUNK_ROWS = 1024
# Candidates per query and chunk, as a multiple of k, whose distance is computed in float64: the
# float32 scores that pick them may swap rows at nearly equal distances, never by k places.
SHORTLIST = 2
# The id of no row, in a query's padded candidates: it sorts after every real one at equal distance.
NO_ROW = np.iinfo(np.int64).max


def recall_hits(found: Sequence[tuple[int, float]], exact: Sequence[tuple[int, float]]) -> int:
    """How many of ``found`` (id, distance) are among ``exact``, the true k nearest, nearest first."""
    if not exact:
        return 0
    truth = {i for i, _ in exact}
    kth = exact[-1][1]
    tie = kth + TIE_EPSILON * max(1.0, abs(kth))
    return min(len(exact), sum(1 for i, d in found if i in truth or d <= tie))


def uses_found(queries: int) -> bool:
    """Whether ``exact_answers`` for this many queries reads the index's answers (``found``): only
    the server's scan does, bounded by them; the client's ranking needs none."""
    return queries < STREAM_FROM


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
    """The true k nearest rows of ``table`` to every query, nearest first, from one pass over the
    table for all of them (run under exact search settings; outside pipeline mode from
    ``STREAM_FROM`` queries, whose rows stream to the client): ``bounded_in_server`` for a few
    queries, ``ranked_in_client`` for more."""
    if uses_found(len(queries)):
        return bounded_in_server(
            cur, table=table, operator=operator, dimensions=dimensions, queries=queries, found=found, k=k
        )
    return ranked_in_client(cur, table=table, operator=operator, dimensions=dimensions, queries=queries, k=k)


def bounded_in_server(
    cur: psycopg.Cursor[Any],
    *,
    table: str,
    operator: str,
    dimensions: int,
    queries: Sequence[np.ndarray],
    found: Sequence[Sequence[tuple[int, float]]],
    k: int,
) -> list[list[tuple[int, float]]]:
    """The true k nearest rows to every query (ties by id) from one scan in the server.

    The index's k answers to a query (``found``) are k real rows, so the true k nearest lie within
    the distance of its k-th answer: the scan returns only rows inside some query's bound, and each
    query's answer is ranked here among them. A query without such a bound (the index found fewer
    than k rows), or whose bound no longer holds k rows (a caller's read-committed transaction saw
    rows deleted in between), is asked of the server directly.
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


def ranked_in_client(
    cur: psycopg.Cursor[Any],
    *,
    table: str,
    operator: str,
    dimensions: int,
    queries: Sequence[np.ndarray],
    k: int,
) -> list[list[tuple[int, float]]]:
    """The true k nearest rows of ``table`` to every query, its rows streamed once and ranked here.

    Each chunk of rows is scored against all the queries by one float32 matrix product, which orders
    rows as the distance does. A query's candidates in a chunk are the rows scoring within its bar,
    the ``SHORTLIST`` x k-th best score it has seen (its best ``SHORTLIST`` x k until it has seen
    that many): after the first chunks a handful, so that the selection is one comparison per row
    rather than a partial sort. The candidates get their distance in float64, as pgvector defines it
    (``exact_distances``), and each query keeps its k nearest, ties by id."""
    if operator not in ("<->", "<=>", "<#>"):
        raise ValueError(f"unknown distance operator {operator!r}")
    if not queries:
        return []
    q = np.stack([np.asarray(v, dtype=np.float64) for v in queries])
    q32 = q.astype(np.float32)
    n = len(q)
    m = SHORTLIST * k
    best_d = np.empty((n, 0))
    best_i = np.empty((n, 0), dtype=np.int64)
    seen = np.empty((n, 0), dtype=np.float32)  # each query's m best scores so far
    bar = np.full(n, np.inf, dtype=np.float32)
    for ids, vectors in stream_vectors(cur, table, dimensions, chunk_rows=max(MIN_CHUNK_ROWS, STREAM_CELLS // n)):
        if not len(ids):
            continue
        columns, scores = _candidates(_scores(operator, q32, vectors), bar, m)
        if not columns.shape[1]:
            continue
        padding = columns < 0
        distances = exact_distances(operator, q, vectors, columns)
        distances[padding] = np.inf
        best_d = np.concatenate([best_d, distances], axis=1)
        best_i = np.concatenate([best_i, np.where(padding, NO_ROW, ids[columns])], axis=1)
        keep = np.lexsort((best_i, best_d), axis=1)[:, :k]
        best_d, best_i = np.take_along_axis(best_d, keep, axis=1), np.take_along_axis(best_i, keep, axis=1)
        seen = np.concatenate([seen, scores], axis=1)
        if seen.shape[1] > m:
            seen = np.partition(seen, m - 1, axis=1)[:, :m]
        if seen.shape[1] == m:
            bar = seen.max(axis=1)
    return [
        [(int(i), float(d)) for i, d in zip(row_i, row_d, strict=True) if i != NO_ROW]
        for row_i, row_d in zip(best_i, best_d, strict=True)
    ]


def _candidates(scores: np.ndarray, bar: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray]:
    """Per query (row of ``scores``), the columns scoring at or under its ``bar``, at most its ``m``
    best, and their scores: ``(n, width)`` arrays, padded with column -1 at score +inf."""
    n, width = scores.shape
    if width <= m:
        return np.broadcast_to(np.arange(width), (n, width)), scores
    within = scores <= bar[:, None]
    counts = within.sum(axis=1)
    most = int(counts.max())
    if np.isinf(bar).any() or most > width // 8:  # no bar yet, or one too loose to spare the sort
        columns = np.argpartition(scores, m - 1, axis=1)[:, :m]
        return columns, np.take_along_axis(scores, columns, axis=1)
    rows, found = np.nonzero(within)  # row by row, so a query's candidates are consecutive
    place = np.arange(len(rows)) - np.repeat(np.cumsum(counts) - counts, counts)
    columns = np.full((n, most), -1, dtype=np.intp)
    chosen = np.full(columns.shape, np.inf, dtype=np.float32)
    columns[rows, place] = found
    chosen[rows, place] = scores[rows, found]
    if most > m:  # the m best of each query's candidates
        best = np.argpartition(chosen, m - 1, axis=1)[:, :m]
        columns, chosen = np.take_along_axis(columns, best, axis=1), np.take_along_axis(chosen, best, axis=1)
    return columns, chosen


def _scores(operator: str, q: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Per query (rows of ``q``), a float32 score of every vector (rows of ``x``) in the order of its
    distance: the distance less what is constant for the query (a zero vector's cosine, NaN in
    pgvector, last). One product and one pass over the scores, in place: they are the bulk of the
    ranking's memory and time."""
    if operator == "<=>":
        norms = np.linalg.norm(x, axis=1)
        zero = norms == 0
        scores = q @ (x / np.where(zero, 1.0, norms)[:, None]).T
        np.negative(scores, out=scores)
        if zero.any():
            scores[:, zero] = np.inf
        return scores
    scores = q @ x.T
    if operator == "<#>":
        return np.negative(scores, out=scores)
    scores *= -2.0
    scores += np.einsum("ij,ij->i", x, x)[None, :]
    return scores


def exact_distances(operator: str, q: np.ndarray, x: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """pgvector's distance from each query (``q[i]``) to its rows ``x[rows[i]]``, in float64:
    ``<->`` Euclidean, ``<=>`` one minus the cosine (a zero vector's: NaN there, which its ORDER BY
    ranks last; +inf here), ``<#>`` the negative inner product. In blocks of queries, so the rows
    gathered stay within ``STREAM_CELLS`` numbers."""
    out = np.empty(rows.shape)
    block = max(1, STREAM_CELLS // max(1, rows.shape[1] * x.shape[1]))
    for start in range(0, len(q), block):
        qs = q[start : start + block]
        xs = x[rows[start : start + block]].astype(np.float64)  # (queries, rows, dimensions)
        if operator == "<->":
            d = np.sqrt(((xs - qs[:, None, :]) ** 2).sum(axis=2))
        else:
            dots = np.einsum("qrd,qd->qr", xs, qs)
            if operator == "<#>":
                d = -dots
            else:
                with np.errstate(divide="ignore", invalid="ignore"):
                    cosine = np.clip(dots / (np.linalg.norm(xs, axis=2) * np.linalg.norm(qs, axis=1)[:, None]), -1, 1)
                d = np.where(np.isnan(cosine), np.inf, 1.0 - cosine)
        out[start : start + block] = d
    return out
