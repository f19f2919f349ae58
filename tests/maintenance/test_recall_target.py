"""Recall target: the ef chosen from a measured ladder (pure), and the worker's tuning pass."""

from __future__ import annotations

import functools
import json
from datetime import UTC, datetime

import numpy as np
import pytest

from maintenance import history, recall, report
from maintenance.cli import main
from maintenance.ladder import measure_ladder
from maintenance.targets import targets_for
from maintenance.tuning import (
    LADDER,
    Point,
    bounds,
    choose_ef,
    design_effect_of,
    ladder_for,
    passes,
    pooled,
    recheck,
    rung_for,
    told_below,
    undecided,
    unmeasured_above,
    wilson,
)
from memstore.errors import InvalidInputError
from memstore.models import ItemIn
from memstore.settings import get_settings
from tests.maintenance.conftest import settle_live_count
from tests.maintenance.maint_helpers import clustered

# ------------------------------------------------------------------ the decision (no database)


def test_the_report_s_ef_history_follows_the_tunings_that_succeeded() -> None:
    t = [datetime(2026, 12, 4, 12, m, tzinfo=UTC) for m in range(6)]

    def tune(start: int, old: int, new: int, outcome: str = "ok", collection: str = "a") -> dict[str, object]:
        before, after = {"ef_search": old, "recall_target": 0.95}, {"ef": new, "ef_search": new}
        return {"action": "tune", "outcome": outcome, "collection": collection, "started_at": t[start],
                "finished_at": t[start + 1], "before": before, "after": after}  # fmt: skip

    vacuum = {"action": "vacuum", "outcome": "ok", "collection": "a", "started_at": t[2], "finished_at": t[3]}
    actions = [
        tune(2, 60, 40),
        vacuum,
        tune(0, 80, 60),
        tune(3, 40, 20, outcome="failed"),
        tune(1, 80, 120, collection="b"),
    ]
    assert report.ef_history(actions) == {
        "a": [(t[0], 80), (t[1], 60), (t[2], 60), (t[3], 40)],  # in time order; the failed tuning set nothing
        "b": [(t[1], 80), (t[2], 120)],
    }
    assert report.ef_history([vacuum]) == {}


def test_wilson_stays_inside_zero_one_and_narrows_with_trials() -> None:
    lo, hi = wilson(10, 10)
    assert 0.0 < lo < 1.0 and hi == 1.0
    assert wilson(0, 10)[0] == 0.0
    assert wilson(0, 0) == (0.0, 1.0)
    wide, narrow = wilson(95, 100), wilson(9500, 10000)
    assert wide[0] < narrow[0] < 0.95 < narrow[1] < wide[1]


def test_monotone_ladder_picks_the_smallest_rung_passing_with_margin() -> None:
    recalls = {10: 0.70, 20: 0.82, 40: 0.91, 80: 0.96, 120: 0.985, 160: 0.995, 240: 0.999}
    points = [Point(ef, r, queries=200) for ef, r in recalls.items()]
    t = choose_ef(points, 0.95)
    # 0.96 over 2000 trials (1000 after the design effect): its lower bound, just under 0.95, is
    # within the tolerance (0.94); without the tolerance the next rung is needed.
    assert passes(Point(80, 0.96, 200), 0.95) and not passes(Point(80, 0.96, 200), 0.95, tolerance=0.0)
    assert t.reachable and t.ef == 80 and t.recall == 0.96
    assert t.lower is not None and 0.94 <= t.lower < 0.95
    assert choose_ef(points, 0.95, tolerance=0.0).ef == 120
    assert choose_ef(points, 0.9).ef == 40
    assert choose_ef(points, 0.99).ef == 160
    assert choose_ef(points, 0.99, tolerance=0.0).ef == 240


def test_the_sample_s_recall_must_reach_the_target_and_its_bound_the_target_less_the_tolerance() -> None:
    # Just under the target on a vast sample: the estimate misses it, whatever the bound says.
    assert not passes(Point(40, 0.949, 100_000), 0.95)
    # At the target on a large sample: the bound is within the tolerance; with none it is below.
    assert passes(Point(40, 0.95, 1000), 0.95)
    assert not passes(Point(40, 0.95, 1000), 0.95, tolerance=0.0)
    # At the target on a small sample of whole-query misses: the bound is beyond the tolerance.
    assert not passes(Point(40, 0.95, 50, design_effect=10.0), 0.95)
    t = choose_ef([Point(40, 0.95, 1000), Point(80, 1.0, 1000)], 0.95, tolerance=0.0)
    assert t.ef == 80


def test_noisy_ladder_does_not_trust_a_pass_below_a_failing_rung() -> None:
    points = [Point(10, 0.80, 100), Point(20, 0.995, 100), Point(40, 0.90, 100), Point(80, 0.999, 100)]
    t = choose_ef(points, 0.95)
    assert t.reachable and t.ef == 80
    # Order of the input does not matter.
    assert choose_ef(list(reversed(points)), 0.95).ef == 80


def test_unreachable_target_takes_the_largest_rung_and_says_a_denser_graph_is_needed() -> None:
    points = [Point(ef, r, 500) for ef, r in [(10, 0.5), (80, 0.80), (320, 0.86), (1000, 0.88)]]
    t = choose_ef(points, 0.95)
    assert not t.reachable and t.ef == 1000 and t.recall == 0.88
    assert not t.sample_limited
    assert "denser graph" in t.reason and "hnsw_m" in t.reason


def test_tiny_sample_is_not_trusted_even_at_perfect_recall() -> None:
    # One query, ten neighbours, all found: far too little evidence for 0.95.
    t = choose_ef([Point(40, 1.0, 1), Point(80, 1.0, 1)], 0.95)
    assert not t.reachable and t.ef == 80 and t.sample_limited
    assert "sample" in t.reason
    # ... but enough for a modest target.
    assert choose_ef([Point(40, 1.0, 5)], 0.5).reachable


def test_design_effect_widens_the_interval() -> None:
    p = Point(80, 0.97, 100)
    assert bounds(p, design_effect=4.0)[0] < bounds(p, design_effect=1.0)[0]
    assert passes(p, 0.95, design_effect=1.0, tolerance=0.0)
    assert not passes(p, 0.95, design_effect=4.0, tolerance=0.0)


def test_design_effect_is_about_one_for_independent_misses_and_large_for_clustered_ones() -> None:
    rng = np.random.default_rng(7)
    k, n = 10, 4000
    independent = rng.binomial(k, 0.95, size=n)  # each neighbour missed alone, 1 in 20
    assert 0.85 < (design_effect_of(independent, [k] * n) or 0) < 1.15
    # The same recall where a query misses most of its ten or none: one query in 20 gets 0 of 10.
    clustered_hits = np.where(rng.random(n) < 0.05, 0, k)
    de = design_effect_of(clustered_hits, [k] * n)
    assert de is not None and 8.0 < de < 11.0
    # Nothing to tell: one query, or no query differs (all right, all wrong).
    assert design_effect_of([7], [10]) is None
    assert design_effect_of([10, 10, 10], [10, 10, 10]) is None
    assert design_effect_of([0, 0], [10, 10]) is None
    assert design_effect_of([], []) is None


def test_a_sample_with_clustered_misses_needs_a_higher_rung() -> None:
    """A reading of 0.97 at ef 40 over 100 queries passes 0.95 with the default margin; when the
    sample's misses came a whole query at a time (design effect near 10) it cannot tell 0.97 from
    0.93, and the next rung, read at 0.995, is chosen."""
    hits = [10] * 97 + [0] * 3  # three queries missed everything: 0.97
    spread = design_effect_of(hits, [10] * 100)
    assert spread is not None and spread > 8
    lucky = [Point(40, 0.97, 100), Point(80, 0.995, 100)]
    assert choose_ef(lucky, 0.95).ef == 40
    measured = [Point(40, 0.97, 100, design_effect=spread), Point(80, 0.995, 100, design_effect=1.0)]
    assert choose_ef(measured, 0.95).ef == 80
    # The configured design effect stays the least assumed: a measured 1.0 does not narrow it.
    assert bounds(Point(80, 0.97, 100, design_effect=1.0)) == bounds(Point(80, 0.97, 100))


def test_pooled_readings_weigh_their_queries() -> None:
    p = pooled(Point(80, 0.90, 100, design_effect=4.0), Point(80, 0.96, 300, design_effect=2.0))
    assert p.queries == 400 and p.recall == pytest.approx(0.945) and p.design_effect == pytest.approx(2.5)
    assert pooled(Point(80, 0.9, 10), Point(80, 1.0, 10)).design_effect is None
    with pytest.raises(ValueError):
        pooled(Point(80, 0.9, 10), Point(40, 0.9, 10))


def test_undecided_rungs_are_those_below_the_choice_whose_interval_holds_the_target() -> None:
    # A wide sample (design effect 10): 40 reads 0.93, 80 reads 0.965, 120 reads 0.99.
    points = [Point(ef, r, 100, design_effect=10.0) for ef, r in [(10, 0.6), (40, 0.93), (80, 0.965), (120, 0.995)]]
    chosen = choose_ef(points, 0.95)
    assert chosen.ef == 120
    # 10 is told below; 40 and 80 may reach it; 120 is the choice (nothing above it is asked).
    assert undecided(points, 0.95) == [40, 80]
    # The same readings over ten times the queries are decided.
    assert undecided([Point(p.ef, p.recall, 1000) for p in points], 0.95) == []
    # Unreachable: every rung whose interval holds the target (not 40, told below it).
    assert undecided([Point(40, 0.80, 20), Point(80, 0.94, 20)], 0.95) == [80]


def test_a_move_of_the_ef_is_checked_on_fresh_queries_and_no_move_costs_nothing() -> None:
    points = [Point(ef, r, 100, design_effect=10.0) for ef, r in [(10, 0.6), (40, 0.93), (80, 0.965), (120, 0.995)]]
    assert choose_ef(points, 0.95).ef == 120
    assert recheck(points, 0.95, current=120) == []  # no move
    # No move, but the ef was not settled for this target (a new target): confirmed as a move down is.
    assert recheck(points, 0.95, current=120, settled=False) == [40, 80, 120]
    assert recheck(points, 0.95, current=80) == [40, 80]  # up: could 40 or 80 do?
    assert recheck(points, 0.95, current=240) == [40, 80, 120]  # down: 120 must pass again
    decided = [Point(ef, r, 1000) for ef, r in [(10, 0.6), (40, 0.93), (80, 0.99)]]
    assert recheck(decided, 0.95, current=40) == []  # up, nothing undecided below
    assert recheck(decided, 0.95, current=160) == [80]  # down: confirmed even when decided


def test_the_rungs_above_a_rung_that_failed_its_recheck_are_measured() -> None:
    """The first sample stopped at 60 (it passed); pooled with fresh queries 60 fails, and 80 and up
    were never measured: they are, before the choice reads "unreachable" at 60."""
    pooled_60 = [Point(40, 0.90, 200), Point(60, 0.935, 200)]
    assert not choose_ef(pooled_60, 0.95).reachable
    assert unmeasured_above(pooled_60, 0.95) == [80, 120, 160, 240, 320, 480, 640, 1000]
    assert unmeasured_above(pooled_60, 0.95, 100) == [80, 100]
    # A reachable choice, or the whole ladder measured, leaves nothing to add.
    assert unmeasured_above([*pooled_60, Point(80, 0.99, 100)], 0.95) == []
    assert unmeasured_above([Point(1000, 0.9, 100)], 0.95) == []
    assert unmeasured_above([], 0.95) == []


def test_told_below_needs_the_upper_bound_under_the_target() -> None:
    points = [Point(80, 0.93, 100, design_effect=10.0), Point(160, 0.945, 100, design_effect=10.0)]
    assert not told_below(points, 0.95, 160)  # 0.945 on 100 clustered queries may well be 0.95
    assert told_below([Point(160, 0.90, 1000)], 0.95, 160)
    assert told_below([Point(80, 0.90, 1000), Point(240, 0.99, 1000)], 0.95, 160)  # the largest rung under 160
    assert not told_below([Point(240, 0.5, 1000)], 0.95, 160)  # nothing measured at or under it


@pytest.mark.parametrize("bad", [0.0, 1.0, -0.1, 1.5, True, float("nan")])
def test_targets_outside_zero_one_are_refused(bad: float) -> None:
    with pytest.raises(ValueError):
        choose_ef([Point(10, 0.9, 10)], bad)


def test_no_points_or_duplicate_rungs_are_refused() -> None:
    with pytest.raises(ValueError):
        choose_ef([], 0.9)
    with pytest.raises(ValueError):
        choose_ef([Point(10, 0.9, 10), Point(10, 0.95, 10)], 0.9)


def test_random_monotone_ladders_meet_the_target_on_the_truth() -> None:
    """Simulated: per-query recall drawn around a true curve; the chosen ef's *true* recall reaches the
    target in nearly every trial, and the choice is never far above the smallest true ef that does."""
    rng = np.random.default_rng(7)
    ladder = ladder_for()
    true = {ef: 1 - 0.6 * np.exp(-ef / 60) for ef in ladder}
    misses = 0
    for _ in range(200):
        points = []
        for ef in ladder:
            hits = rng.binomial(10, true[ef], size=100)  # 100 queries, k = 10
            points.append(Point(ef, float(hits.mean() / 10), 100))
        t = choose_ef(points, 0.95)
        assert t.reachable
        misses += true[t.ef] < 0.95
        smallest = min(ef for ef in ladder if true[ef] >= 0.95)
        assert t.ef <= ladder[ladder.index(smallest) + 1]
    assert misses <= 10


def test_the_rung_for_an_ef_is_the_tuning_s_next_value_up() -> None:
    assert rung_for(77) == 80 and rung_for(80) == 80 and rung_for(56) == 60 and rung_for(1) == 10
    assert rung_for(2000) == 1000
    assert rung_for(70, maximum=50) == 50


def test_ladder_for_caps_and_keeps_the_maximum() -> None:
    assert ladder_for() == list(LADDER)
    assert ladder_for(100) == [10, 20, 30, 40, 60, 80, 100]
    assert ladder_for(5000)[-1] == 1000


# ------------------------------------------------------------------ persistence and the worker's pass


def test_store_sets_shows_and_clears_the_target(store, collection_name) -> None:
    c = store.create_collection(name=collection_name, dimensions=8, recall_target=0.95)
    assert c.recall_target == 0.95 and c.recall_tuning is None
    assert store.set_recall_target(collection=collection_name, target=0.9).recall_target == 0.9
    assert store.get_collection(name=collection_name, fresh=True).recall_target == 0.9
    assert store.set_recall_target(collection=collection_name, target=None).recall_target is None
    for bad in (0, 1, 1.2, -0.5, True, "0.9"):
        with pytest.raises(InvalidInputError):
            store.set_recall_target(collection=collection_name, target=bad)
    with pytest.raises(InvalidInputError):
        store.create_collection(name=collection_name + "_b", dimensions=8, recall_target=1.0)
    assert store.get_collection(name=collection_name, fresh=True).recall_target is None


def held_out_recall(
    store, collection: str, data: np.ndarray, queries: np.ndarray, k: int = 10, ef: int | None = None
) -> float:
    """Recall@k of the collection's default searches (no ef named) against numpy's exact answers."""
    norm = data / np.linalg.norm(data, axis=1, keepdims=True)
    hits = 0
    for q in queries:
        truth = set(np.argsort(-(norm @ (q / np.linalg.norm(q))))[:k].tolist())
        found = store.search(collection=collection, vector=q, k=k, ef_search=ef)
        hits += sum(1 for r in found if int(r.external_id[1:]) in truth)
    return hits / (k * len(queries))


def test_worker_tunes_ef_search_to_the_target_and_again_after_a_load(
    store, make_collection, make_worker, collection_name, conn, dsn, tmp_path
) -> None:
    n, dims = 3000, 32
    make_collection(n, dims)
    data = clustered(n, dims, seed=0)
    store.set_recall_target(collection=collection_name, target=0.95)
    worker = make_worker()
    assert worker.run_once() == 0
    tunes = [o for o in worker.last_outcomes if o.decision == "tune"]
    assert len(tunes) == 1 and tunes[0].outcome == "ok", worker.last_outcomes
    c = store.get_collection(name=collection_name, fresh=True)
    tuning = c.recall_tuning
    assert tuning is not None and tuning["reachable"] and tuning["target"] == 0.95
    assert c.default_ef_search == tuning["ef"] and c.default_ef_search <= 1000
    assert tuning["recall"] >= 0.95 and tuning["lower"] >= 0.94  # the tolerance: 0.01
    # Each rung records the design effect its sample showed (None where every answer was right).
    assert all(len(row) == 3 and (row[2] is None or row[2] > 0) for row in tuning["ladder"])
    assert any(row[2] is not None for row in tuning["ladder"])
    # Held-out queries (not stored rows) meet the target at the tuned default, within the sample's error.
    # Held-out queries from the data's own distribution (more draws of its clusters, none stored):
    # what the stand-ins stand in for. Queries from elsewhere (another model's, another modality's)
    # are what the API's kept samples are for; the tuning cannot know them from stored rows.
    held_out = clustered(n + 200, dims, seed=0)[n:]
    assert held_out_recall(store, collection_name, data, held_out) >= 0.94
    assert tuning["queries"] >= 100  # the first sample, and more where a rung was undecided
    # The change is in the history, with the ef before and after.
    rows = history.list_actions(conn, collection=collection_name)
    tune_rows = [r for r in rows if r["action"] == "tune"]
    assert tune_rows and tune_rows[0]["before"]["ef_search"] == 80
    assert tune_rows[0]["after"]["ef_search"] == c.default_ef_search
    # memstore-maint report's plot draws that ef beside the recall: 80 until the tuning, its ef after.
    assert report.ef_history(rows)[collection_name] == [
        (tune_rows[0]["started_at"], 80),
        (tune_rows[0]["finished_at"], c.default_ef_search),
    ]
    plot = report.plot_history(history.list_probes(conn, collection=collection_name), rows, tmp_path / "h.png")
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # A pass with nothing new measured leaves the tuning alone.
    assert worker.run_once() == 0
    assert not [o for o in worker.last_outcomes if o.decision == "tune"]
    # Load three times as many rows: the next pass measures recall again and re-tunes.
    more = clustered(3 * n, dims, seed=5)
    store.upsert_items(
        collection=collection_name, items=[ItemIn(vector=v, external_id=f"e{n + i}") for i, v in enumerate(more)]
    )
    settle_live_count(dsn, store, c, 4 * n)
    assert worker.run_once() == 0
    tunes = [o for o in worker.last_outcomes if o.decision == "tune"]
    assert len(tunes) == 1 and tunes[0].outcome == "ok", worker.last_outcomes
    again = store.get_collection(name=collection_name, fresh=True)
    assert again.recall_tuning is not None and again.recall_tuning["measured_at"] > tuning["measured_at"]
    assert again.default_ef_search == again.recall_tuning["ef"]
    held_out = np.vstack([clustered(n + 50, dims, seed=0)[n:], clustered(3 * n + 150, dims, seed=5)[3 * n :]])
    assert held_out_recall(store, collection_name, np.vstack([data, more]), held_out) >= 0.94


def test_a_recheck_comes_down_the_ladder_and_stops_at_the_first_rung_told_below(make_collection, conn) -> None:
    """A re-check of many queries measures from the top rung down and stops after the first whose
    recall is below the target beyond the sample's error: the rungs under it are not paid for."""
    c = make_collection(3000, 32)
    [target] = targets_for(conn, c)
    queries = list(clustered(3200, 32, seed=0)[3000:])
    rungs = [10, 20, 40, 80, 160]
    ladder = functools.partial(
        measure_ladder,
        conn,
        target,
        k=10,
        rungs=rungs,
        recall_target=0.995,
        max_scan_tuples=20_000,
        queries=queries,
        stop_on_pass=False,
    )
    every, down = ladder(), ladder(stop_below=True)
    assert [p.ef for p in every.points] == rungs
    measured = [p.ef for p in down.points]
    assert measured == sorted(measured) and measured[-1] == 160 and len(measured) < len(rungs)
    lowest = down.points[0]
    assert told_below([lowest], 0.995, lowest.ef)  # the one it stopped at
    assert not any(told_below([p], 0.995, p.ef) for p in down.points[1:])
    # The same queries, the same readings where both measured.
    assert {p.ef: p.recall for p in down.points} == {p.ef: p.recall for p in every.points if p.ef in measured}


def test_a_tuning_that_rechecks_reads_the_table_once(
    store, make_collection, make_worker, collection_name, monkeypatch
) -> None:
    """A new target's tuning re-checks its choice on fresh queries: those are drawn and answered with
    the first round's, so the first round and its re-check read the table for exact answers once.
    Only where the re-check's queries fail every rung measured (drawn at random: it happens) do the
    rungs above take one more read, of ``tune_sample`` queries. A settled tuning (nothing moved since)
    draws only the first round's queries."""
    make_collection(3000, 32)
    store.set_recall_target(collection=collection_name, target=0.95)
    reads: list[int] = []
    real = recall.core_exact_answers

    def counted(cur, **kwargs):
        reads.append(len(kwargs["queries"]))
        return real(cur, **kwargs)

    monkeypatch.setattr(recall, "core_exact_answers", counted)
    worker = make_worker(tune_sample=100, tune_sample_max=300)
    assert worker.run_once() == 0
    c = store.get_collection(name=collection_name, fresh=True)
    assert c.recall_tuning is not None
    tunings = [n for n in reads if n >= 100]  # the probes' samples are smaller
    assert tunings in ([300], [300, 100]), tunings
    assert c.recall_tuning["queries"] == sum(tunings), c.recall_tuning
    reads.clear()
    again = worker.tune(c)
    assert again.outcome == "ok", again
    assert next(n for n in reads if n >= 100) == 100


def test_an_unreachable_target_keeps_the_largest_ef_and_says_so(
    store, make_collection, make_worker, collection_name
) -> None:
    make_collection(2000, 32)
    store.set_recall_target(collection=collection_name, target=0.999)
    worker = make_worker(tune_max_ef=20, tune_sample=20)
    assert worker.run_once() == 0
    c = store.get_collection(name=collection_name, fresh=True)
    assert c.recall_tuning is not None and not c.recall_tuning["reachable"]
    assert c.default_ef_search == 20


def test_cli_status_and_history_show_the_target_and_its_tuning(
    store, make_collection, collection_name, database_url, monkeypatch, capsys
) -> None:
    monkeypatch.setenv("MEMSTORE_DATABASE_URL", database_url)
    monkeypatch.setenv("MEMSTORE_MAINT_SMALL_INDEX_BYTES", "65536")
    get_settings.cache_clear()
    try:
        make_collection(1500, 16)
        store.set_recall_target(collection=collection_name, target=0.9)
        assert main(["status", "--collection", collection_name]) == 0
        assert "0.9 (not tuned yet)" in capsys.readouterr().out
        assert main(["run", "--once", "--json", "--collection", collection_name]) == 0
        outcomes = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        [tune] = [o for o in outcomes if o["decision"] == "tune"]
        ef = store.get_collection(name=collection_name, fresh=True).default_ef_search
        assert tune["outcome"] == "ok" and tune["after"]["ef_search"] == ef
        assert main(["status", "--json", "--collection", collection_name]) == 0
        [row] = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert row["recall_target"] == 0.9 and row["ef_search"] == ef and row["tuning"]["reachable"]
        assert main(["status", "--collection", collection_name]) == 0
        assert "0.9 ok" in capsys.readouterr().out
        assert main(["history", "--collection", collection_name]) == 0
        text = capsys.readouterr().out
        assert "tune" in text and f"ef_search 80 -> {ef}" in text
        # An unreachable target: the status says so and points at a denser graph.
        store.set_recall_target(collection=collection_name, target=0.9999)
        monkeypatch.setenv("MEMSTORE_MAINT_TUNE_MAX_EF", "10")
        assert main(["run", "--once", "--json", "--collection", collection_name]) == 0
        capsys.readouterr()
        assert main(["status", "--collection", collection_name]) == 0
        out = capsys.readouterr()
        assert "UNREACHABLE" in out.out and "denser graph" in out.err and "hnsw_m" in out.err
    finally:
        get_settings.cache_clear()


def test_one_tuning_of_a_collection_at_a_time(store, make_collection, make_worker, collection_name, conn) -> None:
    """Two workers tuning one collection would both write, the later over the earlier."""
    from maintenance.worker import tune_key

    make_collection(1000, 16)
    store.set_recall_target(collection=collection_name, target=0.9)
    c = store.get_collection(name=collection_name, fresh=True)
    worker = make_worker(tune_sample=20)
    conn.execute("SELECT pg_advisory_lock(hashtext(%s))", (tune_key(c.id),))
    try:
        held = worker.tune(c)
    finally:
        conn.execute("SELECT pg_advisory_unlock(hashtext(%s))", (tune_key(c.id),))
    assert held.outcome == "skipped" and "another worker" in (held.error or "")
    assert store.get_collection(name=collection_name, fresh=True).recall_tuning is None
    assert worker.tune(c).outcome == "ok"


@pytest.mark.parametrize("change", ["target", "ef_search"])
def test_a_target_or_ef_set_while_tuning_is_kept(
    store, make_collection, make_worker, collection_name, conn, monkeypatch, change
) -> None:
    """What the user sets while the ladder is measured is theirs: the tuning, measured for what was
    set before, writes nothing."""
    from maintenance.worker import MaintenanceWorker
    from memstore.catalog.registry import read_collection, set_default_ef_search

    make_collection(1000, 16)
    store.set_recall_target(collection=collection_name, target=0.9)
    c = store.get_collection(name=collection_name, fresh=True)
    measure = MaintenanceWorker._measure_ladder

    def meanwhile(self, *args, **kwargs):
        if change == "target":
            store.set_recall_target(collection=collection_name, target=0.5)
        else:
            set_default_ef_search(conn, read_collection(conn, id=c.id), 123)
        return measure(self, *args, **kwargs)

    monkeypatch.setattr(MaintenanceWorker, "_measure_ladder", meanwhile)
    outcome = make_worker(tune_sample=20).tune(c)
    after = store.get_collection(name=collection_name, fresh=True)
    assert outcome.outcome == "skipped" and "changed while tuning" in outcome.reason
    assert after.recall_tuning is None
    assert (after.recall_target, after.default_ef_search) == ((0.5, 80) if change == "target" else (0.9, 123))


def test_recall_probes_and_tunings_wait_for_the_latency_slo(store, make_collection, make_worker, collection_name, conn):
    """Their exact scans load the server as a VACUUM does: with searches over the SLO they wait for a
    later pass (the index's cheap signals still decide)."""
    make_collection(1000, 16)
    store.set_recall_target(collection=collection_name, target=0.9)
    worker = make_worker(tune_sample=20, latency_source=lambda: 10_000.0, slo_p99_ms=100.0)
    assert worker.run_once() == 0
    outcomes = {o.decision: o for o in worker.last_outcomes}
    assert outcomes["nothing"].before["recall"] is None
    assert outcomes["tune"].outcome == "skipped" and "SLO" in outcomes["tune"].reason
    c = store.get_collection(name=collection_name, fresh=True)
    assert c.recall_tuning is None and c.default_ef_search == 80
    row = conn.execute(
        "SELECT recall FROM memstore_maintenance_probes WHERE collection = %s ORDER BY id DESC LIMIT 1",
        (collection_name,),
    ).fetchone()
    assert row == (None,)


def test_the_reads_of_probes_and_tunings_have_a_statement_timeout(
    store, make_collection, make_worker, collection_name, monkeypatch
) -> None:
    """The worker's session has none (a REINDEX may take hours); an exact scan is bounded."""
    make_collection(1000, 16)
    store.set_recall_target(collection=collection_name, target=0.9)
    seen: list[str] = []
    answer = recall.core_exact_answers

    def answering(cur, **kwargs):
        row = cur.execute("SHOW statement_timeout").fetchone()
        seen.append(row[0])
        return answer(cur, **kwargs)

    monkeypatch.setattr(recall, "core_exact_answers", answering)
    worker = make_worker(tune_sample=20, probe_timeout_s=123)
    assert worker.run_once() == 0
    assert [o.outcome for o in worker.last_outcomes if o.decision == "tune"] == ["ok"]
    assert len(seen) >= 2 and set(seen) == {"123s"}  # the probe's and the tuning's
    shown = worker.session().execute("SHOW statement_timeout").fetchone()
    assert shown is not None and shown[0] == "0"


def test_a_pass_waits_for_the_slo_once_not_once_per_target(
    store, make_collection, make_worker, collection_name, monkeypatch
) -> None:
    """Searches over the SLO through a whole pass over three partitions: the first read waits its
    SLO_MAX_WAIT_S, the others only look (three waits in a row would delay the pass threefold)."""
    from maintenance import worker as worker_module

    make_collection(600, 16, partitions=3)
    store.set_recall_target(collection=collection_name, target=0.9)
    waits: list[int] = []
    wait = worker_module.wait_for_slo

    def counted(*args, **kwargs):
        waits.append(1)
        return wait(*args, **kwargs)

    monkeypatch.setattr(worker_module, "wait_for_slo", counted)
    worker = make_worker(tune_sample=20, latency_source=lambda: 10_000.0, slo_p99_ms=100.0, recall_interval_s=0)
    assert worker.run_once() == 0
    assert len(waits) == 1, waits
    assert worker.run_once() == 0  # a new pass waits again, once
    assert len(waits) == 2, waits
