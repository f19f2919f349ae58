"""Segments: the write path of a collection made for streams of upserts (``write_path="segments"``).

pgvector links a row into a live HNSW graph one at a time, at several times the cost per row of
building a graph over rows already in the table (docs/performance.md, "Streams of upsert batches").
A collection written as segments never links a new row into a graph:

- its rows are numbered by ``id`` (the table's sequence: the order they arrived in);
- its graphs are PARTIAL HNSW indexes over ranges of ids, contiguous from the first row: the first
  covers ``id <= hi``, each later one ``lo < id <= hi``;
- the rows above the last graph (the tail) are in none; a search reads them exactly, through the
  primary key's btree, so a row is found the moment its upsert commits;
- the sealer (``memstore.items.sealing``) gives the tail a graph of its own in one ``CREATE INDEX
  CONCURRENTLY`` (parallel, at build speed) once it holds ``MEMSTORE_SEAL_ROWS`` rows, and merges the
  graphs into one when writes pause or they grow too many (every search walks each graph).

A search is one statement (``memstore.search.statements``): each graph's nearest rows, its WHERE
repeating the graph's range as literals so that the planner proves the partial index applies, and the
tail's, merged by distance. A layout a process read before a seal or a merge is still right: its ranges
cover every id, and a range whose index was dropped since is read without it.

An update keeps the row's id, so a row updated in a sealed range is linked again in that range's graph
(pgvector's per-row path, as every update is in a collection with one graph).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from psycopg import sql

from memstore.catalog import index_spec as compact_spec
from memstore.catalog.collections import Collection
from memstore.errors import InvalidInputError

WRITE_PATH = "write_path"  # options key: how new rows reach the graph
GRAPH = "graph"  # every row linked into the one live graph as it is written
SEGMENTS = "segments"  # the tail and sealed graphs of this module
WRITE_PATHS = (GRAPH, SEGMENTS)
LAYOUT = "segments"  # options key: the graphs a segmented collection has (``Layout.to_json``)


@dataclass(frozen=True)
class Graph:
    """One partial HNSW index: the rows with ``lo < id <= hi``."""

    lo: int
    hi: int
    index: str

    @property
    def rows_bound(self) -> int:
        """The ids its range spans (an upper bound on its rows: deleted ids and upserts that updated
        leave gaps)."""
        return self.hi - self.lo


@dataclass(frozen=True)
class Layout:
    """A segmented collection's graphs, in id order; every id above the last is the tail's."""

    graphs: tuple[Graph, ...] = ()

    @property
    def watermark(self) -> int:
        """The highest id a graph covers (0: none yet, every row is the tail's)."""
        return self.graphs[-1].hi if self.graphs else 0

    @property
    def ranges(self) -> tuple[tuple[int, int], ...]:
        """What a search statement needs: each graph's range (the statement text depends on it alone)."""
        return tuple((g.lo, g.hi) for g in self.graphs)

    def walk_ef(self, ef: int, k: int) -> int:
        """The ``ef_search`` each graph is walked at for a search at ``ef``.

        ``ef`` is the collection's as one graph of all its rows (what a merge leaves, and what a
        recall target tunes). A graph of a share ``s`` of those rows needs less for the same recall:
        the ef a recall needs grows with the rows as about their 0.8th to 1.1th power (docs/scale.md:
        10 at 10,000 rows, 60 at 100,000, 800 at 1,000,000 for 0.95), so ``ef * sqrt(s)`` of the
        largest graph's share is more than each graph needs, and the union of the graphs' answers
        reads higher recall than one graph at ``ef`` (bench.segment_cost). Never below ``k`` (one walk
        must fill the answer), never above ``ef``; one graph or none: ``ef``."""
        if len(self.graphs) < 2:
            return ef
        sizes = [g.rows_bound for g in self.graphs]
        share = max(sizes) / max(1, sum(sizes))
        return min(ef, max(k, math.ceil(ef * math.sqrt(share))))

    def to_json(self) -> list[list[Any]]:
        return [[g.lo, g.hi, g.index] for g in self.graphs]

    @classmethod
    def from_json(cls, value: Any) -> Layout:
        if not isinstance(value, list):
            return cls()
        return cls(tuple(Graph(int(lo), int(hi), str(index)) for lo, hi, index in value))


def segmented(c: Collection) -> bool:
    """Whether ``c`` is written as segments (new rows into an exact tail, never into a live graph)."""
    return c.options.get(WRITE_PATH) == SEGMENTS


def layout(c: Collection) -> Layout | None:
    """The graphs of a segmented collection; None for a collection with one live graph."""
    if not segmented(c):
        return None
    return Layout.from_json(c.options.get(LAYOUT))


def search_ranges(c: Collection) -> tuple[tuple[int, int], ...] | None:
    """The id ranges a search of ``c``'s own vectors walks a graph of (the rest is read exactly);
    None: the one graph of the whole table."""
    found = layout(c)
    return None if found is None else found.ranges


def walk_ef(c: Collection, ef: int, k: int) -> int:
    """The ``ef_search`` each graph of ``c`` is walked at for a search at ``ef`` (``Layout.walk_ef``;
    a collection with one live graph walks it at ``ef``)."""
    found = layout(c)
    return ef if found is None else found.walk_ef(ef, k)


def parts(graphs: tuple[tuple[int, int], ...]) -> list[tuple[int, int | None]]:
    """The id ranges a search reads apart: each graph's, then the tail's (no upper bound)."""
    return [*graphs, (graphs[-1][1] if graphs else 0, None)]


def validate_write_path(write_path: object, *, partitions: int, representation: str) -> str:
    """A write path a new collection may have: segments need one table and full vectors (a compact
    index's switch and a partitioned table's per-partition graphs have states of their own)."""
    if write_path not in WRITE_PATHS:
        raise InvalidInputError(f"write_path must be one of {', '.join(WRITE_PATHS)}, not {write_path!r}")
    if write_path == SEGMENTS and partitions != 1:
        raise InvalidInputError("write_path 'segments' needs partitions = 1 (its graphs are ranges of one table)")
    if write_path == SEGMENTS and representation != "full":
        raise InvalidInputError("write_path 'segments' keeps full vectors: use representation 'full'")
    return str(write_path)


def range_predicate(lo: int, hi: int | None) -> sql.Composed:
    """``lo < id <= hi`` with the bounds as literals (``hi`` None: no upper bound, the tail)."""
    parts = [] if lo <= 0 else [sql.SQL("id > {}").format(sql.Literal(lo))]
    if hi is not None:
        parts.append(sql.SQL("id <= {}").format(sql.Literal(hi)))
    return sql.SQL(" AND ").join(parts) if parts else sql.SQL("TRUE").format()


def index_name(c: Collection, lo: int, hi: int) -> str:
    """A graph's index name: short (the table's name may already be 53 characters of PostgreSQL's
    63) and unique per range, so a merge's graph and the ones it replaces coexist until the swap."""
    return f"c{c.id}_g{lo}_{hi}"


def index_pattern(c: Collection) -> str:
    """A regular expression (PostgreSQL's) that the name of every graph index of ``c`` matches
    (``index_name``) and no other index of its table: those are the table's name and a suffix, and
    the table's name (``c<id>_<name>``) may itself begin ``c<id>_g`` followed by digits."""
    return f"^c{c.id}_g[0-9]+_[0-9]+$"


def graph_definition(c: Collection, lo: int, hi: int) -> sql.Composed:
    """What follows the table in the CREATE INDEX of the graph over ``lo < id <= hi``."""
    return sql.SQL("USING hnsw ({k} {o}) WITH (m = {m}, ef_construction = {ef}) WHERE {p}").format(
        k=sql.SQL(compact_spec.key_expression("full", c.dimensions)),
        o=sql.SQL(compact_spec.opclass("full", c.metric)),
        m=sql.Literal(c.hnsw_m),
        ef=sql.Literal(c.hnsw_ef_construction),
        p=range_predicate(lo, hi),
    )


MERGE_FACTOR = 4  # the most graphs one merge takes while writes go on


def merge_span(layout: Layout, *, quiet: bool, max_graphs: int, ratio: float = 0.25) -> tuple[int, int] | None:
    """The graphs (``layout.graphs[start:end]``) to merge into one now, or None.

    Every merge is a build of every row it covers, so the rule keeps the builds of a row few:

    - while writes go on, graphs are merged only once they reach ``max_graphs`` (each is a walk in
      every search), and then at most ``MERGE_FACTOR`` neighbouring graphs of about one size
      (``_tiered``): a size-tiered merge, so a row is rebuilt about log4 of the seals it took
      times (2.9 over 200 seals of one size, 5.9 over 2,000: ``tests/test_segments.py``), and a merge
      during a stream takes a few seals' rows, never the whole collection's;
    - once writes have paused (``quiet``), the first graph is rebuilt with the rest only when the
      rest hold at least ``ratio`` of its rows (so it grows geometrically); until then the later
      graphs merge among themselves, and a quiet collection keeps at most two graphs, the second
      under ``ratio`` of the first."""
    graphs = layout.graphs
    n = len(graphs)
    if n < 2:
        return None
    if not quiet:
        if n < max_graphs:
            return None
        return _tiered(tuple(g.rows_bound for g in graphs))
    first, rest = graphs[0], graphs[1:]
    if sum(g.rows_bound for g in rest) >= ratio * first.rows_bound:
        return (0, n)
    if len(rest) >= 2:
        return (1, n)
    return None


def _tiered(sizes: tuple[int, ...]) -> tuple[int, int]:
    """The neighbouring graphs of about one size (within a factor of two) with the fewest rows each,
    at most ``MERGE_FACTOR`` of them, the oldest first; when no two neighbours are of about one size,
    the neighbouring pair with the fewest rows."""
    n = len(sizes)
    tiers, start = [], 0
    for end in range(1, n + 1):
        if end == n or max(sizes[start : end + 1]) > 2 * min(sizes[start : end + 1]):
            tiers.append((start, end))
            start = end
    similar = [(sum(sizes[a:b]) / (b - a), a, b) for a, b in tiers if b - a >= 2]
    if similar:
        _, a, b = min(similar)
        return (a, min(b, a + MERGE_FACTOR))
    i = min(range(n - 1), key=lambda j: sizes[j] + sizes[j + 1])
    return (i, i + 2)
