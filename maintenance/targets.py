"""What maintenance works on: one target per table that holds vectors (a plain collection's table,
each partition of a partitioned one, and the side table of each of its other embedding spaces,
``memstore.spaces.lifecycle``) with its HNSW index and any INVALID leftovers."""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg.rows import dict_row

from memstore.catalog import segments
from memstore.catalog.collections import Collection, Space
from memstore.db import locks, sqlfiles


@dataclass(frozen=True)
class Leftover:
    """An INVALID index left by an interrupted concurrent build (``*_ccnew``) or swap (``*_ccold``)."""

    name: str
    bytes: int
    build_running: bool


@dataclass(frozen=True)
class Target:
    collection: Collection
    table: str
    index: str | None  # the valid HNSW index; None when there is none (nothing to maintain)
    partition: int | None = None
    leftovers: tuple[Leftover, ...] = field(default_factory=tuple)
    space: Space | None = None  # a side space's table; None: the collection's own vectors

    @property
    def label(self) -> str:
        if self.space is not None:
            return f"{self.collection.name}/{self.space.name}"
        return self.table if self.partition is None else f"{self.collection.name}[p{self.partition}]"

    @property
    def vectors(self) -> Space:
        """The space whose vectors the table holds: its metric, dimensions and default ef_search."""
        return self.space if self.space is not None else self.collection.default_space

    @property
    def lock_key(self) -> str:
        """The advisory lock name: one worker per index, stable across rebuilds (the name is kept)."""
        return locks.index_key(self.index or self.table)


def representation(c: Collection) -> str:
    """How the collection's index stores vectors: ``full`` (the ``embedding`` column itself) or a
    compact form (``halfvec``, ``binary``, ``lowrank``) when the core supports those."""
    try:  # looked up at run time: the core's compact indexes are optional to maintenance
        spec = importlib.import_module("memstore.catalog.index_spec")
    except ImportError:
        return "full"
    return str(spec.index_spec(c).representation)


def index_representation(target: Target) -> str:
    """What the target's HNSW index holds of each vector (what sizes it): ``halfvec`` or ``binary``
    for the compact index on a collection's own table, else ``full`` (a side space's index is always
    full; a low-rank collection's own table has none, its index is on a side table)."""
    if target.space is not None:
        return "full"
    held = representation(target.collection)
    return held if held in ("halfvec", "binary") else "full"


def leftovers_of(conn: psycopg.Connection[Any], table: str) -> list[Leftover]:
    """The INVALID indexes of one table (a collection's, a partition's, a space's or a compact index's side table)."""
    rows = conn.cursor(row_factory=dict_row).execute(sqlfiles.text("indexes"), {"table": table}).fetchall()
    return [Leftover(r["index_name"], int(r["bytes"]), bool(r["build_running"])) for r in rows if not r["valid"]]


def targets_for(conn: psycopg.Connection[Any], collection: Collection) -> list[Target]:
    return every_target(conn, [collection])


def every_target(conn: psycopg.Connection[Any], collections: list[Collection]) -> list[Target]:
    """The targets of every collection given, their indexes read in one round trip."""
    tables: list[tuple[Collection, int, str, int, Space | None]] = [
        (c, i, t, len(ts), None) for c in collections for ts in [c.partition_tables()] for i, t in enumerate(ts)
    ]
    tables += [(c, 0, s.table_name, 1, s) for c in collections for s in c.spaces]
    with conn.pipeline():
        cursors = [conn.cursor(row_factory=dict_row) for _ in tables]
        for cur, (_, _, table, _, _) in zip(cursors, tables, strict=True):
            cur.execute(sqlfiles.text("indexes"), {"table": table}, prepare=True)
        found = [cur.fetchall() for cur in cursors]
    out: list[Target] = []
    for (collection, i, table, parts, space), rows in zip(tables, found, strict=True):
        valid = [r["index_name"] for r in rows if r["valid"] and r["method"] == "hnsw"]
        # Prefer the conventional name when a table somehow has more than one HNSW index.
        preferred = f"{table}_hnsw"
        index = preferred if preferred in valid else (valid[0] if valid else None)
        layout = segments.layout(collection) if space is None else None
        if layout is not None:
            # A segmented collection's first graph (the largest): the sealer builds and merges the
            # others, and its tail has none (memstore.catalog.segments).
            first = layout.graphs[0].index if layout.graphs else None
            index = first if first in valid else None
        leftovers = tuple(
            Leftover(r["index_name"], int(r["bytes"]), bool(r["build_running"])) for r in rows if not r["valid"]
        )
        out.append(
            Target(
                collection=collection,
                table=table,
                index=index,
                partition=i if parts > 1 else None,
                leftovers=leftovers,
                space=space,
            )
        )
    return out
