"""The store's item reads: one item, its vectors or original, listings (paged, ordered by a metadata
field, filtered) and counts."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from memstore.catalog import metadata_indexes
from memstore.errors import (
    InvalidInputError,
    ItemNotFoundError,
)
from memstore.inputs import MAX_K
from memstore.items import ordering
from memstore.items import writes as item_sql
from memstore.models import Item, Original
from memstore.search.filter_language import compile_filter
from memstore.store.collections import CollectionsPart

# The statuses an item row can have (its table's CHECK, memstore.catalog.tables).
STATUSES = ("pending", "ready", "failed")


class ItemReadsPart(CollectionsPart):
    """Item reads."""

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
        if isinstance(ids, str | bytes):
            raise InvalidInputError("ids must be a list of integers, not a string")
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
        if descending:
            # As the REST API answers it: an ascending id order would pass for the newest-first page asked for.
            raise InvalidInputError("descending orders by order_by; without it a listing is in id order, ascending")
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
            if status not in STATUSES:
                raise InvalidInputError(f"status must be one of {', '.join(STATUSES)}, not {status!r}")
            clauses.append(sql.SQL("status = %(status)s"))
            params["status"] = status
        if filter is not None:
            compiled = compile_filter(filter)
            clauses.append(sql.SQL("({})").format(compiled.where))
            params.update(compiled.params)
        return (sql.SQL(" AND ").join(clauses) if clauses else sql.SQL("TRUE")), params

    def find_external_ids(self, *, collection: str, external_ids: Sequence[str]) -> dict[str, int]:
        """Which of ``external_ids`` the collection holds, with their ids (resumable uploads ask this)."""
        c = self.get_collection(name=collection)
        with self.db.read() as conn:
            rows = conn.execute(
                sql.SQL("SELECT external_id, id FROM {} WHERE external_id = ANY(%s)").format(c.table),
                (storable_external_ids(external_ids),),
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

    @staticmethod
    def _item_key(id: int | None, external_id: str | None) -> tuple[str, Any]:
        if (id is None) == (external_id is None):
            raise InvalidInputError("give exactly one of id or external_id")
        if id is not None:
            if not isinstance(id, int) or isinstance(id, bool):
                raise InvalidInputError(f"id must be an integer, not {id!r}")
            return "id = %s", id
        return "external_id = %s", external_id


def storable_external_ids(external_ids: Iterable[Any]) -> list[str]:
    """The external ids an item could have, of those asked for: one holding a NUL (which no stored
    text can, and which PostgreSQL refuses even in a comparison) names no item, so it is not sent."""
    if isinstance(external_ids, str | bytes):
        # Iterated, it would name one item per character.
        raise InvalidInputError("external_ids must be a list of strings, not a string")
    return [e for e in map(str, external_ids) if "\x00" not in e]
