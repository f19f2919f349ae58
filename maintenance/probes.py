"""Probes: what state an index is in (rows, dead entries, churn, size against fresh, recall, leftovers)."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from maintenance.config import MaintenanceConfig
from maintenance.recall import RecallResult, measure_recall
from maintenance.search_cost import SearchCost
from maintenance.sizing import estimate_index_bytes, fresh_bytes
from maintenance.targets import Target, index_representation, representation
from memstore.db import sqlfiles

COUNTERS = ("n_tup_ins", "n_tup_upd", "n_tup_hot_upd", "n_tup_del", "vector_fills")


def index_entries_made(c: dict[str, Any]) -> int:
    """Index entries ever added: inserts plus non-HOT updates (a HOT update adds no index entry), less
    the rows stored without a vector and given one later (``vector_fills``: the insert added no
    element, the update its only one)."""
    return int(c["n_tup_ins"]) + int(c["n_tup_upd"]) - int(c["n_tup_hot_upd"]) - int(c.get("vector_fills", 0))


def index_entries_killed(c: dict[str, Any]) -> int:
    """Index entries ever made dead: deletes plus non-HOT updates, less the updates that gave a row
    its first vector (the old version, without one, was never in the graph)."""
    return int(c["n_tup_del"]) + int(c["n_tup_upd"]) - int(c["n_tup_hot_upd"]) - int(c.get("vector_fills", 0))


@dataclass
class Probe:
    collection: str
    table: str
    index: str | None
    partition: int | None
    live_rows: int
    dead_tuples: int  # heap tuples not yet vacuumed (pg_stat_user_tables.n_dead_tup)
    dead_entries: int  # estimated dead elements still in the HNSW graph
    churn_since_rebuild: int | None
    index_bytes: int
    fresh_bytes: int
    leftovers: list[str]
    owned: bool  # vacuum_index_cleanup = off: the worker, not autovacuum, cleans this index
    counters: dict[str, int]
    dead_age_s: float | None  # seconds since the index was last known clean
    fresh_recall: float | None  # recall measured right after the last rebuild
    recall_due: bool = True  # enough churn or time since the last recall measurement
    rebuild_s: float | None = None  # how long the last rebuild took (bounds the recall probe's cost)
    recall_target: float | None = None  # the collection's recall target (its own vectors only)
    recall: RecallResult | None = None
    fresh_recall_queries: int | None = None  # the queries of the fresh recall reading
    fresh_recall_ef: int | None = None  # the ef_search it was read at
    hnsw_m: int = 16  # the graph's m (what a VACUUM's repair share depends on)
    # What the index holds of each vector (``targets.index_representation``): what fresh_bytes is
    # estimated for, and recorded so that a rebuild's correction is not applied to another form.
    representation: str = "full"
    search_cost: SearchCost | None = None  # the recall target's cost here (the worker attaches it)
    duration_s: float = 0.0
    taken_at: datetime = field(default_factory=lambda: datetime.now(UTC))

    @property
    def dead_fraction(self) -> float:
        return self.dead_entries / max(self.live_rows, 1)

    @property
    def size_ratio(self) -> float:
        return self.index_bytes / max(self.fresh_bytes, 1)

    @property
    def recall_value(self) -> float | None:
        return None if self.recall is None else self.recall.recall

    def summary(self) -> dict[str, Any]:
        """A JSON-ready summary (used for --json output and the history's before/after figures)."""
        out = {k: v for k, v in asdict(self).items() if k not in ("recall", "taken_at", "search_cost")}
        out.update(
            dead_fraction=round(self.dead_fraction, 5),
            size_ratio=round(self.size_ratio, 4),
            recall=self.recall_value,
            recall_queries=None if self.recall is None else self.recall.queries,
            recall_source=None if self.recall is None else self.recall.source,
            recall_ef=None if self.recall is None else self.recall.ef_search,
            taken_at=self.taken_at.isoformat(),
        )
        return out


def parse_json(value: Any) -> dict[str, Any] | None:
    if value is None:
        return None
    return value if isinstance(value, dict) else json.loads(value)


def probe(
    conn: psycopg.Connection[Any],
    target: Target,
    config: MaintenanceConfig,
    *,
    max_scan_tuples: int,
    with_recall: bool = True,
) -> Probe:
    """Read the state of ``target`` (the connection must be in autocommit mode)."""
    t0 = time.perf_counter()
    c = target.collection
    v = target.vectors  # the size of what the index holds: the collection's vectors or a side space's
    if conn.info.transaction_status != TransactionStatus.IDLE:
        conn.execute("SELECT pg_stat_clear_snapshot()")  # only inside a transaction: a new one reads fresh counters
    with conn.pipeline(), conn.cursor(row_factory=dict_row) as s, conn.cursor(row_factory=dict_row) as h:
        s.execute(sqlfiles.text("table_stats"), {"table": target.table, "index": target.index}, prepare=True)
        h.execute(sqlfiles.text("last_clean"), {"table": target.table}, prepare=True)
        stats, history = s.fetchone(), h.fetchone()
    if stats is None:
        raise LookupError(f"table {target.table} does not exist")
    assert history is not None
    counters = {k: int(stats[k]) for k in COUNTERS}
    live = int(stats["n_live_tup"]) or int(stats["reltuples"])
    if live == 0:
        # Statistics not flushed yet (a fresh table): count, which is cheap exactly then.
        row = conn.execute(sqlfiles.composed("count_rows", table=target.table)).fetchone()
        live = int(row[0]) if row else 0
    owned = str(stats["index_cleanup"]).lower() in ("off", "false", "0", "no")
    index_bytes = int(stats["index_bytes"]) if target.index else 0
    # A compact index holds 2 bytes a dimension (halfvec) or 1 bit (binary): sized as float32, a fresh
    # one read far below 1 and the size rule saw bloat only once it had doubled it, or never.
    held = index_representation(target)

    last_clean = parse_json(history["last_clean"])
    last_compact = parse_json(history["last_compact"])
    last_recall = last_reading(parse_json(history["last_recall"]), last_clean, last_compact)
    recall_due = _recall_due(last_recall, counters, live, config)
    # Before any clean: the dead heap tuples, which also count the old versions of rows given their
    # first vector, and the entries killed since the counters began, which also count those cleaned
    # since; both are bounds from above, the lower one is kept.
    dead_entries = max(0, min(int(stats["n_dead_tup"]), index_entries_killed(counters)))
    dead_age = None
    if last_clean is not None:
        after = last_clean.get("after") or {}
        base = after.get("counters")
        finished = datetime.fromisoformat(last_clean["finished_at"])
        vacuumed = [t for t in (stats["last_vacuum"], stats["last_autovacuum"]) if t is not None]
        # Trust the counters only when nothing outside the worker cleaned the index since.
        trusted = owned or not vacuumed or max(vacuumed) <= finished
        if base and all(counters[k] >= int(base.get(k, 0)) for k in COUNTERS) and trusted:
            # Counted from the clean's own figure, not n_dead_tup: after a rebuild n_dead_tup still
            # counts heap tuples the new index never held (a stale 0.34 caused a needless VACUUM).
            since = index_entries_killed(counters) - index_entries_killed(base)
            dead_entries = max(0, int(after.get("dead_entries", 0)) + since)
        dead_age = (datetime.now(UTC) - finished).total_seconds()
    churn = None
    correction = None
    fresh_recall = None
    fresh_queries = fresh_ef = None
    rebuild_s = None
    if last_compact is not None:
        after = last_compact.get("after") or {}
        base = after.get("counters")
        if base and all(counters[k] >= int(base.get(k, 0)) for k in COUNTERS):
            churn = (index_entries_made(counters) - index_entries_made(base)) + (
                index_entries_killed(counters) - index_entries_killed(base)
            )
        # A rebuild of the index in another form (before a switch of representation) says nothing of
        # this one's bytes; history written before the form was recorded is taken as this one's.
        if after.get("index_bytes") and after.get("live_rows") and after.get("representation", held) == held:
            built = estimate_index_bytes(int(after["live_rows"]), dims=v.dimensions, m=v.hnsw_m, representation=held)
            correction = int(after["index_bytes"]) / built
        fresh_recall = after.get("recall")
        fresh_queries = after.get("recall_queries")
        fresh_ef = after.get("recall_ef")
        rebuild_s = last_compact.get("duration_s")

    result = Probe(
        collection=c.name,
        table=target.table,
        index=target.index,
        partition=target.partition,
        live_rows=live,
        dead_tuples=int(stats["n_dead_tup"]),
        dead_entries=dead_entries,
        churn_since_rebuild=churn,
        index_bytes=index_bytes,
        fresh_bytes=fresh_bytes(live, dims=v.dimensions, m=v.hnsw_m, correction=correction, representation=held),
        leftovers=[lo.name for lo in target.leftovers],
        owned=owned,
        counters=counters,
        dead_age_s=dead_age,
        fresh_recall=fresh_recall,
        recall_due=recall_due,
        rebuild_s=None if rebuild_s is None else float(rebuild_s),
        recall_target=c.recall_target if target.space is None else None,
        fresh_recall_queries=None if fresh_queries is None else int(fresh_queries),
        fresh_recall_ef=None if fresh_ef is None else int(fresh_ef),
        hnsw_m=v.hnsw_m,
        representation=held,
    )
    if with_recall:
        attach_recall(conn, target, result, config, max_scan_tuples=max_scan_tuples)
    result.duration_s = time.perf_counter() - t0
    return result


def attach_recall(
    conn: psycopg.Connection[Any],
    target: Target,
    p: Probe,
    config: MaintenanceConfig,
    *,
    max_scan_tuples: int,
    confirm: bool = False,
) -> None:
    """Measure sampled recall into ``p`` (the costly part of a probe: exact searches). ``confirm``:
    measure a second, independent sample and keep both together."""
    if not target.index or p.live_rows <= 0:
        return
    if target.space is None and representation(target.collection) != "full":
        # The probe's searches order by the full vector; a compact index would need the store's
        # candidate-and-rerank query, per partition. Until then the cheap signals decide alone.
        return
    t0 = time.perf_counter()
    first = p.recall if confirm else None
    measured = measure_recall(
        conn,
        target,
        k=config.recall_k,
        sample=config.recall_sample,
        budget_s=recall_budget(p, config),
        ef_search=target.vectors.default_ef_search,
        max_scan_tuples=max_scan_tuples,
        exclude=() if first is None else first.sample_ids,  # the API's samples the first one did not use
        statement_timeout_s=config.probe_timeout_s,
    )
    p.recall = measured if first is None else first.combined(measured)
    p.duration_s += time.perf_counter() - t0


def recall_budget(p: Probe, config: MaintenanceConfig) -> float:
    """Seconds the recall probe may take: a fraction of what rebuilding this index last cost."""
    rebuild_s = p.rebuild_s if p.rebuild_s is not None else p.live_rows / config.rebuild_rows_per_s
    return min(config.recall_budget_s, config.recall_cost_fraction * rebuild_s)


def last_reading(probed: dict[str, Any] | None, *actions: dict[str, Any] | None) -> dict[str, Any] | None:
    """The latest recall reading with the counters it was taken at: the last probe's (``taken_at``,
    ``counters``), or the one a clean took of the index it left (its ``after``), whichever is newer.
    A rebuild measures the graph it built; counted from the probe before it, the churn the rebuild
    wiped out made the next pass measure recall (and re-tune a recall target) on a nearly unchanged
    graph (seen in bench.churn: a 1,000-query tuning in the pass after the one that rebuilt and
    tuned)."""
    readings = [probed] if probed is not None and probed.get("counters") is not None else []
    for action in actions:
        after = (action or {}).get("after") or {}
        if after.get("recall") is not None and after.get("counters") is not None and after.get("taken_at"):
            readings.append({"taken_at": after["taken_at"], "counters": after["counters"], "recall": after["recall"]})
    if not readings:
        return probed
    return max(readings, key=lambda r: datetime.fromisoformat(r["taken_at"]))


def _recall_due(last: dict[str, Any] | None, counters: dict[str, int], live: int, config: MaintenanceConfig) -> bool:
    """Recall is measured again only after enough churn or time: its exact searches are the probe's cost."""
    if last is None or last.get("counters") is None:
        return True
    age = (datetime.now(UTC) - datetime.fromisoformat(last["taken_at"])).total_seconds()
    if age >= config.recall_interval_s:
        return True
    base = last["counters"]
    if not all(counters[k] >= int(base.get(k, 0)) for k in COUNTERS):
        return True  # statistics were reset
    changed = (index_entries_made(counters) - index_entries_made(base)) + (
        index_entries_killed(counters) - index_entries_killed(base)
    )
    return changed >= config.recall_churn_fraction * max(live, 1)


def record_probe(conn: psycopg.Connection[Any], p: Probe, recommendation: str) -> None:
    r = p.recall
    conn.execute(
        sqlfiles.text("record_probe"),
        {
            "collection": p.collection,
            "partition_table": p.table,
            "index_name": p.index,
            "live_rows": p.live_rows,
            "dead_rows": p.dead_entries,
            "churn_since_rebuild": p.churn_since_rebuild,
            "index_bytes": p.index_bytes,
            "fresh_index_bytes": p.fresh_bytes,
            "invalid_indexes": len(p.leftovers),
            "recall": None if r is None else r.recall,
            "recall_k": None if r is None else r.k,
            "recall_sample": None if r is None else r.queries,
            "ef_search": None if r is None else r.ef_search,
            "duration_s": p.duration_s,
            "recommendation": recommendation,
            "details": Jsonb(
                {
                    "counters": p.counters,
                    "dead_tuples": p.dead_tuples,
                    "owned": p.owned,
                    "leftovers": p.leftovers,
                    "dead_age_s": p.dead_age_s,
                    "fresh_recall": p.fresh_recall,
                    "recall_source": None if r is None else r.source,
                    "recall_seconds": None if r is None else round(r.seconds, 3),
                }
            ),
        },
        prepare=True,
    )
