"""The write path memstore ships for streams (``write_path="segments"``), measured as clients use it.

A client upserts its rows in batches, through the Python API or REST, into a new segmented
collection, then asks for the tail to be sealed (``VectorStore.seal``, ``POST .../seal``): the time
until then is the end-to-end time, every row found through a graph. Meanwhile another client (a
process of its own, ``OtherClient``) searches the collection without pause (``k`` 10, the default
ef): its latency during the stream is compared with the same client's searches once the stream is
over and the graphs are merged (what the sealer does when writes pause). Recall@10 at ef 40 and 80
over the benchmark's queries, with the stream's graphs and after the merge, through the store's own
search (the union of graphs and tail).
"""

from __future__ import annotations

import base64
import contextlib
import json
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import numpy as np
from psycopg import sql
from tqdm import tqdm

from bench import stream_sql as db
from memstore.catalog import segments
from memstore.models import ItemIn
from memstore.search.statements import search_statement
from memstore.store import VectorStore

PREFIX = "bench_stream_"


class Watcher:
    """Searches ``search`` in a loop on a thread of its own, keeping each search's latency."""

    def __init__(self, search: Callable[[np.ndarray], Any], queries: np.ndarray) -> None:
        self.search, self.queries = search, queries
        self.latencies: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-stream-watcher", daemon=True)

    def __enter__(self) -> Watcher:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(60)

    def _run(self) -> None:
        i = 0
        while not self._stop.is_set():
            q = self.queries[i % len(self.queries)]
            t0 = time.perf_counter()
            self.search(q)
            self.latencies.append(time.perf_counter() - t0)
            i += 1

    def summary(self) -> dict[str, Any]:
        return timing_summary(self.latencies)


def timing_summary(latencies: list[float]) -> dict[str, Any]:
    """How many searches, their p50 and p99 in ms."""
    if not latencies:
        return {"searches": 0}
    ms = np.asarray(latencies) * 1000
    return {
        "searches": len(ms),
        "p50_ms": round(float(np.percentile(ms, 50)), 3),
        "p99_ms": round(float(np.percentile(ms, 99)), 3),
    }


def _client_searches(
    url: str, names: tuple[str, ...], queries: np.ndarray, searches: int | None, ready: Any, stop: Any, out: Any
) -> None:
    """``OtherClient``'s process: its own store, one search of each collection to warm its connection,
    then ``searches`` rounds (None: until ``stop``) of one search of each collection in turn, their
    latencies per collection sent back through ``out``."""
    from memstore.db.core import create_engine
    from memstore.settings import Settings

    engine = create_engine(url)
    store = VectorStore(engine, settings=Settings(database_url=url))
    try:
        for name in names:
            store.search(collection=name, vector=queries[0], k=db.K)
        ready.set()
        latencies: dict[str, list[float]] = {name: [] for name in names}
        i = 0
        while i == 0 or (not stop.is_set() and (searches is None or i < searches)):  # one at least
            q = queries[i % len(queries)]
            for name in names:
                t0 = time.perf_counter()
                store.search(collection=name, vector=q, k=db.K)
                latencies[name].append(time.perf_counter() - t0)
            i += 1
        out.send(latencies)
    finally:
        engine.dispose()


class OtherClient:
    """``Watcher``'s searches from another process, as a service's searches come from
    other clients than its writer's: a thread in the writer's own process waits for the interpreter's
    lock behind the writer's Python work (up to ``sys.getswitchinterval()``, 5 ms, at each hand-over),
    which is the benchmark's cost and not the service's. It searches ``name`` and, in turns with it,
    each of ``beside`` (``latencies_of``): a collection nobody writes, searched in the same moments,
    tells what the machine's load alone costs a search. ``searches``: that many rounds, then stop
    (None: until the ``with`` block ends)."""

    def __init__(
        self, url: str, name: str, queries: np.ndarray, searches: int | None = None, beside: tuple[str, ...] = ()
    ) -> None:
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")  # no copy of this process's threads and connections
        self.latencies: list[float] = []
        self._searches, self._names = searches, (name, *beside)
        self._by_name: dict[str, list[float]] = {}
        self._ready, self._halt = ctx.Event(), ctx.Event()
        self._theirs, self._mine = ctx.Pipe(duplex=False)
        self._process = ctx.Process(
            target=_client_searches,
            args=(url, self._names, queries, searches, self._ready, self._halt, self._mine),
            name="bench-stream-client",
            daemon=True,
        )

    def __enter__(self) -> OtherClient:
        self._process.start()
        if not self._ready.wait(120):
            self._process.kill()
            raise RuntimeError("the searching client did not start within 120 s")
        return self

    def __exit__(self, *_: object) -> None:
        if self._searches is None:
            self._halt.set()
        if self._theirs.poll(600):
            self._by_name = dict(self._theirs.recv())
        self._process.join(60)
        if not self._by_name:
            raise RuntimeError(f"the searching client ended without its latencies (exit {self._process.exitcode})")
        self.latencies = self._by_name[self._names[0]]

    def latencies_of(self, name: str) -> list[float]:
        """The latencies of ``name``'s searches (one of ``beside``)."""
        return self._by_name.get(name, [])


def settled(search: Callable[[np.ndarray], Any], queries: np.ndarray, searches: int) -> Watcher:
    """``searches`` searches of the store once the stream is over, timed as the stream's were."""
    after = Watcher(search, queries)
    with after:
        while len(after.latencies) < searches:
            time.sleep(0.05)
    return after


def latency_figures(during: list[float], after: list[float]) -> dict[str, Any]:
    """The searches' latency during the stream and after it, and the p99 of one over the other."""
    out: dict[str, Any] = {"search_during_stream": timing_summary(during), "search_after": timing_summary(after)}
    during_p99, after_p99 = out["search_during_stream"].get("p99_ms"), out["search_after"].get("p99_ms")
    if during_p99 and after_p99:
        out["p99_ratio_during_vs_after"] = round(during_p99 / after_p99, 3)
    return out


def _recall(store: VectorStore, name: str, data: dict[str, Any]) -> dict[str, float]:
    out: dict[str, float] = {}
    for ef in db.EFS:
        hits = 0
        for q, truth in zip(data["queries"], data["truth"], strict=True):
            found = store.search(collection=name, vector=q, k=db.K, ef_search=ef)
            hits += len({int(h.external_id) for h in found} & truth)
        out[str(ef)] = round(hits / (db.K * len(data["truth"])), 4)
    return out


def _b64(v: np.ndarray) -> str:
    return base64.b64encode(np.asarray(v, dtype="<f4").tobytes()).decode()


def stream(
    store: VectorStore,
    data: dict[str, Any],
    *,
    url: str,
    batch: int,
    rest: tuple[str, str] | None = None,
    quiet: str | None = None,
    settle_searches: int = 400,
) -> dict[str, Any]:
    """One stream of ``batch``-row upserts into a new segmented collection, through the Python API or
    (``rest``: the server's URL and a key) REST, sealed at the end; its figures. ``url``: the database's,
    for the client that searches meanwhile (``OtherClient``); ``quiet``: a loaded collection nobody
    writes, which that client searches in turns with the stream's (the machine's load alone)."""
    base = data["base"]
    name = f"{PREFIX}seg_{'rest' if rest else 'py'}_{batch}"
    with contextlib.suppress(LookupError):
        store.drop_collection(name=name)
    store.create_collection(name=name, dimensions=base.shape[1], write_path="segments")
    starts = range(0, len(base), batch)

    def _rows(start: int) -> range:
        return range(start, min(len(base), start + batch))

    client: httpx.Client | None = None
    if rest is None:
        bodies: list[Any] = [[ItemIn(vector=base[i], external_id=str(i)) for i in _rows(s)] for s in starts]
    else:
        client = httpx.Client(base_url=rest[0], headers={"Authorization": f"Bearer {rest[1]}"}, timeout=600)
        # The bodies made beforehand (the client's encoding is not the server's cost): binary vectors.
        bodies = [
            json.dumps(
                {
                    "items": [
                        {"external_id": str(i), "vector_b64": _b64(base[i])}
                        for i in range(s, min(len(base), s + batch))
                    ]
                }
            ).encode()
            for s in starts
        ]

    queries = data["queries"]
    beside = (quiet,) if quiet else ()
    with OtherClient(url, name, queries, beside=beside) as during:
        t0 = time.perf_counter()
        for body in tqdm(bodies, desc=name, file=sys.stderr):
            if client is None:
                store.upsert_items(collection=name, items=body)
            else:
                r = client.post(
                    f"/v1/collections/{name}/items", content=body, headers={"Content-Type": "application/json"}
                )
                r.raise_for_status()
        acked_s = time.perf_counter() - t0
        if client is None:
            sealed = store.seal(collection=name)
        else:
            r = client.post(f"/v1/collections/{name}/seal")
            r.raise_for_status()
            sealed = r.json()["done"]
        indexed_s = time.perf_counter() - t0
    store.forget_collection(name)  # the layout as the seal left it (REST: another process sealed)
    stats = store.collection_stats(name=name).extra["segments"]
    with_graphs = _recall(store, name, data)
    t1 = time.perf_counter()
    merged = store.seal(collection=name, merge=True)
    merge_s = time.perf_counter() - t1
    with OtherClient(url, name, queries, searches=settle_searches, beside=beside) as after:
        pass
    idle_cost = merged_overhead(store, name, queries)
    out = {
        "via": "rest" if rest else "python",
        "batch": batch,
        "acked_s": round(acked_s, 3),
        "seconds": round(indexed_s, 3),
        "rows_per_s": round(len(base) / indexed_s, 1),
        "graphs_at_end": len(stats["graphs"]),
        "last_seal": sealed,
        "sealer": [d.as_json() for d in store.sealer.done] if rest is None else None,
        "recall_at_10": with_graphs,
        "merge_s": round(merge_s, 3),
        "merged": merged,
        "recall_after_merge": _recall(store, name, data),
        "merged_search_vs_one_graph": idle_cost,
        **latency_figures(during.latencies, after.latencies),
    }
    if quiet:  # the same client's searches of a collection nobody wrote, in turns with these
        out["quiet_collection"] = latency_figures(during.latencies_of(quiet), after.latencies_of(quiet))
    if client is not None:
        client.close()
    store.drop_collection(name=name)
    return out


def merged_overhead(store: VectorStore, name: str, queries: np.ndarray) -> dict[str, Any]:
    """What a merged segmented collection's search costs over a collection with one graph: its
    statement (the graph's branch and the empty tail's) against the graph's branch alone, both raw SQL
    on one connection, taking turns of 25 queries at the default ef."""
    c = store.get_collection(name=name, fresh=True)
    ranges = segments.search_ranges(c)
    assert ranges is not None and len(ranges) == 1
    union = search_statement(c.table_name, c.spec.operator, exact=False, limit=db.K, graphs=ranges)
    lo, hi = ranges[0]
    one = sql.SQL("SELECT id FROM {} WHERE embedding IS NOT NULL AND {} ORDER BY embedding <=> %(q)s LIMIT {}").format(
        c.table, segments.range_predicate(lo, hi), sql.Literal(db.K)
    )
    with store.db.dedicated(application_name="bench-stream") as conn:
        db.set_ef(conn, c.default_ef_search)
        merged = db.Side("merged", db.searcher(conn, sql.SQL(union.as_string(conn))))
        return db.timed_pair(merged, db.Side("one_graph", db.searcher(conn, one)), queries)


def quiet_collection(store: VectorStore, data: dict[str, Any]) -> str:
    """A collection of the benchmark's rows in one graph (``bulk_load``) that no stream writes."""
    name = f"{PREFIX}quiet"
    with contextlib.suppress(LookupError):
        store.drop_collection(name=name)
    store.create_collection(name=name, dimensions=data["base"].shape[1])
    base = data["base"]
    store.bulk_load(
        collection=name, items=(ItemIn(vector=v, external_id=str(i)) for i, v in enumerate(base)), total=len(base)
    )
    return name
