"""The maintenance worker: probe every index, decide, act safely, record everything.

``run_once()`` is one pass (cron: ``memstore-maint run --once``); ``run_forever(stop)`` repeats it
every ``interval_s`` until ``stop`` is set (the daemon, or a thread of the API server). Partitions are
handled one at a time, so the extra space and time of a rebuild stay bounded by one partition's.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from functools import partial
from typing import Any

import psycopg

from maintenance import history, search_cost
from maintenance.actions import Busy, Executor, Interrupted, index_density, wait_for_slo
from maintenance.compact_index import maintain_compact_index
from maintenance.config import MaintenanceConfig
from maintenance.ladder import REFERENCE_EF, Ladder, Sample, draw, measure_ladder
from maintenance.policy import Decision, decide
from maintenance.probes import Probe, attach_recall, probe, record_probe
from maintenance.progress import ProgressCallback
from maintenance.recall import limit_statements, snapshot
from maintenance.targets import Target, every_target, representation, targets_for
from maintenance.tuning import Tuning, choose_ef, ladder_for, recheck, told_below, unmeasured_above
from memstore import action_log as core_history
from memstore.catalog import density, segments
from memstore.catalog.collections import RECALL_TUNING, Collection
from memstore.catalog.density import Density
from memstore.catalog.index_spec import index_spec
from memstore.catalog.registry import (
    read_collection,
    read_collections,
    set_default_ef_search,
    set_hnsw_density,
    set_option,
)
from memstore.db import locks, online_ddl
from memstore.db.core import Database, get_database
from memstore.items import bulk_load, sealing
from memstore.settings import Settings, get_settings
from memstore.workers.pacing import FULL_SPEED, Pace, Unit

log = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_FAILED = 1
# 2 is a usage error (encoder.cli_support). An action asked for by name (memstore-maint rebuild,
# vacuum, handback) that was not done exits with one of these, so a script can tell "try later" from
# a failure: skipped (another worker holds the index, or searches stayed over the latency SLO), and
# interrupted (a stop request cancelled it).
EXIT_SKIPPED = 3
EXIT_INTERRUPTED = 4
REQUEST_POLL_S = 2.0  # how soon a requested pass starts (one small DELETE per look)

LatencySource = Callable[[], float | None]


@dataclass
class ActionOutcome:
    """What one pass did to one target (also the --json output of run/vacuum/rebuild)."""

    collection: str
    table: str
    decision: str
    reason: str
    outcome: str  # ok, failed, skipped, interrupted, nothing
    duration_s: float = 0.0
    error: str | None = None
    dropped: list[str] = field(default_factory=list)
    before: dict[str, Any] = field(default_factory=dict)
    after: dict[str, Any] = field(default_factory=dict)
    # The VACUUM after a rebuild, reported on its own: {"action", "outcome", "error", "duration_s"}.
    follow_up: dict[str, Any] | None = None

    @property
    def state(self) -> str:
        """The outcome that counts for an exit code: the action's, else its follow-up's where that
        was not done."""
        if self.outcome == "ok" and self.follow_up is not None and self.follow_up.get("outcome") != "ok":
            return str(self.follow_up["outcome"])
        return self.outcome


def exit_code(outcomes: Sequence[ActionOutcome]) -> int:
    """The exit code of actions asked for by name: a failure first, then an interruption, then a skip."""
    states = {o.state for o in outcomes}
    for state, code in (("failed", EXIT_FAILED), ("interrupted", EXIT_INTERRUPTED), ("skipped", EXIT_SKIPPED)):
        if state in states:
            return code
    return EXIT_OK


def tune_key(collection_id: int) -> str:
    """The advisory lock of a collection's recall-target tuning (``memstore.db.locks``' keys are
    ``memstore.maint.<index>`` and ``memstore.compact.<id>``: none is spelt like it)."""
    return f"memstore.tune.{collection_id}"


class MaintenanceWorker:
    def __init__(
        self,
        db: Database,
        *,
        settings: Settings | None = None,
        config: MaintenanceConfig | None = None,
        collections: list[str] | None = None,
        latency_source: LatencySource | None = None,
        on_progress: ProgressCallback | None = None,
        pace: Pace | None = None,
    ) -> None:
        """``latency_source`` returns the foreground search p99 in ms (the API passes its own tracker);
        without one the worker back-offs on nothing but lock timeouts. ``pace``: the process's
        foreground controller (or follower), whose share sets the parallel workers a rebuild starts
        with (``online_ddl.paced_build_workers``)."""
        self.db = db
        self.settings = settings or get_settings()
        self.config = config or MaintenanceConfig()
        self.collections = collections
        self.latency_source = latency_source
        # Set when a pass's reads waited out SLO_MAX_WAIT_S with searches still over the SLO: the rest
        # of that pass's reads check once and do not wait again (one wait per pass, not per target).
        self._slo_waited_out = False
        self.pace = pace
        self.on_progress = on_progress
        self.stop = threading.Event()
        self.last_outcomes: list[ActionOutcome] = []
        self._local = threading.local()

    # ------------------------------------------------------------------ plumbing

    def connect(self) -> psycopg.Connection[Any]:
        """A dedicated autocommit connection (REINDEX CONCURRENTLY and VACUUM cannot run in a transaction)."""
        conn = self.db.dedicated(application_name="memstore-maint")
        online_ddl.build_resources(conn, self.settings, background=True)
        conn.execute(
            "SELECT set_config('lock_timeout', %s, false), set_config('statement_timeout', '0', false), "
            "set_config('vacuum_cost_delay', %s, false)",
            (f"{self.config.lock_timeout_ms}ms", f"{self.config.vacuum_cost_delay_ms}ms"),
        )
        return conn

    def session(self) -> psycopg.Connection[Any]:
        """This thread's long-lived connection (reconnected when broken): a pass costs no new logins."""
        conn: psycopg.Connection[Any] | None = getattr(self._local, "conn", None)
        if conn is None or conn.closed or conn.broken:
            conn = self._local.conn = self.connect()
        return conn

    def close(self) -> None:
        for name in ("conn", "replica_conn"):
            conn: psycopg.Connection[Any] | None = getattr(self._local, name, None)
            if conn is not None and not conn.closed:
                conn.close()
            setattr(self._local, name, None)

    def recall_session(self) -> psycopg.Connection[Any]:
        """Where sampled recall is measured: a standby's connection with ``recall_on_replica`` (the
        first healthy replica; kept like ``session``), else this thread's session on the primary."""
        if not (self.config.recall_on_replica and self.settings.read_database_urls):
            return self.session()
        conn: psycopg.Connection[Any] | None = getattr(self._local, "replica_conn", None)
        if conn is not None and not conn.closed and not conn.broken:
            return conn
        healthy = [r for r in get_database(self.settings).replicas if r.healthy]
        for replica in healthy:
            try:
                conn = replica.dedicated(application_name="memstore-maint-recall")
            except psycopg.OperationalError as exc:
                log.warning("recall probe: replica %s refused (%s)", replica.url, exc)
                continue
            self._local.replica_conn = conn
            return conn
        log.warning("recall probe: no healthy replica; measuring on the primary")
        return self.session()

    def _attach_recall(self, conn: psycopg.Connection[Any], target: Target, p: Probe, *, confirm: bool = False) -> None:
        """Sampled recall into ``p``, on ``recall_session()``; on the primary when a standby fails it
        (gone, or a table it has not replayed yet)."""
        where = self.recall_session()
        try:
            attach_recall(where, target, p, self.config, max_scan_tuples=self.settings.max_scan_tuples, confirm=confirm)
        except psycopg.Error as exc:
            if where is conn:
                raise
            log.warning("%s: recall probe failed on the replica (%s); measuring on the primary", target.label, exc)
            where.close()
            attach_recall(conn, target, p, self.config, max_scan_tuples=self.settings.max_scan_tuples, confirm=confirm)

    def executor(self, stop: threading.Event | None = None) -> Executor:
        return Executor(self.connect, self.config, stop=stop or self.stop, on_progress=self.on_progress)

    def list_collections(self, conn: psycopg.Connection[Any]) -> list[Collection]:
        """The registry, read on the worker's own autocommit session (one round trip, no pool checkout)."""
        every = read_collections(conn)
        if self.collections is None:
            return every
        wanted = set(self.collections)
        missing = wanted - {c.name for c in every}
        if missing:
            raise LookupError(f"no such collection: {', '.join(sorted(missing))}")
        return [c for c in every if c.name in wanted]

    def targets(self, conn: psycopg.Connection[Any]) -> list[Target]:
        return every_target(conn, self.list_collections(conn))

    # ------------------------------------------------------------------ probing

    def probe(self, *, with_recall: bool = True, record: bool = True) -> list[tuple[Probe, Decision]]:
        out: list[tuple[Probe, Decision]] = []
        conn = self.session()
        for target in self.targets(conn):
            p = probe(conn, target, self.config, max_scan_tuples=self.settings.max_scan_tuples, with_recall=with_recall)
            p.search_cost = self.search_cost(conn, target)
            d = decide(p, self.config)
            if record:
                record_probe(conn, p, d.label)
            out.append((p, d))
        return out

    # ------------------------------------------------------------------ acting

    def act(
        self,
        target: Target,
        action: str,
        *,
        reason: str,
        stop: threading.Event | None = None,
        before: Probe | None = None,
    ) -> ActionOutcome:
        """Run ``action`` (vacuum, rebuild, cleanup, own_index_cleanup, hand_back) on one target, recorded.
        ``before``: the probe the decision was taken on, when there is one (else the target is probed).

        The history row is finished whatever happens (an unexpected exception is recorded as a
        failure, then raised), and before the index's lock is let go, so a second worker never takes
        the index while the row still says the action runs. A rebuild is recorded as done, with the
        figures the next probes count from, as soon as its REINDEX returns; the VACUUM after it is
        its follow-up (``ActionOutcome.follow_up``, and ``follow_up`` in the row's after figures)."""
        ex = self.executor(stop)
        conn = self.session()
        if before is None:
            before = probe(conn, target, self.config, max_scan_tuples=self.settings.max_scan_tuples, with_recall=False)
        graph: tuple[Density, Density] | None = None  # (from, to): a rebuild into a denser graph
        if action == "rebuild" and (index := target.index):
            target = replace(target, collection=read_collection(conn, id=target.collection.id))
            want = self.wanted_density(conn, target)
            if want is not None:
                graph = (index_density(conn, index) or density.of(target.collection), want)
                reason = f"{reason}; graph {graph[0]} -> {want}"
                why = density.plan(target.collection)[1]
                if why:
                    reason += f" ({why})"
        out = ActionOutcome(target.collection.name, target.table, action, reason, "running", before=before.summary())
        action_id = history.start_action(conn, target, action, reason, out.before)
        t0 = time.perf_counter()
        recorded = False

        def record(on: psycopg.Connection[Any]) -> None:
            nonlocal recorded
            out.duration_s = out.duration_s or time.perf_counter() - t0
            history.finish_action(
                on, action_id, outcome=out.outcome, duration_s=out.duration_s, after=out.after, error=out.error
            )
            recorded = True

        try:
            with ex.index_lock(conn, target):
                try:
                    out.dropped = ex.drop_leftovers(conn, target)
                    self._run(ex, conn, target, action, graph=None if graph is None else graph[1])
                    out.outcome = "ok"
                except (Busy, Interrupted, psycopg.Error, LookupError) as exc:
                    self._not_done(out, exc, target)
                except BaseException as exc:
                    out.outcome, out.error = "failed", f"{type(exc).__name__}: {exc}".strip()
                    raise
                finally:
                    out.duration_s = time.perf_counter() - t0  # the action's own: not the probe after it
                    conn = self.session()  # a new one if the old backend died (its lock went with it)
                    if out.outcome == "ok":
                        try:
                            target = self._after(conn, target, action, out, graph, reason)
                        except Exception as exc:  # the action is done: its row says so whatever the probe read
                            log.warning("%s %s: the probe after it failed: %s", action, target.label, exc)
                    record(conn)
                if out.outcome == "ok" and action == "rebuild":
                    self._follow_up(ex, conn, target, action_id, out)
        except Busy as exc:  # the index's lock: another worker holds it
            out.outcome, out.error = "skipped", str(exc)
        finally:
            if not recorded:
                if out.outcome == "running":  # taking the index's lock itself failed
                    exc_now = sys.exc_info()[1]
                    out.outcome = "failed"
                    out.error = f"{type(exc_now).__name__}: {exc_now}".strip() if exc_now else "ended unrecorded"
                record(self.session())
        log.info("%s %s: %s in %.1fs (%s)", action, target.label, out.outcome, out.duration_s, reason)
        return out

    @staticmethod
    def _not_done(out: ActionOutcome, exc: BaseException, target: Target) -> None:
        if isinstance(exc, Busy):
            out.outcome, out.error = "skipped", str(exc)
        elif isinstance(exc, Interrupted):
            out.outcome, out.error = "interrupted", str(exc)
        else:
            out.outcome, out.error = "failed", f"{type(exc).__name__}: {exc}".strip()
            log.error("%s %s failed: %s", out.decision, target.label, out.error)

    def _after(
        self,
        conn: psycopg.Connection[Any],
        target: Target,
        action: str,
        out: ActionOutcome,
        graph: tuple[Density, Density] | None,
        reason: str,
    ) -> Target:
        """What a done action records: the registry's graph after a rebuild into a denser one, and
        the figures after it. A failure here leaves the action done, with the error said."""
        out.after = {"dropped": out.dropped}
        try:
            if graph is not None:
                target = replace(target, collection=self._record_density(conn, target.collection, graph, reason))
            if action in ("vacuum", "rebuild"):
                after = probe(
                    conn,
                    target,
                    self.config,
                    max_scan_tuples=self.settings.max_scan_tuples,
                    with_recall=action == "rebuild",
                )
                out.after = after.summary() | {
                    # What the next probes count dead entries from. A rebuilt index never held the heap's
                    # dead tuples: none (n_dead_tup may still show the old figure then: seen 0.341 just
                    # after a rebuild, and a needless VACUUM followed). After a VACUUM, what it could not
                    # remove (tuples an old snapshot still sees), as its own report counts them.
                    "dead_entries": 0 if action == "rebuild" else after.dead_tuples,
                    "dropped": out.dropped,
                }
            if graph is not None:
                out.after |= {"hnsw_m": graph[1].m, "hnsw_ef_construction": graph[1].ef_construction}
        except (psycopg.Error, LookupError) as exc:
            out.error = f"done, but what followed failed: {type(exc).__name__}: {exc}".strip()
            log.error("%s %s: %s", action, target.label, out.error)
        return target

    def _follow_up(
        self, ex: Executor, conn: psycopg.Connection[Any], target: Target, action_id: int, out: ActionOutcome
    ) -> None:
        """The VACUUM after a rebuild (the heap's dead tuples), once the rebuild is recorded as done:
        whatever becomes of it is its own outcome, added to the rebuild's row."""
        t0 = time.perf_counter()
        done: dict[str, Any] = {"action": "vacuum", "outcome": "ok"}
        try:
            self._wait_for_slo(ex.stop)
            with self.working("vacuum"):
                ex.vacuum(conn, target)
        except Busy as exc:
            done |= {"outcome": "skipped", "error": str(exc)}
        except Interrupted as exc:
            done |= {"outcome": "interrupted", "error": str(exc)}
        except (psycopg.Error, LookupError) as exc:
            done |= {"outcome": "failed", "error": f"{type(exc).__name__}: {exc}".strip()}
        done["duration_s"] = round(time.perf_counter() - t0, 3)
        if done["outcome"] != "ok":
            log.warning("rebuild %s done; the VACUUM after it %s: %s", target.label, done["outcome"], done["error"])
        out.follow_up = done
        out.after["follow_up"] = done
        try:
            history.record_follow_up(self.session(), action_id, done)
        except psycopg.Error as exc:  # the rebuild's row is finished already
            log.error("rebuild %s: could not record the VACUUM after it: %s", target.label, exc)

    @contextmanager
    def working(self, kind: str, *, counted: bool = True) -> Iterator[Unit]:
        """Work that loads the server (a VACUUM, a build, a tuning's or a probe's reads), counted as
        background work by the process's pace, never held back by it (``Pace.working``): the search
        latency read meanwhile is not taken for the idle baseline, here or in the search servers a
        follower reports to. ``counted`` False: only where the caller says it did something."""
        with (self.pace or FULL_SPEED).working(kind) as unit:
            if counted:
                unit.did(1)
            yield unit

    def _run(
        self, ex: Executor, conn: psycopg.Connection[Any], target: Target, action: str, *, graph: Density | None = None
    ) -> None:
        """The action itself; a rebuild's VACUUM is its follow-up (``_follow_up``)."""
        if action in ("vacuum", "rebuild"):
            self._wait_for_slo(ex.stop)
        if action == "vacuum":
            with self.working("vacuum"):
                ex.vacuum(conn, target)
        elif action == "rebuild":
            if target.index is None:
                raise LookupError(f"{target.table} has no valid HNSW index to rebuild")
            if self.pace is not None:  # a build cannot be paused: it starts with what the share allows
                online_ddl.set_build_workers(conn, online_ddl.paced_build_workers(self.settings, self.pace.share()))
            try:
                with self.working("rebuild"):
                    ex.rebuild(conn, target, density=graph)
            finally:
                if self.pace is not None and not conn.broken:
                    online_ddl.set_build_workers(conn, online_ddl.background_build_workers(self.settings))
        elif action == "own_index_cleanup":
            ex.own_index_cleanup(conn, target, own=True)
        elif action == "hand_back":
            ex.own_index_cleanup(conn, target, own=False)
        elif action != "cleanup":
            raise ValueError(f"unknown action {action!r}")

    # ------------------------------------------------------------------ graph density

    def wanted_density(self, conn: psycopg.Connection[Any], target: Target) -> Density | None:
        """The graph the target's next rebuild is to use when it is not the index's own: the denser
        one its collection's recall target needs (``memstore.catalog.density.plan``), or the one the
        registry records where this index (a partition) has not been rebuilt into it yet."""
        c = target.collection
        if target.space is not None or target.index is None or representation(c) != "full":
            return None
        want, _ = density.plan(c)
        if want is None:
            if c.options.get(density.HNSW_DENSITY) is None:
                return None
            want = density.of(c)
        have = index_density(conn, target.index)
        return None if have is None or have == want else want

    def search_cost(self, conn: psycopg.Connection[Any], target: Target) -> search_cost.SearchCost | None:
        """The recall target's cost on the target's index, for the policy (None: no target, or not tuned)."""
        c = target.collection
        if target.space is not None or target.index is None or representation(c) != "full":
            return None
        want = self.wanted_density(conn, target)
        cost = search_cost.from_tuning(
            c.recall_tuning, target=c.recall_target, denser=None if want is None else (want.m, want.ef_construction)
        )
        if cost is not None and c.partitions > 1:
            # The tuning's ladder is the partition that needs the most: no partition's own wear.
            cost = replace(cost, fresh_ef=None, now_at_fresh=None, fresh_at_fresh=None)
        return cost

    def _record_density(
        self, conn: psycopg.Connection[Any], c: Collection, graph: tuple[Density, Density], reason: str
    ) -> Collection:
        """The registry's density after a rebuild into ``graph[1]`` (the first partition's sets it)."""
        with conn.transaction():
            c = read_collection(conn, id=c.id)
            if density.of(c) != graph[1]:
                c = set_hnsw_density(conn, c, m=graph[1].m, ef_construction=graph[1].ef_construction)
                info = {
                    "m": graph[1].m,
                    "ef_construction": graph[1].ef_construction,
                    "from": {"m": graph[0].m, "ef_construction": graph[0].ef_construction},
                    "by": "maintenance",
                    "reason": reason,
                    "at": datetime.now(UTC).isoformat(),
                }
                c = set_option(conn, c, density.HNSW_DENSITY, info)
        return c

    def _wait_for_slo(self, stop: threading.Event) -> None:
        if self.latency_source is not None:
            wait_for_slo(self.latency_source, self.config, stop)

    def _slo_allows(self, what: str) -> bool:
        """Whether reads that load the server (a recall probe's exact scan, a tuning's ladder) may run
        now: after waiting while searches are over the SLO, as an action does; False when they stayed
        over it (or a stop came), and the reads wait for a later pass. Once a wait of this pass ran out,
        the others only look: a pass over many partitions would otherwise wait for each in turn."""
        if self._slo_waited_out and self.latency_source is not None:
            current = self.latency_source()
            if current is not None and current > self.config.slo_p99_ms:
                log.info("%s deferred: search latency %.0f ms still over the SLO", what, current)
                return False
            self._slo_waited_out = False
        try:
            self._wait_for_slo(self.stop)
        except (Busy, Interrupted) as exc:
            self._slo_waited_out = isinstance(exc, Busy)
            log.info("%s deferred: %s", what, exc)
            return False
        return True

    # ------------------------------------------------------------------ the loop

    def run_once(self) -> int:
        """One pass over every (selected) collection; 0 when nothing failed, else 1."""
        self.last_outcomes = []
        self._slo_waited_out = False
        failed = False
        try:
            self._finish_bulk_loads(self.session())
            self._seal_segments(self.session())
            targets = self.targets(self.session())
        except (psycopg.Error, LookupError) as exc:
            log.error("maintenance pass failed before it started: %s", exc)
            return EXIT_FAILED
        seen: list[tuple[Target, ActionOutcome]] = []
        for target in targets:
            if self.stop.is_set():
                break
            try:
                outcome = self._maintain(self.session(), target)
            except (psycopg.Error, LookupError) as exc:
                log.error("%s: probe failed: %s", target.label, exc)
                outcome = ActionOutcome(target.collection.name, target.table, "probe", "", "failed", error=str(exc))
            self.last_outcomes.append(outcome)
            seen.append((target, outcome))
            failed |= outcome.state == "failed"
        collections = {t.collection.name: t.collection for t in targets}
        for c in collections.values():
            own = [(t, o) for t, o in seen if t.collection.name == c.name and t.space is None]
            if self.stop.is_set() or c.recall_target is None or not tune_due(c, [o for _, o in own]):
                continue
            rebuilt = any(o.decision == "rebuild" and o.outcome == "ok" for _, o in own)
            outcome = self.tune(c, [t for t, _ in own], rebuilt=rebuilt)
            self.last_outcomes.append(outcome)
            failed |= outcome.state == "failed"
        for c in collections.values():
            if self.stop.is_set():
                break
            spec = index_spec(c)
            if spec.compact or spec.pending:
                outcome = self._maintain_compact(c)
                self.last_outcomes.append(outcome)
                failed |= outcome.state == "failed"
        return EXIT_FAILED if failed else EXIT_OK

    # ------------------------------------------------------------------ recall target

    def tune(
        self, collection: Collection, targets: list[Target] | None = None, *, rebuilt: bool = False
    ) -> ActionOutcome:
        """Set the collection's default ef_search to the least that reaches its recall target
        (``maintenance.tuning``), from a ladder measured on each of its own tables (a partitioned
        collection takes the largest ef its partitions need); recorded as a "tune" action when the
        ef, the target or its reachability changed. One tuning of a collection at a time (an advisory
        lock: skipped while another worker holds it), and its result is written only where the target
        and the ef_search are still those it measured for (one set meanwhile is kept: skipped)."""
        conn = self.session()
        busy = partial(Busy, f"another worker is tuning {collection.name}")
        try:
            with locks.session_lock(conn, tune_key(collection.id), busy=busy):
                return self._tune(conn, collection, targets, rebuilt=rebuilt)
        except Busy as exc:
            return ActionOutcome(collection.name, collection.table_name, "tune", "", "skipped", error=str(exc))

    def _tune(
        self, conn: psycopg.Connection[Any], collection: Collection, targets: list[Target] | None, *, rebuilt: bool
    ) -> ActionOutcome:
        t0 = time.perf_counter()
        try:
            c = read_collection(conn, id=collection.id)  # afresh: the target may have changed since the pass began
        except LookupError as exc:
            return ActionOutcome(collection.name, collection.table_name, "tune", "", "failed", error=str(exc))

        def skipped(reason: str) -> ActionOutcome:
            return ActionOutcome(c.name, c.table_name, "tune", reason, "nothing")

        def skipped_as(reason: str) -> ActionOutcome:
            return ActionOutcome(c.name, c.table_name, "tune", reason, "skipped", error=reason)

        goal = c.recall_target
        if goal is None:
            return skipped("no recall target")
        if representation(c) != "full":
            return skipped("compact indexes are not tuned yet")
        if targets is None:
            targets = [t for t in targets_for(conn, c) if t.space is None]
        targets = [t for t in targets if t.index is not None]
        if not targets:
            return skipped("no valid HNSW index")
        if not self._slo_allows(f"{c.name}: tuning"):
            return skipped_as(f"searches over the {self.config.slo_p99_ms:.0f} ms latency SLO: tuned at a later pass")
        measured: list[tuple[Tuning, Ladder]] = []
        scans = index_scans(conn, [t.index for t in targets if t.index])
        earlier = c.recall_tuning or {}
        # The ef searches use now was chosen for this very target by an earlier tuning (not a new target).
        settled = earlier.get("target") == goal and earlier.get("ef") == c.default_ef_search
        try:
            for target in targets:
                ladder = self._measure_ladder(conn, target, goal, c.default_ef_search, settled=settled, rebuilt=rebuilt)
                if ladder.points:
                    tuning = choose_ef(ladder.points, goal, **self.config.margin())
                    measured.append((tuning, ladder))
        except psycopg.Error as exc:
            log.error("%s: recall target tuning failed: %s", c.name, exc)
            return ActionOutcome(c.name, c.table_name, "tune", "", "failed", error=f"{type(exc).__name__}: {exc}")
        if not measured:
            return skipped("no rows to measure")
        tuning, ladder = max(measured, key=lambda m: m[0].ef)
        reachable = all(t.reachable for t, _ in measured)
        seconds = time.perf_counter() - t0
        old = c.default_ef_search
        info = tuning.as_json() | {
            "reachable": reachable,
            "sample_limited": any(t.sample_limited for t, _ in measured),
            "queries": ladder.queries,
            "source": ladder.source,
            "seconds": round(seconds, 3),
            # [ef, recall, design effect measured on the sample (None: it could not tell)]
            "ladder": [
                [p.ef, round(p.recall, 5), None if p.design_effect is None else round(p.design_effect, 3)]
                for p in ladder.points
            ],
            "measured_at": datetime.now(UTC).isoformat(),
            "k": self.config.recall_k,
            # Recall at the denser graph's bound is below the target beyond the sample's error: only
            # then does the ef needed count as over the bound (``memstore.catalog.density.plan``).
            "over_bound": told_below(
                ladder.points,
                goal,
                density.DENSE_EF_BOUND,
                z=self.config.tune_z,
                design_effect=self.config.tune_design_effect,
            ),
            "search_ms": [[e, round(ms, 4)] for e, ms in sorted(ladder.ms.items())],
            "index_scans": scans,
            # The worker's own index searches in this tuning: the stand-ins' look-ups and one round per rung.
            "own_scans": sum(m[1].queries * (len(m[1].ms) + 1) for m in measured),
        }
        previous = c.recall_tuning or {}
        info["searches_per_s"] = searches_per_s(previous, info, own_probe_scans=2 * self.config.recall_sample)
        if rebuilt or (previous.get("target") != goal and previous.get("fresh") is None):
            # What a fresh graph needs: the cost a rebuild would bring back (``maintenance.policy.weigh``).
            fresh = {k: info[k] for k in ("ef", "ladder", "queries", "measured_at")}
            info["fresh"] = fresh | {"rebuilt": rebuilt}
        elif previous.get("fresh") is not None:
            info["fresh"] = previous["fresh"]
        try:
            with conn.transaction():
                # The row locked and read again: a target or an ef someone set while this tuning
                # measured is theirs to keep (a new target is tuned for at the next pass).
                conn.execute("SELECT 1 FROM memstore_collections WHERE id = %s FOR UPDATE", (c.id,))
                now = read_collection(conn, id=c.id)
                moved = now.recall_target != goal or now.default_ef_search != old
                if not moved:
                    if tuning.ef != old:
                        set_default_ef_search(conn, now, tuning.ef)
                    set_option(conn, now, RECALL_TUNING, info)
        except LookupError as exc:
            return ActionOutcome(c.name, c.table_name, "tune", "", "failed", error=str(exc))
        if moved:
            return skipped_as(
                f"the recall target ({goal:g} -> {now.recall_target}) or ef_search ({old} -> {now.default_ef_search}) "
                "changed while tuning: left as set"
            )
        reason = f"recall target {goal:g}: ef_search {old} -> {tuning.ef}; {tuning.reason}"
        out = ActionOutcome(
            c.name,
            c.table_name,
            "tune",
            reason,
            "ok",
            duration_s=seconds,
            before={"ef_search": old, "recall_target": goal},
            after={k: info[k] for k in ("ef", "recall", "lower", "reachable", "queries", "ladder")}
            | {"ef_search": tuning.ef},
        )
        if tuning.ef != old or previous.get("target") != goal or previous.get("reachable") != reachable:
            action_id = core_history.start_action(
                conn,
                collection=c.name,
                partition_table=c.table_name,
                index_name=c.index_name,
                action="tune",
                reason=reason,
                before=out.before,
            )
            core_history.finish_action(conn, action_id, outcome="ok", duration_s=seconds, after=out.after)
        log.info("tune %s: %s in %.1fs", c.name, reason, seconds)
        return out

    def _measure_ladder(
        self,
        conn: psycopg.Connection[Any],
        target: Target,
        goal: float,
        current: int,
        *,
        settled: bool,
        rebuilt: bool = False,
    ) -> Ladder:
        """The ladder on ``recall_session()`` (a standby with ``recall_on_replica``), on the primary when
        the standby fails it; ``current``: the collection's ef now; ``settled``: an earlier tuning chose
        it for this target (``maintenance.tuning.recheck``); ``rebuilt``: the graph is a fresh build."""
        where = self.recall_session()
        cfg = self.config

        def rounds(on: psycopg.Connection[Any], rungs: Sequence[int], drawn: Sample, first: bool) -> Ladder:
            # The first round climbs to the first rung that passes; a re-check comes down from the
            # rung that decides to the first one told below the target.
            return measure_ladder(
                on,
                target,
                k=cfg.recall_k,
                rungs=rungs,
                recall_target=goal,
                max_scan_tuples=self.settings.max_scan_tuples,
                drawn=drawn,
                stop_on_pass=first,
                stop_below=not first,
                **cfg.margin(),
            )

        def drawing(on: psycopg.Connection[Any], n: int, exclude: Sequence[int] = ()) -> Sample:
            # A few queries' exact answers are bounded by a reference rung's: one of the ladder's.
            return draw(
                on,
                target,
                n,
                k=cfg.recall_k,
                max_scan_tuples=self.settings.max_scan_tuples,
                reference=min(cfg.tune_max_ef, REFERENCE_EF),
                exclude=exclude,
            )

        def measure(on: psycopg.Connection[Any]) -> Ladder:
            # The ladder on ``tune_sample`` queries; then, where the ef would move, the rungs that
            # decide the move (``maintenance.tuning.recheck``) on fresh queries, all the rest up to
            # ``tune_sample_max`` in one round: a lower ef is re-checked until the queries run out
            # anyway. Then, where those queries failed every rung measured, the rungs above
            # (``tuning.unmeasured_above``). All in one snapshot; where a re-check is likely (a
            # target no tuning settled, a graph just rebuilt) its queries are drawn and answered with
            # the first round's, so the tuning reads the table once (100,000 x 128: 1,000 queries at
            # once in 1.38 s against 0.83 s + 1.50 s in two reads, ``bench.recall_probe``).
            with snapshot(on):
                limit_statements(on, cfg.probe_timeout_s)
                likely = not settled or rebuilt
                first, reserve = drawing(on, cfg.tune_sample_max if likely else cfg.tune_sample).split(cfg.tune_sample)
                ladder = rounds(on, ladder_for(cfg.tune_max_ef), first, True)
                left = cfg.tune_sample_max - ladder.queries
                rungs = recheck(ladder.points, goal, current, settled=settled, **cfg.margin()) if ladder.points else []
                if rungs and left > 0:
                    if not reserve.vectors:
                        reserve = drawing(on, left, exclude=ladder.sample_ids)
                    more = rounds(on, rungs, reserve, False)
                    if more.points:
                        ladder = ladder.extended(more)
                higher = unmeasured_above(ladder.points, goal, cfg.tune_max_ef, **cfg.margin())
                if higher:
                    more = rounds(on, higher, drawing(on, cfg.tune_sample), True)
                    if more.points:
                        ladder = ladder.extended(more)
                return ladder

        try:
            with self.working("tune"):
                return measure(where)
        except psycopg.Error as exc:
            if where is conn:
                raise
            log.warning("%s: tuning ladder failed on the replica (%s); measuring on the primary", target.label, exc)
            where.close()
            with self.working("tune"):
                return measure(conn)

    def _background_settings(self) -> Settings:
        """The settings of a build this worker starts (a seal, a merge, an interrupted load's index):
        the parallel workers of a build nobody waits for, as the foreground's share allows."""
        return online_ddl.background_settings(self.settings, 1.0 if self.pace is None else float(self.pace.share()))

    def _finish_bulk_loads(self, conn: psycopg.Connection[Any]) -> None:
        """Build the index of any bulk load whose process died before it could (a running load holds
        the collection's lock and is left alone)."""
        for c in self.list_collections(conn):
            if bulk_load.in_progress(c) and not self.stop.is_set():
                t0 = time.monotonic()
                if bulk_load.finish_interrupted(self.db, c, self._background_settings()):
                    reason = "a bulk load ended before it built its index"
                    self.last_outcomes.append(
                        ActionOutcome(c.name, c.table_name, "build", reason, "ok", duration_s=time.monotonic() - t0)
                    )

    def _seal_segments(self, conn: psycopg.Connection[Any]) -> None:
        """Seal the full tails and merge the graphs of segmented collections whose writer did not
        (a process that ended, a writer elsewhere): a tail under ``seal_rows`` is left to be read
        exactly; graphs are merged as for a collection whose writes paused, unless a tail was due."""
        db = self.db
        for c in self.list_collections(conn):
            if self.stop.is_set() or not segments.segmented(c):
                continue
            t0 = time.monotonic()
            try:
                with self.working("seal", counted=False) as unit:
                    settings = self._background_settings()
                    done = sealing.seal(db, c, settings)
                    done = done or sealing.merge(db, c, settings, quiet=True)
                    unit.did(done is not None)
            except sealing.SealBusyError:
                continue  # its writer's sealer is at it
            except (psycopg.Error, LookupError) as exc:
                log.error("%s: sealing failed: %s", c.name, exc)
                self.last_outcomes.append(ActionOutcome(c.name, c.table_name, "seal", "", "failed", error=str(exc)))
                continue
            if done is not None:
                reason = f"{done.rows} rows of ids {done.graph.lo + 1} to {done.graph.hi} into {done.graph.index}"
                self.last_outcomes.append(
                    ActionOutcome(
                        c.name, c.table_name, done.action, reason, "ok", duration_s=round(time.monotonic() - t0, 3)
                    )
                )

    def _maintain_compact(self, c: Collection) -> ActionOutcome:
        """Compact indexes (halfvec, binary, low-rank) are checked against exact search on full vectors:
        the projection is refitted when it has drifted, the graph rebuilt when only it is worn."""
        t0 = time.monotonic()
        try:
            with self.working("compact_index"):
                seen = maintain_compact_index(
                    self.db,
                    collection=c.name,
                    min_recall=self.config.recall_floor,
                    settings=self.settings,
                    executor=self.executor(),
                )
        except (psycopg.Error, LookupError) as exc:
            log.error("%s: compact index maintenance failed: %s", c.name, exc)
            return ActionOutcome(c.name, c.table_name, "compact_index", "", "failed", error=str(exc))
        return ActionOutcome(
            c.name,
            c.table_name,
            seen.action or "check_compact_index",
            seen.reason,
            seen.outcome,
            duration_s=round(time.monotonic() - t0, 3),
            error=seen.error,
            before={"recall": seen.recall},
            after={"recall": seen.recall_after},
        )

    def _maintain(self, conn: psycopg.Connection[Any], target: Target) -> ActionOutcome:
        # Cheap signals first; the recall probe (exact searches) only when they see nothing to do
        # and enough has changed since recall was last measured.
        p = probe(conn, target, self.config, max_scan_tuples=self.settings.max_scan_tuples, with_recall=False)
        p.search_cost = self.search_cost(conn, target)
        d = decide(p, self.config)
        if d.action == "nothing" and p.recall_due and self._slo_allows(f"{target.label}: recall probe"):
            with self.working("probe"):
                self._attach_recall(conn, target, p)
            d = decide(p, self.config)
            if d.action != "nothing" and self._slo_allows(f"{target.label}: confirming recall probe"):
                # Recall alone changed the verdict. A small sample can read low by chance (a few
                # hard queries), and a rebuild costs about ten probes: confirm on a second sample
                # and decide on both together.
                with self.working("probe"):
                    self._attach_recall(conn, target, p, confirm=True)
                d = decide(p, self.config)
            elif d.action != "nothing":
                # Unconfirmed, a low reading decides nothing: the next pass that may measures again.
                d = decide(replace(p, recall=None), self.config)
        record_probe(conn, p, d.label)
        if self.config.own_index_cleanup and not p.owned and target.index is not None:
            owned = self.act(
                target, "own_index_cleanup", reason="the worker cleans this index (cheaper by rebuild)", before=p
            )
            if owned.outcome == "failed":
                # Its ALTER TABLE waits behind any concurrent build on the table (a keyword or
                # metadata index): recorded, tried again next pass, and no reason to skip the action.
                log.warning("%s: could not take index cleanup from autovacuum yet: %s", target.label, owned.error)
            p.owned = owned.outcome == "ok"
        if d.action == "nothing":
            if d.cleanup:
                return self.act(target, "cleanup", reason="INVALID leftovers: " + ", ".join(p.leftovers), before=p)
            return ActionOutcome(
                target.collection.name, target.table, "nothing", d.reason, "nothing", before=p.summary()
            )
        return self.act(target, d.action, reason=d.reason, before=p)

    def run_forever(self, stop: threading.Event | None = None) -> int:
        """Passes every ``interval_s`` until ``stop`` (or ``self.stop``) is set; the last pass's exit code."""
        if stop is not None:
            self.stop = stop
        code = EXIT_OK
        while not self.stop.is_set():
            started = time.monotonic()
            code = self.run_once()
            self._wait_for_next_pass(started + self.config.interval_s)
        return code

    def _wait_for_next_pass(self, deadline: float) -> None:
        """Until ``deadline``, or until a pass is asked for (the web pages' "probe now")."""
        while not self.stop.is_set() and time.monotonic() < deadline:
            try:
                if core_history.take_requests(self.session(), self.collections):
                    return
            except psycopg.errors.UndefinedTable:  # a schema from before the requests: just wait
                self.stop.wait(max(0.0, deadline - time.monotonic()))
                return
            except psycopg.Error as exc:  # the next look reconnects
                log.warning("maintenance: could not read pass requests: %s", exc)
            self.stop.wait(max(0.0, min(REQUEST_POLL_S, deadline - time.monotonic())))


def tune_due(c: Collection, outcomes: list[ActionOutcome]) -> bool:
    """A collection's ef_search is tuned again when its target is new or changed, and on every pass
    that measured its recall (enough rows loaded or changed, or enough time passed: the probe's own
    schedule) or cleaned its index (VACUUM, rebuild)."""
    previous = c.recall_tuning
    if previous is None or previous.get("target") != c.recall_target:
        return True
    return any(
        o.before.get("recall") is not None or (o.decision in ("vacuum", "rebuild") and o.outcome == "ok")
        for o in outcomes
    )


def index_scans(conn: psycopg.Connection[Any], indexes: list[str]) -> int | None:
    """The indexes' scans so far (``pg_stat_user_indexes.idx_scan``, summed; None without indexes)."""
    if not indexes:
        return None
    row = conn.execute(
        "SELECT sum(coalesce(pg_stat_get_numscans(to_regclass(i)), 0))::bigint FROM unnest(%s::text[]) i",
        ([f'"{i}"' for i in indexes],),
    ).fetchone()
    return None if row is None or row[0] is None else int(row[0])


def searches_per_s(previous: dict[str, Any], info: dict[str, Any], *, own_probe_scans: int) -> float | None:
    """Foreground searches per second on the collection's index since the previous tuning: its scan
    counter's growth less the worker's own searches (the previous tuning's ladder, and about
    ``own_probe_scans`` for the recall probes between), over the time between. The previous figure
    when the counter cannot tell (reset, or a first tuning)."""
    before, now = previous.get("index_scans"), info.get("index_scans")
    kept = previous.get("searches_per_s")
    if before is None or now is None or previous.get("measured_at") is None or now < before:
        return kept
    then, at = datetime.fromisoformat(previous["measured_at"]), datetime.fromisoformat(info["measured_at"])
    seconds = (at - then).total_seconds()
    if seconds <= 0:
        return kept
    foreground = max(0, now - before - int(previous.get("own_scans") or 0) - own_probe_scans)
    return round(foreground / seconds, 4)
