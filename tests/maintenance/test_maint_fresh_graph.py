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
