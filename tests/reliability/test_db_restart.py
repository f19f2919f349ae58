"""A database that crashes and comes back costs the pool no failed request."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from memstore.db.core import create_engine, raw_connection
from memstore.db.embedded import start_embedded_server

JOIN = (
    "import sys; from memstore.db.embedded import start_embedded_server; "
    "start_embedded_server(sys.argv[1], maintenance_work_mem='64MB', max_parallel_maintenance_workers=1)"
)


def _postmaster(data_dir: Path) -> int:
    return int((data_dir / "pg" / "postmaster.pid").read_text().split()[0])


def _wait_gone(pid: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while psutil.pid_exists(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not psutil.pid_exists(pid), f"postmaster {pid} is still there"


def stop_server(data_dir: Path) -> None:
    """A fast shutdown of the embedded server in ``data_dir`` (a restarted one this process does not
    own), if it runs."""
    if (data_dir / "pg" / "postmaster.pid").exists():
        pid = _postmaster(data_dir)
        if psutil.pid_exists(pid):
            os.kill(pid, signal.SIGINT)
            _wait_gone(pid)


def test_pool_survives_a_killed_and_restarted_server(tmp_path: Path) -> None:
    url = start_embedded_server(tmp_path, maintenance_work_mem="64MB", max_parallel_maintenance_workers=1)
    engine = create_engine(url, pool_size=3, max_overflow=0)
    try:
        with raw_connection(engine) as conn:
            before = conn.execute("SELECT pg_backend_pid()").fetchone()
        old = _postmaster(tmp_path)
        os.kill(old, signal.SIGKILL)
        _wait_gone(old)
        # What a supervisor does: start the server again (this process still holds its handle).
        subprocess.run([sys.executable, "-c", JOIN, str(tmp_path)], check=True, timeout=60)
        assert _postmaster(tmp_path) != old
        for _ in range(5):  # more checkouts than the pool has connections: none may fail
            with raw_connection(engine) as conn:
                after = conn.execute("SELECT pg_backend_pid()").fetchone()
        assert after != before
    finally:
        engine.dispose()
        stop_server(tmp_path)
