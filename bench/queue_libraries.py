"""``python -m bench.queue_libraries --json``: memstore's ingest queue against procrastinate and pgqueuer.

One server, one run, the same N jobs for every side. Each side gets a database of its own on that
server, so the server's per-database counters (``pg_stat_database``) tell each side's transactions
and written rows apart. A job has the real shape of memstore's ingest work: read the item's text,
compute a tiny vector, write it to the item row and mark the item ready. memstore runs its own
``IngestWorker`` (claims of 32, one transaction that writes the vectors and deletes the queue rows);
a library runs the same read and write inside its job, in a transaction of its own, and then
completes the job the way the library does it (a second transaction: neither library can complete a
job inside the caller's transaction).

Measured per side (sides take turns, in a rotating order, round after round):
- enqueue_jobs_per_s: store N pending items and queue them, in ONE transaction (all three can);
- drain_1_jobs_per_s, drain_2_jobs_per_s: end to end with 1 and 2 worker processes; the clock starts
  once every process has imported its modules, and stops when the last one has drained the queue;
- statements_per_job, transactions_per_job, rows_written_per_job while draining: statements are the
  execute/executemany calls the workers send (executemany is one pipeline), transactions and rows
  are the server's own counts for the side's database;
- ready_while_queued_max: the most items a sampler saw ready while their job was still queued
  (memstore's invariant is that this never happens: an item is ready exactly when its row is gone);
- crash: the state right after a worker dies between the item update and the job's completion.

Ratios are library / memstore from the same run (above 1: the library is faster, or, for the
per-job counts, does more). A library that is not installed is skipped with the reason; neither is a
dependency of memstore (``pip install procrastinate pgqueuer`` to measure them).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import hashlib
import importlib.metadata
import importlib.util
import inspect
import json
import logging
import multiprocessing as mp
import os
import shlex
import sys
import threading
import time
import warnings
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import numpy as np
import psycopg
import sqlalchemy as sa
from psycopg import sql
from psycopg.types.json import Jsonb
from tqdm import tqdm

from bench.databases import scratch_dir
from encoder.types import EncoderInfo, Priority
from memstore.db import migrate
from memstore.db.core import Database, create_engine, libpq_url, normalise_url
from memstore.db.embedded import start_embedded_server
from memstore.queue import jobs as ingest_queue
from memstore.queue.jobs import PendingItem
from memstore.settings import IngestSettings, Settings
from memstore.store import VectorStore
from memstore.workers.ingest import IngestWorker

COLLECTION = "queue_bench"
DIMENSIONS = 64
MODEL = "bench-hash"  # the collection's model, so memstore's worker accepts the hash backend's vectors
BATCH = 32  # memstore's default claim; pgqueuer's dequeue batch too
TASK = "embed_item"
QUEUE = "ingest"
CRASH_EXIT = 17
SAMPLE_EVERY_S = 0.1
SIDE_NAMES = ("memstore", "procrastinate", "pgqueuer")


def tiny_vector(text: str) -> np.ndarray:
    """A deterministic unit vector per text: the encoder's place in the job, equally cheap for every side."""
    seed = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")
    v = np.random.default_rng(seed).standard_normal(DIMENSIONS).astype(np.float32)
    return v / np.linalg.norm(v)


class HashBackend:
    """An EmbeddingBackend for memstore's worker that computes ``tiny_vector``."""

    info = EncoderInfo(
        model=MODEL,
        pretrained=None,
        pretrained_weights=False,
        dimensions=DIMENSIONS,
        device="cpu",
        precision="fp32",
        image_size=0,
    )

    def embed_texts(
        self, texts: list[str], *, priority: Priority = Priority.QUERY, deadline_s: float | None = None
    ) -> np.ndarray:
        return np.stack([tiny_vector(t) for t in texts])

    def embed_images(
        self,
        images: list[bytes],
        *,
        priority: Priority = Priority.QUERY,
        deadline_s: float | None = None,
        return_tiles: bool = False,
    ) -> np.ndarray:
        raise ValueError("the queue benchmark queues texts only")


class StatementCounter:
    """Counts the statements this process sends: calls of execute and executemany on psycopg cursors
    (``Connection.execute`` goes through one) and of asyncpg's query methods. COMMIT and BEGIN are
    not counted here; the server's transaction count covers them."""

    def __init__(self) -> None:
        self.count = 0
        for cls in (psycopg.Cursor, psycopg.AsyncCursor):
            for name in ("execute", "executemany"):
                setattr(cls, name, self._counted(getattr(cls, name)))
        if importlib.util.find_spec("asyncpg"):  # pgqueuer's worker talks through asyncpg
            from asyncpg.connection import Connection

            for name in ("execute", "executemany", "fetch", "fetchrow", "fetchval"):
                setattr(Connection, name, self._counted(getattr(Connection, name)))

    def _counted(self, method: Callable[..., Any]) -> Callable[..., Any]:
        if inspect.iscoroutinefunction(method):

            async def counted_async(cursor: Any, *args: Any, **kwargs: Any) -> Any:
                self.count += 1
                return await method(cursor, *args, **kwargs)

            return functools.wraps(method)(counted_async)

        def counted(cursor: Any, *args: Any, **kwargs: Any) -> Any:
            self.count += 1
            return method(cursor, *args, **kwargs)

        return functools.wraps(method)(counted)


@dataclass(frozen=True)
class Target:
    """One side's database and the collection its jobs write to."""

    database: str
    url: str  # SQLAlchemy URL
    table: str
    collection_id: int

    @property
    def conninfo(self) -> str:
        return libpq_url(self.url)


@dataclass(frozen=True)
class WorkerJob:
    """What one worker process is told (picklable: processes are spawned, not forked)."""

    side: str
    target: Target
    concurrency: int
    crash: bool = False


# --- the job's effect, as a library worker runs it -------------------------------------------------


def insert_pending_items(conn: psycopg.Connection[Any], table: str, texts: Sequence[str]) -> list[int]:
    """The item rows a library side stores before deferring: the statement memstore's enqueue uses
    for new items (memstore's enqueue also looks the external ids up first, which this skips)."""
    statement = sql.SQL(
        "INSERT INTO {} (external_id, metadata, status, text, content, content_type) "
        "VALUES (%s, %s, 'pending', %s, NULL, %s) ON CONFLICT (external_id) DO NOTHING RETURNING id"
    ).format(sql.Identifier(table))
    ids: list[int] = []
    with conn.cursor() as cur:
        cur.executemany(
            statement,
            [(f"x{i}", Jsonb({}), text, ingest_queue.TEXT_CONTENT_TYPE) for i, text in enumerate(texts)],
            returning=True,
        )
        while True:
            ids.extend(int(row[0]) for row in cur.fetchall())
            if not cur.nextset():
                break
    return ids


async def open_item_pool(conninfo: str, size: int) -> Any:
    """The connections a library worker's jobs write items with (pgvector's types registered)."""
    from pgvector.psycopg import register_vector_async
    from psycopg_pool import AsyncConnectionPool

    pool = AsyncConnectionPool(
        conninfo,
        min_size=1,
        max_size=size,
        open=False,
        configure=register_vector_async,
        kwargs={"autocommit": True},
    )
    await pool.open(wait=True)
    return pool


async def write_vector(pool: Any, table: str, item_id: int) -> None:
    """The job's effect: read the text, compute the vector, write it and mark the item ready, in one
    transaction. ``updated_at`` guards against a stale write (an item re-sent while this job ran has
    a newer job of its own), which is what memstore's claim number does inside its single transaction."""
    async with pool.connection() as conn, conn.transaction():
        cur = await conn.execute(
            sql.SQL("SELECT text, updated_at FROM {} WHERE id = %s").format(sql.Identifier(table)), (item_id,)
        )
        row = await cur.fetchone()
        if row is None:
            return
        await conn.execute(
            sql.SQL(
                "UPDATE {} SET embedding = %s, status = 'ready', error = NULL, updated_at = now() "
                "WHERE id = %s AND status = 'pending' AND updated_at = %s"
            ).format(sql.Identifier(table)),
            (tiny_vector(row[0]), item_id, row[1]),
        )


# --- the sides -------------------------------------------------------------------------------------


class MemstoreSide:
    name = "memstore"
    queue_tables = ("memstore_ingest_queue",)
    unfinished_sql = "SELECT count(*) FROM memstore_ingest_queue"
    ready_while_queued_sql = (
        "SELECT count(*) FROM memstore_ingest_queue q JOIN {table} i ON i.id = q.item_id WHERE i.status = 'ready'"
    )

    def missing(self) -> str | None:
        return None

    def version(self) -> str:
        return "this tree"

    def install(self, target: Target) -> None:
        """Nothing: the migrations made the queue."""

    def enqueue(self, target: Target, texts: Sequence[str]) -> float:
        db = Database(create_engine(target.url, pool_size=1, max_overflow=0))
        try:
            collection = VectorStore(db, settings=Settings(database_url=target.url)).get_collection(name=COLLECTION)
            items = [PendingItem(text=text, external_id=f"x{i}") for i, text in enumerate(texts)]
            with db.write() as conn:  # connected before the clock, as the libraries' sides are
                conn.execute("SELECT 1")
            start = time.perf_counter()
            ingest_queue.enqueue(db, collection, items, priority=ingest_queue.PRIORITY_BULK)
            return time.perf_counter() - start
        finally:
            db.engine.dispose()

    def work(self, job: WorkerJob) -> None:
        """memstore's own worker, as ``memstore worker --once`` runs it."""
        db = Database(create_engine(job.target.url, pool_size=2, max_overflow=0))
        if job.crash:
            _die_after_first_executemany()
        try:
            IngestWorker(db, HashBackend(), settings=IngestSettings(batch_size=BATCH), name="bench").run(once=True)
        finally:
            db.engine.dispose()

    def after_crash(self, target: Target) -> dict[str, Any]:
        """The dead worker's transaction rolled back; the next claim takes the row over at once
        (its claimer's advisory lock went with its connection)."""
        state = _crash_state(
            target,
            "SELECT i.status, q.attempts FROM {table} i LEFT JOIN memstore_ingest_queue q ON q.item_id = i.id",
        )
        db = Database(create_engine(target.url, pool_size=1, max_overflow=0))
        worker = IngestWorker(db, HashBackend(), settings=IngestSettings(batch_size=BATCH), name="bench")
        start = time.perf_counter()
        try:
            # The dead backend may take a moment to notice its client is gone; until then it holds the row.
            while time.perf_counter() - start < 10 and not worker.run_batch().written:
                time.sleep(0.02)
        finally:
            db.engine.dispose()
        recovered = _crash_state(target, "SELECT i.status, NULL FROM {table} i")
        return {
            "item_status": state[0],
            "queue_row_attempts": state[1],
            "consistent": state[0] == "pending" and state[1] is not None,
            "recovered_in_s": round(time.perf_counter() - start, 3) if recovered[0] == "ready" else None,
            "recovery": "the next claim, at once",
        }


class ProcrastinateSide:
    name = "procrastinate"
    queue_tables = ("procrastinate_jobs", "procrastinate_events", "procrastinate_workers")
    unfinished_sql = "SELECT count(*) FROM procrastinate_jobs WHERE status IN ('todo', 'doing')"
    ready_while_queued_sql = (
        "SELECT count(*) FROM procrastinate_jobs j JOIN {table} i ON i.id = (j.args->>'item_id')::bigint "
        "WHERE j.status IN ('todo', 'doing') AND i.status = 'ready'"
    )

    def missing(self) -> str | None:
        return None if importlib.util.find_spec("procrastinate") else "not installed (pip install procrastinate)"

    def version(self) -> str:
        return importlib.metadata.version("procrastinate")

    def install(self, target: Target) -> None:
        from procrastinate import App, SyncPsycopgConnector

        with App(connector=SyncPsycopgConnector(conninfo=target.conninfo)).open() as app:
            app.schema_manager.apply_schema()

    def enqueue(self, target: Target, texts: Sequence[str]) -> float:
        from procrastinate import App, SyncPsycopgConnector

        # Deferring on the caller's connection puts the jobs in the items' transaction (atomic enqueue).
        # One batch_defer shares its options, so a per-item queueing_lock would cost a defer per item;
        # none is set here (the fastest form).
        app = App(connector=SyncPsycopgConnector(conninfo=target.conninfo))
        with psycopg.connect(target.conninfo) as conn:
            conn.execute("SELECT 1")
            conn.commit()
            start = time.perf_counter()
            ids = insert_pending_items(conn, target.table, texts)
            deferrer = app.configure_task(name=TASK, queue=QUEUE, priority=ingest_queue.PRIORITY_BULK, connection=conn)
            jobs: list[dict[str, Any]] = [{"collection_id": target.collection_id, "item_id": i} for i in ids]
            deferrer.batch_defer(*jobs)
            conn.commit()
            return time.perf_counter() - start

    def work(self, job: WorkerJob) -> None:
        asyncio.run(self._work(job))

    async def _work(self, job: WorkerJob) -> None:
        from procrastinate import App, PsycopgConnector

        pool = await open_item_pool(job.target.conninfo, job.concurrency)
        app = App(connector=PsycopgConnector(conninfo=job.target.conninfo, min_size=1, max_size=job.concurrency + 2))

        @app.task(name=TASK, queue=QUEUE)
        async def embed_item(collection_id: int, item_id: int) -> None:
            await write_vector(pool, job.target.table, item_id)
            if job.crash:  # committed the item; the worker's finish_job never runs
                os._exit(CRASH_EXIT)

        try:
            async with app.open_async():
                await app.run_worker_async(
                    queues=[QUEUE],
                    wait=False,
                    concurrency=job.concurrency,
                    install_signal_handlers=False,
                    delete_jobs="successful",  # like memstore: a finished job leaves no row behind
                )
        finally:
            await pool.close()

    def after_crash(self, target: Target) -> dict[str, Any]:
        """The item is ready but its job stays 'doing' until a retry_stalled_jobs periodic task finds
        it: only after the dead worker's heartbeat is older than 30 s (the library's default)."""
        state = _crash_state(
            target,
            "SELECT i.status, j.status::text FROM {table} i "
            "LEFT JOIN procrastinate_jobs j ON (j.args->>'item_id')::bigint = i.id",
        )
        return {
            "item_status": state[0],
            "job_status": state[1],
            "consistent": state[0] == "pending" or state[1] is None,
            "stalled_jobs_visible_now": asyncio.run(self._stalled(target)),
            "recovery": "a periodic retry_stalled_jobs task, once the worker's heartbeat is 30 s old; "
            "the job then runs again (the updated_at guard makes the second write a no-op)",
        }

    async def _stalled(self, target: Target) -> int:
        from procrastinate import App, PsycopgConnector

        async with App(connector=PsycopgConnector(conninfo=target.conninfo)).open_async() as app:
            return len(list(await app.job_manager.get_stalled_jobs()))


class PgqueuerSide:
    name = "pgqueuer"
    queue_tables = ("pgqueuer", "pgqueuer_log", "pgqueuer_statistics")
    unfinished_sql = "SELECT count(*) FROM pgqueuer WHERE status IN ('queued', 'picked')"
    ready_while_queued_sql = (
        "SELECT count(*) FROM pgqueuer j JOIN {table} i ON i.id = convert_from(j.payload, 'UTF8')::bigint "
        "WHERE j.status IN ('queued', 'picked') AND i.status = 'ready'"
    )

    def missing(self) -> str | None:
        return None if importlib.util.find_spec("pgqueuer") else "not installed (pip install pgqueuer)"

    def version(self) -> str:
        driver = (
            "asyncpg " + importlib.metadata.version("asyncpg") if importlib.util.find_spec("asyncpg") else "psycopg"
        )
        return f"{importlib.metadata.version('pgqueuer')} ({driver} driver)"

    def install(self, target: Target) -> None:
        asyncio.run(self._install(target))

    async def _install(self, target: Target) -> None:
        from pgqueuer.db import PsycopgDriver
        from pgqueuer.queries import Queries

        async with await psycopg.AsyncConnection.connect(target.conninfo, autocommit=True) as conn:
            await Queries(PsycopgDriver(conn)).install()

    def enqueue(self, target: Target, texts: Sequence[str]) -> float:
        from pgqueuer.db import SyncPsycopgDriver
        from pgqueuer.queries import SyncQueries

        # pgqueuer wants an autocommit connection; an explicit transaction block still makes the items
        # and the jobs one commit. A dedupe key per item keeps one queued job per item (one statement).
        with psycopg.connect(target.conninfo, autocommit=True) as conn:
            conn.execute("SELECT 1")
            queries = SyncQueries(SyncPsycopgDriver(conn))
            start = time.perf_counter()
            with conn.transaction():
                ids = insert_pending_items(conn, target.table, texts)
                queries.enqueue(
                    [TASK] * len(ids),
                    [str(i).encode() for i in ids],
                    [ingest_queue.PRIORITY_BULK] * len(ids),
                    dedupe_key=[f"{target.collection_id}:{i}" for i in ids],
                )
            return time.perf_counter() - start

    def work(self, job: WorkerJob) -> None:
        asyncio.run(self._work(job))

    async def _work(self, job: WorkerJob) -> None:
        from pgqueuer import Job, QueueManager
        from pgqueuer.queries import Queries
        from pgqueuer.types import QueueExecutionMode

        pool = await open_item_pool(job.target.conninfo, job.concurrency)
        driver, close = await self._driver(job.target.conninfo)
        manager = QueueManager(Queries(driver))

        @manager.entrypoint(TASK)
        async def embed_item(queued: Job) -> None:
            await write_vector(pool, job.target.table, int((queued.payload or b"0").decode()))
            if job.crash:  # committed the item; the buffered completion never reaches the database
                os._exit(CRASH_EXIT)

        try:
            # Without max_concurrent_tasks one worker picks the whole backlog (a second one gets
            # nothing, and a crash strands it all); twice the batch is the least pgqueuer accepts.
            # dequeue_timeout is the wait after an empty dequeue: its 30 s default would only
            # lengthen the end of a drain.
            await manager.run(
                batch_size=BATCH,
                mode=QueueExecutionMode.drain,
                dequeue_timeout=timedelta(seconds=1),
                max_concurrent_tasks=2 * BATCH,
            )
        finally:
            await close()
            await pool.close()

    async def _driver(self, conninfo: str) -> tuple[Any, Callable[[], Awaitable[None]]]:
        """asyncpg, pgqueuer's first driver, where installed. Its psycopg driver shares one connection
        between LISTEN and the queries and lets a NOTIFY wait hold it for up to a second at a time
        (seen here: every dequeue waited about 1 s), which would measure the driver, not the queue."""
        if importlib.util.find_spec("asyncpg"):
            import asyncpg
            from pgqueuer.db import AsyncpgDriver

            conn = await asyncpg.connect(conninfo)
            return AsyncpgDriver(conn), conn.close
        from pgqueuer.db import PsycopgDriver

        aconn = await psycopg.AsyncConnection.connect(conninfo, autocommit=True)
        return PsycopgDriver(aconn), aconn.close

    def after_crash(self, target: Target) -> dict[str, Any]:
        """The item is ready but its job stays 'picked' until its heartbeat is older than the
        dequeue's heartbeat_timeout (30 s by default); then any worker picks it again."""
        state = _crash_state(
            target,
            "SELECT i.status, j.status::text FROM {table} i "
            "LEFT JOIN pgqueuer j ON convert_from(j.payload, 'UTF8')::bigint = i.id",
        )
        return {
            "item_status": state[0],
            "job_status": state[1],
            "consistent": state[0] == "pending" or state[1] is None,
            "recovery": "re-picked by any worker once its heartbeat is 30 s old; the job then runs again",
        }


Side = MemstoreSide | ProcrastinateSide | PgqueuerSide
SIDES: dict[str, Side] = {s.name: s for s in (MemstoreSide(), ProcrastinateSide(), PgqueuerSide())}


def _die_after_first_executemany() -> None:
    """Kill this process right after memstore's worker sends its item UPDATEs and before it commits:
    the crash point between the item's update and the queue row's removal."""
    original = psycopg.Cursor.executemany

    def executemany_then_die(cursor: Any, *args: Any, **kwargs: Any) -> Any:
        original(cursor, *args, **kwargs)
        os._exit(CRASH_EXIT)

    # setattr rather than assignment: replacing a method is what mypy guards against, and the point here.
    setattr(psycopg.Cursor, "executemany", executemany_then_die)  # noqa: B010


def _crash_state(target: Target, query: str) -> tuple[Any, Any]:
    with psycopg.connect(target.conninfo, autocommit=True) as conn:
        row = conn.execute(sql.SQL(query).format(table=sql.Identifier(target.table))).fetchone()
    assert row is not None
    return row[0], row[1]


# --- worker processes ------------------------------------------------------------------------------


def _worker_process(job: WorkerJob, ready: Any, go: Any, results: Any) -> None:
    """A worker process: import, say ready, wait for the start, drain, report its end time and statements."""
    warnings.simplefilter("ignore")
    counter = StatementCounter()
    ready.put(os.getpid())
    go.wait()
    counter.count = 0
    SIDES[job.side].work(job)
    results.put({"end": time.time(), "statements": counter.count})


@dataclass
class Drain:
    seconds: float
    statements: int
    transactions: int
    rows_written: int
    ready_while_queued_max: int


def run_workers(admin: str, target: Target, job: WorkerJob, workers: int, watch: str | None) -> Drain:
    """Drain the queue with ``workers`` processes; ``watch`` is the sampler's query (None: no sampler)."""
    ctx = mp.get_context("spawn")
    ready, results, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=_worker_process, args=(job, ready, go, results), daemon=True) for _ in range(workers)]
    for p in procs:
        p.start()
    for _ in procs:
        ready.get(timeout=300)
    before = _database_counters(admin, target.database)
    sampler = Sampler(target, watch) if watch else None
    start = time.time()
    go.set()
    reports = _collect(procs, results, allow_exit=CRASH_EXIT if job.crash else None)
    if sampler:
        sampler.stop()
    after = _database_counters(admin, target.database)
    sampled = sampler.queries if sampler else 0
    return Drain(
        seconds=max((r["end"] for r in reports), default=time.time()) - start,
        statements=sum(r["statements"] for r in reports),
        transactions=after[0] - before[0] - sampled,  # the sampler's own statements are transactions too
        rows_written=after[1] - before[1],
        ready_while_queued_max=sampler.most if sampler else 0,
    )


def _collect(procs: list[Any], results: Any, *, allow_exit: int | None) -> list[dict[str, Any]]:
    reports: list[dict[str, Any]] = []
    deadline = time.monotonic() + 1800
    while any(p.is_alive() for p in procs) or not results.empty():
        try:
            reports.append(results.get(timeout=0.2))
        except Exception:  # queue.Empty: look at the processes again
            if time.monotonic() > deadline:
                raise TimeoutError("worker processes did not finish in 30 minutes") from None
    for p in procs:
        p.join()
        if p.exitcode not in (0, allow_exit):
            raise RuntimeError(f"a worker process exited with {p.exitcode}")
    return reports


class Sampler:
    """Polls the side's 'ready while still queued' count while workers drain, from the parent."""

    def __init__(self, target: Target, query: str) -> None:
        self.conn = psycopg.connect(target.conninfo, autocommit=True)
        self.statement = sql.SQL(query).format(table=sql.Identifier(target.table))
        self.most = 0
        self.queries = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_EVERY_S):
            row = self.conn.execute(self.statement).fetchone()
            self.queries += 1
            self.most = max(self.most, int(row[0]) if row else 0)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.conn.close()


def _database_counters(admin: str, database: str) -> tuple[int, int]:
    """(transactions, rows written) of ``database``, once none of its sessions is left (a session's
    counts reach the server's totals when it ends)."""
    with psycopg.connect(admin, autocommit=True) as conn:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND backend_type = 'client backend'",
                (database,),
            ).fetchone()
            if row and row[0] == 0:
                break
            time.sleep(0.02)
        row = conn.execute(
            "SELECT xact_commit + xact_rollback, tup_inserted + tup_updated + tup_deleted "
            "FROM pg_stat_database WHERE datname = %s",
            (database,),
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


# --- phases ----------------------------------------------------------------------------------------


def reset(side: Side, target: Target) -> None:
    tables = [target.table, *side.queue_tables]
    with psycopg.connect(target.conninfo, autocommit=True) as conn:
        conn.execute(sql.SQL("TRUNCATE {} CASCADE").format(sql.SQL(", ").join(map(sql.Identifier, tables))))


def check_drained(side: Side, target: Target, rows: int) -> None:
    with psycopg.connect(target.conninfo, autocommit=True) as conn:
        ready = conn.execute(
            sql.SQL("SELECT count(*) FROM {} WHERE status = 'ready' AND embedding IS NOT NULL").format(
                sql.Identifier(target.table)
            )
        ).fetchone()
        left = conn.execute(side.unfinished_sql).fetchone()
    if not ready or ready[0] != rows or not left or left[0] != 0:
        raise RuntimeError(f"{side.name}: {ready} of {rows} items ready, {left} jobs left after draining")


@dataclass
class Totals:
    enqueue_seconds: float = 0.0
    enqueued: int = 0
    drains: dict[int, list[Drain]] | None = None

    def add(self, workers: int, drain: Drain) -> None:
        self.drains = self.drains or {}
        self.drains.setdefault(workers, []).append(drain)


def run_round(side: Side, target: Target, admin: str, args: argparse.Namespace, totals: Totals, seed: int) -> None:
    for workers in (1, 2):
        reset(side, target)
        texts = [f"item {i} of run {seed}.{workers}" for i in range(args.rows)]
        totals.enqueue_seconds += side.enqueue(target, texts)
        totals.enqueued += len(texts)
        job = WorkerJob(side.name, target, args.library_concurrency)
        watch = side.ready_while_queued_sql if args.sample else None
        totals.add(workers, run_workers(admin, target, job, workers, watch))
        check_drained(side, target, args.rows)


def crash_probe(side: Side, target: Target, admin: str, args: argparse.Namespace) -> dict[str, Any]:
    """One item, one worker that dies right after the item's update and before the job's completion."""
    reset(side, target)
    side.enqueue(target, ["the crash probe's item"])
    run_workers(admin, target, WorkerJob(side.name, target, args.library_concurrency, crash=True), 1, None)
    return side.after_crash(target)


def figures(totals: Totals, rows: int) -> dict[str, Any]:
    assert totals.drains is not None
    out: dict[str, Any] = {"enqueue_jobs_per_s": round(totals.enqueued / totals.enqueue_seconds, 1)}
    for workers, drains in sorted(totals.drains.items()):
        out[f"drain_{workers}_jobs_per_s"] = round(rows * len(drains) / sum(d.seconds for d in drains), 1)
    every = [d for drains in totals.drains.values() for d in drains]
    jobs = rows * len(every)
    per_job = {
        "statements_per_job": sum(d.statements for d in every) / jobs,
        "transactions_per_job": sum(d.transactions for d in every) / jobs,
        "rows_written_per_job": sum(d.rows_written for d in every) / jobs,
    }
    out |= {key: round(value, 3) for key, value in per_job.items()}
    out[f"statements_per_{BATCH}_jobs"] = round(per_job["statements_per_job"] * BATCH, 1)
    out[f"transactions_per_{BATCH}_jobs"] = round(per_job["transactions_per_job"] * BATCH, 1)
    out["ready_while_queued_max"] = max(d.ready_while_queued_max for d in every)
    return out


RATIO_KEYS = (
    "enqueue_jobs_per_s",
    "drain_1_jobs_per_s",
    "drain_2_jobs_per_s",
    "statements_per_job",
    "transactions_per_job",
    "rows_written_per_job",
)


def ratios(results: dict[str, dict[str, Any]]) -> dict[str, dict[str, float]]:
    base = results["memstore"]
    return {
        name: {key: round(r[key] / base[key], 3) for key in RATIO_KEYS if base.get(key)}
        for name, r in results.items()
        if name != "memstore" and "skipped" not in r
    }


# --- setup -----------------------------------------------------------------------------------------


@contextmanager
def server(database_url: str | None) -> Iterator[str]:
    """A SQLAlchemy URL to a database on a server this run may create databases on."""
    if database_url:
        yield normalise_url(database_url)
        return
    with scratch_dir("memstore-queue-bench-") as data_dir:
        yield start_embedded_server(
            data_dir, maintenance_work_mem="256MB", max_parallel_maintenance_workers=1, database="queue_bench"
        )


@contextmanager
def side_database(server_url: str, side: Side) -> Iterator[Target]:
    """A fresh database for one side, migrated, with the collection; dropped afterwards."""
    name = f"queue_bench_{side.name}_{os.getpid()}"
    admin = libpq_url(server_url)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = sa.make_url(server_url).set(database=name).render_as_string(hide_password=False)
    try:
        migrate.upgrade(url)
        engine = create_engine(url, pool_size=1, max_overflow=0)
        try:
            store = VectorStore(engine, settings=Settings(database_url=url))
            c = store.create_collection(name=COLLECTION, dimensions=DIMENSIONS, model=MODEL)
        finally:
            engine.dispose()
        target = Target(name, url, c.table_name, c.id)
        side.install(target)
        yield target
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def run(args: argparse.Namespace) -> dict[str, Any]:
    names = [n for n in args.sides.split(",") if n]
    unknown = set(names) - set(SIDES)
    if unknown or "memstore" not in names:
        raise SystemExit(f"--sides takes memstore plus any of {SIDE_NAMES[1:]}; got {args.sides}")
    results: dict[str, dict[str, Any]] = {}
    for name in names:
        reason = SIDES[name].missing()
        if reason:
            print(f"skipping {name}: {reason}", file=sys.stderr)
            results[name] = {"skipped": reason}
    active = [SIDES[n] for n in names if n not in results]
    totals = {s.name: Totals() for s in active}
    with server(args.database_url) as server_url, contextmanager_stack(server_url, active) as targets:
        admin = libpq_url(server_url)
        progress = tqdm(total=args.rounds * len(active) + len(active), desc="queue benchmark", file=sys.stderr)
        for r in range(args.rounds):
            order = active[r % len(active) :] + active[: r % len(active)]  # rotate who goes first
            for side in order:
                progress.set_postfix_str(f"round {r + 1}: {side.name}")
                run_round(side, targets[side.name], admin, args, totals[side.name], seed=r)
                progress.update()
        for side in active:
            progress.set_postfix_str(f"crash probe: {side.name}")
            results[side.name] = figures(totals[side.name], args.rows)
            results[side.name]["crash_between_update_and_completion"] = crash_probe(
                side, targets[side.name], admin, args
            )
            progress.update()
        progress.close()
        with psycopg.connect(admin) as conn:
            row = conn.execute("SHOW server_version").fetchone()
    return {
        "rows": args.rows,
        "rounds": args.rounds,
        "batch_size": BATCH,
        "library_concurrency": args.library_concurrency,
        "postgresql": row[0] if row else None,
        "versions": {s.name: s.version() for s in active},
        "sides": {name: results[name] for name in names},
        "ratios_library_over_memstore": ratios({name: results[name] for name in names}),
    }


@contextmanager
def contextmanager_stack(server_url: str, sides: Sequence[Side]) -> Iterator[dict[str, Target]]:
    """One database per side, all dropped at the end."""
    if not sides:
        yield {}
        return
    with side_database(server_url, sides[0]) as target, contextmanager_stack(server_url, sides[1:]) as rest:
        yield {sides[0].name: target, **rest}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.queue_libraries", description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", help="print only the JSON result (last line)")
    parser.add_argument("--rows", type=int, default=2000, help="jobs per enqueue and per drain")
    parser.add_argument("--rounds", type=int, default=2, help="rounds; every round enqueues and drains twice")
    parser.add_argument("--sides", default=",".join(SIDE_NAMES))
    parser.add_argument(
        "--library-concurrency",
        type=int,
        default=8,
        help="jobs a library worker process runs at once (procrastinate's concurrency; pgqueuer takes batches "
        f"of {BATCH}); also the size of its item-writing pool",
    )
    parser.add_argument("--no-sample", dest="sample", action="store_false", help="no 'ready while queued' sampler")
    parser.add_argument(
        "--database-url",
        default=os.environ.get("MEMSTORE_DATABASE_URL"),
        help="a server this run may create databases on (default: MEMSTORE_DATABASE_URL, else an embedded server)",
    )
    args = parser.parse_args(argv)
    # procrastinate warns when an App is made in the __main__ module (its workers import tasks by
    # path); this run's workers define their task themselves.
    logging.getLogger("procrastinate").setLevel(logging.ERROR)
    result = run(args)
    result["command"] = "python -m bench.queue_libraries " + shlex.join(argv if argv is not None else sys.argv[1:])
    if not args.json:
        print(json.dumps(result, indent=2))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
