"""The ``memstore`` command as a user runs it: migrations on a fresh database, and ``serve`` on the embedded one."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psycopg
import pytest

from memstore.db.core import libpq_url
from tests.databases import scratch_database

MEMSTORE = [sys.executable, "-m", "memstore.cli"]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSTORE_")}
    env.update(extra)
    return env


def test_db_upgrade_on_a_fresh_database(server_url: str) -> None:
    with scratch_database(server_url, "memstore_cli", migrated=False) as url:
        env = _env(MEMSTORE_DATABASE_URL=url)
        out = subprocess.run(
            [*MEMSTORE, "db", "upgrade", "--json"], env=env, capture_output=True, text=True, timeout=120
        )
        assert out.returncode == 0, out.stderr
        result = json.loads(out.stdout.strip().splitlines()[-1])
        assert result["before"] is None and result["after"] is not None
        again = subprocess.run(
            [*MEMSTORE, "db", "upgrade", "--json"], env=env, capture_output=True, text=True, timeout=120
        )
        assert json.loads(again.stdout.strip().splitlines()[-1]) == {
            "before": result["after"],
            "after": result["after"],
        }
        with psycopg.connect(libpq_url(url)) as conn:
            tables = {r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE tablename LIKE 'memstore_%'")}
            assert {"memstore_collections", "memstore_ingest_queue", "memstore_maintenance_actions"} <= tables
            assert conn.execute("SELECT 1 FROM pg_extension WHERE extname = 'vector'").fetchone() == (1,)


def test_bad_database_url_fails_with_a_message() -> None:
    env = _env(MEMSTORE_DATABASE_URL="postgresql://nobody@127.0.0.1:1/none")
    out = subprocess.run([*MEMSTORE, "db", "upgrade"], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert "cannot reach the database" in out.stderr
    assert "Traceback" not in out.stderr


def test_db_upgrade_to_an_unknown_revision_is_one_line(server_url: str) -> None:
    with scratch_database(server_url, "memstore_cli", migrated=False) as url:
        out = subprocess.run(
            [*MEMSTORE, "db", "upgrade", "--revision", "9999"],
            env=_env(MEMSTORE_DATABASE_URL=url),
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert out.returncode == 2, out.stderr
    assert out.stderr.splitlines() == [
        "memstore: cannot upgrade to revision '9999': Can't locate revision identified by '9999'"
    ], out.stderr
    assert out.stdout == ""


def test_db_url_warns_when_the_embedded_server_stops_with_the_command(tmp_path: Path) -> None:
    """Started by `memstore db url` alone, the embedded server stops as it exits and the URL printed is
    dead: stderr says so, and stdout stays the URL alone for `$(memstore db url)`."""
    from memstore.db.embedded import start_embedded_server, stop_embedded_servers_under

    env = _env(MEMSTORE_DATA_DIR=str(tmp_path / "data"))
    alone = subprocess.run([*MEMSTORE, "db", "url"], env=env, capture_output=True, text=True, timeout=120)
    assert alone.returncode == 0, alone.stderr
    assert alone.stdout.startswith("postgresql://") and len(alone.stdout.splitlines()) == 1
    assert "the embedded server stops when this command exits" in alone.stderr
    start_embedded_server(tmp_path / "data", maintenance_work_mem="64MB", max_parallel_maintenance_workers=1)
    try:  # held by this process, as `memstore serve` would hold it
        held = subprocess.run([*MEMSTORE, "db", "url"], env=env, capture_output=True, text=True, timeout=120)
        assert held.returncode == 0 and "stops when" not in held.stderr, held.stderr
        with psycopg.connect(held.stdout.strip()) as conn:  # still up after the command exited
            assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        stop_embedded_servers_under(tmp_path)


def test_serve_refuses_a_port_in_use_before_starting_anything(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = subprocess.run(
            [*MEMSTORE, "serve", "--port", str(port)],
            env=_env(MEMSTORE_DATA_DIR=str(tmp_path / "data")),
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert out.returncode == 2, out.stderr
    assert out.stderr.splitlines() == [
        f"memstore: port {port} on 127.0.0.1 is already in use; choose another with --port (MEMSTORE_PORT)"
    ]
    assert out.stdout == ""
    assert not (tmp_path / "data").exists(), "the database started before the port was checked"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("access_log", [None, "true", "false"])
def test_serve_on_the_embedded_database_answers_health(tmp_path: Path, access_log: str | None) -> None:
    """The first quick-start command: embedded server up, migrations applied, /health answering. The
    access log: by default (sampled) a line for every error and for the first success, not for each
    one; MEMSTORE_API_ACCESS_LOG=true a line per request; false none."""
    port = _free_port()
    # The offline model (the default one's weights cannot be fetched here): /health must reach "ok".
    env = _env(MEMSTORE_DATA_DIR=str(tmp_path / "data"), MEMSTORE_MODEL="memstore-tiny", MEMSTORE_PRETRAINED="none")
    if access_log is not None:
        env["MEMSTORE_API_ACCESS_LOG"] = access_log
    proc = subprocess.Popen(
        [*MEMSTORE, "serve", "--port", str(port)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        body = None
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                response = httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)
                body = response.json()
                if body["status"] != "starting":  # the model loads after the server answers
                    break
                assert any("still loading" in r for r in body["reasons"]), body
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        if body is None:
            proc.kill()
            output = proc.stdout.read() if proc.stdout else ""
            pytest.fail(f"memstore serve never answered /health; it printed:\n{output[-4000:]}")
        # Without a key /health is liveness only: no versions, model or queue for strangers.
        assert body == {"status": "ok", "reasons": []}
        keyed = subprocess.run(
            [*MEMSTORE, "keys", "create", "health-check", "--scope", "read", "--json"],
            env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert keyed.returncode == 0, keyed.stderr
        secret = json.loads(keyed.stdout)["key"]
        detail = httpx.get(f"http://127.0.0.1:{port}/health", headers={"Authorization": f"Bearer {secret}"}).json()
        assert detail["database"]["server_version"].startswith("18")
        assert detail["database"]["revision"]
        # Start-up objects (torch, the model, the app) are kept out of the collector's passes by default:
        # a full collection over them held every search for about 0.2 s (encoder.gc_freeze).
        assert detail["gc"]["frozen_objects"] > 100_000, detail["gc"]
        assert httpx.get(f"http://127.0.0.1:{port}/v1/collections").status_code == 401
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    printed = proc.stdout.read() if proc.stdout else ""
    assert "Application startup complete" in printed  # the service's own messages are logged either way
    health_lines = printed.count('"GET /health HTTP/1.1" 200')
    refused_line = '"GET /v1/collections HTTP/1.1" 401' in printed
    if access_log == "false":
        assert health_lines == 0 and not refused_line, printed[-2000:]
    elif access_log == "true":
        assert health_lines >= 2 and refused_line, printed[-2000:]  # the polls and the keyed one
    else:
        assert health_lines == 1 and refused_line, printed[-2000:]
    pidfile = tmp_path / "data" / "pg" / "postmaster.pid"
    deadline = time.monotonic() + 60  # a shutdown checkpoint on a loaded machine
    while pidfile.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not pidfile.exists(), "the embedded server kept running after memstore serve exited"


def test_ingest_says_each_retry_when_the_server_cannot_be_reached(tmp_path: Path) -> None:
    """A wrong --url is a line on stderr at each retry, not a minute and a half of silence."""
    (tmp_path / "note.txt").write_text("hello")
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [*MEMSTORE, "ingest", str(tmp_path), "--collection", "notes", "--url", f"http://127.0.0.1:{port}"]
    proc = subprocess.Popen(command, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        first = proc.stderr.readline()  # the first retry is announced at once (it would wait 1 s, then 2, 4 ...)
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert f"cannot reach http://127.0.0.1:{port}" in first, first
    assert "trying again in 1 s (attempt 2 of 8)" in first, first


def test_the_readme_python_example_runs(server_url: str) -> None:
    """The README's Python example, as a user pastes it, against a fresh database."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    blocks = [b.split("```", 1)[0] for b in readme.split("```python\n")[1:]]
    [example] = [b for b in blocks if "VectorStore(get_engine())" in b]
    with scratch_database(server_url, "memstore_readme") as url:
        done = subprocess.run(
            [sys.executable, "-c", example],
            env=_env(MEMSTORE_DATABASE_URL=url),
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("img-1 "), done.stdout  # the one item, found through its filter
