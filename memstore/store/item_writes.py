"""The store's item writes: upserts (one at a time, in batches, or loaded at index-build speed),
updates and deletes."""

from __future__ import annotations

import itertools
import queue
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence, Sized
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from tqdm import tqdm

from memstore.catalog import segments
from memstore.catalog.collections import (
    Collection,
)
from memstore.db import retrying
from memstore.errors import (
    CollectionNotFoundError,
    InvalidInputError,
    ItemNotFoundError,
)
from memstore.inputs import check_external_id, check_item_text, check_metadata
from memstore.items import bulk_load
from memstore.items import writes as item_sql
from memstore.items.vectors import as_matrix, as_vector
from memstore.models import Item, ItemIn, UpsertResult
from memstore.queue import jobs
from memstore.search.filter_language import compile_filter
from memstore.store.item_reads import ItemReadsPart, storable_external_ids

# Above this many items an upsert goes through COPY ... FORMAT BINARY into a staging table.
COPY_THRESHOLD = 32
# How many of a large load's first external ids are looked up to tell a new load from one sent again.
NEW_SAMPLE = 1_000


def _check_external_id(value: Any) -> str:
    return uuid.uuid4().hex if value is None else check_external_id(value)


def _batches(items: Iterable[ItemIn], size: int) -> Iterator[list[ItemIn]]:
    it = iter(items)
    while batch := list(itertools.islice(it, size)):
        yield batch


def _side_by_side(batches: Iterator[list[ItemIn]], write: Callable[[list[ItemIn]], None], workers: int) -> None:
    """``write`` every batch, ``workers`` at a time on their own connections. Each batch is cut into
    one part per worker by external id, and each worker writes its parts in the stream's order: an
    id named again later in the stream goes to the same worker after its earlier occurrence, so the
    last occurrence wins as in one batch, and the workers never wait on one another's rows."""
    if workers == 1:
        for batch in batches:
            write(batch)
        return
    lanes: list[queue.Queue[list[ItemIn] | None]] = [queue.Queue(maxsize=2) for _ in range(workers)]
    failed = threading.Event()

    def drain(lane: queue.Queue[list[ItemIn] | None]) -> None:
        try:
            while (part := lane.get()) is not None:
                if not failed.is_set():  # another worker failed: the load stops, nothing more is written
                    write(part)
        except BaseException:
            failed.set()
            while lane.get() is not None:  # the reader never waits on a lane nobody takes from
                pass
            raise

    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="memstore-load") as pool:
        done = [pool.submit(drain, lane) for lane in lanes]
        try:
            for batch in batches:
                if failed.is_set():
                    break
                parts: list[list[ItemIn]] = [[] for _ in range(workers)]
                for i, item in enumerate(batch):
                    # An item without an id gets a new one: any worker will do.
                    parts[(i if item.external_id is None else hash(item.external_id)) % workers].append(item)
                for lane, part in zip(lanes, parts, strict=True):
                    if part:
                        lane.put(part)
        finally:
            for lane in lanes:
                lane.put(None)
        for future in done:
            future.result()


class ItemWritesPart(ItemReadsPart):
    """Item writes (on the reads)."""

    def upsert_item(
        self,
        *,
        collection: str,
        vector: Any,
        external_id: str | None = None,
        metadata: dict[str, Any] | None = None,
        text: str | None = None,
    ) -> UpsertResult:
        return self.upsert_items(
            collection=collection,
            items=[ItemIn(vector=vector, external_id=external_id, metadata=metadata, text=text)],
        )[0]

    def upsert_items(
        self, *, collection: str, items: Sequence[ItemIn], backpressure: bool = True
    ) -> list[UpsertResult]:
        """Insert new items and update changed ones, keyed by ``external_id``; results in input order.

        Re-sending an identical item changes nothing (no dead tuple, no index churn). When one batch
        names the same external_id twice, the last occurrence wins. A batch large against its
        collection (``memstore.items.bulk_load.defers``) goes in without the HNSW index, which is built
        again before this returns; searches meanwhile are exact scans.

        Into a segmented collection (``write_path="segments"``) a batch that leaves the tail over its
        bound returns once the sealer has brought it under (``memstore.items.sealing.Sealer``);
        ``backpressure=False``: at once (a caller that waits for room itself, as the REST API does on
        its event loop, ``Sealer.room``).
        """
        c = self._collection_for_write(collection)
        if len(items) >= self.settings.bulk_min_rows and not bulk_load.in_progress(c):
            rows_now = self.collection_stats(name=collection).items
            if bulk_load.defers(c, len(items), rows_now, self.settings) and self._mostly_new(c, items):
                try:
                    with bulk_load.deferred_index(self.db, c, self.settings):
                        return self._write_items(c, items)
                except bulk_load.BulkLoadBusyError:
                    pass  # a switch, a rebuild or another load holds the index: into the live graph
        return self._write_items(c, items, backpressure=backpressure)

    def _mostly_new(self, c: Collection, items: Sequence[ItemIn]) -> bool:
        """Whether most of a load's first items are new to the collection (read from up to
        NEW_SAMPLE of their external ids): a load sent again (a nightly sync of the same file) changes
        few rows, and must not take the collection's indexes away for it (its searches would be exact
        scans until they are built again)."""
        named = [it.external_id for it in items[:NEW_SAMPLE] if it.external_id is not None]
        if not named:
            return True  # ids made here: every row is new
        with self.db.read() as conn:
            row = conn.execute(
                sql.SQL("SELECT count(*) FROM {} WHERE external_id = ANY(%s)").format(c.table),
                (storable_external_ids(named),),
            ).fetchone()
        return row is not None and int(row[0]) * 2 <= len(named)

    def _write_items(self, c: Collection, items: Sequence[ItemIn], *, backpressure: bool = True) -> list[UpsertResult]:
        """One upsert transaction (COPY into a staging table above ``COPY_THRESHOLD`` items)."""
        if not items:
            return []
        ids = [_check_external_id(it.external_id) for it in items]
        matrix = as_matrix([it.vector for it in items], dimensions=c.dimensions, metric=c.metric)
        metas = [check_metadata(it.metadata) for it in items]
        texts = [check_item_text(it.text, f"items[{i}].text") for i, it in enumerate(items)]
        last = {eid: i for i, eid in enumerate(ids)}
        # Rows are written in external id order, whatever the request's: two batches that share ids
        # then take their row locks in one order and wait for each other instead of deadlocking. A
        # deadlock with another kind of writer (a text batch) rolls the transaction back whole, so it
        # runs again.
        unique = sorted(last.values(), key=ids.__getitem__)
        try:
            for attempt in retrying.deadlocks(attempts=jobs.DEADLOCK_RETRIES + 1):
                with attempt, self.db.write() as conn:
                    returned = item_sql.upsert(
                        conn, c, ids, matrix, metas, texts, unique, bulk=len(unique) > COPY_THRESHOLD
                    )
                    missing = [ids[i] for i in unique if ids[i] not in returned]
                    if missing:
                        for row_id, eid in conn.execute(
                            sql.SQL("SELECT id, external_id FROM {} WHERE external_id = ANY(%s)").format(c.table),
                            (missing,),
                        ):
                            returned[eid] = (int(row_id), "unchanged")
        except psycopg.errors.UndefinedTable:
            self.forget_collection(c.name)
            raise CollectionNotFoundError(c.name) from None
        if segments.segmented(c):
            high = max((r[0] for r in returned.values()), default=None) if backpressure else None
            self.sealer.wrote(c, high)
        return [UpsertResult(id=returned[eid][0], external_id=eid, status=returned[eid][1]) for eid in ids]

    def bulk_load(
        self,
        *,
        collection: str,
        items: Iterable[ItemIn],
        batch_rows: int = 10_000,
        total: int | None = None,
        connections: int | None = None,
        progress: bool = False,
    ) -> bulk_load.LoadResult:
        """Load many items (an iterable, read lazily in batches of ``batch_rows``) and return once every
        one is searchable through the index. Large against the collection (``total`` or the length of
        ``items`` says how large; an iterable of unknown length is looked at up to the threshold), the
        load writes without the HNSW index and builds it afterwards (``memstore.items.bulk_load``); else
        ``connections`` (default ``MEMSTORE_BULK_CONNECTIONS``) insert batches into the live index
        side by side. Each batch is its own transaction: after a failure, the batches before it stay."""
        if isinstance(batch_rows, bool) or not isinstance(batch_rows, int) or not 1 <= batch_rows <= 1_000_000:
            raise InvalidInputError(f"batch_rows must be between 1 and 1,000,000, not {batch_rows!r}")
        workers = self.settings.bulk_connections if connections is None else connections
        if isinstance(workers, bool) or not isinstance(workers, int) or not 1 <= workers <= 64:
            raise InvalidInputError(f"connections must be between 1 and 64, not {workers!r}")
        c = self.get_collection(name=collection, fresh=True)
        if bulk_load.in_progress(c):
            bulk_load.finish_interrupted(self.db, c, self.settings, progress=progress)
            c = self.get_collection(name=collection, fresh=True)
        batches = _batches(items, batch_rows)
        size = total if total is not None else (len(items) if isinstance(items, Sized) else None)
        rows_now = self.collection_stats(name=collection).items
        ahead: list[list[ItemIn]] = []
        if size is None:  # look ahead as far as the decision needs (bounded: pass total= beyond that)
            need = min(max(self.settings.bulk_min_rows, int(self.settings.bulk_fraction * rows_now)), 200_000)
            size = 0  # the whole load when it ends sooner
            for batch in batches:
                ahead.append(batch)
                size += len(batch)
                if size >= need:
                    break
        stream = itertools.chain(ahead, batches)
        counts: Counter[str] = Counter()
        build_s: list[float] = []
        t0 = time.perf_counter()
        bar = tqdm(
            total=total if total is not None else (size if isinstance(items, Sized) else None),
            desc=f"{collection}: loading",
            unit="row",
            disable=not progress,
            leave=False,
        )
        with bar:
            counting = threading.Lock()

            def write(batch: list[ItemIn]) -> None:
                written = self._write_items(c, batch)
                with counting:  # an external id the batch names twice is one row written
                    counts.update({r.external_id: r.status for r in written}.values())
                    bar.update(len(batch))

            first = next(stream, None)  # the first batch tells a new load from one sent again
            stream = itertools.chain([first] if first else [], stream)
            deferred = bulk_load.defers(c, size, rows_now, self.settings) and self._mostly_new(c, first or [])
            if deferred:
                try:
                    with bulk_load.deferred_index(
                        self.db, c, self.settings, progress=progress, on_build=build_s.append
                    ):
                        _side_by_side(stream, write, workers)
                except bulk_load.BulkLoadBusyError:
                    deferred = False
            if not deferred:
                _side_by_side(stream, write, workers)
        if segments.segmented(c):
            # Every row in a graph before this returns, as a load into one graph promises.
            t_seal = time.perf_counter()
            self.sealer.seal_now(c, wait_s=bulk_load.SEAL_WAIT_S)
            build_s.append(time.perf_counter() - t_seal)
        total_s = time.perf_counter() - t0
        built = build_s[0] if build_s else 0.0
        return bulk_load.LoadResult(
            created=counts["created"],
            updated=counts["updated"] + counts["metadata"],  # a load's answer counts every changed row
            unchanged=counts["unchanged"],
            deferred_index=deferred,
            load_s=total_s - built,
            build_s=built,
        )

    def update_item(
        self,
        *,
        collection: str,
        id: int | None = None,
        external_id: str | None = None,
        metadata: dict[str, Any] | None = None,
        merge_metadata: bool = False,
        vector: Any = None,
    ) -> Item:
        """Replace (or with ``merge_metadata`` merge into) the metadata and/or replace the vector."""
        c = self.get_collection(name=collection)
        where, value = self._item_key(id, external_id)
        sets: list[str] = ["updated_at = now()"]
        params: list[Any] = []
        if metadata is not None:
            sets.append("metadata = %s")
            params.append(Jsonb(check_metadata(metadata)))
        if vector is not None:
            sets += ["embedding = %s", "status = 'ready'", "error = NULL"]
            params.append(as_vector(vector, dimensions=c.dimensions, metric=c.metric))
        if len(sets) == 1:
            raise InvalidInputError("nothing to update: give metadata, vector or both")
        query = sql.SQL(
            "UPDATE {} SET " + ", ".join(sets) + " WHERE " + where + " RETURNING " + item_sql.ITEM_COLUMNS
        ).format(c.table)
        with self.db.write() as conn:
            if metadata is not None and merge_metadata:
                # Merged here, under the row's lock, so that the result is held to the limits a
                # stored item's metadata is (merges one after another would grow it without bound).
                held = conn.execute(
                    sql.SQL("SELECT metadata FROM {} WHERE " + where + " FOR UPDATE").format(c.table), [value]
                ).fetchone()
                if held is None:
                    raise ItemNotFoundError(collection, id if id is not None else str(external_id))
                params[0] = Jsonb(_merged_metadata(held[0], metadata))
            row = conn.cursor(row_factory=dict_row).execute(query, [*params, value]).fetchone()
            if row is not None and vector is not None:
                # The vector given supersedes an embedding still queued for this item (a worker
                # would overwrite it): the item row is locked by the UPDATE, then its queue row.
                jobs.unqueue(conn, c, [int(row["id"])])
        if row is None:
            raise ItemNotFoundError(collection, id if id is not None else str(external_id))
        return item_sql.item_from_row(row)

    def delete_items(
        self,
        *,
        collection: str,
        ids: Iterable[int] | None = None,
        external_ids: Iterable[str] | None = None,
        filter: dict[str, Any] | None = None,
    ) -> int:
        """Delete by ids, by external ids, or every item that matches ``filter`` (the search filter
        language, ``memstore.search.filter_language``); returns the count."""
        c = self.get_collection(name=collection)
        given = [x is not None for x in (ids, external_ids, filter)]
        if sum(given) != 1:
            raise InvalidInputError("give exactly one of ids, external_ids or filter")
        params: dict[str, Any]
        if filter is not None:
            compiled = compile_filter(filter)
            if not filter or compiled.where.as_string() == "TRUE":
                raise InvalidInputError("this filter matches every item; to delete them all, drop the collection")
            clause, params = compiled.where, compiled.params
        elif ids is not None:
            if isinstance(ids, str | bytes):  # not split into digits: "12" is not the items 1 and 2
                raise InvalidInputError("ids must be a list of integers, not a string")
            clause, params = sql.SQL("id = ANY(%(ids)s)"), {"ids": [int(i) for i in ids]}
        else:
            clause, params = sql.SQL("external_id = ANY(%(ids)s)"), {"ids": storable_external_ids(external_ids or ())}
        # The rows are locked in id order first, as every writer of items and queue rows takes them
        # (a DELETE alone locks in scan order, which could deadlock with an enqueue of the same items).
        statement = sql.SQL(
            "DELETE FROM {t} WHERE id IN (SELECT id FROM {t} WHERE {clause} ORDER BY id FOR UPDATE) RETURNING id"
        ).format(t=c.table, clause=clause)
        with self.db.write() as conn:
            gone = [int(r[0]) for r in conn.execute(statement, params).fetchall()]
            jobs.unqueue(conn, c, gone, deleted=True)  # then their queue rows, in the same transaction
        return len(gone)

    def delete_item(self, *, collection: str, id: int | None = None, external_id: str | None = None) -> None:
        where, value = self._item_key(id, external_id)
        n = self.delete_items(
            collection=collection,
            ids=[int(value)] if where.startswith("id") else None,
            external_ids=[str(value)] if where.startswith("external_id") else None,
        )
        if n == 0:
            raise ItemNotFoundError(collection, id if id is not None else str(external_id))


def _merged_metadata(stored: dict[str, Any] | None, patch: dict[str, Any]) -> dict[str, Any]:
    """jsonb's ``stored || patch`` for two objects (the patch's top-level keys replace the stored
    ones), checked as a whole."""
    try:
        return check_metadata({**(stored or {}), **patch})
    except InvalidInputError as exc:
        raise InvalidInputError(f"merged into the stored metadata, the {exc.args[0]}") from None
