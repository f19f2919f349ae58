"""The policy with a recall target: search cost as the objective, decided on the sample's error (no database)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from maintenance.config import MaintenanceConfig
from maintenance.policy import decide, drifted, weigh
from maintenance.search_cost import SearchCost, difference_lower, from_tuning, told_apart
from maintenance.tuning import Point
from tests.maintenance.test_maint_policy import state

CONFIG = MaintenanceConfig(_env_file=None)  # type: ignore[call-arg]
MS = ((10, 0.2), (40, 0.5), (80, 0.9), (160, 1.7), (320, 3.3))


def cost(**kw: Any) -> SearchCost:
    base: dict[str, Any] = dict(
        ef_now=80,
        reachable=True,
        fresh_ef=40,
        now_at_fresh=Point(40, 0.90, 100),
        fresh_at_fresh=Point(40, 0.97, 100),
        ms_per_search=MS,
        searches_per_s=50.0,
    )
    base.update(kw)
    return SearchCost(**base)


def targeted(c: SearchCost, **kw: Any) -> Any:
    p = state(recall=0.96, fresh_recall=0.97, churn_since_rebuild=5000, recall_target=0.95, rebuild_s=30.0, **kw)
    p.search_cost = c
    return p


def test_difference_test_carries_both_samples_error() -> None:
    assert told_apart(Point(40, 0.99, 200), Point(40, 0.93, 200))
    # The same drift on 20 queries each: within the error, not told apart.
    assert not told_apart(Point(40, 0.99, 20), Point(40, 0.96, 20))
    assert difference_lower(Point(40, 0.9, 100), Point(40, 0.9, 100)) < 0


def test_a_graph_the_probe_cannot_tell_from_fresh_is_not_rebuilt() -> None:
    """bench.churn's back-to-back rebuild: a 20-query reading 0.03 under the fresh build's."""
    p = state(recall=0.95, fresh_recall=0.98, fresh_recall_queries=20, churn_since_rebuild=2000)
    p.recall = replace(p.recall, queries=20)  # type: ignore[arg-type]
    assert drifted(p, CONFIG) is False
    assert decide(p, CONFIG).action == "nothing"
    # Beyond the error (more queries, or a larger drift), the drift rule still rebuilds.
    p = state(recall=0.90, fresh_recall=0.98, fresh_recall_queries=40, churn_since_rebuild=2000)
    assert drifted(p, CONFIG) and decide(p, CONFIG).action == "rebuild"


def test_readings_at_a_shallower_ef_than_the_fresh_ones_are_not_compared() -> None:
    p = state(recall=0.90, fresh_recall=0.99, fresh_recall_queries=200, fresh_recall_ef=120, churn_since_rebuild=5)
    assert drifted(p, CONFIG) is None


def test_a_worn_graph_is_rebuilt_when_the_searches_it_saves_outweigh_the_rebuild() -> None:
    p = targeted(cost())
    action, why, totals = weigh(p, p.search_cost, CONFIG)  # type: ignore[arg-type]
    assert action == "rebuild" and "ef 80 -> 40" in why
    assert totals["rebuild"] < totals["nothing"]
    d = decide(p, CONFIG)
    assert d.action == "rebuild" and "search cost" in d.reason


def test_few_searches_do_not_pay_for_a_rebuild() -> None:
    p = targeted(cost(searches_per_s=0.001))
    assert decide(p, CONFIG).action == "nothing"
    p = targeted(cost(searches_per_s=None))
    assert decide(p, CONFIG).action == "nothing"


def test_a_larger_ef_within_the_error_of_the_fresh_ladder_is_not_wear() -> None:
    """ef 80 now against 40 fresh, but recall at ef 40 is not told apart: no rebuild, however many searches."""
    c = cost(now_at_fresh=Point(40, 0.955, 100), fresh_at_fresh=Point(40, 0.965, 100), searches_per_s=1e6)
    assert not c.worn()
    p = targeted(c)
    assert decide(p, CONFIG).action == "nothing"


def test_a_fresh_graph_with_no_churn_is_never_rebuilt_for_cost() -> None:
    p = targeted(cost(searches_per_s=1e6))
    p.churn_since_rebuild = 0
    assert decide(p, CONFIG).action == "nothing"


def test_vacuum_is_chosen_when_dead_entries_take_the_search_and_the_graph_is_not_worn() -> None:
    c = cost(now_at_fresh=None, fresh_at_fresh=None, fresh_ef=None, searches_per_s=500.0)
    p = targeted(c, dead_entries=30_000)  # 30% dead: ef 80 -> 56, the tuning's rung 60
    action, why, totals = weigh(p, c, CONFIG)
    assert set(totals) == {"nothing", "vacuum"}
    assert action == "vacuum" and "ef 80 -> 60" in why
    assert decide(p, CONFIG).action == "vacuum"


def test_a_vacuum_that_cannot_move_the_tuned_ef_off_its_rung_saves_nothing() -> None:
    """4% dead: the ef needed would fall from 80 to 77, but the tuning sets rungs (60, 80), so the
    searches would still run at 80: however many there are, the VACUUM buys nothing."""
    c = cost(now_at_fresh=None, fresh_at_fresh=None, fresh_ef=None, searches_per_s=1e6)
    p = targeted(c, dead_entries=4000)
    action, _, totals = weigh(p, c, CONFIG)
    assert action == "nothing" and totals["vacuum"] > totals["nothing"]


def test_a_planned_denser_graph_is_built_at_once_when_the_target_is_out_of_reach() -> None:
    c = cost(ef_now=1000, reachable=False, denser=(32, 128), denser_ef=160, searches_per_s=0.0)
    d = decide(targeted(c), CONFIG)
    assert d.action == "rebuild" and "denser graph" in d.reason
    # Reachable, but at ef 800 against the bound 160: the weighing counts the denser build's cost.
    c = cost(ef_now=800, denser=(32, 128), denser_ef=160, searches_per_s=20.0)
    action, why, _ = weigh(targeted(c), c, CONFIG)
    assert action == "rebuild" and "ef 800 -> 160" in why


def test_search_time_is_interpolated_and_proportional_beyond() -> None:
    c = cost()
    assert c.search_ms(40) == 0.5
    assert c.search_ms(60) == 0.7
    assert c.search_ms(640) == 3.3 * 2
    assert c.search_ms(5) == 0.1
    assert cost(ms_per_search=()).search_ms(40) is None


def test_cost_figures_from_the_recorded_tuning() -> None:
    tuning = {
        "target": 0.95,
        "ef": 80,
        "reachable": True,
        "queries": 100,
        "k": 10,
        "ladder": [[10, 0.8], [20, 0.88], [40, 0.93], [80, 0.975]],
        "search_ms": [[10, 0.2], [80, 0.9]],
        "searches_per_s": 3.5,
        "fresh": {"ef": 40, "ladder": [[10, 0.85], [20, 0.93], [40, 0.975]], "queries": 100},
    }
    c = from_tuning(tuning, target=0.95)
    assert c is not None and c.ef_now == 80 and c.fresh_ef == 40 and c.searches_per_s == 3.5
    assert c.now_at_fresh == Point(40, 0.93, 100) and c.fresh_at_fresh == Point(40, 0.975, 100)
    assert from_tuning(tuning, target=0.9) is None  # another target: not tuned for it yet
    assert from_tuning(None, target=0.95) is None
