"""Recall at a ladder of ef_search values, for the recall target's tuning (``maintenance.tuning``).

One sample of queries (the API's kept query samples where there are enough, topped up with stored
vectors), one transaction and snapshot, and one pass over the table for the exact answers of the
whole ladder (``memstore.search.exact_answers.exact_answers``: the rows streamed and ranked in the
client for a tuning's hundreds of queries; for a few, a scan in the server bounded by the k-th
distances of a reference rung the index answers first); then each rung from the bottom is one
pipelined round of index searches scored against those same exact answers, up to the first rung
that passes the target with its margin. A ladder thus costs one read of the table plus a few rounds
of index searches. A tuning that will likely re-check its choice on fresh queries (``Sample.split``)
draws and answers those too, in the same read and the same snapshot.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import psycopg

from maintenance.recall import (
    _index_answers,
    exact_answers,
    exact_settings,
    index_search,
    index_settings,
    snapshot,
    stand_ins,
)
from maintenance.targets import Target
from maintenance.tuning import (
    DEFAULT_DESIGN_EFFECT,
    DEFAULT_TOLERANCE,
    DEFAULT_Z,
    Point,
    design_effect_of,
    passes,
    pooled,
    told_below,
)
from memstore.db import sqlfiles
from memstore.search import query_samples
from memstore.search.exact_answers import recall_hits, uses_found
from memstore.search.statements import apply

# The rung whose answers bound the server's exact scan (a few queries): deep enough that its k-th
# distances are close to the true ones (a tight bound returns few rows), shallow enough to cost
# little on a large graph.
REFERENCE_EF = 240


@dataclass(frozen=True)
class Ladder:
    points: list[Point]
    queries: int
    source: str  # "query_samples", "stand_ins", "query_samples+stand_ins" or "given"
    ms: dict[int, float] = field(default_factory=dict)  # ms per search at each ef measured (one pipelined round)
    sample_ids: tuple[int, ...] = ()  # the API's kept samples among the queries (a later round draws others)

    def extended(self, more: Ladder) -> Ladder:
        """This ladder with ``more`` measured on other queries: a rung both measured is pooled."""
        by_ef = {p.ef: p for p in self.points}
        for p in more.points:
            by_ef[p.ef] = pooled(by_ef[p.ef], p) if p.ef in by_ef else p
        ms = dict(self.ms)
        for ef, m in more.ms.items():
            ms[ef] = (ms[ef] + m) / 2 if ef in ms else m
        source = self.source if more.source in self.source.split("+") else f"{self.source}+{more.source}"
        points = sorted(by_ef.values(), key=lambda p: p.ef)
        return Ladder(points, self.queries + more.queries, source, ms, self.sample_ids + more.sample_ids)


def tuning_queries(
    conn: psycopg.Connection[Any], target: Target, n: int, *, max_scan_tuples: int, exclude: Sequence[int] = ()
) -> tuple[list[np.ndarray], str, tuple[int, ...]]:
    """``n`` queries, their source and the ids of the API's kept samples among them: a random draw
    of those samples other than ``exclude`` (an earlier round's), topped up with stand-ins made from
    random stored vectors when fewer are left (a side space's: stand-ins only, the API keeps the
    default space's), see ``maintenance.recall.stand_ins``."""
    c = target.collection
    kept = [] if target.space else query_samples.draw(conn, c.id, n, dimensions=c.dimensions, exclude=exclude)
    vectors = [v for _, v in kept]
    ids = tuple(i for i, _ in kept)
    if len(vectors) >= n:
        return vectors, "query_samples", ids
    rows = (
        conn.cursor(binary=True)
        .execute(sqlfiles.composed("sample_stored", table=target.table), {"n": n - len(vectors)})
        .fetchall()
    )
    stored = stand_ins(conn, target, [query_samples.as_numpy(r[0]) for r in rows], max_scan_tuples=max_scan_tuples)
    source = "query_samples+stand_ins" if vectors and stored else ("query_samples" if vectors else "stand_ins")
    return vectors + stored, source, ids


@dataclass(frozen=True)
class Sample:
    """Queries with their exact answers from one snapshot: what a ladder's rungs are scored against.
    The API's kept samples come first (``sample_ids``, in order), then any stand-ins."""

    vectors: list[np.ndarray]
    exact: list[list[tuple[int, float]]]
    source: str
    sample_ids: tuple[int, ...] = ()
    # The index's answers already read at an ef (the reference rung bounding the server's scan), and
    # their ms per search: a rung at that ef costs nothing more.
    found: dict[int, list[list[tuple[int, float]]]] = field(default_factory=dict)
    ms: dict[int, float] = field(default_factory=dict)

    def split(self, n: int) -> tuple[Sample, Sample]:
        """The first ``n`` queries and the rest, as two samples of the same snapshot."""
        return self._part(slice(0, n)), self._part(slice(n, len(self.vectors)))

    def _part(self, part: slice) -> Sample:
        start, stop, _ = part.indices(len(self.vectors))
        kept = max(0, min(stop, len(self.sample_ids)) - start)
        stood_in = (stop - start) - kept
        source = self.source if self.source == "given" else _source(kept, stood_in)
        return Sample(
            self.vectors[part],
            self.exact[part],
            source,
            self.sample_ids[part],
            {ef: f[part] for ef, f in self.found.items()},
            dict(self.ms) if start == 0 else {},  # the searches were made once: counted with the first part
        )


def _source(kept: int, stood_in: int) -> str:
    if kept and stood_in:
        return "query_samples+stand_ins"
    return "query_samples" if kept or not stood_in else "stand_ins"


def answered(
    conn: psycopg.Connection[Any],
    target: Target,
    vectors: Sequence[np.ndarray],
    *,
    k: int,
    max_scan_tuples: int,
    reference: int = REFERENCE_EF,
    source: str = "given",
    sample_ids: tuple[int, ...] = (),
) -> Sample:
    """``vectors`` with their exact answers, from one pass over the table: ranked in the worker for
    many queries; for a few, a scan in the server bounded by the ``reference`` rung's answers."""
    vectors = list(vectors)
    found: dict[int, list[list[tuple[int, float]]]] = {}
    ms: dict[int, float] = {}
    with snapshot(conn), conn.cursor() as cur:
        if vectors and uses_found(len(vectors)):
            apply(cur, index_settings(target, ef_search=reference, k=k, max_scan_tuples=max_scan_tuples))
            t0 = time.perf_counter()
            found[reference] = _index_answers(conn, index_search(target), vectors, k)
            ms[reference] = (time.perf_counter() - t0) * 1000 / len(vectors)
        apply(cur, exact_settings(ef_search=reference, max_scan_tuples=max_scan_tuples))
        exact = exact_answers(cur, target, vectors, found.get(reference, [[] for _ in vectors]), k) if vectors else []
    return Sample(vectors, exact, source, sample_ids, found, ms)


def draw(
    conn: psycopg.Connection[Any],
    target: Target,
    n: int,
    *,
    k: int,
    max_scan_tuples: int,
    reference: int = REFERENCE_EF,
    exclude: Sequence[int] = (),
) -> Sample:
    """``n`` tuning queries (``tuning_queries``) with their exact answers, in one snapshot."""
    with snapshot(conn):
        vectors, source, ids = tuning_queries(conn, target, n, max_scan_tuples=max_scan_tuples, exclude=exclude)
        return answered(
            conn,
            target,
            vectors,
            k=k,
            max_scan_tuples=max_scan_tuples,
            reference=reference,
            source=source,
            sample_ids=ids,
        )


def measure_ladder(
    conn: psycopg.Connection[Any],
    target: Target,
    *,
    k: int,
    rungs: Sequence[int],
    recall_target: float,
    max_scan_tuples: int,
    sample: int = 100,
    queries: Sequence[np.ndarray] | None = None,
    drawn: Sample | None = None,
    z: float = DEFAULT_Z,
    design_effect: float = DEFAULT_DESIGN_EFFECT,
    tolerance: float = DEFAULT_TOLERANCE,
    stop_on_pass: bool = True,
    stop_below: bool = False,
    exclude: Sequence[int] = (),
) -> Ladder:
    """Recall@k at each of ``rungs`` (ascending), stopping after the first that passes
    ``recall_target`` with the margin (``stop_on_pass``); or (``stop_below``) from the top down,
    stopping after the first whose recall is below the target beyond the sample's error (recall
    rises with ef: the rungs under it are below too, and a re-check of many queries need not pay for
    them). The queries: ``drawn`` (answered already, in the caller's snapshot), else ``queries``,
    else ``sample`` drawn here other than the kept samples ``exclude``."""
    rungs = sorted(set(rungs))
    if not rungs:
        return Ladder([], 0, drawn.source if drawn is not None else "given")
    with snapshot(conn):
        if drawn is None:
            reference = min(max(rungs), REFERENCE_EF)
            drawn = (
                answered(conn, target, queries, k=k, max_scan_tuples=max_scan_tuples, reference=reference)
                if queries is not None
                else draw(
                    conn, target, sample, k=k, max_scan_tuples=max_scan_tuples, reference=reference, exclude=exclude
                )
            )
        if not drawn.vectors:
            return Ladder([], 0, drawn.source)
        statement = index_search(target)
        points: list[Point] = []
        ms = dict(drawn.ms)
        expected = sum(len(e) for e in drawn.exact)
        with conn.cursor() as cur:
            for ef in sorted(rungs, reverse=stop_below):
                found = drawn.found.get(ef)
                if found is None:
                    apply(cur, index_settings(target, ef_search=ef, k=k, max_scan_tuples=max_scan_tuples))
                    t0 = time.perf_counter()
                    found = _index_answers(conn, statement, drawn.vectors, k)
                    ms[ef] = (time.perf_counter() - t0) * 1000 / len(drawn.vectors)
                per_query = [recall_hits(f, e) for f, e in zip(found, drawn.exact, strict=True)]
                spread = design_effect_of(per_query, [len(e) for e in drawn.exact])
                point = Point(ef, sum(per_query) / expected if expected else 1.0, len(drawn.vectors), k, spread)
                points.append(point)
                if stop_on_pass and passes(point, recall_target, z=z, design_effect=design_effect, tolerance=tolerance):
                    break
                if stop_below and told_below([point], recall_target, ef, z=z, design_effect=design_effect):
                    break
    return Ladder(sorted(points, key=lambda p: p.ef), len(drawn.vectors), drawn.source, ms, drawn.sample_ids)
