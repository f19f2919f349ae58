"""Background index builds at a lower CPU priority, where the database server runs on this machine.

A seal, a merge or a rebuild is one ``CREATE INDEX`` that cannot pause once it runs, and on a small
machine it takes the cores the searches need: a search's backend, the API server and the client wait
for a core while the build holds it. Where the server is this machine's own (the embedded default, or
any server whose backends this process can see), the build's backend and the parallel workers it
starts run at a higher ``nice`` value, so the kernel gives a waking search the core at once and the
build only what is left. A remote server (compose, a managed database) is left alone: its CPU is
shared with nothing of ours.

Parallel workers are forked by the postmaster, not by the build's backend, so they do not inherit its
priority: a watcher renices each one as it appears (``pg_stat_activity.leader_pid``) while the build
runs. Raising a priority back needs privileges an ordinary user lacks, so the build's connection is a
dedicated one that closes afterwards; nothing else ever runs on a lowered backend.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

import psutil
import psycopg

log = logging.getLogger(__name__)

WATCH_INTERVAL_S = 0.05  # parallel workers start as the build does; a build runs for seconds


def local_backend(conn: psycopg.Connection[Any]) -> psutil.Process | None:
    """``conn``'s server process when it runs on this machine and this process may see it, else None.

    The pid alone proves nothing (a server in another container or on another host has its own pid
    space): the process must also run in the server's data directory, which needs a role that may
    read ``data_directory`` (a superuser, as on the embedded server, or pg_read_all_settings)."""
    try:
        row = conn.execute("SELECT current_setting('data_directory')").fetchone()
        if row is None:
            return None
        process = psutil.Process(conn.info.backend_pid)
        if os.path.realpath(process.cwd()) != os.path.realpath(str(row[0])):
            return None
        return process
    except psycopg.Error:
        if not conn.autocommit:
            conn.rollback()
        return None
    except (psutil.Error, OSError):
        return None


def _renice(process: psutil.Process, niceness: int) -> bool:
    try:
        if process.nice() < niceness:
            process.nice(niceness)
        return True
    except (psutil.Error, OSError):
        return False


def lower(conn: psycopg.Connection[Any], niceness: int) -> bool:
    """Put ``conn``'s backend at ``niceness`` where the server is this machine's own; whether it did.
    ``conn`` must serve background work only from then on (see the module's docstring)."""
    backend = local_backend(conn) if niceness > 0 else None
    return backend is not None and _renice(backend, niceness)


@contextlib.contextmanager
def workers_lowered(conn: psycopg.Connection[Any], watcher: Callable[[], psycopg.Connection[Any]]) -> Iterator[None]:
    """While the block runs, the parallel workers ``conn``'s backend starts are put at its own
    priority as they appear (watched on a second connection, ``watcher()``). Nothing when the backend
    runs at the server's priority (not lowered, ``lower``) or on another machine."""
    backend = local_backend(conn)
    niceness = _niceness(backend) if backend is not None else 0
    if backend is None or niceness <= 0:
        yield
        return
    stop = threading.Event()
    thread = threading.Thread(
        target=_watch_workers, args=(watcher, backend.pid, niceness, stop), name="memstore-build-priority", daemon=True
    )
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(5)


def _niceness(process: psutil.Process) -> int:
    try:
        return int(process.nice())
    except (psutil.Error, OSError):
        return 0


@contextlib.contextmanager
def lowered(
    conn: psycopg.Connection[Any], niceness: int, *, watcher: Callable[[], psycopg.Connection[Any]]
) -> Iterator[bool]:
    """``lower`` then ``workers_lowered`` for the block; yields whether the backend was lowered."""
    if not lower(conn, niceness):
        yield False
        return
    with workers_lowered(conn, watcher):
        yield True


def _watch_workers(
    watcher: Callable[[], psycopg.Connection[Any]], leader: int, niceness: int, stop: threading.Event
) -> None:
    """Renice the parallel workers of ``leader`` as they appear, until ``stop``."""
    seen: set[int] = set()
    try:
        with watcher() as conn:
            while not stop.is_set():
                rows = conn.execute("SELECT pid FROM pg_stat_activity WHERE leader_pid = %s", (leader,)).fetchall()
                for (pid,) in rows:
                    if pid not in seen:
                        seen.add(pid)
                        with contextlib.suppress(psutil.Error, OSError):
                            _renice(psutil.Process(pid), niceness)
                stop.wait(WATCH_INTERVAL_S)
    except psycopg.Error as exc:  # the build goes on at the workers' own priority
        log.debug("could not watch the build's parallel workers: %s", exc)
