"""What bench.peers measures on every system alike: the workload, the ef ladder, timed searches, recall.

A system is anything with the methods of ``System``: the benchmark never looks inside one.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from tqdm import tqdm

from bench.data import clustered, exact_neighbours

K = 10


class Searcher(Protocol):
    name: str  # the key in the JSON's systems table

    def search(self, query: np.ndarray) -> list[int]:
        """The ids of the K nearest rows at the ef last set, best first."""


class System(Searcher, Protocol):
    label: str  # the row's name in the docs' table
    ingest_path: str  # how rows went in (e.g. bulk_load, upsert_items, COPY + CREATE INDEX)
    cleanup_name: str  # what its own clean-up after churn is

    def ingest(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        """Load every row; returns when all of them are searchable (an index build included)."""

    def set_ef(self, ef: int) -> None: ...

    def update(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        """New vectors for existing ids."""

    def delete(self, ids: np.ndarray) -> None: ...

    def cleanup(self) -> str:
        """The system's own clean-up after churn; returns what it decided, when that varies ("" if not)."""

    def close(self) -> None: ...


@dataclass(frozen=True)
class Workload:
    """The rows, the queries, and the churn every system goes through, with exact answers before and after."""

    ids: np.ndarray  # 0..rows-1
    base: np.ndarray
    queries: np.ndarray
    updated_ids: np.ndarray  # 20% of the ids get new vectors ...
    updated_vectors: np.ndarray
    deleted_ids: np.ndarray  # ... and another 10% are deleted
    truth: list[set[int]]  # exact top K ids of each query on the loaded rows
    truth_after_churn: list[set[int]]


def make_workload(
    rows: int, dims: int, queries: int, *, seed: int = 42, update_fraction: float = 0.2, delete_fraction: float = 0.1
) -> Workload:
    n_upd, n_del = int(rows * update_fraction), int(rows * delete_fraction)
    every = clustered(rows + n_upd + queries, dims, seed=seed)
    base, new, q = every[:rows], every[rows : rows + n_upd], every[rows + n_upd :]
    ids = np.arange(rows, dtype=np.int64)
    picked = np.random.default_rng(seed + 1).permutation(rows)
    upd, dele = np.sort(picked[:n_upd]), np.sort(picked[n_upd : n_upd + n_del])
    after = base.copy()
    after[upd] = new
    live = np.setdiff1d(ids, dele)
    truth = [set(row.tolist()) for row in exact_neighbours(base, q, K)]
    truth_after = [set(live[row].tolist()) for row in exact_neighbours(after[live], q, K)]
    return Workload(ids, base, q, upd, new, dele, truth, truth_after)


def recall(system: System, queries: np.ndarray, truth: Sequence[set[int]]) -> float:
    hits = [len(set(system.search(q)) & t) / K for q, t in zip(queries, truth, strict=True)]
    return float(np.mean(hits))


@dataclass
class LadderResult:
    ef: int  # the lowest ef reaching the target (the highest tried when none does)
    reached: bool
    recall: float
    curve: dict[int, dict[str, float]]  # ef -> recall and q/s of that step's searches (for the plot)


def climb(system: System, ladder: Sequence[int], target: float, w: Workload, *, whole: bool = False) -> LadderResult:
    """Recall at each ef of the ladder, lowest first, until one reaches ``target`` (``whole``: every
    step, for the q/s-against-recall curve). The searches are timed as they go (after 20 warm-up ones):
    the curve's q/s are indicative (one pass); the table's figures come from ``time_searches``."""
    curve: dict[int, dict[str, float]] = {}
    chosen: int | None = None
    for ef in tqdm(ladder, desc=f"{system.name}: ef ladder", file=sys.stderr, leave=False):
        system.set_ef(ef)
        for q in w.queries[:20]:  # a short warm-up at this ef (a reopened client, a colder cache)
            system.search(q)
        hits, spent = [], 0.0
        for q, t in zip(w.queries, w.truth, strict=True):
            t0 = time.perf_counter()
            found = system.search(q)
            spent += time.perf_counter() - t0
            hits.append(len(set(found) & t) / K)
        curve[ef] = {"recall": round(float(np.mean(hits)), 4), "qps": round(len(hits) / spent, 1)}
        if chosen is None and curve[ef]["recall"] >= target:
            chosen = ef
            if not whole:
                break
    ef = chosen if chosen is not None else ladder[-1]
    system.set_ef(ef)
    return LadderResult(ef, chosen is not None, curve[ef]["recall"], curve)


@dataclass
class Timing:
    qps: float
    p50_ms: float
    p99_ms: float

    def as_dict(self) -> dict[str, float]:
        return {"search_qps": round(self.qps, 1), "p50_ms": round(self.p50_ms, 3), "p99_ms": round(self.p99_ms, 3)}


def _timing(latencies: list[float]) -> Timing:
    ms = np.asarray(latencies) * 1000
    return Timing(float(len(ms) / (ms.sum() / 1000)), float(np.percentile(ms, 50)), float(np.percentile(ms, 99)))


TURN = 25  # queries a system runs back to back in its turn


def time_searches(
    systems: Sequence[Searcher], queries: np.ndarray, rounds: int, warmup: int = 50, turn: int = TURN
) -> list[Timing]:
    """One client, one query at a time. With several systems they take turns, ``turn`` queries each
    (and the first of each cycle rotates), so load from anything else on the machine lands on all
    alike. A turn of several queries, not one, because a program runs its searches back to back;
    25 queries take a few tens of milliseconds, much shorter than the machine's changes of speed.
    (Turns of one query gave the same Python API ratio within the noise: docs/performance.md, runs 7
    and 8.)"""
    if turn < 1:
        raise ValueError(f"turn must be at least one query, not {turn}")
    for s in systems:
        for q in queries[:warmup]:
            s.search(q)
    latencies: list[list[float]] = [[] for _ in systems]
    order = list(range(len(systems)))
    total = rounds * len(queries)
    names = "+".join(s.name for s in systems)
    with tqdm(total=total, desc=f"{names}: timed searches", file=sys.stderr, leave=False) as bar:
        cycles = -(-len(queries) // turn)  # a round's turns per system (the last one may be short)
        for r in range(rounds):
            for c, start in enumerate(range(0, len(queries), turn)):
                block = queries[start : start + turn]
                first = (r * cycles + c) % len(systems)
                for j in order[first:] + order[:first]:
                    for q in block:
                        t0 = time.perf_counter()
                        systems[j].search(q)
                        latencies[j].append(time.perf_counter() - t0)
                bar.update(len(block))
    return [_timing(lat) for lat in latencies]


def timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0
