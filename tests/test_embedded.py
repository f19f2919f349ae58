"""The embedded server is shared by several processes and stopped by the last one to leave."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import psycopg
import pytest
from pydantic import ValidationError

from memstore.db.core import libpq_url
from memstore.db.embedded import SERVER_CONF, shared_buffers_size
from memstore.settings import Settings

HOLDER = textwrap.dedent(
    """
    import logging, sys, time
    from encoder.cli_support import exit_cleanly_on_sigterm
    from memstore.db.embedded import start_embedded_server
    logging.basicConfig(level=logging.WARNING)
    exit_cleanly_on_sigterm()
    url = start_embedded_server(
        sys.argv[1], maintenance_work_mem="64MB", max_parallel_maintenance_workers=1, shared_buffers=sys.argv[2]
    )
    print(url, flush=True)
    while True:
        time.sleep(0.1)
    """
)


def _start_holder(data_dir: Path, shared_buffers: str = "auto") -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(data_dir), shared_buffers],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    url = proc.stdout.readline().strip()
    assert url, proc.stderr.read() if proc.stderr else "no output"
    return proc, url


def _postmaster_pid(data_dir: Path) -> int | None:
    pidfile = data_dir / "pg" / "postmaster.pid"
    if not pidfile.exists():
        return None
    pid = int(pidfile.read_text().split()[0])
    return pid if psutil.pid_exists(pid) else None


def _wait_stopped(data_dir: Path, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _postmaster_pid(data_dir) is None:
            return True
        time.sleep(0.2)
    return False


def _select_one(url: str) -> int:
    with psycopg.connect(libpq_url(url)) as conn:
        row = conn.execute("SELECT 1").fetchone()
    assert row is not None
    return int(row[0])


def test_two_processes_share_one_server_and_the_last_stops_it(tmp_path: Path) -> None:
    first, url1 = _start_holder(tmp_path)
    second, url2 = _start_holder(tmp_path)
    try:
        assert url1 == url2
        server_pid = _postmaster_pid(tmp_path)
        assert server_pid is not None
        assert _select_one(url1) == 1
        first.send_signal(signal.SIGTERM)
        first.wait(timeout=20)
        # The other process still holds the server.
        assert _postmaster_pid(tmp_path) == server_pid
        assert _select_one(url2) == 1
        second.send_signal(signal.SIGTERM)
        second.wait(timeout=20)
        assert _wait_stopped(tmp_path), "the last process to leave did not stop the server"
    finally:
        for proc in (first, second):
            if proc.poll() is None:
                proc.kill()


def test_a_killed_holder_does_not_keep_the_server_alive(tmp_path: Path) -> None:
    killed, _ = _start_holder(tmp_path)
    os.kill(killed.pid, signal.SIGKILL)
    killed.wait(timeout=10)
    survivor, url = _start_holder(tmp_path)
    try:
        assert _select_one(url) == 1
        survivor.send_signal(signal.SIGTERM)
        survivor.wait(timeout=20)
        assert _wait_stopped(tmp_path), "a dead process left in the handle list kept the server running"
    finally:
        if survivor.poll() is None:
            survivor.kill()


def test_tuning_is_applied(tmp_path: Path) -> None:
    proc, url = _start_holder(tmp_path)
    try:
        with psycopg.connect(libpq_url(url)) as conn:
            settings = dict(
                conn.execute(
                    "SELECT name, current_setting(name) FROM pg_settings "
                    "WHERE name IN ('maintenance_work_mem', 'max_parallel_maintenance_workers', 'jit')"
                ).fetchall()
            )
        assert settings == {"maintenance_work_mem": "64MB", "max_parallel_maintenance_workers": "1", "jit": "off"}
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)


def _shared_buffers(url: str) -> str:
    with psycopg.connect(libpq_url(url)) as conn:
        row = conn.execute("SELECT current_setting('shared_buffers')").fetchone()
    assert row is not None
    return str(row[0])


def _stop(proc: subprocess.Popen[str]) -> str:
    """SIGTERM, then what the holder wrote to stderr."""
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=20)
    return err


def test_shared_buffers_apply_from_the_first_start_and_follow_the_setting(tmp_path: Path) -> None:
    """A new data folder's first start already has them (not PostgreSQL's 128MB); a later start takes a
    changed setting; a process joining a running server keeps the server's and says so."""
    started: list[subprocess.Popen[str]] = []

    def holder(buffers: str) -> tuple[subprocess.Popen[str], str]:
        proc, url = _start_holder(tmp_path, buffers)
        started.append(proc)
        return proc, url

    try:
        first, url = holder("200MB")
        assert _shared_buffers(url) == "200MB"
        joiner, joined_url = holder("300MB")  # the server runs: its buffers stay
        assert _shared_buffers(joined_url) == "200MB"
        assert "300MB applies when it next starts" in _stop(joiner)
        _stop(first)
        assert _wait_stopped(tmp_path)
        second, url = holder("300MB")
        assert _shared_buffers(url) == "300MB"
        _stop(second)
    finally:
        for proc in started:
            if proc.poll() is None:
                proc.kill()
    conf = (tmp_path / "pg" / "postgresql.conf").read_text()
    assert conf.count(f"include_if_exists = '{SERVER_CONF}'") == 1  # included once, however many starts
    assert "shared_buffers = '300MB'" in (tmp_path / "pg" / SERVER_CONF).read_text()


def test_shared_buffers_auto_is_an_eighth_of_memory_within_bounds() -> None:
    gib = 1 << 30
    assert shared_buffers_size("auto", memory_bytes=16 * gib) == "2048MB"
    assert shared_buffers_size("auto", memory_bytes=gib // 2) == "128MB"  # never below PostgreSQL's default
    assert shared_buffers_size("auto", memory_bytes=256 * gib) == "4096MB"
    assert shared_buffers_size("512MB") == "512MB"


@pytest.mark.parametrize("value", ["12", "1 GB", "2GB'; fsync = 'off", "-1MB", "auto "])
def test_shared_buffers_refuse_what_is_not_a_size(value: str) -> None:
    """A size goes into the server's configuration file: anything else is refused before it gets there."""
    with pytest.raises(ValueError, match="shared_buffers"):
        shared_buffers_size(value)
    with pytest.raises(ValidationError):
        Settings(embedded_shared_buffers=value)


SCRATCH_RUN = textwrap.dedent(
    """
    import json, psutil
    from bench.databases import scratch_dir
    from memstore.db.embedded import start_embedded_server
    with scratch_dir() as folder:
        start_embedded_server(folder, maintenance_work_mem="64MB", max_parallel_maintenance_workers=1)
        pid = int((folder / "pg" / "postmaster.pid").read_text().split()[0])
    try:  # before the exit handlers run
        stopped = psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        stopped = True
    print(json.dumps({"folder": str(folder), "stopped_before_exit": stopped}))
    """
)


def test_a_benchmark_s_scratch_folder_stops_its_server_before_it_is_removed() -> None:
    # A TemporaryDirectory removed the folder under the running server: pg_wal was "not empty" and the
    # exit handler found no cluster to stop (a benchmark failed with exit 1 under load).
    done = subprocess.run(
        [sys.executable, "-c", SCRATCH_RUN], capture_output=True, text=True, timeout=120, cwd=Path(__file__).parents[1]
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["stopped_before_exit"]
    assert not Path(result["folder"]).exists()
    assert "Failed to stop server" not in done.stderr


@pytest.mark.parametrize("error", [psycopg.errors.DuplicateDatabase, psycopg.errors.UniqueViolation])
def test_a_database_another_process_made_first_is_taken_as_ours(error: type[Exception]) -> None:
    """Two processes starting on a new data folder at once (``memstore serve`` and a CLI command) both
    see no database and both create it; the loser's error says so in one of two ways."""
    from memstore.db.embedded import _ensure_database

    class Racing:
        def __init__(self) -> None:
            self.statements: list[str] = []

        def execute(self, statement: object, params: object = None) -> Racing:
            self.statements.append(str(statement))
            if "CREATE DATABASE" in repr(statement):
                raise error("the other process won")
            return self

        def fetchone(self) -> None:
            return None  # the database did not exist when this one looked

    racing = Racing()
    _ensure_database(racing, "memstore")  # type: ignore[arg-type]
    assert len(racing.statements) == 2
