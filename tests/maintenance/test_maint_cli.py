"""``memstore-maint`` end to end: JSON output, exit codes, history, the plot, SIGTERM on the daemon."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from maintenance.cli import main
from memstore.catalog.collections import Collection
from memstore.settings import Settings, get_settings
from memstore.store import VectorStore
from tests.maintenance.maint_helpers import churn


@pytest.fixture
def cli_env(monkeypatch: pytest.MonkeyPatch, database_url: str) -> dict[str, str]:
    monkeypatch.setenv("MEMSTORE_DATABASE_URL", database_url)
    monkeypatch.setenv("MEMSTORE_MAINT_SMALL_INDEX_BYTES", "65536")
    get_settings.cache_clear()
    yield {"MEMSTORE_DATABASE_URL": database_url}
    get_settings.cache_clear()


def _json_out(capsys: pytest.CaptureFixture[str]) -> Any:
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_status_probe_run_history_report(
    cli_env: dict[str, str],
    conn: psycopg.Connection[Any],
    make_collection: Callable[..., Collection],
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    c = make_collection(1200, 8)
    churn(conn, c, update=0.25)
    assert main(["status", "--json", "--collection", c.name]) == 0
    [row] = _json_out(capsys)
    assert row["table"] == c.table_name and row["recommendation"] == "rebuild" and row["dead_entries"] == 300

    assert main(["probe", "--json", "--collection", c.name]) == 0
    [row] = _json_out(capsys)
    assert row["recall"] is not None and row["recall_queries"] > 0

    assert main(["run", "--once", "--json", "--collection", c.name]) == 0
    [outcome] = _json_out(capsys)
    assert outcome["decision"] == "rebuild" and outcome["outcome"] == "ok"

    assert main(["status", "--collection", c.name]) == 0
    text = capsys.readouterr().out
    assert c.table_name in text and "rebuild ok" in text

    assert main(["history", "--json", "--collection", c.name]) == 0
    actions = _json_out(capsys)
    assert [a["action"] for a in actions][:2] == ["rebuild", "own_index_cleanup"]
    assert main(["history", "--probes", "--json", "--collection", c.name]) == 0
    assert len(_json_out(capsys)) >= 2
    assert main(["history", "--collection", c.name]) == 0
    text = capsys.readouterr().out
    durations = [line.split()[6:8] for line in text.splitlines()[1:]]  # "0.21 s", "3.4 ms", "1 min 05 s"...
    assert durations and all(unit in ("s", "ms", "min", "h") for _, unit in durations), text
    assert not re.search(r"\d\.\d{6,}", text), "raw floats in the table: " + text

    png = tmp_path / "report.png"
    assert main(["report", "--plot", str(png), "--collection", c.name]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    assert main(["vacuum", "--json", "--collection", c.name]) == 0
    assert _json_out(capsys)[0]["outcome"] == "ok"

    assert main(["compact", "--json", "--collection", c.name]) == 0  # the old name of rebuild, for a release
    captured = capsys.readouterr()
    assert "now called 'rebuild'" in captured.err
    assert json.loads(captured.out.strip().splitlines()[-1])[0]["decision"] == "rebuild"


def test_failures_exit_non_zero(cli_env: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "--collection", "no_such_collection"]) == 1
    assert "no_such_collection" in capsys.readouterr().err
    assert main(["status", "--database-url", "postgresql://nobody@127.0.0.1:1/none"]) == 1


def test_daemon_stops_cleanly_on_sigterm(
    cli_env: dict[str, str], conn: psycopg.Connection[Any], make_collection: Callable[..., Collection]
) -> None:
    c = make_collection(300, 8)
    env = os.environ | cli_env
    proc = subprocess.Popen(
        [sys.executable, "-m", "maintenance.cli", "daemon", "--interval", "0.5", "--collection", c.name],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=Path(__file__).resolve().parents[2],
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            n = conn.execute("SELECT count(*) FROM memstore_maintenance_probes WHERE collection = %s", (c.name,))
            row = n.fetchone()
            if row and row[0] >= 2:  # at least two passes ran
                break
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            time.sleep(0.2)
        else:
            raise AssertionError("the daemon recorded no probes")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.0030741650000436493, "3.1 ms"),
        (0.84, "0.84 s"),
        (12.34, "12.3 s"),
        (65.2, "1 min 05 s"),
        (7380, "2 h 03 min"),
    ],
)
def test_durations_are_formatted_for_people(seconds: float, text: str) -> None:
    from maintenance.display import format_duration

    assert format_duration(seconds) == text


def test_status_says_when_the_indexes_outgrow_the_buffer_cache(
    cli_env: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    """On a server whose shared_buffers (1MB) hold less than its HNSW indexes, status says so on stderr
    and its JSON stays whole; on the test server (auto: far above these small indexes) it says nothing."""
    from memstore.db import migrate
    from memstore.db.core import create_engine
    from memstore.db.embedded import start_embedded_server
    from memstore.models import ItemIn
    from memstore.store import VectorStore
    from tests.maintenance.maint_helpers import clustered

    assert main(["status", "--json"]) == 0
    assert "shared_buffers" not in capsys.readouterr().err

    url = start_embedded_server(
        tmp_path, maintenance_work_mem="64MB", max_parallel_maintenance_workers=1, shared_buffers="1MB"
    )
    migrate.upgrade(url)
    engine = create_engine(url)
    try:
        store = VectorStore(engine, settings=Settings(database_url=url))
        store.create_collection(name="outgrown", dimensions=128)
        vectors = clustered(3000, 128, seed=1)
        store.upsert_items(
            collection="outgrown", items=[ItemIn(external_id=str(i), vector=v.tolist()) for i, v in enumerate(vectors)]
        )
    finally:
        engine.dispose()
    monkeypatch.setenv("MEMSTORE_DATABASE_URL", url)
    get_settings.cache_clear()
    assert main(["status", "--json"]) == 0
    captured = capsys.readouterr()
    assert [row["collection"] for row in json.loads(captured.out.strip().splitlines()[-1])] == ["outgrown"]
    assert "more than the server's shared_buffers (1.0MB)" in captured.err
    assert "MEMSTORE_EMBEDDED_SHARED_BUFFERS" in captured.err


def test_status_advises_a_denser_graph_when_even_a_fresh_build_misses_the_recall_floor() -> None:
    from maintenance.cli import sparse_graph_note

    note = sparse_graph_note("photos", 0.858, 0.95)
    assert note is not None and "photos" in note and "0.858" in note and "hnsw_ef_construction" in note
    assert sparse_graph_note("photos", 0.97, 0.95) is None  # a rebuild restores what the graph can give
    assert sparse_graph_note("photos", None, 0.95) is None  # never rebuilt: nothing known yet


def test_an_action_refuses_a_partition_that_does_not_exist(
    cli_env: dict[str, str],
    store: VectorStore,
    make_collection: Callable[..., Collection],
    collection_name: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Acting on no index would print an empty table and exit 0, like a success: a partition that does
    not exist is a usage error naming the ones that do."""
    c = make_collection(200, 8, partitions=2)
    for n in ("2", "-1"):
        assert main(["vacuum", "--json", "--collection", c.name, "--partition", n]) == 2
        captured = capsys.readouterr()
        assert captured.out == "" and f"no partition {n}: {c.name} has partitions 0 to 1" in captured.err, captured.err
    plain = f"{collection_name}_plain"
    store.create_collection(name=plain, dimensions=8)
    assert main(["rebuild", "--collection", plain, "--partition", "0"]) == 2
    assert f"collection {plain} is not partitioned" in capsys.readouterr().err

    assert main(["vacuum", "--json", "--collection", c.name, "--partition", "1"]) == 0
    [outcome] = _json_out(capsys)
    assert outcome["table"] == c.partition_tables()[1] and outcome["outcome"] == "ok"


def test_a_pass_that_fails_before_it_starts_says_so_in_its_json(capsys: pytest.CaptureFixture[str]) -> None:
    """`[]` is also what a pass with nothing to do prints: a JSON Lines log must tell the two apart."""
    unreachable = "postgresql://nobody@127.0.0.1:1/none"
    assert main(["run", "--once", "--json", "--database-url", unreachable]) == 1
    result = json.loads(capsys.readouterr().out)
    assert isinstance(result, dict) and "failed before it started" in result["error"], result


@pytest.mark.parametrize(
    "args",
    [
        ["history", "--since-hours", "0"],
        ["history", "--since-hours", "-1"],
        ["history", "--limit", "0"],
        ["history", "--limit", "-5"],
        ["report", "--plot", "history.png", "--since-hours", "0"],
    ],
)
def test_history_refuses_an_empty_window_or_limit(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """0 hours read as no window at all (every row), and a window or limit of nothing has no use."""
    option = args[-2]
    assert main([*args, "--database-url", "postgresql://nobody@127.0.0.1:1/none"]) == 2
    assert f"Invalid value for '{option}'" in capsys.readouterr().err


def test_an_action_asked_for_by_name_and_not_done_exits_with_its_own_code(
    cli_env: dict[str, str],
    conn: psycopg.Connection[Any],
    make_collection: Callable[..., Collection],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A script running `memstore-maint rebuild` must tell "not done, try later" from done and from
    failed: another worker holding the index (or searches over the SLO) is exit 3."""
    from maintenance.targets import targets_for
    from maintenance.worker import EXIT_SKIPPED

    c = make_collection(1000, 8)
    [target] = targets_for(conn, c)
    conn.execute("SELECT pg_advisory_lock(hashtext(%s))", (target.lock_key,))
    try:
        for command in ("rebuild", "vacuum", "handback"):
            assert main([command, "--json", "--collection", c.name]) == EXIT_SKIPPED, command
            assert _json_out(capsys)[0]["outcome"] == "skipped"
    finally:
        conn.execute("SELECT pg_advisory_unlock(hashtext(%s))", (target.lock_key,))
    assert main(["vacuum", "--json", "--collection", c.name]) == 0
    assert _json_out(capsys)[0]["outcome"] == "ok"


def test_the_exit_code_of_actions_is_the_worst_of_their_outcomes() -> None:
    from maintenance.worker import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_SKIPPED, ActionOutcome, exit_code

    def done(outcome: str, follow_up: str | None = None) -> ActionOutcome:
        after = None if follow_up is None else {"action": "vacuum", "outcome": follow_up}
        return ActionOutcome("c", "t", "rebuild", "", outcome, follow_up=after)

    assert exit_code([]) == EXIT_OK
    assert exit_code([done("ok"), done("ok", "ok")]) == EXIT_OK
    assert exit_code([done("ok"), done("skipped")]) == EXIT_SKIPPED
    assert exit_code([done("ok", "skipped")]) == EXIT_SKIPPED  # rebuilt, but its VACUUM waited in vain
    assert exit_code([done("skipped"), done("interrupted")]) == EXIT_INTERRUPTED
    assert exit_code([done("interrupted"), done("ok", "failed")]) == EXIT_FAILED
    assert len({EXIT_OK, EXIT_FAILED, 2, EXIT_SKIPPED, EXIT_INTERRUPTED}) == 5  # 2: a usage error
