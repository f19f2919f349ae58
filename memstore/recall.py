"""Counting recall@k: which of a search's answers are among the true nearest. Shared by the core's
compact-index checks and the maintenance worker's probes, so both count the same way."""

from __future__ import annotations

from collections.abc import Sequence

# Distances equal to the k-th exact one count as hits: ties (duplicate vectors) must not cost recall.
TIE_EPSILON = 1e-6


def recall_hits(found: Sequence[tuple[int, float]], exact: Sequence[tuple[int, float]]) -> int:
    """How many of ``found`` (id, distance) are among ``exact``, the true k nearest, nearest first."""
    if not exact:
        return 0
    truth = {i for i, _ in exact}
    kth = exact[-1][1]
    return min(len(exact), sum(1 for i, d in found if i in truth or d <= kth + TIE_EPSILON))
