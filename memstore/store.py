"""The vector store: collections, items and search over PostgreSQL + pgvector.

Every public method is keyword-only and raises memstore's own errors (``memstore.errors``); bad input
is refused before anything is written. The REST API, the ingest workers and maintenance all use it.
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence, Sized
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import replace
from functools import partial
from typing import Any, NamedTuple

import numpy as np
import psycopg
import sqlalchemy as sa
from psycopg import sql
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from tqdm import tqdm

from memstore.catalog import index_spec as compact_spec
from memstore.catalog import keywords, metadata_indexes, ocr_items
from memstore.catalog.collections import (
    RECALL_TARGET,
    Collection,
    Space,
    create_table_statements,
    validate_collection_params,
    validate_name,
    validate_recall_target,
)
from memstore.catalog.metadata_indexes import MetadataIndex
from memstore.catalog.registry import (
    CACHE_SECONDS,
    Registry,
    clear_option,
    deregister,
    read_collection,
    register,
    set_keywords,
    set_option,
)
from memstore.compact import search as compact_search
from memstore.db import locks, online_ddl
from memstore.db.core import Database, as_database
from memstore.errors import (
    CollectionNotFoundError,
    ConflictError,
    InvalidInputError,
    ItemNotFoundError,
    NotFoundError,
    SpaceNotFoundError,
)
from memstore.inputs import check_external_id, check_item_text, check_metadata
from memstore.items import bulk_load, ordering
from memstore.items import writes as item_sql
from memstore.items.vectors import as_matrix, as_vector
from memstore.models import CollectionStats, DuplicatePair, Item, ItemIn, Original, SearchResult, UpsertResult
from memstore.queue import jobs
from memstore.search import request, statements
from memstore.search.filter_language import CompiledFilter, compile_filter
from memstore.search.request import MAX_K, SearchQuery, Weights, check_query
from memstore.search.statements import SearchSettings
from memstore.settings import Settings, get_settings
from memstore.spaces import lifecycle

# Above this many items an upsert goes through COPY ... FORMAT BINARY into a staging table.
COPY_THRESHOLD = 32


def _check_k(k: int) -> int:
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= MAX_K:
        raise InvalidInputError(f"k must be an integer between 1 and {MAX_K}, not {k!r}")
    return k


def _check_external_id(value: Any) -> str:
    return uuid.uuid4().hex if value is None else check_external_id(value)


# Past this many rows an exact count(*) costs tens of ms a call and more, and collections are polled
# (``memstore ingest`` asks twice a second while it waits).
EXACT_COUNT_LIMIT = 100_000


class VectorStore:
    """Collections and their items in one PostgreSQL database, reached through ``engine``."""

    def __init__(self, engine: sa.Engine | Database, *, settings: Settings | None = None) -> None:
        self.db = as_database(engine)
        self.engine = self.db.engine
        self.settings = settings or get_settings()
        self.registry = Registry(self.engine)
        self._second_walks = 0
        self._second_walks_lock = threading.Lock()

    # ------------------------------------------------------------------ collections

    def create_collection(
        self,
        *,
        name: str,
        dimensions: int,
        metric: str = "cosine",
        hnsw_m: int | None = None,
        hnsw_ef_construction: int | None = None,
        ef_search: int | None = None,
        partitions: int = 1,
        model: str | None = None,
        representation: str = "full",
        rank: int | None = None,
        pool_factor: float | None = None,
        language: str = keywords.DEFAULT_LANGUAGE,
        text_fields: Sequence[str] = (),
        ocr: bool = False,
        recall_target: float | None = None,
    ) -> Collection:
        """A new, empty collection. ``representation`` picks what its HNSW index holds (see
        ``memstore.compact``); ``lowrank`` needs rows to fit on, so it starts with the full index and
        is switched to by ``maintain_compact_index`` once enough vectors are stored. ``ocr``: read the
        text in its images (``memstore.catalog.ocr_items``). ``recall_target``: the recall@k its default
        searches should reach (0 < t < 1): the maintenance worker tunes its ef_search to it."""
        validate_name(name)
        s = self.settings
        m = hnsw_m if hnsw_m is not None else s.default_hnsw_m
        efc = hnsw_ef_construction if hnsw_ef_construction is not None else s.default_hnsw_ef_construction
        efs = ef_search if ef_search is not None else s.default_ef_search
        validate_collection_params(
            dimensions=dimensions,
            metric=metric,
            hnsw_m=m,
            hnsw_ef_construction=efc,
            ef_search=efs,
            partitions=partitions,
        )
        compact_spec.validate_choice(
            representation=representation, dimensions=dimensions, rank=rank, pool_factor=pool_factor
        )
        if representation == "lowrank":
            index = compact_spec.IndexSpec(
                pending={"representation": "lowrank", "rank": rank, "pool_factor": pool_factor}
            )
        else:
            index = compact_spec.IndexSpec(representation=representation, pool_factor=pool_factor)
        options: dict[str, Any] = {compact_spec.OPTIONS_KEY: index.to_json()}
        if ocr:
            options[ocr_items.OPTION] = True
        if (target := validate_recall_target(recall_target)) is not None:
            options[RECALL_TARGET] = target
        fields = keywords.check_text_fields(list(text_fields))
        with self.db.write() as conn:
            keywords.check_language(conn, language)
            collection = register(
                conn,
                name=name,
                dimensions=dimensions,
                metric=metric,
                hnsw_m=m,
                hnsw_ef_construction=efc,
                default_ef_search=efs,
                partitions=partitions,
                model=model,
                options=options,
                language=language,
                text_fields=fields,
            )
            for statement in create_table_statements(collection):
                conn.execute(statement)
        return self.get_collection(name=name, fresh=True)

    # ------------------------------------------------------------------ spaces (memstore.spaces.lifecycle)

    def create_space(
        self,
        *,
        collection: str,
        name: str,
        model: str,
        dimensions: int,
        pretrained: str | None = None,
        metric: str | None = None,
        hnsw_m: int | None = None,
        hnsw_ef_construction: int | None = None,
        ef_search: int | None = None,
    ) -> Space:
        """A new embedding space of the collection, filled in the background from the stored originals
        by ingest workers that run ``model`` (its progress: ``space_progress``)."""
        c = self.get_collection(name=collection, fresh=True)
        with self._ddl_connection("memstore-spaces") as conn:
            space = lifecycle.create(
                conn,
                c,
                name=name,
                model=model,
                pretrained=pretrained,
                dimensions=dimensions,
                metric=metric,
                hnsw_m=hnsw_m,
                hnsw_ef_construction=hnsw_ef_construction,
                ef_search=ef_search,
            )
        self.forget_collection(collection)
        return space

    def space_progress(self, *, collection: str, name: str | None = None) -> lifecycle.Progress:
        """How far a space is filled (default: the active space)."""
        c = self.get_collection(name=collection, fresh=True)
        with self.db.write() as conn:  # the primary's counts: a replica may lag the queue
            return lifecycle.progress(conn, c, c.space(name))

    def activate_space(self, *, collection: str, name: str, force: bool = False) -> Collection:
        """Make ``name`` the space searches use when they name none (``lifecycle.activate`` says when it
        is refused); this process sees it at once, others within the registry's cache time."""
        c = self.get_collection(name=collection, fresh=True)
        with self.db.write() as conn:
            lifecycle.activate(conn, c, name, force=force)
        self.forget_collection(collection)
        return self.get_collection(name=collection, fresh=True)

    def delete_space(self, *, collection: str, name: str) -> None:
        """Drop a space searches do not use, with its vectors and index."""
        c = self.get_collection(name=collection, fresh=True)
        with self._ddl_connection("memstore-spaces") as conn:
            lifecycle.delete(conn, c, name)
        self.forget_collection(collection)

    def put_space_vectors(self, *, collection: str, name: str, vectors: dict[str, Any]) -> int:
        """Write vectors into a side space by external id (items stored without an original need this
        before the space can be activated); returns how many were written."""
        c = self.get_collection(name=collection, fresh=True)
        space = c.space(name)
        checked = {
            eid: as_vector(v, dimensions=space.dimensions, metric=space.metric, where=f"vectors[{eid!r}]")
            for eid, v in vectors.items()
        }
        ids = self.find_external_ids(collection=collection, external_ids=list(checked))
        missing = [eid for eid in checked if eid not in ids]
        if missing:
            raise ItemNotFoundError(collection, missing[0])
        with self.db.write() as conn:
            return lifecycle.put_vectors(conn, c, space, {ids[eid]: v for eid, v in checked.items()})

    def list_collections(self) -> list[Collection]:
        return self.registry.all()

    def get_collection(self, *, name: str, fresh: bool = False) -> Collection:
        return self.registry.get(name, fresh=fresh)

    def set_keywords(
        self,
        *,
        collection: str,
        language: str | None = None,
        text_fields: Sequence[str] | None = None,
        grace_s: float = CACHE_SECONDS + 1.0,
        ocr: bool | None = None,
    ) -> Collection:
        """Change the collection's text-search configuration or keyword fields, or turn the reading of
        text in its images on or off (``ocr``: part of its keywords, ``memstore.catalog.ocr_items``), online:
        searches go on while its keyword index is rebuilt (``memstore.catalog.keywords.change``); returns the
        collection."""
        wanted_fields = None if text_fields is None else keywords.check_text_fields(list(text_fields))
        c = self.get_collection(name=collection, fresh=True)
        busy = partial(ConflictError, f"another process is changing the indexes of collection {c.name!r}")
        with (
            self._ddl_connection("memstore-keywords") as conn,
            locks.session_lock(conn, locks.collection_key(c.id), busy=busy),
        ):
            c = read_collection(conn, id=c.id)  # afresh, under the lock: no other change is under way
            self._recover_keywords(conn, c)
            chosen = c.language if language is None else keywords.check_language(conn, language)
            fields = c.text_fields if wanted_fields is None else wanted_fields
            reads = c.ocr if ocr is None else ocr
            if (chosen, fields, reads) == (c.language, c.text_fields, c.ocr):
                return c
            set_option(conn, c, keywords.PENDING, {"language": chosen, "text_fields": list(fields), "ocr": reads})
            if reads and not c.ocr:
                ocr_items.install_trigger(conn, c)  # before the backfill starts: no new image is missed

            def record(version: int) -> Collection:
                with conn.transaction():
                    changed = set_keywords(conn, c, language=chosen, text_fields=fields)
                    changed = set_option(conn, changed, keywords.VERSION, version)
                    if reads != c.ocr:
                        changed = ocr_items.record(conn, changed, reads)
                self.forget_collection(collection)
                return changed

            keywords.change(conn, c, language=chosen, text_fields=fields, ocr=reads, record=record, grace_s=grace_s)
            set_option(conn, c, keywords.PENDING, None)
        return self.get_collection(name=collection, fresh=True)

    @staticmethod
    def _recover_keywords(conn: psycopg.Connection[Any], c: Collection) -> None:
        """A keyword change that stopped half way: the version the registry does not name dropped
        (the old one when the change was recorded, the new one when it was not)."""
        keywords.drop_other_versions(conn, c)
        if c.options.get(keywords.PENDING):
            set_option(conn, c, keywords.PENDING, None)

    # ------------------------------------------------------------------ typed metadata indexes

    def create_metadata_index(self, *, collection: str, field: str | list[str], type: str) -> MetadataIndex:
        """A B-tree index on a metadata field read as ``number``, ``timestamp`` or ``keyword``, built
        online (``CREATE INDEX CONCURRENTLY``); range and equality filters on it then use it."""
        c = self.get_collection(name=collection)
        with self._ddl_connection("memstore-indexes") as conn:
            return metadata_indexes.create(conn, c, field, type)

    def list_metadata_indexes(self, *, collection: str) -> list[MetadataIndex]:
        c = self.get_collection(name=collection)
        with self.db.read() as conn:
            return metadata_indexes.list(conn, c)

    def drop_metadata_index(self, *, collection: str, name: str) -> MetadataIndex:
        """Drop the typed index called ``name`` (as listed); ItemNotFoundError-like NotFoundError when
        the collection has none by that name."""
        c = self.get_collection(name=collection)
        with self._ddl_connection("memstore-indexes") as conn:
            found = [i for i in metadata_indexes.list(conn, c) if i.name == name]
            if not found:
                raise NotFoundError(f"collection {collection!r} has no metadata index {name!r}")
            metadata_indexes.drop(conn, c, found[0].field, found[0].type)
        return found[0]

    @contextmanager
    def _ddl_connection(self, application_name: str) -> Iterator[psycopg.Connection[Any]]:
        """An autocommit connection of its own, with the short lock wait online DDL is written for."""
        with self.db.dedicated(application_name=application_name) as conn:
            online_ddl.set_lock_timeout(conn)
            yield conn

    def drop_collection(self, *, name: str) -> None:
        collection = self.get_collection(name=name, fresh=True)
        with self.db.write() as conn:
            conn.execute("SET LOCAL lock_timeout = '10s'")
            deregister(conn, collection)
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {} CASCADE").format(collection.table))
            # Low-rank side tables (their triggers went with the table; registry rows cascade).
            for (side,) in conn.execute(
                "SELECT relname FROM pg_class WHERE relkind = 'r' AND starts_with(relname, %s)",
                (f"memstore_lr_c{collection.id}_v",),
            ).fetchall():
                conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(side)))
            for statement in lifecycle.drop_statements(collection):  # their registry rows cascade too
                conn.execute(statement)
            for statement in keywords.drop_statements(conn, collection):  # their triggers went with the table
                conn.execute(statement)
        self.forget_collection(name)

    def collection_stats(self, *, name: str, exact_limit: int = EXACT_COUNT_LIMIT) -> CollectionStats:
        """Item counts and sizes. Items (and so ready) are counted exactly up to about ``exact_limit``
        rows and estimated past that (``counts_exact``); pending and failed are always exact."""
        c = self.get_collection(name=name)
        spec = compact_spec.index_spec(c)
        tables = c.partition_tables()
        if spec.representation == "lowrank" and spec.version is not None:
            tables = [*tables, compact_spec.side_table(c.id, spec.version)]
        with self.db.read() as conn:
            by_status = jobs.counts(conn, c)  # no scan of the items
            items, exact = _count_items(conn, c, exact_limit)
            sizes = conn.execute(item_sql.SIZES_SQL, (tables,)).fetchone()
            ocr_pending = ocr_items.pending_count(conn, c) if c.ocr else None  # through its partial index
        pending, failed = by_status["pending"], by_status["failed"]
        assert sizes is not None
        return CollectionStats(
            collection=c,
            items=items,
            ready=max(0, items - pending - failed),
            pending=pending,
            failed=failed,
            table_bytes=int(sizes[0] or 0),
            index_bytes=int(sizes[1] or 0),
            counts_exact=exact,
            extra={"index": spec.to_json(), "ocr_pending": ocr_pending},
        )

    def _collection_for_write(self, name: str) -> Collection:
        return self.get_collection(name=name)

    # ------------------------------------------------------------------ items

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

    # ------------------------------------------------------------------ search

    def search(
        self,
        *,
        collection: str,
        vector: Any = None,
        text: str | None = None,
        mode: str | None = None,
        k: int = 10,
        filter: dict[str, Any] | None = None,
        ef_search: int | None = None,
        exact: bool = False,
        pool: int | None = None,
        offset: int = 0,
        candidates: int | None = None,
        weights: Weights | dict[str, float] | None = None,
        score_threshold: float | None = None,
        using: str | None = None,
    ) -> list[SearchResult]:
        """The ``k`` best items for a vector, a text or both, best first (``memstore.search.request``).

        ``mode``: ``vector`` (the nearest to ``vector``), ``keyword`` (the best matches of ``text``'s
        words) or ``hybrid`` (both lists fused); by default hybrid when both are given, else vector.
        ``filter`` keeps the items whose metadata contains it, in every mode. The HNSW index answers
        unless ``exact``; with ``hnsw.iterative_scan`` a filtered search keeps scanning until it has
        enough rows (or has visited ``max_scan_tuples``). ``exact`` is the brute-force ground truth. On
        a compact index (``memstore.compact``) the index gives ``pool`` candidates (default: the
        collection's pool factor times k) and they are re-ranked exactly. ``offset`` skips the first
        hits (offset + k at most 1,000); ``candidates``: how deep each list of a hybrid search goes
        (default max(50, 4 x (offset + k))); ``weights``: each list's weight in the fusion;
        ``score_threshold``: leave out hits scoring lower. ``using``: the embedding space searched
        (``memstore.spaces.lifecycle``; default: the collection's active space).
        """
        q = check_query(
            mode=mode,
            vector=vector,
            text=text,
            k=k,
            filter=filter,
            offset=offset,
            candidates=candidates,
            weights=weights,
            score_threshold=score_threshold,
            pool=pool,
            using=using,
        )
        return self.run_search(collection=collection, query=q, ef_search=ef_search, exact=exact)

    def search_groups(
        self, *, collection: str, group_by: str, group_size: int = 1, groups: int = 10, **search: Any
    ) -> list[list[SearchResult]]:
        """The best ``group_size`` hits of each of the best ``groups`` groups (items sharing the value
        of the metadata field ``group_by``: the best photos per album, passages per document), groups in
        the order of their best hit. ``search`` takes ``search``'s other arguments (not k or offset)."""
        if not 1 <= group_size <= request.MAX_GROUP_SIZE:
            raise InvalidInputError(f"group_size must be between 1 and {request.MAX_GROUP_SIZE}")
        window = request.group_window(groups, group_size)
        hits = self.search(collection=collection, k=window, **search)
        return request.grouped(hits, group_by, groups, group_size, metadata=lambda h: h.metadata)

    def duplicates(
        self,
        *,
        collection: str,
        threshold: float,
        after_id: int = 0,
        scan: int = 500,
        per_item: int = 5,
    ) -> tuple[list[DuplicatePair], int | None]:
        """Near-duplicate pairs, a page at a time: the ``scan`` items after ``after_id`` (by id) are
        each searched for their ``per_item`` nearest within ``threshold`` (the metric's distance;
        cosine: 1 - similarity). Returns the pairs, closest first, and the id to go on after (None at
        the end). Approximate, as every index search is; bounded, so a large collection is walked
        page by page rather than compared all at once."""
        c = self.get_collection(name=collection)
        if isinstance(threshold, bool) or not isinstance(threshold, int | float) or not 0 <= threshold < 1e30:
            raise InvalidInputError(f"threshold must be a non-negative distance, not {threshold!r}")
        request.check_count("scan", scan, 1, 5000)
        request.check_count("per_item", per_item, 1, 100)
        request.check_count("after_id", after_id, 0, 2**63 - 1)
        with self.db.read() as conn:
            ids = [
                int(r[0])
                for r in conn.execute(
                    sql.SQL("SELECT id FROM {} WHERE id > %s AND embedding IS NOT NULL ORDER BY id LIMIT %s").format(
                        c.table
                    ),
                    (after_id, scan),
                )
            ]
            settings = SearchSettings(
                ef_search=max(c.default_ef_search, per_item), exact=False, max_scan_tuples=self.settings.max_scan_tuples
            )
            params = {"ids": ids, "per": per_item + 1, "threshold": float(threshold)}  # + 1: the item itself
            rows = statements.run_search(conn, settings, statements.duplicates_statement(c), params) if ids else []
        pairs = [DuplicatePair(int(r[0]), r[1], int(r[2]), r[3], float(r[4])) for r in rows]
        return pairs, (ids[-1] if len(ids) == scan else None)

    def recommend(
        self,
        *,
        collection: str,
        positive: Sequence[int | Any],
        negative: Sequence[int | Any] = (),
        k: int = 10,
        filter: dict[str, Any] | None = None,
        ef_search: int | None = None,
        exact: bool = False,
    ) -> list[SearchResult]:
        """Items like the ``positive`` examples and unlike the ``negative`` ones: each example a stored
        item's id or a vector (``request.recommendation`` says how they combine). The example
        items themselves are not answered. Examples and the search are in the collection's active space."""
        c = self.get_collection(name=collection)
        space = c.space()
        ids = [e for e in [*positive, *negative] if isinstance(e, int) and not isinstance(e, bool)]
        stored = self.vectors(collection=collection, ids=ids) if ids else {}
        missing = [i for i in ids if i not in stored]
        if missing:
            raise NotFoundError(
                f"item {missing[0]} of collection {collection!r} has no vector: it does not exist or is not ready yet"
            )

        def vector_of(example: int | Any, where: str) -> np.ndarray:
            if isinstance(example, int) and not isinstance(example, bool):
                return stored[example]
            return as_vector(example, dimensions=space.dimensions, metric=space.metric, where=where)

        target = request.recommendation(
            [vector_of(e, f"positive[{i}]") for i, e in enumerate(positive)],
            [vector_of(e, f"negative[{i}]") for i, e in enumerate(negative)],
            space.metric,
        )
        examples = set(ids)
        hits = self.search(
            collection=collection,
            vector=target,
            k=min(MAX_K, k + len(examples)),
            filter=filter,
            ef_search=ef_search,
            exact=exact,
        )
        kept = [h for h in hits if h.id not in examples][:k]
        return [replace(h, vector_rank=rank) for rank, h in enumerate(kept, start=1)]

    def run_search(
        self, *, collection: str, query: SearchQuery, ef_search: int | None = None, exact: bool = False
    ) -> list[SearchResult]:
        """A search whose arguments ``request.check_query`` has checked (the API checks them before
        it spends time embedding the query)."""
        q = query
        for attempt in range(2):
            # A switch of representation may drop what a cached collection row still names: the
            # second attempt reads the registry afresh.
            c = self.get_collection(name=collection, fresh=attempt > 0)
            try:
                # On a search connection (a replica's when there are some); run once more on another
                # when the connection fails under it.
                rows = self.db.run_search(partial(self._search_rows, c, q, ef_search, exact))
                break
            except SpaceNotFoundError:
                # A space made or dropped by another process within the registry's cache time.
                self.forget_collection(collection)
                if attempt:
                    raise
            except (psycopg.errors.UndefinedTable, LookupError):
                self.forget_collection(collection)
                if attempt:
                    raise CollectionNotFoundError(collection) from None
        return request.results(c, q, rows)

    def _search_rows(
        self, c: Collection, q: SearchQuery, ef_search: int | None, exact: bool, conn: psycopg.Connection[Any]
    ) -> list[tuple[Any, ...]]:
        plan = self.plan(c, q, ef_search=ef_search, exact=exact, conn=conn)
        rows = statements.run_search(conn, plan.settings, plan.statement, plan.params, prepare=plan.prepare)
        again = plan.second_walk(rows)
        if again is not None:
            self.count_second_walk()
            rows = statements.run_search(conn, again, plan.statement, plan.params, prepare=plan.prepare)
        return rows

    @property
    def second_walks(self) -> int:
        """How many searches through this store ran a second time with pgvector's iterative scan
        because one walk of the graph came back short (``SearchPlan.second_walk``). A rising rate means rows
        deleted or replaced since the last vacuum crowd the graph where searches look, or searches ask
        small collections for more rows than they hold; each such search costs two round trips."""
        return self._second_walks

    def count_second_walk(self) -> None:
        with self._second_walks_lock:  # searches run on many threads; += alone could lose counts
            self._second_walks += 1

    def plan(
        self,
        c: Collection,
        q: SearchQuery,
        *,
        ef_search: int | None,
        exact: bool,
        conn: psycopg.Connection[Any] | None = None,
    ) -> SearchPlan:
        """The statement, settings and parameters of one search. ``conn`` (where the search will run)
        is needed on a compact index only, to project the query vector."""
        where = q.filter.where if q.filter else None
        if q.mode == "keyword":
            params: dict[str, Any] = {
                "text": q.text,
                "k": q.k,
                "offset": q.offset,
                **(q.filter.params if q.filter else {}),
            }
            settings = SearchSettings(
                ef_search=_ef_search(c, ef_search), exact=exact, max_scan_tuples=self.settings.max_scan_tuples
            )
            assert q.text is not None
            statement = statements.keyword_statement(c, q.text, where=where)
            return SearchPlan(statement, settings, params, prepare=False if where is not None else None)
        # The vector list: as long as the answer in a vector search, the candidates in a hybrid one.
        depth = q.window if q.mode == "vector" else q.candidates
        nearest = self._vector_plan(c, q, depth, ef_search=ef_search, exact=exact, conn=conn)
        if q.mode == "vector":
            return nearest
        params = {
            **nearest.params,
            "text": q.text,
            "hits": q.k,
            "offset": q.offset,
            "wv": q.weights.vector,
            "wk": q.weights.keyword,
        }
        assert q.text is not None
        statement = statements.hybrid_statement(
            c, q.text, nearest=nearest.statement, where=where, space=c.space(q.using)
        )
        return SearchPlan(statement, nearest.settings, params, prepare=False if where is not None else None)

    def _vector_plan(
        self,
        c: Collection,
        q: SearchQuery,
        depth: int,
        *,
        ef_search: int | None,
        exact: bool,
        conn: psycopg.Connection[Any] | None,
    ) -> SearchPlan:
        """The ``depth`` nearest rows to the query vector, on whatever the searched space's index holds."""
        space = c.space(q.using)
        efs = _ef_search(space, ef_search)
        if q.mode == "hybrid":
            # The graph search must reach as deep as the list it feeds into the fusion.
            efs = min(1000, max(efs, depth))
        if space.side:
            return SearchPlan(
                statements.space_search_statement(c, space, exact=exact, where=q.filter.where if q.filter else None),
                SearchSettings(ef_search=efs, exact=exact, max_scan_tuples=self.settings.max_scan_tuples),
                _search_params(space, q.vector, depth, q.filter),
            )
        spec = compact_spec.index_spec(c)
        if spec.compact and not exact:
            if conn is None:
                raise ValueError("a search on a compact index is planned on its connection")
            params = _search_params(c, q.vector, depth, q.filter)
            params["pool"] = spec.pool(depth, q.pool)
            params["c"] = compact_search.compact_query(conn, spec, params["q"])
            statement = compact_search.statement(c, spec, where=q.filter.where if q.filter else None)
            settings = compact_search.settings(
                ef_search=min(1000, max(efs, params["pool"])), max_scan_tuples=self.settings.max_scan_tuples
            )
            return SearchPlan(statement, settings, params)
        return self.plain_search(
            c, vector=q.vector, k=depth, filter=q.filter, ef_search=efs, exact=exact, alone=q.mode == "vector"
        )

    def plain_search(
        self,
        c: Collection,
        *,
        vector: Any,
        k: int,
        filter: CompiledFilter | None,
        ef_search: int | None,
        exact: bool,
        alone: bool = False,
    ) -> SearchPlan:
        """The statement, settings and parameters of a search on the full-precision index (or exact).

        Without a filter, ``k`` is written into the statement and it runs prepared, on the generic
        plan PostgreSQL keeps for it; a filtered one is planned with its values every time
        (``memstore.search.statements``).

        ``alone``: the statement's rows are the whole answer (not one list of a hybrid search). Then an
        unfiltered index search of an unpartitioned collection whose ``k`` rows (offset included) fit
        in the ``ef_search`` candidates of one graph walk runs without pgvector's iterative scan. Only
        rows the search cannot see (deleted or replaced and not vacuumed yet, not committed) can leave
        it short, or a collection with fewer than ``k`` rows with vectors; the plan's ``fallback``
        runs it again with the scan then (``SearchPlan.second_walk``). A partitioned collection keeps the
        scan: the merge of its partitions' walks would fill a short walk's place with another
        partition's farther rows, and the answer would come back complete but worse."""
        efs, scan_limit = _ef_search(c, ef_search), self.settings.max_scan_tuples
        walk_once = alone and filter is None and not exact and k <= efs and c.partitions == 1
        settings = statements.search_settings(
            ef_search=efs, exact=exact, max_scan_tuples=scan_limit, iterative=not walk_once
        )
        return SearchPlan(
            statements.search_statement(
                c.table_name,
                c.spec.operator,
                exact=exact,
                where=filter.where if filter else None,
                limit=None if filter else k,
            ),
            settings,
            _search_params(c, vector, k, filter),
            prepare=filter is None,
            fallback=statements.search_settings(ef_search=efs, exact=False, max_scan_tuples=scan_limit)
            if walk_once
            else None,
            wanted=k,
        )

    def cached_collection(self, name: str) -> Collection | None:
        """The collection's registry row if this store read it recently, without touching the database."""
        return self.registry.cached(name)

    def forget_collection(self, name: str) -> None:
        """Drop a cached registry row (dropped, switched, or its table turned out to be gone)."""
        self.registry.forget(name)

    def set_recall_target(self, *, collection: str, target: float | None) -> Collection:
        """The recall@k the collection's default searches should reach (0 < target < 1; None: off, the
        ef_search stays where the last tuning left it). The maintenance worker's next pass that
        measures recall sets its ef_search (docs/maintenance.md, "Recall target")."""
        checked = validate_recall_target(target)
        c = self.get_collection(name=collection, fresh=True)
        with self.db.write() as conn:
            c = read_collection(conn, id=c.id)
            if checked is None:
                clear_option(conn, c, RECALL_TARGET)
            else:
                set_option(conn, c, RECALL_TARGET, checked)
        self.forget_collection(collection)
        return self.get_collection(name=collection, fresh=True)

    def set_index_representation(
        self,
        *,
        collection: str,
        representation: str,
        rank: int | None = None,
        pool_factor: float | None = None,
        refit: bool = False,
        grace_s: float | None = None,
    ) -> compact_spec.IndexSpec:
        """Switch the collection's HNSW index to another representation online (see ``memstore.compact``)."""
        from memstore.compact.switch import DEFAULT_GRACE_S, set_representation

        spec = set_representation(
            self.engine,
            collection=collection,
            representation=representation,
            rank=rank,
            pool_factor=pool_factor,
            refit=refit,
            grace_s=DEFAULT_GRACE_S if grace_s is None else grace_s,
        )
        self.forget_collection(collection)
        return spec


class SearchPlan(NamedTuple):
    """What one search runs (a tuple: every search builds one, and a frozen dataclass cost more)."""

    statement: statements.Statement
    settings: SearchSettings
    params: dict[str, Any]
    # How psycopg runs the statement (``statements.run_search``): True prepared (a generic plan kept),
    # False planned with its values each time, None psycopg's default.
    prepare: bool | None = None
    # The settings to run the statement again with when it answers fewer than ``wanted`` rows (a
    # search without pgvector's iterative scan, whose candidates dead tuples may thin out); None: one run.
    fallback: SearchSettings | None = None
    wanted: int = 0

    def second_walk(self, rows: list[Any]) -> SearchSettings | None:
        """The fallback when ``rows`` call for it (fewer than asked, from a scan that stopped early),
        else None. A collection with fewer rows than asked is searched twice (both walks are short)."""
        return self.fallback if len(rows) < self.wanted else None


def _count_items(conn: psycopg.Connection[Any], c: Collection, exact_limit: int) -> tuple[int, bool]:
    """(items, exact): counted up to about ``exact_limit`` rows, past that the planner's estimate
    (kept current by autovacuum's ANALYZE), so that a poll of a large collection does not scan it."""
    row = conn.execute(
        "SELECT coalesce(sum(greatest(reltuples, 0)), 0)::bigint, coalesce(bool_or(reltuples < 0), true) "
        "FROM pg_class WHERE oid = ANY(%s::regclass[])",
        (c.partition_tables(),),
    ).fetchone()
    assert row is not None
    estimate, never_analyzed = int(row[0]), bool(row[1])
    if never_analyzed or estimate <= exact_limit:
        counted = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(c.table)).fetchone()
        assert counted is not None
        return int(counted[0]), True
    return estimate, False


def _search_params(c: Collection | Space, vector: Any, k: int, filter: CompiledFilter | None) -> dict[str, Any]:
    """The query vector (checked against the collection or space searched), k and the filter's values,
    as every search binds them."""
    params: dict[str, Any] = {"q": as_vector(vector, dimensions=c.dimensions, metric=c.metric), "k": k}
    if filter:
        params.update(filter.params)
    return params


def _ef_search(c: Collection | Space, ef_search: int | None) -> int:
    efs = c.default_ef_search if ef_search is None else ef_search
    if not isinstance(efs, int) or isinstance(efs, bool) or not 1 <= efs <= 1000:
        raise InvalidInputError(f"ef_search must be an integer between 1 and 1000, not {efs!r}")
    return efs


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
