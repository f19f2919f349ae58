"""``bench.churn --recall-target T``: the policy's collection asks for a recall instead of an ef_search.

The target is set before the rounds, so the worker tunes the collection's default ef_search on its
passes as it does in production (``maintenance.tuning``), and weighs search cost at the target against
its actions' cost (``maintenance.search_cost``). After each pass the benchmark reads:

- the collection's default ef_search, and recall@10 at that ef over the benchmark's recall queries.
  These are held out: the worker tunes on the users' searches the sampler kept
  (``memstore_query_samples``), which are other queries, and ``held_out`` checks that no recall query
  is among the kept samples (and that the users' are, so the check can see one);
- recall at every ef of ``LADDER`` on the same queries. The smallest ladder ef that reached T at every
  round is the fixed ef that would also have held the target: chosen in hindsight, on the very
  queries it is scored on, so the best any fixed setting could have done.

On the final data, searches at the tuned ef are timed against searches at that fixed ef, taking turns
(``bench.peers_measure.time_searches``), so load from elsewhere on the machine lands on both alike.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np
import psycopg

from bench.churn_db import connect, fetch_topk, recall_at
from bench.peers_measure import time_searches
from memstore.search.query_samples import as_numpy
from memstore.search.statements import SearchSettings, apply, search_statement

K = 10
LADDER: tuple[int, ...] = (10, 20, 40, 60, 80, 120, 160, 240, 320)
MARGIN = 0.01  # the goal: recall at the tuned ef never below target - 0.01
COST_GOAL = 0.15  # the policy's maintenance seconds over plain VACUUM's
TIMED_ROUNDS = 3  # passes over the recall queries per searcher when timing
SAME_VECTOR = 0.9999  # cosine similarity at which a kept sample is taken for the query itself


def split_queries(queries: np.ndarray, n: int, *, apart: bool) -> tuple[np.ndarray, np.ndarray]:
    """(recall queries, users' queries): the first ``n``, then the rest. With too few for both, the
    same queries serve both, unless ``apart`` asks for them held apart (then half each)."""
    if len(queries) > n:
        return queries[:n], queries[n:]
    if not apart or len(queries) < 2:
        return queries, queries
    half = len(queries) // 2
    return queries[:half], queries[half:]


def recall_by_ef(
    conn: psycopg.Connection[Any], table: str, queries: np.ndarray, truth: list[set[int]], efs: Sequence[int]
) -> dict[int, float]:
    """Recall@K from the graph at each ef (index scans forced: on a small table the planner would
    otherwise answer exactly and every ef would read 1.0)."""
    return {
        ef: recall_at(fetch_topk(conn, table, queries, K, ef_search=ef, index_only=True), truth)
        for ef in sorted(set(efs))
    }


def fixed_ef(ladders: Sequence[dict[int, float]], target: float) -> int | None:
    """The least ef measured at every round whose recall reached ``target`` at every round (None: none)."""
    if not ladders:
        return None
    common = set.intersection(*(set(ladder) for ladder in ladders))
    return next((ef for ef in sorted(common) if all(ladder[ef] >= target for ladder in ladders)), None)


def rebuild_rounds(decisions: Sequence[Sequence[str]]) -> list[int]:
    """The rounds (from 1) whose maintenance pass rebuilt the index."""
    return [r + 1 for r, done in enumerate(decisions) if "rebuild:ok" in done]


def back_to_back(rounds: Sequence[int]) -> bool:
    """Two rebuilds in consecutive rounds: the second rebuilt a graph built one round before."""
    return any(b - a == 1 for a, b in itertools.pairwise(rounds))


def held_out(
    conn: psycopg.Connection[Any], collection_id: int, recall: np.ndarray, users: np.ndarray
) -> dict[str, int]:
    """How many recall queries, and how many users' queries, are among the collection's kept samples
    (what the worker tunes on). The first must be 0; the second shows the check can see a match."""
    rows = conn.execute(
        "SELECT embedding FROM memstore_query_samples WHERE collection_id = %s", (collection_id,)
    ).fetchall()
    kept = np.stack([as_numpy(r[0]) for r in rows]) if rows else np.zeros((0, recall.shape[1]), np.float32)

    def found(queries: np.ndarray) -> int:
        if not len(kept) or not len(queries):
            return 0
        q = queries / np.linalg.norm(queries, axis=1, keepdims=True)
        s = kept / np.linalg.norm(kept, axis=1, keepdims=True)
        return int(((q @ s.T).max(axis=1) >= SAME_VECTOR).sum())

    return {
        "samples_kept": len(kept),
        "recall_queries_in_samples": found(recall),
        "user_queries_in_samples": found(users),
    }


class EfSearcher:
    """Searches at one ef on a connection of its own, with the benchmark's search settings (a
    ``bench.peers_measure.Searcher``)."""

    def __init__(self, name: str, table: str, ef: int) -> None:
        self.name = name
        self.conn = connect()
        self.settings = SearchSettings(ef_search=ef, exact=False, max_scan_tuples=20_000)
        self.statement = search_statement(table, "<=>", exact=False, ids_only=True)

    def search(self, query: np.ndarray) -> list[int]:
        with self.conn.transaction(), self.conn.cursor() as cur:
            apply(cur, self.settings)
            return [int(r[0]) for r in cur.execute(self.statement, {"q": query, "k": K}).fetchall()]

    def close(self) -> None:
        self.conn.close()


def time_tuned_vs_fixed(table: str, queries: np.ndarray, *, tuned: int, fixed: int) -> dict[str, Any]:
    """Searches at the tuned ef against searches at the fixed ef, taking turns (same ef: the noise)."""
    searchers = [EfSearcher("tuned", table, tuned), EfSearcher("fixed", table, fixed)]
    try:
        t, f = time_searches(searchers, queries, TIMED_ROUNDS)
    finally:
        for s in searchers:
            s.close()
    return {
        "tuned": {"ef": tuned, **t.as_dict()},
        "fixed": {"ef": fixed, **f.as_dict()},
        "qps_ratio_tuned_vs_fixed": round(t.qps / f.qps, 4),
    }


def summary(policy: dict[str, Any], target: float, cost_ratio: float | None) -> dict[str, Any]:
    """The target mode's figures and goals, from the policy strategy's record (``policy["target"]``)."""
    t = policy["target"]
    rounds = [
        {"round": r + 1, "ef_search": ef, "recall": rec, "holds": rec >= target - MARGIN, "actions": acts}
        for r, (ef, rec, acts) in enumerate(zip(t["ef_search"][1:], t["recall"][1:], t["actions"], strict=True))
    ]
    rebuilt = rebuild_rounds(policy["decisions"])
    min_recall = min((r["recall"] for r in rounds), default=t["recall"][0])
    return {
        "target": target,
        "floor": round(target - MARGIN, 4),
        "before_first_pass": {"ef_search": t["ef_search"][0], "recall": t["recall"][0]},
        "rounds": rounds,
        "min_recall_tuned": min_recall,
        "ladder_efs": list(LADDER),
        "fixed_ef": t["fixed_ef"],
        "fixed_ef_holds": t["fixed_ef_holds"],
        "timing": t["timing"],
        "qps_ratio_tuned_vs_fixed": t["timing"]["qps_ratio_tuned_vs_fixed"],
        "rebuild_rounds": rebuilt,
        "back_to_back_rebuild": back_to_back(rebuilt),
        "held_out": t["held_out"],
        "cost_ratio_policy_vs_vacuum": cost_ratio,
        "goals": {
            "recall_tuned>=target-0.01_every_round": all(r["holds"] for r in rounds),
            f"cost_ratio_policy_vs_vacuum<={COST_GOAL}": cost_ratio is not None and cost_ratio <= COST_GOAL,
            "no_back_to_back_rebuild": not back_to_back(rebuilt),
            "recall_queries_held_out": t["held_out"]["recall_queries_in_samples"] == 0,
        },
    }
