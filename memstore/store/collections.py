"""The store's collections: creating, changing and dropping them, their keyword and metadata indexes,
their recall target and index representation, and their counts."""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

import psycopg
from psycopg import sql

from memstore.catalog import density, keywords, metadata_indexes, ocr_items, segments
from memstore.catalog import index_spec as compact_spec
from memstore.catalog.collections import (
    RECALL_TARGET,
    Collection,
    validate_collection_params,
    validate_name,
    validate_recall_target,
)
from memstore.catalog.metadata_indexes import MetadataIndex
from memstore.catalog.registry import (
    CACHE_SECONDS,
    clear_option,
    deregister,
    read_collection,
    register,
    registry_schema,
    set_keywords,
    set_option,
)
from memstore.catalog.tables import create_table_statements
from memstore.db import locks
from memstore.errors import (
    ConflictError,
    InvalidInputError,
    NotFoundError,
)
from memstore.items import sealing
from memstore.items import writes as item_sql
from memstore.models import CollectionStats
from memstore.queue import jobs
from memstore.spaces import lifecycle
from memstore.store.base import StoreBase

# Past this many rows an exact count(*) costs tens of ms a call and more, and collections are polled
# (``memstore ingest`` asks twice a second while it waits).
EXACT_COUNT_LIMIT = 100_000


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


class CollectionsPart(StoreBase):
    """Collections and their indexes."""

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
        write_path: str = segments.GRAPH,
    ) -> Collection:
        """A new, empty collection. ``representation`` picks what its HNSW index holds (see
        ``memstore.compact``); ``lowrank`` needs rows to fit on, so it starts with the full index and
        is switched to by ``maintain_compact_index`` once enough vectors are stored. ``ocr``: read the
        text in its images (``memstore.catalog.ocr_items``). ``recall_target``: the recall@k its default
        searches should reach (0 < t < 1): the maintenance worker tunes its ef_search to it.
        ``write_path``: ``graph`` (each row linked into the live graph as it is written) or
        ``segments`` (for streams of upserts: rows go to an exact tail, given graphs at build speed
        in the background; ``memstore.catalog.segments``)."""
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
        if segments.validate_write_path(write_path, partitions=partitions, representation=representation) == (
            segments.SEGMENTS
        ):
            options[segments.WRITE_PATH] = segments.SEGMENTS
            options[segments.LAYOUT] = segments.Layout().to_json()
        if ocr:
            options[ocr_items.OPTION] = True
        if (target := validate_recall_target(recall_target)) is not None:
            options[RECALL_TARGET] = target
        # A graph the user chose is kept; a default one may be made denser for the size (memstore.catalog.density).
        options[density.HNSW_EXPLICIT] = hnsw_m is not None or hnsw_ef_construction is not None
        fields = keywords.check_text_fields(text_fields)  # a str is refused there, not split into letters
        with registry_schema(), self.db.write() as conn:
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
        wanted_fields = None if text_fields is None else keywords.check_text_fields(text_fields)
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

    def drop_collection(self, *, name: str) -> None:
        collection = self.get_collection(name=name, fresh=True)
        with self.db.write() as conn:
            conn.execute("SET LOCAL lock_timeout = '10s'")
            # The table before the registry row: a writer holds the table, then checks its queue
            # row's reference to the registry row; deleting that row first would wait on the
            # writer while the writer waits on it (a deadlock PostgreSQL breaks by failing the drop).
            # A table already gone (dropped by hand) leaves only its registry rows to remove.
            found = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (collection.table_name,)).fetchone()
            if found is not None and found[0]:
                conn.execute(sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(collection.table))
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
            graphs = sealing.graphs_state(conn, c)  # a segmented collection's graphs and tail
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
            extra={"index": spec.to_json(), "ocr_pending": ocr_pending, "segments": graphs},
        )

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

    def seal(self, *, collection: str, merge: bool = False, wait_s: float = 300.0) -> list[dict[str, Any]]:
        """Give a segmented collection's tail a graph now, whatever its size, so every row is in a
        graph when this returns (a stream's writer calls it at the end); ``merge``: then merge every
        graph into one. Waits up to ``wait_s`` for a seal under way elsewhere. What was done, as the
        status shows it (nothing for a collection whose rows are all in graphs already)."""
        c = self.get_collection(name=collection, fresh=True)
        if not segments.segmented(c):
            raise InvalidInputError(f"collection {collection!r} is not written as segments (write_path 'graph')")
        try:
            done = self.sealer.seal_now(c, merge_all=merge, wait_s=wait_s)
        except sealing.SealBusyError as exc:
            raise ConflictError(f"{exc}; try again when it is done") from None
        self.forget_collection(collection)
        return [d.as_json() for d in done]

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
        if segments.segmented(self.get_collection(name=collection, fresh=True)):
            raise InvalidInputError(f"collection {collection!r} is written as segments, whose graphs keep full vectors")
        from memstore.compact.switch import DEFAULT_GRACE_S, set_representation

        spec = set_representation(
            self.db,
            collection=collection,
            representation=representation,
            rank=rank,
            pool_factor=pool_factor,
            refit=refit,
            grace_s=DEFAULT_GRACE_S if grace_s is None else grace_s,
        )
        self.forget_collection(collection)
        return spec
