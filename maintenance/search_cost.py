"""What a recall target costs the searches of one index, read from the worker's own measurements (the
tuning ladders, ``maintenance.ladder``; the index's scan counter), and the test that tells two recall
readings apart. Pure functions: the policy (``maintenance.policy``) decides on them.

The difference test is Newcombe's hybrid score interval for a difference of two proportions (Newcombe
1998, method 10): the lower end of ``a - b`` is ``(a - b) - sqrt((a - lower_a)^2 + (upper_b - b)^2)``
on the Wilson intervals of each (``maintenance.tuning.bounds``, with its design effect). Two readings
are told apart when that lower end is above zero.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from maintenance.tuning import DEFAULT_DESIGN_EFFECT, DEFAULT_Z, Point, bounds
from memstore.catalog.density import DENSE_EF_BOUND


@dataclass(frozen=True)
class SearchCost:
    """The recall target's cost on one index, from the collection's last tuning (``recall_tuning``)."""

    ef_now: int  # the ef the target needs now
    reachable: bool
    fresh_ef: int | None = None  # the ef it needed right after the last rebuild
    now_at_fresh: Point | None = None  # recall now at ``fresh_ef`` (the current ladder's rung there)
    fresh_at_fresh: Point | None = None  # recall then at ``fresh_ef`` (the ladder after the rebuild)
    ms_per_search: tuple[tuple[int, float], ...] = ()  # measured: ms a search takes at each ef
    searches_per_s: float | None = None  # measured: the index's scans per second, less the worker's own
    denser: tuple[int, int] | None = None  # (m, ef_construction) the next rebuild is to use, if planned
    denser_ef: int | None = None  # the ef the denser graph is expected to need (the bound)

    def search_ms(self, ef: float) -> float | None:
        """ms of one search at ``ef``: interpolated between measured rungs, proportional to ef beyond."""
        points = sorted(self.ms_per_search)
        if not points:
            return None
        if ef <= points[0][0]:
            return points[0][1] * ef / points[0][0]
        if ef >= points[-1][0]:
            return points[-1][1] * ef / points[-1][0]
        for (e0, m0), (e1, m1) in itertools.pairwise(points):
            if e0 <= ef <= e1:
                return m0 + (m1 - m0) * (ef - e0) / (e1 - e0)
        return None  # pragma: no cover

    def worn(self, *, z: float = DEFAULT_Z, design_effect: float = DEFAULT_DESIGN_EFFECT) -> bool:
        """The graph needs more ef than its fresh build did, and its recall at the fresh build's ef is
        lower beyond both samples' error."""
        if self.fresh_ef is None or self.ef_now <= self.fresh_ef:
            return False
        if self.now_at_fresh is None or self.fresh_at_fresh is None:
            return False
        return told_apart(self.fresh_at_fresh, self.now_at_fresh, z=z, design_effect=design_effect)


def difference_lower(
    a: Point, b: Point, *, z: float = DEFAULT_Z, design_effect: float = DEFAULT_DESIGN_EFFECT
) -> float:
    """The lower end of the interval of ``a.recall - b.recall`` (Newcombe's hybrid score interval)."""
    lower_a, _ = bounds(a, z=z, design_effect=design_effect)
    _, upper_b = bounds(b, z=z, design_effect=design_effect)
    return (a.recall - b.recall) - math.sqrt((a.recall - lower_a) ** 2 + (upper_b - b.recall) ** 2)


def told_apart(a: Point, b: Point, *, z: float = DEFAULT_Z, design_effect: float = DEFAULT_DESIGN_EFFECT) -> bool:
    """``a``'s recall is above ``b``'s beyond both samples' error."""
    return difference_lower(a, b, z=z, design_effect=design_effect) > 0


def _point_at(ladder: Sequence[Sequence[Any]], ef: int, queries: int, k: int) -> Point | None:
    for row in ladder:  # [ef, recall] or [ef, recall, design effect] (recorded since it is measured)
        if int(row[0]) == ef:
            spread = row[2] if len(row) > 2 and row[2] is not None else None
            return Point(ef, float(row[1]), queries, k, None if spread is None else float(spread))
    return None


def from_tuning(
    tuning: dict[str, Any] | None, *, target: float | None, denser: tuple[int, int] | None = None
) -> SearchCost | None:
    """The cost figures a collection's last tuning recorded (None: no tuning of this target yet)."""
    if target is None or tuning is None or tuning.get("target") != target or tuning.get("ef") is None:
        return None
    k = int(tuning.get("k") or 10)
    queries = int(tuning.get("queries") or 0)
    ef_now = int(tuning["ef"])
    fresh = tuning.get("fresh") if isinstance(tuning.get("fresh"), dict) else None
    fresh_ef = now_at = fresh_at = None
    if fresh and fresh.get("ef") is not None and queries:
        fresh_ef = int(fresh["ef"])
        now_at = _point_at(tuning.get("ladder") or [], fresh_ef, queries, k)
        fresh_at = _point_at(fresh.get("ladder") or [], fresh_ef, int(fresh.get("queries") or 0), k)
        if fresh_at is not None and fresh_at.queries == 0:
            fresh_at = None
    rate = tuning.get("searches_per_s")
    return SearchCost(
        ef_now=ef_now,
        reachable=bool(tuning.get("reachable")),
        fresh_ef=fresh_ef,
        now_at_fresh=now_at,
        fresh_at_fresh=fresh_at,
        ms_per_search=tuple((int(e), float(m)) for e, m in tuning.get("search_ms") or []),
        searches_per_s=None if rate is None else float(rate),
        denser=denser,
        denser_ef=DENSE_EF_BOUND if denser is not None else None,
    )
