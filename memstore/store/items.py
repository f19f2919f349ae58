"""The store's items: upserts (one at a time, in batches, or loaded at index-build speed), reads,
listings and counts, updates and deletes."""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence, Sized
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import psycopg
from psycopg import sql
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from tqdm import tqdm

from memstore.catalog import metadata_indexes
from memstore.catalog.collections import (
    Collection,
)
from memstore.errors import (
    CollectionNotFoundError,
    InvalidInputError,
    ItemNotFoundError,
)
from memstore.inputs import check_external_id, check_item_text, check_metadata
from memstore.items import bulk_load, ordering
from memstore.items import writes as item_sql
from memstore.items.vectors import as_matrix, as_vector
from memstore.models import Item, ItemIn, Original, UpsertResult
from memstore.queue import jobs
from memstore.search.filter_language import compile_filter
from memstore.search.request import MAX_K
from memstore.store.collections import CollectionsPart

# Above this many items an upsert goes through COPY ... FORMAT BINARY into a staging table.
COPY_THRESHOLD = 32


def _check_external_id(value: Any) -> str:
    return uuid.uuid4().hex if value is None else check_external_id(value)


def _batches(items: Iterable[ItemIn], size: int) -> Iterator[list[ItemIn]]:
    it = iter(items)
    while batch := list(itertools.islice(it, size)):
        yield batch


def _side_by_side(batches: Iterator[list[ItemIn]], write: Callable[[list[ItemIn]], None], workers: int) -> None:
    """``write`` every batch, ``workers`` at a time on their own connections (disjoint batches, so
    they never wait on one another's rows; only on the index's pages)."""
    if workers == 1:
        for batch in batches:
            write(batch)
        return
    taking = threading.Lock()

    def drain() -> None:
        while True:
            with taking:
                batch = next(batches, None)
            if batch is None:
                return
            write(batch)

    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="memstore-load") as pool:
        for done in [pool.submit(drain) for _ in range(workers)]:
            done.result()


class ItemsPart(CollectionsPart):
    """Items."""

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

    def upsert_items(self, *, collection: str, items: Sequence[ItemIn]) -> list[UpsertResult]:
        """Insert new items and update changed ones, keyed by ``external_id``; results in input order.

        Re-sending an identical item changes nothing (no dead tuple, no index churn). When one batch
        names the same external_id twice, the last occurrence wins. A batch large against its
        collection (``memstore.items.bulk_load.defers``) goes in without the HNSW index, which is built
        again before this returns; searches meanwhile are exact scans.
        """
        c = self._collection_for_write(collection)
        if len(items) >= self.settings.bulk_min_rows and not bulk_load.in_progress(c):
            rows_now = self.collection_stats(name=collection).items
            if bulk_load.defers(c, len(items), rows_now, self.settings):
                try:
                    with bulk_load.deferred_index(self.db, c, self.settings):
                        return self._write_items(c, items)
                except bulk_load.BulkLoadBusyError:
                    pass  # a switch, a rebuild or another load holds the index: into the live graph
        return self._write_items(c, items)

    def _write_items(self, c: Collection, items: Sequence[ItemIn]) -> list[UpsertResult]:
        """One upsert transaction (COPY into a staging table above ``COPY_THRESHOLD`` items)."""
        if not items:
            return []
        ids = [_check_external_id(it.external_id) for it in items]
        matrix = as_matrix([it.vector for it in items], dimensions=c.dimensions, metric=c.metric)
        metas = [check_metadata(it.metadata) for it in items]
        texts = [check_item_text(it.text, f"items[{i}].text") for i, it in enumerate(items)]
        last = {eid: i for i, eid in enumerate(ids)}
        unique = sorted(last.values())
        try:
            with self.db.write() as conn:
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
                with counting:
                    counts.update(r.status for r in written)
                    bar.update(len(batch))

            deferred = bulk_load.defers(c, size, rows_now, self.settings)
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
        total_s = time.perf_counter() - t0
        built = build_s[0] if build_s else 0.0
        return bulk_load.LoadResult(
            created=counts["created"],
            updated=counts["updated"],
            unchanged=counts["unchanged"],
            deferred_index=bool(build_s),
            load_s=total_s - built,
            build_s=built,
        )

    def get_item(
        self, *, collection: str, id: int | None = None, external_id: str | None = None, with_vector: bool = False
    ) -> Item:
        c = self.get_collection(name=collection)
        where, value = self._item_key(id, external_id)
        columns = item_sql.ITEM_COLUMNS + (", embedding" if with_vector else "")
        with self.db.read() as conn:
            row = (
                conn.cursor(row_factory=dict_row)
                .execute(sql.SQL("SELECT " + columns + " FROM {} WHERE " + where).format(c.table), (value,))
                .fetchone()
            )
        if row is None:
            raise ItemNotFoundError(collection, id if id is not None else str(external_id))
        return item_sql.item_from_row(row)

    def vectors(self, *, collection: str, ids: Sequence[int], using: str | None = None) -> dict[int, np.ndarray]:
        """The stored vectors of ``ids`` (those that have one) in the space ``using`` (default: the
        active one), by id: what a search's hits carry with ``with_vector``, read in one statement
        after the search rather than by every search."""
        c = self.get_collection(name=collection)
        space = c.space(using)
        table = sql.Identifier(space.table_name) if space.side else c.table
        with self.db.read() as conn:
            rows = conn.execute(
                sql.SQL("SELECT id, embedding FROM {} WHERE id = ANY(%s) AND embedding IS NOT NULL").format(table),
                ([int(i) for i in ids],),
            ).fetchall()
        return {int(r[0]): np.asarray(r[1].to_numpy(), dtype=np.float32) for r in rows}

    def list_items(
        self,
        *,
        collection: str,
        after_id: int = 0,
        limit: int = 100,
        external_id: str | None = None,
        status: str | None = None,
        filter: dict[str, Any] | None = None,
        order_by: str | Sequence[str] | None = None,
        order_type: str = "timestamp",
        descending: bool = False,
        after_key: str | None = None,
    ) -> list[Item]:
        """Items in id order, ``limit`` at a time after ``after_id`` (keyset paging), those matching
        ``filter`` (the search filter language) when given; with ``order_by``, in the order of that
        metadata field (``page_items_ordered``), paged by ``after_key``."""
        return self.page_items(
            collection=collection,
            after_id=after_id,
            limit=limit,
            external_id=external_id,
            status=status,
            filter=filter,
            order_by=order_by,
            order_type=order_type,
            descending=descending,
            after_key=after_key,
        )[0]

    def page_items(
        self,
        *,
        collection: str,
        after_id: int = 0,
        limit: int = 100,
        external_id: str | None = None,
        status: str | None = None,
        filter: dict[str, Any] | None = None,
        order_by: str | Sequence[str] | None = None,
        order_type: str = "timestamp",
        descending: bool = False,
        after_key: str | None = None,
    ) -> tuple[list[Item], bool]:
        """``list_items`` and whether more items follow (one row more is read to know, so a last page
        that is exactly full links to no empty page). Runs as a search does (its connection, its
        statement timeout): a filter that matches few items may walk many rows to fill a page.
        With ``order_by`` (or ``after_key``), ``page_items_ordered``'s page: its next ``after_key`` is
        what that method returns."""
        if order_by is not None or after_key is not None:
            if after_id:
                raise InvalidInputError("after pages the listing in id order; an ordered listing pages by its cursor")
            items, cursor = self.page_items_ordered(
                collection=collection,
                order_by=order_by,
                order_type=order_type,
                descending=descending,
                after_key=after_key,
                limit=limit,
                external_id=external_id,
                status=status,
                filter=filter,
            )
            return items, cursor is not None
        c = self.get_collection(name=collection)
        if not 1 <= limit <= MAX_K:
            raise InvalidInputError(f"limit must be between 1 and {MAX_K}, not {limit}")
        where, params = self._item_conditions(external_id=external_id, status=status, filter=filter)
        params.update(after=after_id, limit=limit + 1)
        query = sql.SQL(
            "SELECT " + item_sql.ITEM_COLUMNS + " FROM {t} WHERE id > %(after)s AND {w} ORDER BY id LIMIT %(limit)s"
        ).format(t=c.table, w=where)
        rows = self.db.run_search(lambda conn: conn.cursor(row_factory=dict_row).execute(query, params).fetchall())
        return [item_sql.item_from_row(r) for r in rows[:limit]], len(rows) > limit

    def page_items_ordered(
        self,
        *,
        collection: str,
        order_by: str | Sequence[str] | None,
        order_type: str = "timestamp",
        descending: bool = False,
        after_key: str | None = None,
        limit: int = 100,
        external_id: str | None = None,
        status: str | None = None,
        filter: dict[str, Any] | None = None,
    ) -> tuple[list[Item], str | None]:
        """A page of items in the order of a metadata field and the cursor of the next page (None
        after the last). ``order_by`` is a top-level key or the path to a nested field
        (``["image", "taken_at"]``), read as ``order_type`` (timestamp, number or keyword) with the
        functions filters compare with (``filter_language.typed_expression``), so a typed metadata
        index of that field and type serves the order (an index scan, backward when ``descending``).
        Ties go by id, in the same direction; items whose field is missing or not of that type (a
        list included) come last in either direction, by id. ``after_key`` is the cursor a page
        returned (opaque: the last item's value and id); one that is not, or that belongs to another
        order, is refused (InvalidInputError). Keyset paging: a page reads only its own rows."""
        from memstore.search import filter_language

        if order_by is None:
            raise InvalidInputError("a cursor pages a listing ordered by a metadata field: give order_by")
        c = self.get_collection(name=collection)
        if not 1 <= limit <= MAX_K:
            raise InvalidInputError(f"limit must be between 1 and {MAX_K}, not {limit}")
        path = metadata_indexes.check_field(order_by)
        kind = metadata_indexes.check_type(order_type)
        if not isinstance(descending, bool):
            raise InvalidInputError("descending must be true or false")
        tag = ordering.tag(path, kind, descending)
        where, params = self._item_conditions(external_id=external_id, status=status, filter=filter)
        fields: list[sql.Composable] = []
        for i, key in enumerate(path):
            # As the filter compiler writes a field (a literal, so an index on it matches), except a
            # key holding "%", which psycopg would read as a placeholder in the query's text.
            if "%" in key:
                params[f"order_field_{i}"] = key
                fields.append(sql.Placeholder(f"order_field_{i}"))
            else:
                fields.append(sql.Literal(key))
        typed = filter_language.typed_expression(kind, tuple(fields))
        value, after = (None, None) if after_key is None else ordering.read_cursor(after_key, kind, tag)
        direction = sql.SQL("DESC" if descending else "ASC")
        beyond = sql.SQL("<" if descending else ">")
        params.update(order_id=after, order_value=value, order_limit=limit + 1)
        columns = "SELECT " + item_sql.ITEM_COLUMNS + ", {key} AS order_key FROM {t} WHERE "
        valued: sql.Composed | None = None
        if value is not None or after is None:  # the items that have a value, unless the cursor is past them
            keyset: sql.Composable = sql.SQL("")
            if value is not None:
                # The first bound is the index's to use; the second breaks ties by id.
                keyset = sql.SQL(" AND {v} {at} {bound} AND ({v} {beyond} {bound} OR id {beyond} %(order_id)s)").format(
                    v=typed,
                    at=sql.SQL("<=" if descending else ">="),
                    beyond=beyond,
                    bound=ordering.bound(kind),
                )
            valued = sql.SQL(
                columns + "{v} IS NOT NULL AND {w}{keyset} ORDER BY {v} {d}, id {d} LIMIT %(order_limit)s"
            ).format(key=ordering.text(kind, typed), t=c.table, v=typed, w=where, keyset=keyset, d=direction)
        unvalued = sql.SQL(columns + "{v} IS NULL AND {w}{keyset} ORDER BY id {d} LIMIT %(order_rest)s").format(
            key=sql.SQL("NULL::text"),
            t=c.table,
            v=typed,
            w=where,
            keyset=sql.SQL(" AND id {} %(order_id)s").format(beyond)
            if value is None and after is not None
            else sql.SQL(""),
            d=direction,
        )

        def run(conn: psycopg.Connection[Any]) -> list[dict[str, Any]]:
            cur = conn.cursor(row_factory=dict_row)
            rows = cur.execute(valued, params).fetchall() if valued is not None else []
            if len(rows) <= limit:
                rows += cur.execute(unvalued, {**params, "order_rest": limit + 1 - len(rows)}).fetchall()
            return rows

        rows = self.db.run_search(run)
        keys = [(r.pop("order_key"), int(r["id"])) for r in rows]
        items = [item_sql.item_from_row(r) for r in rows[:limit]]
        cursor = ordering.cursor(keys[limit - 1], tag) if len(rows) > limit else None
        return items, cursor

    def count_items(
        self,
        *,
        collection: str,
        filter: dict[str, Any] | None = None,
        status: str | None = None,
    ) -> int:
        """How many items match ``filter`` (and ``status``): an exact count, run as a search (its
        statement timeout bounds it; ``collection_stats`` gives a collection's size at once)."""
        c = self.get_collection(name=collection)
        where, params = self._item_conditions(external_id=None, status=status, filter=filter)
        query = sql.SQL("SELECT count(*) FROM {t} WHERE {w}").format(t=c.table, w=where)
        row = self.db.run_search(lambda conn: conn.execute(query, params).fetchone())
        return int(row[0]) if row else 0

    @staticmethod
    def _item_conditions(
        *, external_id: str | None, status: str | None, filter: dict[str, Any] | None
    ) -> tuple[sql.Composable, dict[str, Any]]:
        """The WHERE of a listing or a count, with its named parameters."""
        clauses: list[sql.Composable] = []
        params: dict[str, Any] = {}
        if external_id is not None:
            clauses.append(sql.SQL("external_id = %(external_id)s"))
            params["external_id"] = external_id
        if status is not None:
            clauses.append(sql.SQL("status = %(status)s"))
            params["status"] = status
        if filter is not None:
            compiled = compile_filter(filter)
            clauses.append(sql.SQL("({})").format(compiled.where))
            params.update(compiled.params)
        return (sql.SQL(" AND ").join(clauses) if clauses else sql.SQL("TRUE")), params

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
            sets.append("metadata = metadata || %s" if merge_metadata else "metadata = %s")
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
            clause, params = sql.SQL("id = ANY(%(ids)s)"), {"ids": [int(i) for i in ids]}
        else:
            clause, params = sql.SQL("external_id = ANY(%(ids)s)"), {"ids": [str(e) for e in external_ids or ()]}
        # The rows are locked in id order first, as every writer of items and queue rows takes them
        # (a DELETE alone locks in scan order, which could deadlock with an enqueue of the same items).
        statement = sql.SQL(
            "DELETE FROM {t} WHERE id IN (SELECT id FROM {t} WHERE {clause} ORDER BY id FOR UPDATE) RETURNING id"
        ).format(t=c.table, clause=clause)
        with self.db.write() as conn:
            gone = [int(r[0]) for r in conn.execute(statement, params).fetchall()]
            jobs.unqueue(conn, c, gone, deleted=True)  # then their queue rows, in the same transaction
        return len(gone)

    def find_external_ids(self, *, collection: str, external_ids: Sequence[str]) -> dict[str, int]:
        """Which of ``external_ids`` the collection holds, with their ids (resumable uploads ask this)."""
        c = self.get_collection(name=collection)
        with self.db.read() as conn:
            rows = conn.execute(
                sql.SQL("SELECT external_id, id FROM {} WHERE external_id = ANY(%s)").format(c.table),
                ([str(e) for e in external_ids],),
            ).fetchall()
        return {str(e): int(i) for e, i in rows}

    def get_original(self, *, collection: str, id: int) -> Original:
        """The stored original of an item: its bytes or its text (ItemNotFoundError if there is no item)."""
        c = self.get_collection(name=collection)
        with self.db.read() as conn:
            row = conn.execute(
                sql.SQL(
                    "SELECT content, content_type, text, external_id, metadata ->> 'filename' FROM {} WHERE id = %s"
                ).format(c.table),
                (int(id),),
                binary=True,  # the original as its bytes, not as hex (see ingest_worker.Processor._load)
            ).fetchone()
        if row is None:
            raise ItemNotFoundError(collection, id)
        content, ctype, text, external_id, filename = row
        return Original(
            external_id=external_id,
            content=None if content is None else bytes(content),
            content_type=ctype,
            text=text,
            filename=filename,
        )

    def delete_item(self, *, collection: str, id: int | None = None, external_id: str | None = None) -> None:
        where, value = self._item_key(id, external_id)
        n = self.delete_items(
            collection=collection,
            ids=[int(value)] if where.startswith("id") else None,
            external_ids=[str(value)] if where.startswith("external_id") else None,
        )
        if n == 0:
            raise ItemNotFoundError(collection, id if id is not None else str(external_id))

    @staticmethod
    def _item_key(id: int | None, external_id: str | None) -> tuple[str, Any]:
        if (id is None) == (external_id is None):
            raise InvalidInputError("give exactly one of id or external_id")
        if id is not None:
            if not isinstance(id, int) or isinstance(id, bool):
                raise InvalidInputError(f"id must be an integer, not {id!r}")
            return "id = %s", id
        return "external_id = %s", external_id
