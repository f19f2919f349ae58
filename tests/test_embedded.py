"""The embedded server is shared by several processes and stopped by the last one to leave."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import psycopg

from memstore.db import libpq_url

HOLDER = textwrap.dedent(
    """
    import sys, time
    from memstore.cli_support import exit_cleanly_on_sigterm
    from memstore.embedded import start_embedded_server
    exit_cleanly_on_sigterm()
    url = start_embedded_server(sys.argv[1], maintenance_work_mem="64MB", max_parallel_maintenance_workers=1)
    print(url, flush=True)
    while True:
        time.sleep(0.1)
    """
)


def _start_holder(data_dir: Path) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(data_dir)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
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
