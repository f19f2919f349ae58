"""Counting recall hits: one rule for the core's compact-index checks and the maintenance probes."""

from __future__ import annotations

from memstore.search.exact_answers import recall_hits


def test_hits_count_answers_among_the_true_nearest() -> None:
    exact = [(1, 0.1), (2, 0.2), (3, 0.3)]
    assert recall_hits([(1, 0.1), (2, 0.2), (3, 0.3)], exact) == 3
    assert recall_hits([(1, 0.1), (9, 0.35), (3, 0.3)], exact) == 2
    assert recall_hits([], exact) == 0
    assert recall_hits([(1, 0.1)], []) == 0


def test_a_tie_at_the_kth_distance_is_a_hit_but_never_more_than_k() -> None:
    exact = [(1, 0.1), (2, 0.2), (3, 0.3)]
    # Row 7 is a duplicate of row 3 (same distance): either is a right answer.
    assert recall_hits([(1, 0.1), (2, 0.2), (7, 0.3)], exact) == 3
    assert recall_hits([(1, 0.1), (2, 0.2), (7, 0.3000005)], exact) == 3
    assert recall_hits([(1, 0.1), (2, 0.2), (7, 0.31)], exact) == 2
    assert recall_hits([(1, 0.1), (2, 0.2), (3, 0.3), (7, 0.3)], exact) == 3
