"""The policy's decisions on constructed states (no database)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from maintenance.config import MaintenanceConfig
from maintenance.policy import decide, under_floor
from maintenance.probes import Probe
from maintenance.recall import RecallResult
from maintenance.sizing import estimate_index_bytes

CONFIG = MaintenanceConfig(_env_file=None)  # type: ignore[call-arg]


def state(**kw: Any) -> Probe:
    recall = kw.pop("recall", None)
    live = kw.pop("live_rows", 100_000)
    base: dict[str, Any] = dict(
        collection="docs",
        table="c1_docs",
        index="c1_docs_hnsw",
        partition=None,
        live_rows=live,
        dead_tuples=0,
        dead_entries=0,
        churn_since_rebuild=0,
        index_bytes=estimate_index_bytes(live, dims=128, m=16),
        fresh_bytes=estimate_index_bytes(live, dims=128, m=16),
        leftovers=[],
        owned=True,
        counters={},
        dead_age_s=60.0,
        fresh_recall=None,
    )
    base.update(kw)
    p = Probe(**base)
    if recall is not None:
        p.recall = RecallResult(recall=recall, k=10, queries=32, ef_search=80, source="stored", seconds=0.1)
    return p


def test_healthy_index_is_left_alone() -> None:
    d = decide(state(recall=0.99, dead_entries=1000), CONFIG)
    assert d.action == "nothing" and d.reason == "healthy" and not d.cleanup


def test_dead_fraction_over_threshold_compacts() -> None:
    d = decide(state(dead_entries=int(100_000 * CONFIG.compact_dead_fraction) + 1), CONFIG)
    assert d.action == "rebuild" and "dead fraction" in d.reason


def test_just_under_the_dead_threshold_waits() -> None:
    assert decide(state(dead_entries=int(100_000 * CONFIG.compact_dead_fraction) - 10), CONFIG).action == "nothing"


def test_small_tables_are_vacuumed_not_rebuilt() -> None:
    p = state(live_rows=1000, dead_entries=500)
    assert p.index_bytes < CONFIG.small_index_bytes
    d = decide(p, CONFIG)
    assert d.action == "vacuum"


def test_a_small_bloated_index_without_dead_entries_is_not_vacuumed_again() -> None:
    """40 kB against a fresh 32 kB: VACUUM cannot shrink it and it is too small to rebuild, so a
    VACUUM would be repeated on every pass for ever; once its dead entries are gone, nothing is done."""
    p = state(live_rows=40, dead_entries=3)
    p.index_bytes, p.fresh_bytes = 40 * 1024, 32 * 1024
    assert decide(p, CONFIG).action == "vacuum"  # dead entries to remove: VACUUM does change that
    p.dead_entries = 0
    d = decide(p, CONFIG)
    assert d.action == "nothing" and "1.25x" in d.reason and "VACUUM cannot change" in d.reason
    p.recall = RecallResult(recall=0.5, k=10, queries=32, ef_search=80, source="stored", seconds=0.1)
    assert decide(p, CONFIG).action == "nothing"


def test_bloated_index_compacts() -> None:
    p = state()
    p.index_bytes = int(p.fresh_bytes * (CONFIG.max_size_ratio + 0.01))
    d = decide(p, CONFIG)
    assert d.action == "rebuild" and "fresh build" in d.reason


def test_recall_below_floor_compacts_when_never_rebuilt() -> None:
    d = decide(state(recall=CONFIG.recall_floor - 0.05), CONFIG)
    assert d.action == "rebuild" and "recall" in d.reason


def test_a_reading_under_the_floor_within_its_error_is_not_a_rebuild() -> None:
    # 32 queries reading 0.93 may well be 0.95: their upper bound is over the floor.
    p = state(recall=CONFIG.recall_floor - 0.02)
    assert not under_floor(p, CONFIG.recall_floor, CONFIG)
    assert decide(p, CONFIG).action == "nothing"
    assert under_floor(state(recall=CONFIG.recall_floor - 0.08), CONFIG.recall_floor, CONFIG)


def test_recall_drift_against_fresh_recall_compacts() -> None:
    p = state(recall=0.99 - CONFIG.recall_drop - 0.01, fresh_recall=0.99, churn_since_rebuild=5000)
    assert decide(p, CONFIG).action == "rebuild"


def test_no_rebuild_loop_when_fresh_build_is_no_better() -> None:
    # Hard data: even a fresh build only reaches 0.9; rebuilding again would not help.
    p = state(recall=0.9, fresh_recall=0.9, churn_since_rebuild=5000)
    assert decide(p, CONFIG).action == "nothing"
    # And no churn since the rebuild: nothing to gain either.
    p = state(recall=0.9, fresh_recall=0.99, churn_since_rebuild=0)
    assert decide(p, CONFIG).action == "nothing"


def test_old_dead_entries_are_vacuumed_while_few() -> None:
    p = state(dead_entries=50, dead_age_s=CONFIG.max_dead_age_s + 1)
    d = decide(p, CONFIG)
    assert d.action == "vacuum" and "older than" in d.reason


def test_leftovers_alone_mean_cleanup() -> None:
    d = decide(state(leftovers=["c1_docs_hnsw_ccnew"]), CONFIG)
    assert d.action == "nothing" and d.cleanup and d.label == "cleanup"
    d = decide(state(leftovers=["c1_docs_hnsw_ccnew"], dead_entries=50_000), CONFIG)
    assert d.action == "rebuild" and d.label == "rebuild+cleanup"


def test_no_index_no_action() -> None:
    assert decide(state(index=None, dead_entries=90_000), CONFIG).action == "nothing"


@pytest.mark.parametrize("fraction", [0.0, 0.01, 0.05])
def test_thresholds_come_from_config(fraction: float) -> None:
    strict = MaintenanceConfig(_env_file=None, compact_dead_fraction=0.005)  # type: ignore[call-arg]
    p = state(dead_entries=int(100_000 * fraction))
    assert decide(p, strict).action == ("rebuild" if fraction >= 0.005 else "nothing")


@given(
    dead=st.floats(0, 0.5),
    ratio=st.floats(1.0, 1.5),
    recall=st.one_of(st.none(), st.floats(0.5, 1.0)),
    live=st.integers(1, 10_000_000),
)
def test_decisions_follow_the_thresholds(dead: float, ratio: float, recall: float | None, live: int) -> None:
    p = state(live_rows=live, dead_entries=int(live * dead), recall=recall, dead_age_s=0.0)
    p.index_bytes = int(p.fresh_bytes * ratio)
    d = decide(p, CONFIG)
    unhealthy = (
        p.dead_fraction >= CONFIG.compact_dead_fraction
        or (p.size_ratio >= CONFIG.max_size_ratio and p.index_bytes > 4 * 8192)
        or (recall is not None and under_floor(p, CONFIG.recall_floor, CONFIG))
    )
    small = p.index_bytes < CONFIG.small_index_bytes
    actionable = unhealthy and (not small or p.dead_entries > 0)  # VACUUM of nothing changes nothing
    assert (d.action != "nothing") == actionable
    if actionable:
        assert d.action == ("vacuum" if small else "rebuild")
