"""Collections written as segments (``write_path="segments"``): rows go to an exact tail and get
partial HNSW graphs at build speed; every row is found right after its upsert in every state of the
tail, the graphs and their merges; updates and deletes show at once; a seal that dies loses nothing."""

from __future__ import annotations

import itertools
import re
import threading
import time
import uuid
from collections.abc import Iterator

import numpy as np
import psycopg
import pytest
import sqlalchemy as sa
from psycopg import sql

from memstore.catalog import segments
from memstore.catalog.segments import Graph, Layout
from memstore.db.core import raw_connection
from memstore.errors import InvalidInputError
from memstore.items import sealing
from memstore.models import ItemIn
from memstore.search.statements import search_statement
from memstore.settings import Settings
from memstore.store import VectorStore

DIMS = 16


@pytest.fixture
def seg_settings(settings: Settings) -> Settings:
    """Small seals, and a sealer thread that only looks when a test asks (``step``)."""
    return settings.model_copy(update={"seal_rows": 100, "seal_interval_s": 3600.0, "segments_max": 4})


@pytest.fixture
def seg_store(engine: sa.Engine, seg_settings: Settings) -> Iterator[VectorStore]:
    store = VectorStore(engine, settings=seg_settings)
    store.sealer.BACKLOG = 10_000  # no back-pressure: these tests seal by hand
    yield store
    store.sealer.close()


def _vectors(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, DIMS)).astype(np.float32)


def _write(store: VectorStore, name: str, x: np.ndarray, start: int, batch: int = 100) -> None:
    for b in range(start, start + len(x), batch):
        rows = x[b - start : b - start + batch]
        store.upsert_items(
            collection=name,
            items=[ItemIn(vector=v, external_id=f"r{b + i}", metadata={"n": b + i}) for i, v in enumerate(rows)],
        )


def _all_found(store: VectorStore, name: str, x: np.ndarray, start: int = 0, every: int = 1) -> None:
    """Each row is its own nearest neighbour (distance 0): a search finds it whether a graph or the tail holds it."""
    for i in range(0, len(x), every):
        hits = store.search(collection=name, vector=x[i], k=1)
        assert hits and hits[0].external_id == f"r{start + i}", (i, hits)


def _sealed_and_tail(store: VectorStore, name: str, *, seed: int) -> np.ndarray:
    """A segmented collection of 300 rows: r0..r199 in one graph, r200..r299 in the tail."""
    c = store.create_collection(name=name, dimensions=DIMS, write_path="segments")
    x = _vectors(300, seed=seed)
    _write(store, name, x[:200], 0)
    assert sealing.seal(store.db, c, store.settings) is not None
    _write(store, name, x[200:], 200)
    store.forget_collection(name)
    return x


def _layout(store: VectorStore, name: str) -> Layout:
    found = segments.layout(store.get_collection(name=name, fresh=True))
    assert found is not None
    return found


def _graph_indexes(engine: sa.Engine, c_id: int) -> list[tuple[str, bool]]:
    with raw_connection(engine) as conn:
        return [
            (str(r[0]), bool(r[1]))
            for r in conn.execute(
                "SELECT i.relname, x.indisvalid FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid "
                "WHERE starts_with(i.relname, %s) ORDER BY 1",
                (f"c{c_id}_g",),
            )
        ]


# -- the layout, pure ----------------------------------------------------------------------------------


def test_layout_round_trips_and_names_its_ranges() -> None:
    layout = Layout((Graph(0, 500, "c1_g0_500"), Graph(500, 800, "c1_g500_800")))
    assert Layout.from_json(layout.to_json()) == layout
    assert layout.watermark == 800 and layout.ranges == ((0, 500), (500, 800))
    assert Layout.from_json(None) == Layout() and Layout().watermark == 0


def test_range_predicates_carry_their_bounds_as_literals() -> None:
    assert segments.range_predicate(0, 500).as_string() == "id <= 500"
    assert segments.range_predicate(500, 800).as_string() == "id > 500 AND id <= 800"
    assert segments.range_predicate(800, None).as_string() == "id > 800"


@pytest.mark.parametrize(
    ("sizes", "quiet", "want"),
    [
        ([100], True, None),  # one graph: nothing to merge
        ([1000, 100, 100], False, None),  # writes going on, under the cap
        ([1000, 100, 100], True, (1, 3)),  # quiet: the small ones merge among themselves
        ([1000, 100], True, None),  # quiet, one small graph after a large one: left
        ([1000, 200, 100], True, (0, 3)),  # the rest reach a quarter of the first: everything
        ([1000, 10, 10, 10], False, (1, 4)),  # at the cap while writing: the small ones of one size
        ([100] * 6, False, (0, 4)),  # seals of one size: the oldest four of them
        ([400, 300, 100, 100], False, (2, 4)),  # the two of about one size with the fewest rows
        ([1600, 400, 100, 10], False, (2, 4)),  # no two of one size: the smallest neighbouring pair
        ([100], False, None),
    ],
)
def test_merge_span_keeps_builds_geometric(sizes: list[int], quiet: bool, want: tuple[int, int] | None) -> None:
    graphs, lo = [], 0
    for size in sizes:
        graphs.append(Graph(lo, lo + size, f"g{lo}"))
        lo += size
    assert segments.merge_span(Layout(tuple(graphs)), quiet=quiet, max_graphs=4) == want


def test_a_build_takes_fewer_workers_while_searches_are_held_back(seg_store: VectorStore) -> None:
    class Share:
        def __init__(self, share: float) -> None:
            self.value = share

        def share(self) -> float:
            return self.value

    sealer = seg_store.sealer
    full = Settings(max_parallel_maintenance_workers=4, background_build_workers=4)
    sealer.settings, before = full, sealer.settings
    try:
        sealer.pace = None
        assert sealer._build_settings() is full
        sealer.pace = Share(1.0)
        assert sealer._build_settings() is full
        sealer.pace = Share(0.5)
        assert sealer._build_settings().max_parallel_maintenance_workers == 2
        sealer.pace = Share(0.2)
        halved = sealer._build_settings()
        assert halved.max_parallel_maintenance_workers == 0 and halved.seal_rows == full.seal_rows
    finally:
        sealer.settings, sealer.pace = before, None


def test_merges_while_writing_rebuild_each_row_a_few_times() -> None:
    """A stream of 200 equal seals under a cap of 12 graphs: the graphs stay under the cap, and the
    rows the merges rebuild stay a small multiple of the rows (about log4 of the seals: 2.9 here)."""
    graphs: list[Graph] = []
    rebuilt = 0
    for i in range(200):
        graphs.append(Graph(i * 100, (i + 1) * 100, f"g{i}"))
        while (span := segments.merge_span(Layout(tuple(graphs)), quiet=False, max_graphs=12)) is not None:
            start, end = span
            merged = Graph(graphs[start].lo, graphs[end - 1].hi, "m")
            rebuilt += merged.rows_bound
            graphs[start:end] = [merged]
        assert len(graphs) < 12
    assert rebuilt <= 4 * 200 * 100


@pytest.mark.parametrize(
    ("sizes", "ef", "k", "want"),
    [
        ([], 80, 10, 80),  # no graph: the tail alone, exactly
        ([100_000], 80, 10, 80),  # one graph: the collection's ef
        ([10_000] * 10, 80, 10, 26),  # ten of a tenth each: ceil(80 * sqrt(0.1))
        ([10_000] * 10, 40, 10, 13),
        ([10_000] * 100, 40, 10, 10),  # never under k
        ([10_000] * 10, 8, 10, 8),  # nor over the ef asked for, under k or not
        ([80_000, 20_000], 80, 10, 72),  # a quiet collection's two graphs: the larger's share, 0.8
        ([5_000, 95_000], 1000, 10, 975),
    ],
)
def test_each_graph_is_walked_at_the_ef_of_its_share(sizes: list[int], ef: int, k: int, want: int) -> None:
    edges = np.cumsum([0, *sizes]).tolist()
    layout = Layout(tuple(Graph(lo, hi, f"g{i}") for i, (lo, hi) in enumerate(itertools.pairwise(edges))))
    assert layout.walk_ef(ef, k) == want


def test_write_path_is_checked() -> None:
    assert segments.validate_write_path("segments", partitions=1, representation="full") == "segments"
    with pytest.raises(InvalidInputError, match="write_path must be one of"):
        segments.validate_write_path("fast", partitions=1, representation="full")
    with pytest.raises(InvalidInputError, match="partitions = 1"):
        segments.validate_write_path("segments", partitions=4, representation="full")
    with pytest.raises(InvalidInputError, match="full vectors"):
        segments.validate_write_path("segments", partitions=1, representation="binary")


def test_statement_has_a_branch_per_graph_and_the_tail() -> None:
    text = search_statement("t", "<=>", exact=False, limit=10, graphs=((0, 500), (500, 800))).as_string()
    assert text.count("UNION ALL") == 2
    assert "id <= 500" in text and "id > 500 AND id <= 800" in text and "id > 800" in text
    # An exact search reads every row in one scan whatever the graphs.
    exact = search_statement("t", "<=>", exact=True, limit=10, graphs=((0, 500),)).as_string()
    assert "UNION" not in exact and "id <=" not in exact


# -- the write path, on the database ---------------------------------------------------------------------


def test_rows_are_found_in_every_state(seg_store: VectorStore, collection_name: str, engine: sa.Engine) -> None:
    store, s = seg_store, seg_store.settings
    c = store.create_collection(name=collection_name, dimensions=DIMS, write_path="segments")
    assert _graph_indexes(engine, c.id) == []  # no graph at all: every row is the tail's
    x = _vectors(700)
    _write(store, collection_name, x[:250], 0)
    _all_found(store, collection_name, x[:250])  # the tail alone, exactly
    first = sealing.seal(store.db, c, s)
    assert first is not None and first.rows == 250 and first.graph.lo == 0
    _write(store, collection_name, x[250:400], 250)
    store.forget_collection(collection_name)
    _all_found(store, collection_name, x[:400])  # a graph and a tail
    second = sealing.seal(store.db, c, s)
    assert second is not None and second.graph.lo == first.graph.hi and second.rows == 150
    _write(store, collection_name, x[400:520], 400)
    third = sealing.seal(store.db, c, s)
    assert third is not None
    _write(store, collection_name, x[520:], 520)  # 180 in the tail again
    store.forget_collection(collection_name)
    assert len(_layout(store, collection_name).graphs) == 3
    _all_found(store, collection_name, x)
    # Graphs of 250, 150 and 120 rows: a search at the default ef walks each at the largest's share,
    # ceil(80 * sqrt(250 / 520)).
    three = store.get_collection(name=collection_name)
    plan = store.plain_search(three, vector=x[0], k=10, filter=None, ef_search=None, exact=False, alone=True)
    assert plan.settings.ef_search == segments.walk_ef(three, s.default_ef_search, 10) == 56
    # Each graph's walk keeps pgvector's iterative scan: a walk thinned by dead rows would otherwise
    # have its place filled by the other graphs' farther rows, complete but worse.
    assert plan.settings.iterative and plan.fallback is None
    # A layout read before the merge still finds every row once its indexes are gone.
    stale = store.get_collection(name=collection_name, fresh=True)
    merged = sealing.merge(store.db, c, s, quiet=True, everything=True)
    assert merged is not None and merged.rows == 520 and len(merged.replaced) == 3
    assert _graph_indexes(engine, c.id) == [(merged.graph.index, True)]
    hits = store.search(collection=collection_name, vector=x[10], k=1)  # the store's cached, stale layout
    assert segments.layout(stale) != _layout(store, collection_name) and hits[0].external_id == "r10"
    store.forget_collection(collection_name)
    _all_found(store, collection_name, x)
    assert store.collection_stats(name=collection_name).extra["segments"]["tail_rows"] == 180


def test_updates_deletes_and_filters_across_graphs_and_tail(seg_store: VectorStore, collection_name: str) -> None:
    store = seg_store
    x = _sealed_and_tail(store, collection_name, seed=1)
    # An update of a sealed row moves it in its graph; of a tail row, in the tail.
    far = -x[5]
    store.upsert_items(collection=collection_name, items=[ItemIn(vector=far, external_id="r5", metadata={"n": 5})])
    store.upsert_items(collection=collection_name, items=[ItemIn(vector=-x[250], external_id="r250")])
    assert store.search(collection=collection_name, vector=far, k=1)[0].external_id == "r5"
    assert store.search(collection=collection_name, vector=x[5], k=1)[0].external_id != "r5"
    assert store.search(collection=collection_name, vector=-x[250], k=1)[0].external_id == "r250"
    # Deletes show at once, from a graph and from the tail.
    store.delete_items(collection=collection_name, external_ids=["r7", "r270"])
    for i in (7, 270):
        assert store.search(collection=collection_name, vector=x[i], k=1)[0].external_id != f"r{i}"
    # A filter that keeps a few rows of each part still answers k of them, nearest first.
    hits = store.search(collection=collection_name, vector=x[0], k=6, filter={"n": {"$in": [1, 2, 3, 201, 202, 203]}})
    assert sorted(h.external_id for h in hits) == ["r1", "r2", "r201", "r202", "r203", "r3"]
    assert [h.distance for h in hits] == sorted(h.distance for h in hits)


def test_the_sealer_seals_full_tails_and_merges_when_writes_pause(
    engine: sa.Engine, seg_settings: Settings, collection_name: str
) -> None:
    settings = seg_settings.model_copy(update={"seal_interval_s": 0.1, "segments_quiet_s": 1.0})
    store = VectorStore(engine, settings=settings)
    try:
        store.create_collection(name=collection_name, dimensions=DIMS, write_path="segments")
        x = _vectors(450, seed=2)
        for start in (0, 150, 300):  # three tails over the bound, each sealed before the next arrives
            # One upsert each: in two, a sealer that looked between them (a loaded machine) sealed the
            # first 100 and left the other 50 under seal_rows, and the watermark stopped short.
            _write(store, collection_name, x[start : start + 150], start, batch=150)
            deadline = time.monotonic() + 60
            while _layout(store, collection_name).watermark < start + 150 and time.monotonic() < deadline:
                time.sleep(0.1)
            # A new table's ids start at 1 and no upsert here updated: the highest id is the rows written.
            assert _layout(store, collection_name).watermark == start + 150

        # Then a pause: the two later graphs are a quarter of the first or more, so all merge into one.
        # The sealer notes a merge just after it records the layout: both are awaited.
        def merged() -> bool:
            done = store.sealer.done
            return len(_layout(store, collection_name).graphs) == 1 and bool(done) and done[-1].action == "merge"

        deadline = time.monotonic() + 60
        while not merged() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(_layout(store, collection_name).graphs) == 1
        assert [d.action for d in store.sealer.done][-1] == "merge"
        _all_found(store, collection_name, x, every=7)
    finally:
        store.sealer.close()


def test_bulk_load_returns_with_every_row_in_a_graph(seg_store: VectorStore, collection_name: str) -> None:
    seg_store.create_collection(name=collection_name, dimensions=DIMS, write_path="segments")
    x = _vectors(400, seed=3)
    result = seg_store.bulk_load(
        collection=collection_name, items=[ItemIn(vector=v, external_id=f"r{i}") for i, v in enumerate(x)]
    )
    assert result.created == 400
    assert _layout(seg_store, collection_name).watermark == 400
    assert seg_store.collection_stats(name=collection_name).extra["segments"]["tail_rows"] == 0


def test_segments_refuse_what_they_do_not_support(seg_store: VectorStore, collection_name: str) -> None:
    with pytest.raises(InvalidInputError, match="partitions"):
        seg_store.create_collection(name=collection_name, dimensions=DIMS, write_path="segments", partitions=2)
    seg_store.create_collection(name=collection_name, dimensions=DIMS, write_path="segments")
    with pytest.raises(InvalidInputError, match="full vectors"):
        seg_store.set_index_representation(collection=collection_name, representation="binary")
    graph = f"{collection_name}_g"
    seg_store.create_collection(name=graph, dimensions=DIMS)
    with pytest.raises(InvalidInputError, match="not written as segments"):
        seg_store.seal(collection=graph)


def test_a_seal_killed_mid_build_loses_nothing(seg_store: VectorStore, collection_name: str, engine: sa.Engine) -> None:
    """The backend building a graph is terminated (what a server crash does to it): the rows stay the
    tail's and are found; the next seal drops the INVALID index it left and builds the graph."""
    store = seg_store
    c = store.create_collection(name=collection_name, dimensions=DIMS, write_path="segments")
    x = _vectors(30_000, seed=4)
    store.upsert_items(
        collection=collection_name, items=[ItemIn(vector=v, external_id=f"r{i}") for i, v in enumerate(x)]
    )
    failed: list[BaseException] = []

    def build() -> None:
        try:
            sealing.seal(store.db, c, store.settings.model_copy(update={"max_parallel_maintenance_workers": 0}))
        except BaseException as exc:
            failed.append(exc)

    t = threading.Thread(target=build)
    t.start()
    killed = False
    deadline = time.monotonic() + 60
    with store.db.dedicated(application_name="test-watcher") as conn:  # autocommit, outside the pool
        while not killed and t.is_alive() and time.monotonic() < deadline:
            row = conn.execute(
                "SELECT p.pid FROM pg_stat_progress_create_index p JOIN pg_stat_activity a USING (pid) "
                "WHERE a.application_name = 'memstore-sealer' AND p.relid = to_regclass(%s)",
                (c.table_name,),
            ).fetchone()
            if row is not None:
                killed = bool(conn.execute("SELECT pg_terminate_backend(%s)", (row[0],)).fetchone()[0])
            time.sleep(0.01)
    t.join(120)
    assert killed, "the build ended before it could be killed"
    assert failed and isinstance(failed[0], psycopg.OperationalError)
    assert _layout(store, collection_name).graphs == ()  # nothing recorded: every row is still the tail's
    left = _graph_indexes(engine, c.id)
    assert all(not valid for _, valid in left)  # an INVALID leftover at most
    _all_found(store, collection_name, x, every=997)
    done = sealing.seal(store.db, c, store.settings)
    assert done is not None and done.rows == len(x)
    assert _graph_indexes(engine, c.id) == [(done.graph.index, True)]
    store.forget_collection(collection_name)
    _all_found(store, collection_name, x, every=997)


def test_near_duplicates_across_graphs_and_tail(seg_store: VectorStore, collection_name: str) -> None:
    store = seg_store
    x = _sealed_and_tail(store, collection_name, seed=6)
    # Copies of a sealed row and of a tail row, both in the tail.
    store.upsert_items(
        collection=collection_name,
        items=[ItemIn(vector=x[10] * 1.0001, external_id="d10"), ItemIn(vector=x[250], external_id="d250")],
    )
    store.forget_collection(collection_name)
    pairs, _ = store.duplicates(collection=collection_name, threshold=1e-4, scan=1000)
    assert {(p.a_external_id, p.b_external_id) for p in pairs} >= {("r10", "d10"), ("r250", "d250")}


def test_a_writer_faster_than_the_sealer_waits_for_it(
    engine: sa.Engine, seg_settings: Settings, collection_name: str
) -> None:
    """A batch that leaves more than twice ``seal_rows`` in the tail returns once the sealer brought
    the tail under that bound: searches never read an unbounded tail exactly."""
    store = VectorStore(engine, settings=seg_settings.model_copy(update={"seal_interval_s": 0.1}))
    try:
        store.create_collection(name=collection_name, dimensions=DIMS, write_path="segments")
        x = _vectors(1000, seed=8)
        returned = store.upsert_items(
            collection=collection_name, items=[ItemIn(vector=v, external_id=f"r{i}") for i, v in enumerate(x)]
        )
        high = max(r.id for r in returned)
        layout = _layout(store, collection_name)
        assert high - layout.watermark <= store.sealer.BACKLOG * store.settings.seal_rows
        assert layout.graphs and store.sealer.done
        # Under the bound, a write returns at once without waiting for a seal.
        small = store.upsert_items(collection=collection_name, items=[ItemIn(vector=x[0], external_id="extra")])
        assert _layout(store, collection_name).watermark < small[0].id
        assert store.sealer.room(store.get_collection(name=collection_name))
        # A caller that waits for room itself (the REST API, on its event loop) is not held: written
        # by a store whose sealer is stopped, into a collection no sealer looks after yet.
        other = f"{collection_name}_b"
        quiet_store = VectorStore(engine, settings=store.settings)
        quiet_store.sealer.close()
        quiet_store.create_collection(name=other, dimensions=DIMS, write_path="segments")
        more = [ItemIn(vector=v, external_id=f"m{i}") for i, v in enumerate(_vectors(600, seed=14))]
        quiet_store.upsert_items(collection=other, items=more, backpressure=False)
        c_other = store.get_collection(name=other)
        assert not store.sealer.room(c_other)  # 600 rows in the tail, over the bound of 200
        store.sealer.wrote(c_other)  # now this store's sealer looks after it
        deadline = time.monotonic() + 60
        while not store.sealer.room(c_other) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert store.sealer.room(c_other)
    finally:
        store.sealer.close()


def test_rows_waiting_for_their_vectors_stay_in_the_tail(seg_store: VectorStore, collection_name: str) -> None:
    """A seal stops before the first row still queued for the encoder: a graph built over it would
    take its vector later through pgvector's per-row insert."""
    store = seg_store
    c = store.create_collection(name=collection_name, dimensions=DIMS, write_path="segments")
    x = _vectors(300, seed=9)
    _write(store, collection_name, x, 0)
    with store.db.write() as conn:  # r150 as a queued item is before the worker embeds it
        conn.execute(
            sql.SQL("UPDATE {} SET status = 'pending', embedding = NULL WHERE external_id = 'r150'").format(c.table)
        )
    done = sealing.seal(store.db, c, store.settings)
    assert done is not None and done.rows == 150 and done.graph.hi == 150
    store.upsert_items(collection=collection_name, items=[ItemIn(vector=x[150], external_id="r150")])  # embedded
    done = sealing.seal(store.db, c, store.settings)
    assert done is not None and done.graph.lo == 150 and done.rows == 150
    store.forget_collection(collection_name)
    _all_found(store, collection_name, x, every=13)


def test_a_second_space_of_a_segmented_collection(seg_store: VectorStore, collection_name: str) -> None:
    """Spaces keep their own side table and graph: a segmented collection's second space is filled
    and searched as any collection's, its hits joined to items in graphs and in the tail alike."""
    store = seg_store
    x = _sealed_and_tail(store, collection_name, seed=10)
    store.create_space(collection=collection_name, name="other", model="user", dimensions=8)
    other = _vectors(300, seed=11)[:, :8]
    store.put_space_vectors(collection=collection_name, name="other", vectors={f"r{i}": v for i, v in enumerate(other)})
    for i in (3, 250):  # one in the graph, one in the tail
        hits = store.search(collection=collection_name, vector=other[i], k=1, using="other", exact=True)
        assert hits[0].external_id == f"r{i}"
        assert store.search(collection=collection_name, vector=x[i], k=1)[0].external_id == f"r{i}"


def test_leftover_cleanup_drops_only_graph_indexes(seg_store: VectorStore, engine: sa.Engine) -> None:
    """A collection whose table's name itself looks like a graph's prefix (``c<id>_g1...``): seals and
    merges, which drop leftover graph indexes first, leave its other indexes alone."""
    store = seg_store
    name = f"g1_{uuid.uuid4().hex[:8]}"
    c = store.create_collection(name=name, dimensions=DIMS, write_path="segments")
    store.create_metadata_index(collection=name, field="n", type="number")

    def others() -> set[str]:
        with raw_connection(engine) as conn:
            rows = conn.execute(
                "SELECT i.relname FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid "
                "WHERE x.indrelid = %s::regclass",
                (c.table_name,),
            ).fetchall()
        return {r[0] for r in rows if not re.fullmatch(rf"c{c.id}_g[0-9]+_[0-9]+", r[0])}

    before = others()
    assert len(before) >= 4  # the primary key, external_id, metadata and the typed index at least
    _write(store, name, _vectors(300, seed=12), 0)
    assert sealing.seal(store.db, c, store.settings, min_rows=1) is not None
    _write(store, name, _vectors(100, seed=13), 300)
    assert sealing.seal(store.db, c, store.settings, min_rows=1) is not None
    assert sealing.merge(store.db, c, store.settings, quiet=True, everything=True) is not None
    assert others() == before
    store.drop_collection(name=name)
