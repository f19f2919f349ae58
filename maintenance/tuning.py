"""Recall target: from recall measured at a ladder of ef_search values to the ef searches should use.
A pure function (the worker measures, ``maintenance.ladder``; this decides).

The choice: the smallest ef whose recall reads at least the target on the sample and whose *lower
confidence bound* reaches the target less a tolerance (``DEFAULT_TOLERANCE``, 0.01), so that a lucky
sample does not set an ef that misses the target on the queries that follow by more than the
tolerance. Without the tolerance the bound must reach the target itself: on clustered data, whose
queries are hit or miss as a whole, 200 queries bound recall to about +-0.02, and near recall 1 the
curve is flat, so that margin cost 2-8x the ef that reaches the target at 100k rows (bench.recall_target,
docs/maintenance.md); a tolerance of 0 restores it. The bound is the
Wilson score interval's lower end on the per-neighbour hits: a probe of ``n`` queries at recall@k
makes ``k * n`` trials (is the i-th true neighbour among the answers?) of which ``hits`` succeed.
Wilson rather than the normal approximation because recall lives near 1, where the normal interval
is too narrow and can pass 1; it stays inside [0, 1] and is sound for tiny samples (one query,
ten trials, all hits: a lower bound of 0.79, not 1.0).

The hits of one query are not independent (a hard query tends to miss several neighbours), so the
k * n trials overstate the sample's information; the *design effect* divides the trials to account
for that. It is measured on the sample itself (``design_effect_of``: the variance of the recall
across the sample's queries against the variance independent trials would give), since it moves
with the data: about 1.5 on uniform stand-ins, near 10 on clustered data, where a walk that misses a
query's cluster misses most of its ten (docs/maintenance.md, "Recall target"). The worker's
configured design effect (2) is the least assumed, for a rung whose sample cannot tell (every
answer right).

Noise: the ladder is measured on one set of queries against one set of exact answers, so recall
rises with ef almost always; where it does not (a rung above a passing one reads lower), the passing
rung is not trusted, and the choice is the smallest ef from which every measured rung passes.

When no rung passes, the choice is the ladder's largest ef measured (the best this graph gives) with
``reachable`` False: a denser graph (hnsw_m, hnsw_ef_construction) is what reaches the target then.
``sample_limited`` says the best rung's upper bound still reaches the target: more queries, not a
denser graph, might tell.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypedDict

from memstore.catalog.collections import validate_recall_target
from memstore.errors import InvalidInputError

# The ef values a tuning pass tries, in order: from 20 up, steps of about 1.5x at most, so the choice is
# within about 1.5x of the smallest ef that passes; pgvector's hnsw.ef_search takes at most 1000.
LADDER: tuple[int, ...] = (10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 1000)
MAX_EF = 1000
# One-sided 95%: the target is missed by chance at most about one time in twenty.
DEFAULT_Z = 1.645
DEFAULT_DESIGN_EFFECT = 2.0
# How far below the target the lower confidence bound may read (the point estimate must reach it).
DEFAULT_TOLERANCE = 0.01


class Margin(TypedDict):
    """The keyword arguments that set a decision's margin (``MaintenanceConfig.margin``)."""

    z: float
    design_effect: float
    tolerance: float


@dataclass(frozen=True)
class Point:
    """Recall@k measured at one ef over ``queries`` queries."""

    ef: int
    recall: float
    queries: int
    k: int = 10
    design_effect: float | None = None  # measured on the sample's queries (``design_effect_of``)

    @property
    def trials(self) -> int:
        return self.k * self.queries

    @property
    def hits(self) -> float:
        return self.recall * self.trials


@dataclass(frozen=True)
class Tuning:
    ef: int  # the ef searches should use
    reachable: bool  # some rung's lower bound reached the target
    target: float
    recall: float | None  # measured at ``ef``
    lower: float | None  # its lower confidence bound
    sample_limited: bool = False  # unreachable, but the best rung's upper bound reaches the target
    reason: str = ""

    def as_json(self) -> dict[str, object]:
        return {
            "ef": self.ef,
            "reachable": self.reachable,
            "target": self.target,
            "recall": None if self.recall is None else round(self.recall, 5),
            "lower": None if self.lower is None else round(self.lower, 5),
            "sample_limited": self.sample_limited,
            "reason": self.reason,
        }


def wilson(hits: float, trials: float, z: float = DEFAULT_Z) -> tuple[float, float]:
    """The Wilson score interval of a proportion ``hits / trials`` at normal quantile ``z``."""
    if trials <= 0:
        return 0.0, 1.0
    p = min(max(hits / trials, 0.0), 1.0)
    z2 = z * z
    centre = (p + z2 / (2 * trials)) / (1 + z2 / trials)
    half = z * math.sqrt(p * (1 - p) / trials + z2 / (4 * trials * trials)) / (1 + z2 / trials)
    return max(0.0, centre - half), min(1.0, centre + half)


def design_effect_of(hits: Sequence[float], expected: Sequence[float]) -> float | None:
    """The design effect of a recall read over queries with ``hits[i]`` of ``expected[i]`` true
    neighbours found: the variance of the ratio estimate (its residuals across queries) over the
    variance of as many independent trials. None when it cannot be told: under two queries, or no
    query varies from the mean (every answer right, or every one wrong)."""
    n = len(hits)
    total = float(sum(expected))
    if n < 2 or len(expected) != n or total <= 0:
        return None
    p = float(sum(hits)) / total
    if p <= 0.0 or p >= 1.0:
        return None
    mean_k = total / n
    residuals = sum((h - p * e) ** 2 for h, e in zip(hits, expected, strict=True)) / (n - 1)
    return residuals / (mean_k * p * (1.0 - p))


def effective_design_effect(p: Point, design_effect: float = DEFAULT_DESIGN_EFFECT) -> float:
    """The design effect ``p``'s bounds use: its measured one, at least ``design_effect`` (and 1)."""
    return max(design_effect, p.design_effect or 0.0, 1.0)


def bounds(p: Point, *, z: float = DEFAULT_Z, design_effect: float = DEFAULT_DESIGN_EFFECT) -> tuple[float, float]:
    """The confidence interval of ``p``'s recall, its trials divided by the design effect (the
    sample's own where larger than ``design_effect``)."""
    trials = p.trials / effective_design_effect(p, design_effect)
    return wilson(p.recall * trials, trials, z)


def passes(
    p: Point,
    target: float,
    *,
    z: float = DEFAULT_Z,
    design_effect: float = DEFAULT_DESIGN_EFFECT,
    tolerance: float = DEFAULT_TOLERANCE,
) -> bool:
    """The rung's recall reaches ``target`` with the margin: the sample's recall does, and its lower
    bound reaches ``target - tolerance``."""
    return p.recall >= target and bounds(p, z=z, design_effect=design_effect)[0] >= target - tolerance


def pooled(a: Point, b: Point) -> Point:
    """Two readings of one rung over different queries, as one reading over all of them."""
    if a.ef != b.ef or a.k != b.k:
        raise ValueError("only readings of one rung at one k pool")
    n = a.queries + b.queries
    recall = (a.recall * a.queries + b.recall * b.queries) / n if n else a.recall
    spreads = [(p.design_effect, p.queries) for p in (a, b) if p.design_effect is not None]
    spread = sum(d * q for d, q in spreads) / sum(q for _, q in spreads) if spreads else None
    return Point(a.ef, recall, n, a.k, spread)


def undecided(
    points: Sequence[Point],
    target: float,
    *,
    z: float = DEFAULT_Z,
    design_effect: float = DEFAULT_DESIGN_EFFECT,
    tolerance: float = DEFAULT_TOLERANCE,
) -> list[int]:
    """The rungs below the chosen one (all, when none passes) that fail but whose upper bound reaches
    the target: more queries there could show a smaller ef reaches it (or that the best one measured
    does), so the worker measures them again on fresh queries before it settles (``maintenance.worker``)."""
    ladder = sorted(points, key=lambda p: p.ef)
    chosen = choose_ef(ladder, target, z=z, design_effect=design_effect, tolerance=tolerance) if ladder else None
    out = []
    for p in ladder:
        if chosen is not None and chosen.reachable and p.ef >= chosen.ef:
            break
        passed = passes(p, target, z=z, design_effect=design_effect, tolerance=tolerance)
        if not passed and bounds(p, z=z, design_effect=design_effect)[1] >= target:
            out.append(p.ef)
    return out


def recheck(
    points: Sequence[Point],
    target: float,
    current: int,
    *,
    settled: bool = True,
    z: float = DEFAULT_Z,
    design_effect: float = DEFAULT_DESIGN_EFFECT,
    tolerance: float = DEFAULT_TOLERANCE,
) -> list[int]:
    """The rungs to measure again on fresh queries before the collection's ef moves from ``current``.

    A lower ef risks the target on the queries that follow: one sample of clustered data can miss
    the few hard queries and read several points high, so the chosen rung (and any undecided one
    below it) must pass again, pooled with a second sample. So must an unchanged ef that no earlier
    tuning settled for this target (``settled`` False: the target is new, or the ef was set by
    hand): the first sample stops at the first rung that passes, and a rung that passes on one
    sample is more often one that read high (seen in bench.recall_target at 100,000 rows: target 0.99
    kept the ef 60 the target 0.95 had set, on a sample reading 0.992 where held-out queries read
    0.972). A higher ef costs every search: the undecided rungs below the choice are measured again,
    since more queries may show one of them reaches the target. An unchanged, settled ef costs
    nothing more."""
    chosen = choose_ef(points, target, z=z, design_effect=design_effect, tolerance=tolerance)
    below = undecided(points, target, z=z, design_effect=design_effect, tolerance=tolerance)
    if chosen.reachable and (chosen.ef < current or (chosen.ef == current and not settled)):
        return sorted({*below, chosen.ef})
    if chosen.ef > current:
        return below
    return []


def unmeasured_above(
    points: Sequence[Point],
    target: float,
    maximum: int = MAX_EF,
    *,
    z: float = DEFAULT_Z,
    design_effect: float = DEFAULT_DESIGN_EFFECT,
    tolerance: float = DEFAULT_TOLERANCE,
) -> list[int]:
    """The rungs above the largest measured, when no measured rung passes: the first sample stops at
    the first rung that passes, and when fresh queries then fail that rung (``recheck``), the rungs
    above it were never measured; without them the choice would read "unreachable" at a rung the
    next one up may well pass (seen in bench.churn: ef 80 -> 60, "not reached")."""
    if not points or choose_ef(points, target, z=z, design_effect=design_effect, tolerance=tolerance).reachable:
        return []
    top = max(p.ef for p in points)
    return [e for e in ladder_for(maximum) if e > top]


def told_below(
    points: Sequence[Point],
    target: float,
    ef: int,
    *,
    z: float = DEFAULT_Z,
    design_effect: float = DEFAULT_DESIGN_EFFECT,
) -> bool:
    """The recall at ``ef`` is below ``target`` beyond the sample's error: the upper bound of the
    largest rung measured at or below ``ef`` misses it (False when none was measured there)."""
    below = [p for p in points if p.ef <= ef]
    if not below:
        return False
    return bounds(max(below, key=lambda p: p.ef), z=z, design_effect=design_effect)[1] < target


def choose_ef(
    points: Sequence[Point],
    target: float,
    *,
    z: float = DEFAULT_Z,
    design_effect: float = DEFAULT_DESIGN_EFFECT,
    tolerance: float = DEFAULT_TOLERANCE,
) -> Tuning:
    """The smallest ef from which every measured rung passes (``passes``); else the largest ef
    measured, flagged unreachable (see the module's docstring)."""
    checked = validate_recall_target(target)  # an InvalidInputError: a ValueError
    if checked is None:
        raise InvalidInputError("a recall target is needed to choose an ef_search")
    target = checked
    if not points:
        raise ValueError("no measured points to choose from")
    ladder = sorted(points, key=lambda p: p.ef)
    if len({p.ef for p in ladder}) != len(ladder):
        raise ValueError("one point per ef")
    ok = [passes(p, target, z=z, design_effect=design_effect, tolerance=tolerance) for p in ladder]
    # The first rung from which all the rest pass (a failing rung above resets it).
    chosen: int | None = None
    for i in range(len(ladder) - 1, -1, -1):
        if not ok[i]:
            break
        chosen = i
    if chosen is not None:
        p = ladder[chosen]
        lower = bounds(p, z=z, design_effect=design_effect)[0]
        return Tuning(
            ef=p.ef,
            reachable=True,
            target=target,
            recall=p.recall,
            lower=lower,
            reason=f"recall {p.recall:.3f} (at least {lower:.3f}) at ef_search {p.ef} over {p.queries} queries",
        )
    best = ladder[-1]
    lower, upper = bounds(best, z=z, design_effect=design_effect)
    limited = upper >= target
    why = (
        "the sample is too small to tell; more queries might"
        if limited
        else "a denser graph (hnsw_m, hnsw_ef_construction) is needed"
    )
    return Tuning(
        ef=best.ef,
        reachable=False,
        target=target,
        recall=best.recall,
        lower=lower,
        sample_limited=limited,
        reason=f"target {target:g} not reached: recall {best.recall:.3f} (at least {lower:.3f}) at the largest "
        f"ef_search tried, {best.ef}; {why}",
    )


def rung_for(ef: float, maximum: int = MAX_EF) -> int:
    """The ef a tuning would set where ``ef`` is what recall needs: the smallest rung of
    ``ladder_for(maximum)`` at or above it (the largest when none is). A tuning sets rungs only, so
    a need between two rungs costs the upper one."""
    rungs = ladder_for(maximum)
    return next((e for e in rungs if e >= ef - 1e-9), rungs[-1])


def ladder_for(maximum: int = MAX_EF, ladder: Sequence[int] = LADDER) -> list[int]:
    """The rungs up to ``maximum`` (and ``maximum`` itself as the last rung)."""
    rungs = sorted({e for e in ladder if e < maximum} | {min(maximum, MAX_EF)})
    return [e for e in rungs if e >= 1]
