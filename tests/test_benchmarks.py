"""The maintenance benchmarks run end to end on a small table (their figures are in the docs; here
only that they run, agree with themselves and report what their readers rely on)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]


def _run(module: str, database_url: str, *args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    env = os.environ | {"MEMSTORE_DATABASE_URL": database_url} | (env or {})
    done = subprocess.run(
        [sys.executable, "-m", module, "--json", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_churn_benchmark_runs_every_strategy(database_url: str, tmp_path: Path) -> None:
    plot = tmp_path / "churn.png"
    result = _run(
        "bench.churn",
        database_url,
        *("--rows", "1500", "--rounds", "2", "--queries", "30", "--fresh-builds", "2", "--plot", str(plot)),
    )
    strategies = result["strategies"]
    assert set(strategies) == {"none", "vacuum", "compact", "policy"}
    for s in strategies.values():
        assert len(s["recall"]) == 3 and len(s["index_bytes"]) == 3  # before, then after each round
        assert len(s["fresh_recalls"]) == 2 and s["fresh_recall"] == round(sum(s["fresh_recalls"]) / 2, 4)
        assert s["errors"] == 0, s["error_samples"]
    assert strategies["none"]["maint_seconds"] == 0 < strategies["vacuum"]["maint_seconds"]
    assert len(strategies["policy"]["decisions"]) == 2
    assert set(result["goals"]) == {
        "min_recall_policy>=0.95",
        "min_recall_policy>=fresh_recall-0.01",
        "cost_ratio_policy_vs_vacuum<=0.25",
        "size_ratio_policy_max<=1.1",
        "zero_errors",
    }
    assert result["cost_ratio_policy_vs_vacuum"] == round(
        strategies["policy"]["maint_seconds"] / strategies["vacuum"]["maint_seconds"], 4
    )
    assert plot.stat().st_size > 10_000


def test_churn_benchmark_with_a_recall_target(database_url: str, tmp_path: Path) -> None:
    """The policy's collection asks for recall 0.9: its ef is tuned on the users' samples, read on
    held-out queries every round, and set against the least fixed ef that held the target."""
    plot = tmp_path / "churn-target.png"
    result = _run(
        "bench.churn",
        database_url,
        *("--rows", "3000", "--rounds", "2", "--queries", "60", "--fresh-builds", "1", "--plot", str(plot)),
        *("--recall-target", "0.9", "--strategies", "vacuum,policy"),
    )
    assert set(result["strategies"]) == {"vacuum", "policy"}
    assert "target" not in result["strategies"]["vacuum"]  # the other strategies run as without a target
    t = result["recall_target"]
    assert t["target"] == 0.9 and t["floor"] == 0.89
    assert [r["round"] for r in t["rounds"]] == [1, 2]
    ladder_efs = t["ladder_efs"]
    per_round = result["strategies"]["policy"]["target"]["ladder"]
    for r, ladder in zip(t["rounds"], per_round[1:], strict=True):
        assert r["ef_search"] >= 1 and 0 <= r["recall"] <= 1
        assert r["holds"] == (r["recall"] >= 0.89)
        assert ladder[str(r["ef_search"])] == r["recall"]  # recall at the tuned ef, read with the ladder
        assert {int(e) for e in ladder} >= set(ladder_efs)
    # The first pass tunes the new target: a "tune" action, and the ef it set is the collection's.
    first = t["rounds"][0]["actions"]
    assert any(a["action"] == "tune" and a["outcome"] == "ok" for a in first)
    assert t["min_recall_tuned"] == min(r["recall"] for r in t["rounds"])
    # The fixed ef: the least ladder ef that reached the target at every round.
    if t["fixed_ef_holds"]:
        fixed = t["fixed_ef"]
        assert all(ladder[str(fixed)] >= 0.9 for ladder in per_round)
        assert all(any(ladder[str(e)] < 0.9 for ladder in per_round) for e in ladder_efs if e < fixed)
    timing = t["timing"]
    assert timing["tuned"]["ef"] == t["rounds"][-1]["ef_search"] and timing["fixed"]["ef"] == t["fixed_ef"]
    assert timing["tuned"]["search_qps"] > 0 and timing["fixed"]["search_qps"] > 0
    assert t["qps_ratio_tuned_vs_fixed"] == timing["qps_ratio_tuned_vs_fixed"] > 0
    # Held out: the worker tunes on the users' kept samples, which hold none of the recall queries.
    assert t["held_out"]["recall_queries_in_samples"] == 0 < t["held_out"]["user_queries_in_samples"]
    assert set(t["rebuild_rounds"]) <= {1, 2}
    assert t["back_to_back_rebuild"] == (t["rebuild_rounds"] == [1, 2])
    assert t["cost_ratio_policy_vs_vacuum"] == result["cost_ratio_policy_vs_vacuum"]
    assert set(t["goals"]) == {
        "recall_tuned>=target-0.01_every_round",
        "cost_ratio_policy_vs_vacuum<=0.15",
        "no_back_to_back_rebuild",
        "recall_queries_held_out",
    }
    assert plot.stat().st_size > 10_000


def test_churn_target_fixed_ef_and_back_to_back_rebuilds() -> None:
    """The fixed ef must hold the target at every round; a rebuild right after a rebuild is flagged."""
    from bench.churn_target import back_to_back, fixed_ef, rebuild_rounds, split_queries

    rounds = [{10: 0.93, 40: 0.96, 80: 0.98}, {10: 0.95, 40: 0.94, 80: 0.97}, {10: 0.96, 40: 0.955, 80: 0.97}]
    assert fixed_ef(rounds, 0.95) == 80  # 40 fell short in the second round
    assert fixed_ef(rounds, 0.94) == 40 and fixed_ef(rounds, 0.99) is None
    decisions = [["nothing:nothing"], ["rebuild:ok", "tune:ok"], ["rebuild:failed"], ["rebuild:ok"]]
    assert rebuild_rounds(decisions) == [2, 4] and not back_to_back([2, 4]) and back_to_back([2, 3])
    queries = np.arange(8, dtype=np.float32).reshape(4, 2)
    recall, users = split_queries(queries, 2, apart=True)
    assert recall.tolist() == queries[:2].tolist() and users.tolist() == queries[2:].tolist()
    recall, users = split_queries(queries, 10, apart=True)  # too few for both: half each
    assert len(recall) == len(users) == 2 and not set(map(tuple, recall.tolist())) & set(map(tuple, users.tolist()))
    assert split_queries(queries, 10, apart=False)[1] is queries


def test_bulk_benchmark_measures_live_scaling_and_the_crossover(database_url: str) -> None:
    result = _run("bench.bulk", database_url, "--rows", "600", "--extra", "200", "--fractions", "0.5,1.0")
    scaling = result["live_scaling"]
    assert set(scaling["rows_per_s"]) == {"1", "2", "4"} and all(v > 0 for v in scaling["rows_per_s"].values())
    assert scaling["ratio_to_one"]["1"] == 1.0
    assert [row["fraction"] for row in result["crossover"]] == [0.5, 1.0]
    assert all(row["live"] > 0 and row["rebuilt"] > 0 and row["speedup"] > 0 for row in result["crossover"])


def _run_on_its_own_server(module: str, *args: str) -> dict[str, Any]:
    """A benchmark that starts an embedded server of its own (under ``bench.databases.scratch_dir``)."""
    done = subprocess.run(
        [sys.executable, "-m", module, "--json", *args], cwd=REPO, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_space_layout_benchmark_measures_both_layouts() -> None:
    result = _run_on_its_own_server("bench.space_layout", "--rows", "600", "--queries", "20", "--rounds", "1")
    for layout in ("column", "side"):
        figures = result[layout]
        assert figures["rows_per_s"] > 0 and figures["search_qps"] > 0 and figures["first_index_growth"] >= 1.0
    assert result["side"]["first_index_growth"] == 1.0  # the side table never touches the first index


def test_recall_probe_benchmark_agrees_with_brute_force(database_url: str) -> None:
    result = _run("bench.recall_probe", database_url, "--rows", "3000", "--repeats", "1", "--queries", "5,20,80")
    for n in (5, 20, 80):
        figures = result[f"queries_{n}"]
        assert figures["same_answers"] is True
        assert figures["in_server_ms"] > 0 and figures["in_client_ms"] > 0
    assert result["queries_20"]["per_query_ms"] > 0 and "per_query_ms" not in result["queries_80"]
    assert result["stream_from"] > 20


def test_search_benchmark_finds_identifiers_with_hybrid_search(database_url: str) -> None:
    """Real sentence embeddings (all-MiniLM-L6-v2, offline) on the standard-library corpus: keywords
    rescue what the vectors blur, and fusion does not hurt queries in plain language. Quality only:
    the q/s figures depend on the machine and are not asserted."""
    result = _run(
        "bench.search",
        database_url,
        *("--database-url", database_url, "--queries", "80", "--rounds", "1"),
        *("--range-rows", "4000", "--range-queries", "10"),
    )
    assert result["corpus"] > 1500 and result["identifier_queries"] == 80
    assert result["hit_at_1_hybrid"] >= 0.95
    assert result["hit_at_1_hybrid"] >= result["hit_at_1_vector"] + 0.1
    assert result["mrr_hybrid_nl"] >= 0.95 * result["mrr_vector_nl"]
    assert result["filtered_k_ok"] is True, result["filtered_short"]
    assert result["hybrid_qps"] > 0 and result["vector_qps"] > 0
    # Under a 0.5% date range, with the typed index and without it, every search has its k rows.
    assert result["range_selectivity"] == 0.005 and result["range_short_answers"] == 0


def test_replica_benchmark_measures_the_lag_of_a_real_standby(database_url: str) -> None:
    if os.environ.get("MEMSTORE_TEST_DATABASE_URL"):
        pytest.skip("bench.replicas makes its standby of a server on this machine (the embedded test server)")
    result = _run("bench.replicas", database_url, "--only", "lag", "--n", "400", "--lag-batches", "6", "--batch", "50")
    lag = result["lag"]
    assert lag["batches"] == 6 and lag["batch"] == 50 and lag["rows_per_s"] > 0
    assert 0 < lag["lag_p50_ms"] <= lag["lag_p99_ms"] <= lag["lag_max_ms"]
    assert result["replica_lag_p99_ms"] == lag["lag_p99_ms"]
    assert result["search"] is None and result["replica_qps_ratio"] is None


def test_store_benchmark_reports_its_ratios_against_the_raw_limits(database_url: str) -> None:
    result = _run(
        "bench.store",
        database_url,
        *("--database-url", database_url, "--rows", "2000", "--queries", "40"),
        "--search-rounds",
        "1",
    )
    for key in ("ingest_ratio", "search_ratio", "search_pool_gain", "search_qps_store_statement_raw"):
        assert result[key] > 0
    assert result["ingest_rows_per_s_raw"] > 0 and result["search_qps_raw"] > 0
    assert result["recall_at_10"] >= 0.9  # 2,000 rows at ef_search 80: nearly exact


def test_systems_take_turns_of_whole_blocks_of_queries() -> None:
    """Each system runs a turn of queries back to back, the first system of each cycle rotates, and
    every system answers every query of every round once."""
    import numpy as np

    from bench.peers_measure import time_searches

    calls: list[tuple[str, int]] = []

    class Recorder:
        def __init__(self, name: str) -> None:
            self.name = name

        def search(self, query: np.ndarray) -> list[int]:
            calls.append((self.name, int(query[0])))
            return []

    queries = np.arange(10, dtype=np.float32).reshape(10, 1)
    timings = time_searches([Recorder("a"), Recorder("b")], queries, rounds=2, warmup=0, turn=4)
    assert [t.qps > 0 for t in timings] == [True, True]
    # round 1: turns of 4, 4 and the last 2 queries; the first system of each cycle rotates
    expected = [("a", range(0, 4)), ("b", range(0, 4)), ("b", range(4, 8)), ("a", range(4, 8))]
    expected += [("a", range(8, 10)), ("b", range(8, 10))]
    assert calls[:20] == [(name, q) for name, block in expected for q in block]
    assert calls[20] == ("b", 0)  # round 2 goes on rotating: its first cycle is the fourth
    for name in ("a", "b"):
        assert sorted(q for n, q in calls if n == name) == sorted(list(range(10)) * 2)
    with pytest.raises(ValueError, match="turn"):
        time_searches([Recorder("a")], queries, rounds=1, warmup=0, turn=0)


def test_peers_benchmark_measures_every_system_the_same_way(database_url: str) -> None:
    """Keys and recall only: how fast each system is depends on the machine."""
    from bench.peers import CORE
    from bench.peers_libs import OPTIONAL
    from memstore.settings import ApiSettings

    result = _run(
        "bench.peers",
        database_url,
        *("--database-url", database_url, "--rows", "1500", "--queries", "30", "--rounds", "1", "--turn", "7"),
    )
    assert result["turn"] == 7
    ratios = ("ingest_ratio_vs_raw_build", "search_ratio_vs_raw", "rest_search_ratio_vs_raw")
    for key in (*ratios, "rest_httpx_search_ratio_vs_raw"):
        assert isinstance(result[key], float) and result[key] > 0, key
    systems, skipped = result["systems"], result["skipped"]
    assert set(CORE) <= set(systems)
    assert set(systems) | set(skipped) == set(CORE) | set(OPTIONAL)  # each optional one measured or explained
    assert all(reason for reason in skipped.values())
    assert result["recall_after_cleanup"] == {name: row["recall_after_cleanup"] for name, row in systems.items()}
    for name, row in systems.items():
        assert row["ingest_rows_per_s"] > 0 and row["search_qps"] > 0, name
        assert row["p50_ms"] <= row["p99_ms"], name
        assert row["ef"] in result["ef_ladder"], name
        assert row["reached_target"] and row["recall"] >= 0.95, name  # 1,500 rows: the ladder reaches it
        assert 0 <= row["recall_after_churn"] <= 1 and 0 <= row["recall_after_cleanup"] <= 1, name
    # memstore's clean-up is its maintenance pass, raw pgvector's a REINDEX: both give back a whole graph.
    for name in CORE:
        assert systems[name]["recall_after_cleanup"] >= 0.95, name
    assert "maintenance pass" in systems["memstore_python"]["cleanup"]
    assert result["ratio_ef"] == systems["memstore_python"]["ef"]
    assert set(result["goals"]) >= {"ingest_ratio_vs_raw_build>=0.8", "search_ratio_vs_raw>=0.85"}
    assert result["rest_access_log"] == ApiSettings.model_fields["access_log"].default  # the server as it ships


def test_scale_reference_measures_the_same_rows_in_hnswlib(database_url: str) -> None:
    """The reference graph's recall per ef, on bench.scale's rows (hnswlib: the ``peers`` extra)."""
    pytest.importorskip("hnswlib", reason="bench.scale_reference needs hnswlib: pip install -e '.[peers]'")
    result = _run("bench.scale_reference", database_url, *("--sizes", "2000,3000", "--queries", "40"))
    assert result["system"] == "hnswlib" and result["hnsw"] == {"m": 16, "ef_construction": 64}
    assert [s["rows"] for s in result["sizes"]] == [2000, 3000]
    for size in result["sizes"]:
        recall = {int(ef): r for ef, r in size["recall_by_ef"].items()}
        assert all(0 <= r <= 1 for r in recall.values()) and size["build_s"] > 0
        assert recall[max(recall)] >= 0.95  # 3,000 rows at ef 800: nearly exact
        assert size["ef_for_goal"] == min(ef for ef, r in recall.items() if r >= 0.95)
        assert 0 <= size["queries_below_half_at_top_ef"] <= 1


def test_scale_benchmark_reports_every_figure_per_size(database_url: str, tmp_path: Path) -> None:
    """Two tiny sizes: every figure the curves and docs/scale.md read is there and sane (not how fast)."""
    plot = tmp_path / "scale.png"
    result = _run(
        "bench.scale",
        database_url,
        *("--database-url", database_url, "--sizes", "2000,3000", "--queries", "60", "--search-rounds", "1"),
        *("--plot", str(plot), "--ef-construction", "48"),
    )
    assert result["hnsw"] == {"m": 16, "ef_construction": 48}
    assert [s["rows"] for s in result["sizes"]] == [2000, 3000]
    assert all(size["hnsw"] == {"m": 16, "ef_construction": 48} for size in result["sizes"])  # the collections
    for size in result["sizes"]:
        assert size["recall_at_10"] >= 0.95
        assert size["recall_by_ef"][str(size["ef_search"])] == size["recall_at_10"]
        # The lowest ef_search that reaches the goal: every smaller one tried fell short.
        assert all(r < 0.95 for ef, r in size["recall_by_ef"].items() if int(ef) < size["ef_search"])
        for key in ("ingest_rows_per_s", "ingest_rows_per_s_raw_copy", "build_s", "reference_build_s", "search_qps"):
            assert size[key] > 0, key
        assert 0 < size["search_p50_ms"] <= size["search_p99_ms"]
        at_default = size["at_default_ef"]
        assert at_default["recall_at_10"] >= 0.9 and 0 < at_default["search_p50_ms"] <= at_default["search_p99_ms"]
        assert size["index_bytes_per_row"] == round(size["index_bytes"] / size["rows"], 2)
        # An HNSW graph of 128-d vectors holds each vector (512 bytes) plus its neighbour lists.
        assert 512 < size["index_bytes_per_row"] < 4096
        maint = size["maintenance"]
        assert maint["vacuum_s"] > 0 and maint["policy_s"] > 0
        # The ratio of the unrounded seconds; the reported seconds are rounded to the millisecond.
        assert maint["cost"] == pytest.approx(maint["policy_s"] / maint["vacuum_s"], rel=0.02, abs=2e-3)
        assert maint["recall_after_policy"] >= 0.9
    assert set(result["exponents"]) >= {"ingest_rows_per_s", "build_s", "index_bytes_per_row", "search_p99_ms"}
    assert abs(result["exponents"]["index_bytes_per_row"]) < 0.2  # bytes per row do not grow with rows
    assert set(result["goals"]) == {
        "index_bytes_per_row_spread<=1.10",
        "search_p99_growth<=2.5",
        "policy_cost<=0.25",
    }
    assert plot.stat().st_size > 10_000


def test_reembed_benchmark_fills_a_second_space_under_a_search_stream(database_url: str) -> None:
    """Two rounds on 64 small images: every figure is there and sane, every item has exactly one vector
    in the activated space, nothing failed (how fast is not asserted)."""
    result = _run(
        "bench.reembed",
        database_url,
        *("--database-url", database_url, "--images", "64", "--largest", "640", "--batch-size", "16"),
        *("--rounds", "2", "--baseline-s", "2", "--search-rate", "20"),
    )
    assert result["images"] == 64 and result["rounds"] == 2 and len(result["per_round"]) == 2
    assert [r["space"] for r in result["per_round"]] == ["wide1", "wide2"] and result["activated"] == "wide2"
    for r in result["per_round"]:
        assert r["encoder_images_per_s"] > 0 and r["reembed_items_per_s"] > 0
        assert 0 < r["reembed_s"] <= r["ready_s"]
        assert r["reembed_per_s_ratio"] == pytest.approx(r["reembed_items_per_s"] / r["encoder_images_per_s"], rel=0.01)
        for window in ("search_before", "search_during"):
            assert r[window]["searches"] > 0 and r[window]["failed"] == 0
            assert 0 < r[window]["p50_ms"] <= r[window]["p99_ms"]
        assert r["search_p99_ratio_during"] > 0
    assert result["reembed_per_s_ratio"] > 0 and result["search_p99_ratio_during"] > 0
    # The default space's 64 vectors, then 64 per round; none failed, none left queued.
    assert result["vectors_written_by_workers"] == 64 * 3
    assert result["errors"] == 0 and result["failed_queue_rows"] == 0 and result["pending_queue_rows"] == 0
    assert result["after_activation"] == {
        "items": 64,
        "side_rows": 64,
        "duplicates": 0,
        "items_without_vector": 0,
        "exactly_one_vector": True,
    }
    assert result["exactly_one_vector"] is True
    assert set(result["goals"]) == {
        "reembed_per_s_ratio>=0.8",
        "search_p99_ratio_during<=2",
        "errors==0",
        "exactly_one_vector",
    }
    assert result["goals_met"] == all(result["goals"].values())


def test_buffers_benchmark_starts_the_server_with_each_size() -> None:
    """Each size is what the server really ran with (its own child process, its own start)."""
    sizes = ("--sizes=128MB,256MB", "--ef=40", "--rounds=1", "--passes=1")
    done = subprocess.run(
        [sys.executable, "-m", "bench.buffers", "--json", "--rows=2000", "--queries=20", *sizes],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert [run["shared_buffers"] for size in ("128MB", "256MB") for run in result["runs"][size]] == ["128MB", "256MB"]
    assert result["index_bytes"] > 0 and result["build_s"] >= 0
    for size in ("128MB", "256MB"):
        figures = result["summary"][size]["40"]
        assert 0 < figures["p50_ms"] <= figures["p99_ms"]
    assert result["summary"]["128MB"]["40"]["ratio_vs_first"] == 1.0


def test_scale_plot_draws_a_run_without_maintenance(tmp_path: Path) -> None:
    """A --no-maintenance run has no maintenance figures: its plot still draws (an empty log-scaled
    panel used to raise after the whole run), and the search that never reached the recall goal at the
    largest size is left out of the curve rather than failing it."""
    from bench.scale_report import fit_and_check, plot

    def size(rows: int, ef: int | None, p99: float | None) -> dict[str, Any]:
        search = {"search_qps": 500.0, "search_p50_ms": 1.0, "search_p99_ms": p99} if p99 else {}
        return {
            "rows": rows,
            "ingest_rows_per_s": 20_000.0,
            "ingest_rows_per_s_raw_copy": 30_000.0,
            "build_s": rows / 5000,
            "index_bytes": rows * 832,
            "index_bytes_per_row": 832.0,
            "ef_search": ef,
            "recall_at_10": 0.96 if ef else None,
            **search,
            "at_default_ef": {"ef_search": 80, "recall_at_10": 0.9, "search_p50_ms": 2.0, "search_p99_ms": 3.0},
        }

    rows = [size(10_000, 10, 1.0), size(100_000, 80, 3.5), size(1_000_000, None, None)]
    result = {"dataset": "synthetic-128d-clustered", "k": 10, "sizes": rows, **fit_and_check(rows)}
    out = plot(result, tmp_path / "scale.png")
    assert out.stat().st_size > 10_000


def test_build_settings_benchmark_builds_every_variant(database_url: str) -> None:
    """Every variant is built and searched as often as asked; on 1,500 rows each graph is nearly exact."""
    result = _run(
        "bench.build_settings", database_url, "--database-url", database_url, "--rows", "1500", "--queries", "20"
    )
    variants = result["variants"]
    assert set(variants) == {"workers_0", "workers_1", "workers_2", "workers_3", "concurrently", "inner_product"}
    assert variants["inner_product"]["opclass"] == "vector_ip_ops" and variants["concurrently"]["concurrently"]
    for name, v in variants.items():
        assert len(v["build_s"]) == len(v["recall"]) == len(v["qps"]) == result["repeat"] == 2, name
        assert all(s > 0 for s in v["build_s"]) and all(q > 0 for q in v["qps"]), name
        assert min(v["recall"]) >= 0.9, name


def test_cost_benchmark_serves_another_tenant_while_searches_are_abandoned_and_bombs_sent(database_url: str) -> None:
    result = _run(
        "bench.cost",
        database_url,
        *("--database-url", database_url, "--texts", "60", "--chars", "3000", "--runs", "3", "--abandoned", "3"),
        *("--images", "--bombs", "2"),
    )
    assert result["texts"] == 60 and result["abandoned"] == 3
    # Two scan bombs refused from their markers, two slow images taken, another key's image ready.
    assert result["bombs_refused"] == 2 and result["bomb_statuses"] == {"413": 2, "202": 2}
    assert result["other_image_ready"] is True
    assert result["keyword_p50_s"] > 0 and result["keyword_p50_parsed_s"] > 0
    assert result["abandoned_still_running"] == 0
    assert set(result["statuses"]) == {"200"} and result["statuses"]["200"] > 0


def test_api_benchmark_measures_the_client_beside_plain_httpx(database_url: str) -> None:
    result = _run(
        "bench.api",
        database_url,
        *("--database-url", database_url, "--only", "search", "--n", "1500", "--dims", "32", "--seconds", "1"),
        *("--rounds", "2", "--client-seconds", "2", "--client-batch", "100", "--concurrency", "2"),
        *("--servers", "serve,log-on,log-off,asyncio-h11"),
    )
    assert result["ingest_images_per_s_ratio"] is None
    for name in ("search_qps_ratio", "client_search_ratio", "client_upload_ratio"):
        assert result[name] > 0, name
    servers = result["search"]["servers"]
    assert list(servers) == ["serve", "log-on", "log-off", "asyncio-h11"]
    assert result["search_qps_ratio"] == servers["serve"]["ratio"]
    assert all(s["api_qps"] > 0 and s["server_cpu_ms_per_search"] > 0 for s in servers.values()), servers
    assert result["client"]["search_per_s_client"] > 0 and result["client"]["upload_per_s_httpx"] > 0


def test_recall_target_benchmark_tunes_to_each_target_on_held_out_queries(database_url: str) -> None:
    result = _run(
        "bench.recall_target",
        database_url,
        *("--sizes", "2000", "--targets", "0.9", "--tune-sample", "50"),
    )
    [size] = result["sizes"]
    assert size["rows"] == 2000
    # Loaded as a user loads a set, into the graph a collection of its size gets (the default one).
    assert (size["graph"]["hnsw_m"], size["graph"]["hnsw_ef_construction"]) == (16, 64)
    [target] = size["targets"]
    assert target["held_out_recall"] is not None and target["held_out_recall"] >= 0.89
    assert target["recall_ok"] is True
    assert 0 < size["default_ef_recall"] <= 1
    timing = target["timing"]
    assert timing["tuned"]["ef"] == target["ef"] and timing["fixed"]["ef"] == size["default_ef"] == 80
    assert timing["tuned"]["p99_ms"] >= timing["tuned"]["p50_ms"] > 0


def test_segment_cost_benchmark_times_each_part_of_a_segmented_search(database_url: str) -> None:
    """Three graphs and a tail: the store's statement (at the ef and at the ef it walks each graph at),
    its graphs alone, its tail alone and one graph of the same rows are timed at each ef; on 1,800
    rows every answer is nearly exact."""
    result = _run(
        "bench.segment_cost",
        database_url,
        *("--database-url", database_url, "--rows", "1800", "--graphs", "3", "--tail", "300", "--dim", "16"),
        *("--queries", "30", "--rounds", "1", "--efs", "10,40"),
    )
    assert result["graphs_built"] == 3
    for ef in ("10", "40"):
        row = result[ef]
        assert set(row) == {"segmented", "as_searched", "graphs", "tail", "one_graph"}
        assert all(part["p99_ms"] >= part["p50_ms"] > 0 for part in row.values()), row
        assert all(row[s]["recall_at_10"] >= 0.9 for s in ("segmented", "as_searched", "one_graph")), row
    # Three graphs of 500 rows: each walked at the ef of a third of the rows, never under k.
    assert result["10"]["as_searched"]["walk_ef"] == 10
    assert result["40"]["as_searched"]["walk_ef"] == 24  # ceil(40 * sqrt(1/3))
    assert result["tail_us_per_row_p50"] > 0


def test_stream_benchmark_measures_every_write_path(database_url: str, tmp_path: Path) -> None:
    """Every write path runs on the same rows; on 6,000 rows each graph is nearly exact, and the
    watermark's search plans its partial index (a segment of 2,000 rows may be scanned instead: the
    planner's choice, which the JSON reports). The segmented streams end with every row in a graph
    and one graph after the merge, through the Python API and REST alike."""
    plot = tmp_path / "stream.png"
    result = _run(
        "bench.stream",
        database_url,
        *("--database-url", database_url, "--rows", "6000", "--dim", "48", "--batch", "1000", "--queries", "30"),
        *("--batches", "1000,3000", "--rest-batch", "1000", "--designs", "--peers", "chroma,lancedb,qdrant_local"),
        *("--latency-queries", "30", "--builds", "2", "--min-seal", "2000", "--plot", str(plot)),
    )
    options = result["options"]
    for name in ("segments_python_1000", "segments_python_3000", "segments_rest_1000"):
        o = options.pop(name)
        assert o["seconds"] >= o["acked_s"] > 0, name
        assert o["graphs_at_end"] >= 1 and o["merged"] is not None, name
        assert o["recall_after_merge"]["80"] >= 0.9 and o["recall_at_10"]["80"] >= 0.9, name
        assert o["search_during_stream"]["searches"] > 0 and o["search_after"]["searches"] >= 400, name
        quiet = o["quiet_collection"]  # searched in turns with the stream's collection, as many times
        assert quiet["search_during_stream"]["searches"] == o["search_during_stream"]["searches"], name
        assert quiet["search_after"]["searches"] == o["search_after"]["searches"], name
    # The peers' streams where they import (the peers extra), else skipped with the reason.
    for peer in ("chroma", "lancedb", "qdrant_local"):
        for batch in (1000, 3000):
            o = options.pop(f"peer_{peer}_{batch}")
            if "skipped" in o:
                assert "does not import" in o["skipped"], o
                continue
            assert o["rows_per_s"] > 0 and o["seconds"] >= o["acked_s"] > 0, o
            assert o["recall_at_10"] and max(o["recall_at_10"].values()) >= 0.9, o
            assert o["search_after"]["searches"] >= 400, o
    assert options["copy_build_parallel"]["recall_at_10"]["80"] >= 0.9
    assert set(options) == {
        "copy_build_parallel",
        "copy_build_serial",
        "memstore_upsert",
        "memstore_reindexed",
        "live_copy_given",
        "live_copy_shuffled",
        "live_copy_clustered",
        "watermark_0.25",
        "segments_0.25",
        "watermark_1",
        "segments_1",
    }
    assert options["copy_build_parallel"]["ratio_vs_copy_build"] == 1.0
    assert len(options["copy_build_serial"]["builds"]) == 2
    assert all(b["workers_seen"] == 0 for b in options["copy_build_serial"]["builds"])
    for name, o in options.items():
        assert o["rows_per_s"] > 0 and o["recall_at_10"]["40"] <= 1.0, name
        assert o["recall_at_10"]["80"] >= 0.9, name
    for name in ("watermark_0.25", "segments_0.25", "watermark_1", "segments_1"):
        o = options[name]
        assert o["indexed"]["rows_per_s"] <= o["rows_per_s"]
        assert isinstance(o["latency_no_tail"]["plan_uses_partial_indexes"], bool), name
        assert o["latency_no_tail"]["plan_uses_partial_indexes"] or name.startswith("segments"), name
        assert o["rows_built"] >= result["rows"]
    assert options["segments_1"]["rows_built"] == result["rows"]  # each row in one segment's build
    assert plot.stat().st_size > 10_000


def test_build_priority_benchmark_times_searches_during_builds_in_each_mode() -> None:
    small = ("--rows", "3000", "--dims", "16", "--queries", "20", "--rounds", "1", "--idle-s", "0.5")
    modes = "parallel,nice_10,sched_idle,background" if hasattr(os, "SCHED_IDLE") else "parallel,nice_10,background"
    result = _run_on_its_own_server("bench.build_priority", *small, "--modes", modes, "--workers", "2")
    assert set(result["summary"]) == {"idle", *modes.split(",")}
    for mode, runs in result["runs"].items():
        assert runs and all(r["searches"] > 0 and r["p99_ms"] >= r["p50_ms"] > 0 for r in runs), mode
    assert result["runs"]["nice_10"][0]["backend_nice"] == 10  # the embedded server is this machine's own
    assert result["runs"]["parallel"][0]["backend_nice"] < 10
    assert result["summary"]["nice_10"]["build_s"] > 0
    assert result["runs"]["parallel"][0]["workers"] == 2
    assert result["runs"]["background"][0]["workers"] == min(2, max(0, result["cores"] - 2))
    if sys.platform == "linux":  # the run queue's waits are read from /proc
        assert result["summary"]["parallel"]["slowest_1pct_backend_run_queue_ms"] is not None


@pytest.mark.parametrize("background", ["reembed", "ingest", "ocr"])
def test_foreground_benchmark_runs_each_background_under_the_search_stream(
    background: str, database_url: str, tmp_path: Path
) -> None:
    """A short run of each background kind: every phase measured, the background kept going (a count
    of units done that only grows), no search failed, and the plot drawn."""
    if background == "ocr" and shutil.which("tesseract") is None:
        pytest.fail("tesseract is not installed (apt-get install tesseract-ocr tesseract-ocr-eng)", pytrace=False)
    plot = tmp_path / "foreground.png"
    result = _run(
        "bench.foreground",
        database_url,
        *("--database-url", database_url, "--background", background, "--images", "8", "--round", "6"),
        *("--largest", "400", "--phases", "2", "--phase-s", "3", "--idle-s", "1.5", "--plot", str(plot)),
    )
    assert result["background"] == background
    assert result["round"] == (None if background == "reembed" else 6)
    assert [p["mode"] for p in result["phases"]] == ["off", "on"]
    assert result["failed_searches"] == 0
    assert result["idle_before"]["searches"] > 0 and result["idle_before"]["p99_ms"] > 0
    done = [point["done"] for point in result["share_trace"]]
    assert done == sorted(done) and done[-1] > 0  # a count that only grows, and work was done
    assert result["work_started"] >= 1 and result["search_windows"]
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_foreground_benchmark_with_the_workers_in_a_process_of_their_own(database_url: str) -> None:
    """``--split``: re-embedding done by a ``memstore worker`` process (its spaces' vectors counted in
    the database), following the share the searching process publishes."""
    result = _run(
        "bench.foreground",
        database_url,
        *("--database-url", database_url, "--background", "reembed", "--images", "8", "--split"),
        *("--largest", "400", "--phases", "2", "--phase-s", "3", "--idle-s", "1.5"),
        # nice 10, not the worker's default idle priority: another test process may keep every core busy
        env={"MEMSTORE_INGEST_CPU_PRIORITY": "low"},
    )
    assert result["layout"] == "split"
    # Stopped while the searching process still published a share of zero: it exits cleanly at once.
    assert result["worker_exit"] == 0
    assert [p["mode"] for p in result["phases"]] == ["off", "on"]
    assert result["failed_searches"] == 0
    done = [point["done"] for point in result["share_trace"]]
    assert done == sorted(done) and done[-1] > 0  # the other process re-embedded


def test_gc_pause_benchmark_times_full_collections_before_and_after_the_freeze() -> None:
    """Shape and counts only: almost every object the loaded process tracks is frozen (how long a
    collection takes is the benchmark's figure, not a test's)."""
    done = subprocess.run(
        [sys.executable, "-m", "bench.gc_pause", "--json", "--rounds", "2"],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["tracked_objects"] > 100_000  # torch and the model
    assert result["frozen_objects"] >= 0.9 * result["tracked_objects"]
    assert len(result["full_collection_ms_before"]) == len(result["full_collection_ms_after"]) == 2


def test_encoder_benchmark_with_a_model_that_costs_nothing(database_url: str, tmp_path: Path) -> None:
    """`--model instant`: the engine's own ceiling (preparing images bounds it, as on a GPU host)."""
    plot = tmp_path / "encoder.png"
    r = _run(
        "bench.encoder",
        database_url,
        *("--model", "instant", "--duration", "1", "--repeat", "1", "--large", "4", "--plot", str(plot)),
    )
    assert r["model"] == "instant" and r["batch_invariant"] is True and r["repeats"] == 1
    assert r["burst_tiles_per_image"] == 64 and r["preprocess_workers"] == 2
    assert r["small_p99_unloaded_ms"] > 0 and r["small_p99_burst_sched_ms"] > 0
    assert r["burst_units_per_s_sched"] > 0 and r["small_capacity_per_s"] > 0
    assert isinstance(r["gc_full_collections"], int) and r["gc_pause_ms_max"] >= 0
    # Strict JSON: a figure no repetition measured (the model never saturated) is null, never NaN.
    assert r["throughput_ratio"] is None or r["throughput_ratio"] >= 0
    assert all(rep["ratio"] is None or rep["ratio"] >= 0 for rep in r["per_repeat"])
    assert plot.stat().st_size > 0


def test_rest_cost_benchmark_measures_every_layer(database_url: str) -> None:
    """Shape only (the figures are the benchmark's): every layer measured, and what each adds."""
    r = _run("bench.rest_cost", database_url, *("--database-url", database_url, "--rows", "500", "--calls", "100"))
    layers = r["layers"]
    assert set(layers) == {"cursor", "statement", "execute", "fast_path", "front", "server", "http_floor"}
    assert all(figures["cpu_ms"] > 0 and figures["wall_ms"] > 0 for figures in layers.values())
    assert len(r["added_ms"]) == 4 and r["server_cpu_ms_per_search"] == layers["server"]["cpu_ms"]
    assert r["statement_share_of_server_cpu"] > 0
    assert r["direct_fetch_saves_ms"] == round(layers["cursor"]["cpu_ms"] - layers["statement"]["cpu_ms"], 4)
