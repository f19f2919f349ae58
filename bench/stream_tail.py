"""The unindexed-tail designs of ``bench.stream``, prototyped in raw SQL on one bare table.

Rows carry ``seq``, their arrival order. HNSW indexes are PARTIAL over ranges of ``seq``; the rows
above the watermark (the highest ``seq`` any index covers) are the tail, found by an exact scan
through a btree on ``seq``. A batch is acknowledged once COPYed: it is searchable at once, exactly.
When the tail reaches ``fraction`` of the indexed rows (and at least ``min_seal`` rows) it is sealed
by ``CREATE INDEX CONCURRENTLY``:

- ``merge=True`` (the watermark design): one index over ``seq <= W`` is built afresh over every row
  and swapped in for the old one. The indexed rows grow geometrically, so a row is built about
  ``1 + 1/fraction`` times in all, and searches see one graph and the tail.
- ``merge=False`` (segments, as Qdrant's and Milvus's sealed segments): a new index covers only the
  rows sealed now, ``seq > W_old AND seq <= W_new``: each row is built once, and a search walks every
  segment's graph (their number grows with the log of the rows; a merge would rebuild them as one).

A search is one statement: each index's top k (its WHERE repeats the index's predicate, constants
inlined, so the planner can prove the partial index applies) and the tail's exact top k, merged.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import psycopg
from psycopg import sql

from bench import stream_sql as db
from memstore.settings import Settings


@dataclass(frozen=True)
class Segment:
    lo: int  # exclusive; 0: from the first row
    hi: int  # inclusive
    index: str

    def predicate(self) -> sql.Composed:
        if self.lo == 0:
            return sql.SQL("seq <= {}").format(sql.Literal(self.hi))
        return sql.SQL("seq > {} AND seq <= {}").format(sql.Literal(self.lo), sql.Literal(self.hi))


@dataclass
class Seal:
    rows_indexed: int  # rows the new index covers
    tail_before: int
    seconds: float
    workers: int


@dataclass
class TailTable:
    conn: psycopg.Connection[Any]
    url: str
    settings: Settings
    table: str
    fraction: float
    merge: bool
    min_seal: int
    rows: int = 0
    segments: list[Segment] = field(default_factory=list)
    seals: list[Seal] = field(default_factory=list)

    def create(self, dims: int) -> None:
        db.create_table(self.conn, self.table, dims)
        # The tail's exact scan reads only the rows above the watermark.
        self.conn.execute(sql.SQL("CREATE INDEX ON {} (seq)").format(sql.Identifier(self.table)))

    @property
    def watermark(self) -> int:
        return self.segments[-1].hi if self.segments else 0

    @property
    def tail(self) -> int:
        return self.rows - self.watermark

    def write(self, ids: np.ndarray, rows: np.ndarray) -> None:
        seqs = np.arange(self.rows + 1, self.rows + len(ids) + 1)
        db.copy_rows(self.conn, self.table, ids, seqs, rows)
        self.rows += len(ids)

    def due(self) -> bool:
        return self.tail > 0 and self.tail >= max(self.min_seal, self.fraction * self.watermark)

    def seal(self) -> None:
        """Index the tail (all rows so far, or only the tail's), drop what the new index replaces."""
        hi, lo = self.rows, 0 if self.merge else self.watermark
        new = Segment(lo, hi, f"{self.table}_hnsw_{hi}")
        statement = sql.SQL("CREATE INDEX CONCURRENTLY {} ON {} {} WHERE {}").format(
            sql.Identifier(new.index), sql.Identifier(self.table), db.hnsw_clause(self.settings), new.predicate()
        )
        t0 = time.perf_counter()
        _, workers = db.build(self.conn, self.url, self.settings, statement)
        replaced = self.segments if self.merge else []
        for old in replaced:
            self.conn.execute(sql.SQL("DROP INDEX CONCURRENTLY {}").format(sql.Identifier(old.index)))
        # The planner's row counts for the tail's btree scan and the new index (a table that grew).
        self.conn.execute(sql.SQL("ANALYZE {}").format(sql.Identifier(self.table)))
        self.seals.append(Seal(hi - lo, self.tail, time.perf_counter() - t0, workers))
        self.segments = [*([] if self.merge else self.segments), new]

    def statement(self) -> sql.Composed:
        t, k = sql.Identifier(self.table), sql.Literal(db.K)
        graph = sql.SQL("(SELECT id, embedding <=> %(q)s AS d FROM {} WHERE {} ORDER BY embedding <=> %(q)s LIMIT {})")
        parts = [graph.format(t, s.predicate(), k) for s in self.segments]
        tail = sql.SQL("(SELECT id, embedding <=> %(q)s AS d FROM {} WHERE seq > {} ORDER BY d LIMIT {})")
        parts.append(tail.format(t, sql.Literal(self.watermark), k))
        return sql.SQL("SELECT id FROM ({}) AS u ORDER BY d LIMIT {}").format(sql.SQL(" UNION ALL ").join(parts), k)

    def plan_uses_every_index(self, q: np.ndarray) -> bool:
        used = set(db.plan_indexes(self.conn, self.statement(), q))
        return all(s.index in used for s in self.segments)


def ingest(
    store: TailTable,
    base: np.ndarray,
    order: np.ndarray,
    batch: int,
    on_seal_due: Callable[[TailTable], None],
) -> float:
    """Write every batch, sealing when due (inline: on two cores a background seal takes the same CPU
    from the writer). ``on_seal_due`` sees the store just before each seal and after the last batch
    (when the tail is at a local maximum); its time is not counted. Returns the seconds counted."""
    counted = 0.0
    for start in range(0, len(order), batch):
        ids = order[start : start + batch]
        t0 = time.perf_counter()
        store.write(ids, base[ids])
        counted += time.perf_counter() - t0
        if store.due() or start + batch >= len(order):
            on_seal_due(store)
        if store.due():
            t0 = time.perf_counter()
            store.seal()
            counted += time.perf_counter() - t0
    return counted
