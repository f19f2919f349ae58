"""The policy: from a probe's figures to nothing, VACUUM or a concurrent rebuild. A pure function.

Why these rules (measurements in docs/maintenance.md):
- pgvector's VACUUM repairs every live element that has a dead neighbour; at m=16 an element has 32
  layer-0 neighbours, so with a dead fraction d about 1-(1-d)^32 of the graph is searched again
  (5% dead: 80%). Past a few percent a concurrent rebuild is cheaper, and it also restores the size
  and the graph quality a fresh build has. So dead entries are left to accumulate while recall and
  size are healthy, and then cleaned all at once by a rebuild.
- VACUUM stays the right tool where a rebuild's fixed costs dominate (tiny tables) and where few dead
  entries have waited long (their repair touches little of the graph).
- A verdict that rests on recall alone is taken on two independent samples (the worker confirms a low
  first reading before it pays for a rebuild).
- A collection with a recall target has its ef_search tuned to it (``maintenance.tuning``): the
  floor is then the target less ``recall_drop`` where that is lower, so a target under the floor does
  not make every tuned index look worn; a deeper search, not a rebuild, is the first remedy.
- No action is chosen that cannot change the figure it answers: VACUUM never shrinks an HNSW index
  nor rebuilds its graph, so on a small index (never rebuilt) a size or recall verdict with no dead
  entries to remove is "nothing", not the same VACUUM on every pass.
- Every recall comparison carries the sample's error: a reading below the last fresh build's is
  drift only when the difference of the two is beyond both samples' error (Newcombe's hybrid score
  interval: the Wilson intervals of ``maintenance.tuning`` combined), so a graph the probe cannot
  tell apart from its last fresh build is never rebuilt again (``bench.churn`` had rebuilt a graph
  built one round before on a 20-query reading). The absolute floor likewise: a graph the worker has
  never rebuilt is rebuilt for recall only when its reading's upper bound is under the floor.
- With a recall target, search cost is the objective (``weigh``): each choice leaves an ef at the
  target (nothing: the tuned one; a rebuild: what the last fresh build needed, or the denser graph's
  bound when one is planned, ``memstore.catalog.density``; VACUUM: the tuned one less the share of
  the candidate list dead entries take), and the choice with the least search seconds over
  ``search_horizon_s`` (the measured searches per second times the measured time of a search at
  that ef) plus the action's own seconds (the last rebuild's; VACUUM: the share of the graph it
  repairs, 1-(1-d)^(2m), of that) is taken. A rebuild for search cost needs the ladder to tell the
  graph apart from its fresh build at the fresh build's ef (the same test); a planned denser graph
  is built at once when the target is out of reach.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from maintenance.config import MaintenanceConfig
from maintenance.probes import Probe
from maintenance.search_cost import SearchCost, told_apart
from maintenance.tuning import Point, bounds, rung_for
from memstore.catalog.density import DENSE_BUILD_COST

Action = Literal["nothing", "vacuum", "rebuild"]


@dataclass(frozen=True)
class Decision:
    action: Action
    reason: str
    cleanup: bool = False  # INVALID leftovers to drop first (always done before anything else)

    @property
    def label(self) -> str:
        return (
            f"{self.action}+cleanup"
            if self.cleanup and self.action != "nothing"
            else ("cleanup" if self.cleanup else self.action)
        )


def drifted(p: Probe, config: MaintenanceConfig) -> bool | None:
    """The probe's recall is below the last fresh build's by ``recall_drop`` and beyond both samples'
    error (None: no reading to compare, or readings at different ef_search values where the fresh
    one's was deeper)."""
    recall, fresh = p.recall_value, p.fresh_recall
    if recall is None or fresh is None or p.recall is None:
        return None
    if p.fresh_recall_ef is not None and p.recall.ef_search < p.fresh_recall_ef:
        return None  # a shallower search reads lower by itself
    if recall >= fresh - config.recall_drop:
        return False
    k = p.recall.k
    spread = p.recall.design_effect  # the fresh reading's is not kept: both samples are taken alike
    now = Point(p.recall.ef_search, recall, max(p.recall.queries, 1), k, spread)
    then = Point(p.recall.ef_search, fresh, max(p.fresh_recall_queries or p.recall.queries, 1), k, spread)
    return told_apart(then, now, z=config.tune_z, design_effect=config.tune_design_effect)


def under_floor(p: Probe, floor: float, config: MaintenanceConfig) -> bool:
    """The probe's recall is below ``floor`` beyond its sample's error (its upper bound is)."""
    recall = p.recall_value
    if recall is None:
        return False
    if p.recall is None:
        return recall < floor
    point = Point(p.recall.ef_search, recall, max(p.recall.queries, 1), p.recall.k, p.recall.design_effect)
    return bounds(point, z=config.tune_z, design_effect=config.tune_design_effect)[1] < floor


def weigh(p: Probe, cost: SearchCost, config: MaintenanceConfig) -> tuple[str, str, dict[str, float]]:
    """The action with the least seconds over ``search_horizon_s``: searches at the ef each action
    leaves plus the action's own (see the module's docstring). Returns (action, why, totals)."""
    rebuild_s = p.rebuild_s if p.rebuild_s is not None else p.live_rows / config.rebuild_rows_per_s
    rate = cost.searches_per_s or 0.0
    searches = rate * config.search_horizon_s

    def search_s(ef: float) -> float | None:
        ms = cost.search_ms(ef)
        return None if ms is None else searches * ms / 1000.0

    # The ef each option leaves, as the tuning would set it: a rung (``tuning.rung_for``). A VACUUM that
    # would bring the ef needed from 80 to 77 leaves the tuned ef at 80 and saves no search time (seen in
    # bench.churn: two VACUUMs for search cost that could not move the ef).
    def rung(ef: float) -> float:
        return float(rung_for(ef, config.tune_max_ef))

    options: dict[str, tuple[float, float]] = {"nothing": (rung(cost.ef_now), 0.0)}  # action: (ef left, action s)
    if cost.denser is not None and cost.denser_ef is not None:
        options["rebuild"] = (rung(min(cost.ef_now, cost.denser_ef)), rebuild_s * DENSE_BUILD_COST)
    elif (
        cost.fresh_ef is not None
        and (p.churn_since_rebuild or 0) > 0
        and cost.worn(z=config.tune_z, design_effect=config.tune_design_effect)
    ):
        options["rebuild"] = (rung(cost.fresh_ef), rebuild_s)
    if p.dead_entries > 0:
        d = min(p.dead_fraction, 1.0)
        ef_left = max(float(cost.fresh_ef or 1), cost.ef_now * (1.0 - d))
        repaired = 1.0 - (1.0 - d) ** (2 * max(p.hnsw_m, 1))
        options["vacuum"] = (rung(ef_left), rebuild_s * repaired)
    totals: dict[str, float] = {}
    for action, (ef, action_s) in options.items():
        s = search_s(ef)
        if s is None:
            return "nothing", "no search time measured", {}
        totals[action] = s + action_s
    best = min(totals, key=lambda a: (totals[a], a != "nothing"))
    ef_left = options[best][0]
    why = (
        f"search cost at recall {p.recall_target:g}: ef {cost.ef_now} -> {ef_left:.0f} "
        f"({searches:.0f} searches in {config.search_horizon_s:.0f}s: {totals['nothing']:.1f}s -> "
        f"{totals[best] - options[best][1]:.1f}s, for a {best} of {options[best][1]:.1f}s)"
    )
    return best, why, totals


def decide(p: Probe, config: MaintenanceConfig) -> Decision:
    cleanup = bool(p.leftovers)
    if p.index is None:
        return Decision("nothing", "no valid HNSW index", cleanup)
    if p.live_rows == 0 and p.dead_entries == 0:
        return Decision("nothing", "empty", cleanup)
    small = p.index_bytes < config.small_index_bytes

    def heavy(reason: str) -> Decision:
        """A rebuild, or VACUUM where a rebuild's fixed costs dominate; nothing where VACUUM has
        already done all it could (see the module's docstring)."""
        if not small:
            return Decision("rebuild", reason, cleanup)
        if p.dead_entries > 0:
            return Decision("vacuum", reason, cleanup)
        return Decision(
            "nothing",
            f"{reason}, but VACUUM cannot change that and indexes under {config.small_index_bytes // 1024} kB "
            "are not rebuilt",
            cleanup,
        )

    recall = p.recall_value
    floor = config.recall_floor
    if p.recall_target is not None:
        floor = min(floor, p.recall_target - config.recall_drop)
    cost = p.search_cost
    if cost is not None and cost.denser is not None and not cost.reachable and not small:
        # The target is out of reach at the largest ef: only the planned denser graph can reach it.
        m, efc = cost.denser
        return Decision("rebuild", f"recall target {p.recall_target:g} unreached at ef {cost.ef_now}: "
                        f"a denser graph (m {m}, ef_construction {efc})", cleanup)  # fmt: skip
    if recall is not None:
        if p.fresh_recall is None:
            # Never rebuilt by the worker: the absolute floor; one rebuild then tells what fresh gives.
            if under_floor(p, floor, config):
                return heavy(f"recall {recall:.3f} below {floor:.3f}")
        elif (p.churn_since_rebuild or 0) > 0 and drifted(p, config):
            # Relative to what a fresh build gave: a rebuild cannot beat that, so no rebuild loops;
            # and beyond the samples' error, so a graph the probe cannot tell from fresh is kept.
            return heavy(f"recall {recall:.3f} drifted from {p.fresh_recall:.3f} after the last rebuild")
    if cost is not None and not small:
        action, why, _ = weigh(p, cost, config)
        if action != "nothing":
            return Decision(action, why, cleanup)  # type: ignore[arg-type]
    if p.dead_fraction >= config.compact_dead_fraction:
        return heavy(f"dead fraction {p.dead_fraction:.3f} at or over {config.compact_dead_fraction:.3f}")
    if p.size_ratio >= config.max_size_ratio and p.index_bytes > 4 * 8192:
        return heavy(f"index {p.size_ratio:.2f}x a fresh build (limit {config.max_size_ratio:.2f})")
    if p.dead_entries > 0 and p.dead_age_s is not None and p.dead_age_s >= config.max_dead_age_s:
        return Decision("vacuum", f"{p.dead_entries} dead entries older than {config.max_dead_age_s:.0f}s", cleanup)
    return Decision("nothing", "healthy", cleanup)
