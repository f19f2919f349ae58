"""The compact-index maintenance action: measure recall against exact search, refit or rebuild online.

``maintain_compact_index(db, collection=..., min_recall=...)`` is the one entry point (the
maintenance worker calls it for every collection whose options name a compact representation, or a
pending one). It

1. makes a pending low-rank representation once the collection has enough vectors to fit on;
2. otherwise measures recall@k of the compact search (candidates re-ranked exactly) against exact
   full-precision search, on a random draw of the real queries the API kept
   (``memstore.search.query_samples``, the same draw as the maintenance worker's probes) or stand-ins
   made from stored vectors;
3. when recall is below ``min_recall``: refits the projection on a fresh sample and builds its index
   online when the projection itself has become lossy (low-rank, judged by the same search made
   exhaustive on the projected rows), or else rebuilds the compact index with
   ``REINDEX ... CONCURRENTLY`` (a graph worn by churn; halfvec and binary); then measures again.

Each action is recorded in ``memstore_maintenance_actions`` like the worker's own (``before`` and
``after`` hold the recall probes and the index specs), so ``memstore-maint history`` lists it.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import asdict, dataclass, replace
from functools import partial
from typing import Any

import numpy as np
import psycopg
from psycopg import sql

from maintenance.actions import Executor, Interrupted
from maintenance.config import MaintenanceConfig
from maintenance.recall import limit_statements, moved_apart, snapshot
from maintenance.targets import Target
from memstore import action_log
from memstore.catalog import index_spec as specs
from memstore.catalog.registry import read_collection
from memstore.compact import ddl
from memstore.compact import projection as proj
from memstore.compact.switch import DEFAULT_GRACE_S, reconcile, set_representation
from memstore.db import locks, online_ddl
from memstore.db.core import Database
from memstore.search import compact as compact_search
from memstore.search import query_samples
from memstore.search.exact_answers import exact_answers, recall_hits
from memstore.search.plan import plan
from memstore.search.request import check_query
from memstore.search.statements import SearchSettings, apply, run_search
from memstore.settings import Settings, get_settings
from memstore.store import VectorStore

log = logging.getLogger(__name__)

DEFAULT_MIN_RECALL = 0.9
DEFAULT_QUERIES = 30
# After an action that left recall below the minimum, acting again soon would only repeat it (the
# representation loses too much for this data): wait this long, or until someone changes the index.
DEFAULT_RETRY_AFTER_S = 24 * 3600.0


@dataclass(frozen=True)
class CompactUpkeep:
    """What ``maintain_compact_index`` saw and did. ``action``: None, ``make_pending``,
    ``refit_projection`` or ``rebuild_compact_index``; ``outcome``: ok, skipped, failed or interrupted
    (a stop request cancelled the rebuild)."""

    collection: str
    outcome: str = "ok"
    action: str | None = None
    representation: str | None = None
    reason: str = ""
    recall: float | None = None  # before acting
    probe: dict[str, Any] | None = None
    recall_after: float | None = None
    # Still low after acting: the representation loses too much at this pool size for this data;
    # raise pool_factor (or the rank) or choose a finer representation.
    still_below: bool = False
    spec: dict[str, Any] | None = None  # the index in force after acting
    reconciled: list[str] | None = None
    error: str | None = None


@dataclass(frozen=True)
class CompactProbe:
    recall: float | None  # the search as configured (HNSW on the compact form, re-ranked); None: no queries
    # Low-rank: the same pool taken by scanning every projected row, i.e. what the projection alone loses.
    exhaustive_recall: float | None
    k: int
    queries: int
    pool: int
    source: str  # "query_samples" or "stand_ins"
    seconds: float


def _queries(conn: psycopg.Connection[Any], store: VectorStore, c: Any, n: int) -> tuple[list[np.ndarray], str]:
    """A random draw of the API's kept query samples (the same draw as the maintenance worker's
    probes), else stand-ins made from random stored vectors (``maintenance.recall.stand_ins``: a
    stored vector is no fair query, the graph holds it as a node), their nearest rows found by the
    collection's own search."""
    kept = query_samples.draw(conn, c.id, n, dimensions=c.dimensions)
    if kept:
        return [v for _, v in kept], "query_samples"
    rows = conn.execute(
        sql.SQL("SELECT embedding FROM {} WHERE embedding IS NOT NULL ORDER BY random() LIMIT %s").format(c.table), (n,)
    ).fetchall()
    stored = [r[0].to_numpy() for r in rows]
    near = [
        [(r.id, r.distance) for r in store.search(collection=c.name, vector=v, k=4) if r.distance is not None]
        for v in stored
    ]
    return moved_apart(conn, c.table_name, stored, near), "stand_ins"


def _exhaustive(conn: psycopg.Connection[Any], c: Any, spec: specs.IndexSpec, v: np.ndarray, k: int) -> list:
    """Low-rank only: the top k of ``pool`` candidates found by scanning every projected row (no HNSW)."""
    assert spec.version is not None
    side = sql.Identifier(specs.side_table(c.id, spec.version))
    op = sql.SQL(specs.order_operator("lowrank", c.metric))
    with conn.transaction():
        conn.execute("SELECT set_config('enable_indexscan', 'off', true)")
        ids = conn.execute(
            sql.SQL("SELECT id FROM {} ORDER BY v {} %s LIMIT %s").format(side, op),
            (compact_search.compact_query(conn, spec, v), spec.pool(k)),
        ).fetchall()
    distance = sql.SQL(specs.order_operator("full", c.metric))
    rows = conn.execute(
        sql.SQL("SELECT id, embedding {} %s FROM {} WHERE id = ANY(%s) AND embedding IS NOT NULL").format(
            distance, c.table
        ),
        (v, [r[0] for r in ids]),
    ).fetchall()
    return sorted(((int(r[0]), float(r[1])) for r in rows), key=lambda x: x[1])[:k]


def _compact_answer(
    conn: psycopg.Connection[Any], store: VectorStore, c: Any, v: np.ndarray, k: int
) -> list[tuple[int, float]]:
    """The collection's own search of ``v`` (its plan: the compact index's pool, re-ranked exactly, at
    the collection's ef_search), run on ``conn`` inside the caller's transaction and snapshot."""
    query = check_query(mode="vector", vector=v, text=None, k=k)
    p = plan(c, query, ef_search=None, exact=False, max_scan_tuples=store.settings.max_scan_tuples, conn=conn)
    rows = run_search(conn, p.settings, p.statement, p.params, prepare=p.prepare)
    return [(int(r[0]), float(r[3])) for r in rows if r[3] is not None]


def probe_compact_recall(
    store: VectorStore, *, collection: str, k: int = 10, queries: int = DEFAULT_QUERIES
) -> CompactProbe:
    """recall@k of the collection's search (as configured) against exact search on full vectors, and
    of the same search made exhaustive on the compact form (telling a worn graph from a lossy projection)."""
    started = time.monotonic()
    c = store.get_collection(name=collection, fresh=True)
    spec = specs.index_spec(c)
    with ddl.connect(store.db) as conn:
        vectors, source = _queries(conn, store, c, queries)
        vectors = [v for v in vectors if v.shape == (c.dimensions,) and np.isfinite(v).all()]
        # The compact search's answers (the index as configured, re-ranked on full vectors), then the
        # true answers of every query from one scan bounded by them, as the maintenance probes do.
        # All in one snapshot on this one connection: rows written between the index's answers and
        # the exact ones (a busy collection) would otherwise count as misses the index never had a
        # chance to find, and a low reading rebuilds or refits for nothing.
        with snapshot(conn), conn.cursor() as cur:
            limit_statements(conn, MaintenanceConfig().probe_timeout_s)  # the exact scan, bounded
            found = [_compact_answer(conn, store, c, v, k) for v in vectors]
            apply(
                cur,
                SearchSettings(
                    ef_search=c.default_ef_search, exact=True, max_scan_tuples=store.settings.max_scan_tuples
                ),
            )
            truth = exact_answers(
                cur,
                table=c.table_name,
                operator=c.spec.operator,
                dimensions=c.dimensions,
                queries=vectors,
                found=found,
                k=k,
            )
            hits = exhaustive_hits = total = 0
            for v, answer, exact in zip(vectors, found, truth, strict=True):
                if not exact:
                    continue
                hits += recall_hits(answer, exact)
                if spec.representation == "lowrank":
                    # In the same snapshot too: the projection is judged against the same truth.
                    exhaustive_hits += recall_hits(_exhaustive(conn, c, spec, v, k), exact)
                total += len(exact)
    return CompactProbe(
        recall=hits / total if total else None,
        exhaustive_recall=exhaustive_hits / total if total and spec.representation == "lowrank" else None,
        k=k,
        queries=len(vectors),
        pool=spec.pool(k),
        source=source,
        seconds=round(time.monotonic() - started, 3),
    )


def _start(
    conn: psycopg.Connection[Any], c_name: str, table: str, index: str, action: str, reason: str, before: Any
) -> int:
    return action_log.start_action(
        conn, collection=c_name, partition_table=table, index_name=index, action=action, reason=reason, before=before
    )


def _finish(
    conn: psycopg.Connection[Any], action_id: int, started: float, outcome: str, after: Any, error: str | None
) -> None:
    duration = round(time.monotonic() - started, 3)
    action_log.finish_action(conn, action_id, outcome=outcome, duration_s=duration, after=after, error=error)


def _futile_action(
    conn: psycopg.Connection[Any], table: str, spec: specs.IndexSpec, min_recall: float, within_s: float
) -> str | None:
    """Why not to act again: the last action on this collection, within ``within_s``, left recall below
    ``min_recall`` and the index it left is still the one in force (None when acting may help)."""
    row = conn.execute(
        "SELECT action, finished_at, (after -> 'probe' ->> 'recall')::float8, after -> 'spec' "
        "FROM memstore_maintenance_actions "
        "WHERE partition_table = %s AND outcome = 'ok' AND action IN ('refit_projection', 'rebuild_compact_index') "
        "AND finished_at > now() - make_interval(secs => %s) ORDER BY finished_at DESC LIMIT 1",
        (table, within_s),
    ).fetchone()
    if row is None or row[2] is None or row[2] >= min_recall:
        return None
    if row[3] != json.loads(json.dumps(spec.to_json())):
        return None  # the index changed since (a new representation, pool or rank): worth a new try
    return (
        f"the {row[0]} at {row[1]:%Y-%m-%d %H:%M} left recall at {row[2]:.3f}, below {min_recall}, and doing it "
        "again would not help: raise pool_factor (or the rank) or choose a finer representation"
    )


def _index_name(c: Any, spec: specs.IndexSpec) -> str:
    if spec.representation == "lowrank" and spec.version is not None:
        return specs.side_index(c.id, spec.version)
    return str(c.index_name)


def _reindex(conn: psycopg.Connection[Any], c: Any, spec: specs.IndexSpec, executor: Executor) -> None:
    """``REINDEX CONCURRENTLY`` of the compact index (each partition's), by the maintenance worker's
    own executor: under the long lock timeout of concurrent statements, leftovers of an earlier try
    dropped first and those of a failed one at once, cancelled by the executor's stop."""
    if spec.representation == "lowrank":
        assert spec.version is not None
        names = [(_index_name(c, spec), specs.side_table(c.id, spec.version))]
    elif c.partitions == 1:
        names = [(str(c.index_name), str(c.table_name))]
    else:
        names = [(f"{part}_hnsw", part) for part in c.partition_tables()]
    for name, table in names:
        target = Target(collection=c, table=table, index=name)
        # The maintenance worker's own lock on this index: never two rebuilds of one index at once.
        busy = partial(ddl.CompactBusyError, f"the maintenance worker holds {name}")
        with locks.session_lock(conn, target.lock_key, busy=busy):
            executor.drop_leftovers(conn, target)
            executor.rebuild(conn, target)


def default_executor(db: Database) -> Executor:
    """The executor of an upkeep run on its own (not by the worker): the worker's configuration, its
    connections' lock timeout, and no stop request."""

    def connect() -> psycopg.Connection[Any]:
        conn = db.dedicated(application_name="memstore-compact")
        online_ddl.set_lock_timeout(conn)
        return conn

    return Executor(connect, MaintenanceConfig(), stop=threading.Event())


def maintain_compact_index(
    db: Database,
    *,
    collection: str,
    min_recall: float = DEFAULT_MIN_RECALL,
    k: int = 10,
    queries: int = DEFAULT_QUERIES,
    grace_s: float = DEFAULT_GRACE_S,
    retry_after_s: float = DEFAULT_RETRY_AFTER_S,
    settings: Settings | None = None,
    executor: Executor | None = None,
) -> CompactUpkeep:
    """Check one collection's compact index and act when needed; returns what was seen and done.
    ``executor``: what runs a rebuild (the maintenance worker passes its own; else ``default_executor``)."""
    store = VectorStore(db, settings=settings or get_settings())
    with ddl.connect(db) as conn:
        c = read_collection(conn, name=collection)
        try:
            with ddl.collection_lock(conn, c):
                fixed = reconcile(conn, read_collection(conn, name=collection))
        except ddl.CompactBusyError as exc:
            return CompactUpkeep(collection, outcome="skipped", reason=str(exc))
        c = read_collection(conn, name=collection)
        spec = specs.index_spec(c)
        out = CompactUpkeep(collection, representation=spec.representation, reconciled=list(fixed) if fixed else None)
        if spec.pending:
            return _make_pending(conn, store, c, spec, out, grace_s=grace_s, k=k, queries=queries)
        if not spec.compact:
            return replace(out, outcome="skipped", reason="full-precision index: nothing compact to maintain")
        probe = probe_compact_recall(store, collection=collection, k=k, queries=queries)
        out = replace(out, recall=probe.recall, probe=asdict(probe))
        if probe.recall is None or probe.recall >= min_recall:
            return replace(out, outcome="ok")
        # A projection that still finds the neighbours when scanned exhaustively is fine: the graph
        # is what wore out (churn), and a rebuild is enough. Otherwise the data drifted from it.
        lossy = probe.exhaustive_recall is not None and probe.exhaustive_recall < min_recall
        action = "refit_projection" if lossy else "rebuild_compact_index"
        reason = f"compact recall@{k} {probe.recall:.3f} below {min_recall}"
        if probe.exhaustive_recall is not None:
            reason += f" (exhaustive on the projection: {probe.exhaustive_recall:.3f})"
        futile = _futile_action(conn, c.table_name, spec, min_recall, retry_after_s)
        if futile is not None:
            return replace(out, outcome="skipped", reason=futile)
        before = {"probe": asdict(probe), "spec": spec.to_json()}
        started = time.monotonic()
        action_id = _start(conn, collection, c.table_name, _index_name(c, spec), action, reason, before)
        try:
            if action == "refit_projection":
                new = set_representation(
                    db, collection=collection, representation="lowrank", refit=True, grace_s=grace_s
                )
            else:
                _reindex(conn, c, spec, executor or default_executor(db))
                new = spec
        except Interrupted as exc:  # a stop request cancelled it; what it left is dropped
            _finish(conn, action_id, started, "interrupted", {}, str(exc))
            return replace(out, action=action, outcome="interrupted", error=str(exc))
        except Exception as exc:
            _finish(conn, action_id, started, "failed", {}, f"{type(exc).__name__}: {exc}")
            log.exception("%s of %s failed", action, collection)
            return replace(out, action=action, outcome="failed", error=str(exc))
        after = probe_compact_recall(store, collection=collection, k=k, queries=queries)
        result = {"probe": asdict(after), "spec": new.to_json()}
        _finish(conn, action_id, started, "ok", result, None)
        return replace(
            out,
            action=action,
            outcome="ok",
            reason=reason,
            recall_after=after.recall,
            still_below=after.recall is not None and after.recall < min_recall,
            spec=new.to_json(),
        )


def _make_pending(
    conn: psycopg.Connection[Any],
    store: VectorStore,
    c: Any,
    spec: specs.IndexSpec,
    out: CompactUpkeep,
    *,
    grace_s: float,
    k: int,
    queries: int,
) -> CompactUpkeep:
    pending = spec.pending or {}
    row = conn.execute(sql.SQL("SELECT count(*) FROM {} WHERE embedding IS NOT NULL").format(c.table)).fetchone()
    stored = int(row[0]) if row else 0
    if stored < proj.MIN_FIT_ROWS:
        return replace(out, outcome="skipped", reason=f"{stored} vectors; fitting needs {proj.MIN_FIT_ROWS}")
    reason = f"pending {pending.get('representation')} representation; {stored} vectors to fit on"
    started = time.monotonic()
    action_id = _start(conn, c.name, c.table_name, c.index_name, "make_pending", reason, {"spec": spec.to_json()})
    try:
        new = set_representation(
            store.db,
            collection=c.name,
            representation=str(pending.get("representation", "lowrank")),
            rank=pending.get("rank"),
            pool_factor=pending.get("pool_factor"),
            grace_s=grace_s,
        )
    except Exception as exc:
        _finish(conn, action_id, started, "failed", {}, f"{type(exc).__name__}: {exc}")
        return replace(out, action="make_pending", outcome="failed", reason=reason, error=str(exc))
    after = probe_compact_recall(store, collection=c.name, k=k, queries=queries)
    _finish(conn, action_id, started, "ok", {"probe": asdict(after), "spec": new.to_json()}, None)
    return replace(
        out, action="make_pending", outcome="ok", reason=reason, recall_after=after.recall, spec=new.to_json()
    )
