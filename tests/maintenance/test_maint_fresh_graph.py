"""The worker with a recall target: a fresh graph is not rebuilt again on a reading within the sample's error."""

from __future__ import annotations

from maintenance import history
from tests.maintenance.maint_helpers import churn


def test_a_rebuilt_graph_is_not_rebuilt_back_to_back_and_its_fresh_ladder_is_kept(
    store, make_collection, make_worker, collection_name, conn
) -> None:
    c = make_collection(3000, 32)
    store.set_recall_target(collection=collection_name, target=0.95)
    worker = make_worker(tune_sample=40, recall_churn_fraction=0.01)
    [target] = worker.targets(worker.session())
    assert worker.act(target, "rebuild", reason="test").outcome == "ok"
    assert worker.tune(c, rebuilt=True).outcome == "ok"
    tuning = store.get_collection(name=collection_name, fresh=True).recall_tuning
    assert tuning is not None and tuning["fresh"]["rebuilt"] and tuning["fresh"]["ef"] == tuning["ef"]
    assert tuning["k"] == 10 and tuning["search_ms"] and all(ms > 0 for _, ms in tuning["search_ms"])
    # A round of churn (2%), as bench.churn's: the passes that follow measure recall and decide on it.
    for seed in (1, 2):
        churn(conn, c, update=0.02, seed=seed)
        assert worker.run_once() == 0
        assert any(o.before.get("recall") is not None for o in worker.last_outcomes), worker.last_outcomes
        assert not [o for o in worker.last_outcomes if o.decision == "rebuild"], worker.last_outcomes
    rebuilds = [r for r in history.list_actions(conn, collection=collection_name) if r["action"] == "rebuild"]
    assert len(rebuilds) == 1
    kept = store.get_collection(name=collection_name, fresh=True).recall_tuning
    assert kept is not None and kept["fresh"]["measured_at"] == tuning["fresh"]["measured_at"]


def test_churn_before_a_rebuild_does_not_count_against_the_graph_it_built(
    store, make_collection, make_worker, collection_name, conn
) -> None:
    """A rebuild measures the recall of the graph it built: that reading is the one the next
    measurement's churn counts from. Counted from the probe before the rebuild instead, the churn
    the rebuild had wiped out made the next pass measure recall, and re-tune the target, on a
    nearly unchanged graph (seen in bench.churn: a 1,000-query tuning in the pass after the one
    that rebuilt and tuned)."""
    c = make_collection(3000, 32)
    store.set_recall_target(collection=collection_name, target=0.95)
    # Recall is measured again once index entries made and killed reach 10% of the rows (an update
    # of 1% of the rows makes and kills 2%).
    worker = make_worker(tune_sample=40, recall_churn_fraction=0.1)
    assert worker.run_once() == 0  # a probe that measures recall, and the target's first tuning
    assert any(o.before.get("recall") is not None for o in worker.last_outcomes), worker.last_outcomes
    churn(conn, c, update=0.04, seed=1)  # 8%: not due
    [target] = worker.targets(worker.session())
    rebuilt = worker.act(target, "rebuild", reason="test")
    assert rebuilt.outcome == "ok" and rebuilt.after.get("recall") is not None
    assert worker.tune(c, rebuilt=True).outcome == "ok"
    churn(conn, c, update=0.02, seed=2)  # 4% since the rebuild, 12% since the first probe
    assert worker.run_once() == 0
    assert worker.last_outcomes and all(o.before.get("recall") is None for o in worker.last_outcomes)
    assert not [o for o in worker.last_outcomes if o.decision == "tune"], worker.last_outcomes
    churn(conn, c, update=0.04, seed=3)  # 12% since the rebuild: due
    assert worker.run_once() == 0
    assert any(o.before.get("recall") is not None for o in worker.last_outcomes), worker.last_outcomes
