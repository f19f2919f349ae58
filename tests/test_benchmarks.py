"""The maintenance benchmarks run end to end on a small table (their figures are in the docs; here
only that they run, agree with themselves and report what their readers rely on)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]


def _run(module: str, database_url: str, *args: str) -> dict[str, Any]:
    env = os.environ | {"MEMSTORE_DATABASE_URL": database_url}
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


def test_recall_probe_benchmark_agrees_with_brute_force(database_url: str) -> None:
    result = _run("bench.recall_probe", database_url, "--rows", "3000", "--repeats", "1")
    for n in (5, 20):
        figures = result[f"queries_{n}"]
        assert figures["same_answers"] is True
        assert figures["per_query_ms"] > 0 and figures["one_scan_ms"] > 0


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


def test_scale_benchmark_reports_every_figure_per_size(database_url: str, tmp_path: Path) -> None:
    """Two tiny sizes: every figure the curves and docs/scale.md read is there and sane (not how fast)."""
    plot = tmp_path / "scale.png"
    result = _run(
        "bench.scale",
        database_url,
        *("--database-url", database_url, "--sizes", "2000,3000", "--queries", "60", "--search-rounds", "1"),
        *("--plot", str(plot)),
    )
    assert [s["rows"] for s in result["sizes"]] == [2000, 3000]
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
