"""The collection registry: the one reader of ``memstore_collections`` and the one cache of its rows.

Every process keeps a registry row for at most ``CACHE_SECONDS`` (a segmented collection's, whose
layout changes with each seal, for ``LAYOUT_CACHE_SECONDS``); a process forgets a row at once
when it changes or drops the collection itself. Another process's change (a representation switch,
a drop) therefore reaches every process within ``CACHE_SECONDS``, which is what the compact switch's
grace period waits for (``memstore.compact.switch.DEFAULT_GRACE_S``).

``read_collection`` and ``read_collections`` read on a connection the caller holds (inside its
transaction, or a maintenance session); ``Registry`` reads through the ``Database`` (on the primary) and caches.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from memstore.catalog import segments
from memstore.catalog.collections import Collection, validate_name
from memstore.db.core import Database
from memstore.errors import CollectionExistsError, CollectionNotFoundError, SchemaNotReadyError

# How long a process trusts its cached copy of a collection's registry row.
CACHE_SECONDS = 5.0
# The same for a segmented collection (``memstore.catalog.segments``), whose row changes with every
# seal: a process still on an older layout reads the rows sealed since exactly (right, but a stream
# of 3,500 rows/s grows that read by 17,500 rows in 5 s). One row read twice a second per process.
LAYOUT_CACHE_SECONDS = 0.5
COLUMNS = (
    "id, name, table_name, dimensions, metric, hnsw_m, hnsw_ef_construction, default_ef_search, "
    "partitions, model, options, created_at, language, text_fields, "
    # Every space besides the default one (memstore.spaces.lifecycle), read with the row so a cached row and its
    # spaces are always of one moment.
    "(SELECT coalesce(jsonb_agg(to_jsonb(s) ORDER BY s.id), '[]') FROM memstore_spaces s "
    "WHERE s.collection_id = memstore_collections.id) AS spaces"
)
_SELECT = sql.SQL("SELECT " + COLUMNS + " FROM memstore_collections")


def read_collection(conn: psycopg.Connection[Any], *, name: str | None = None, id: int | None = None) -> Collection:
    """One collection by name or id, on ``conn``; CollectionNotFoundError when there is none."""
    if (name is None) == (id is None):
        raise ValueError("give exactly one of name or id")
    where = sql.SQL(" WHERE name = %s") if name is not None else sql.SQL(" WHERE id = %s")
    row = conn.cursor(row_factory=dict_row).execute(_SELECT + where, (name if name is not None else id,)).fetchone()
    if row is None:
        raise CollectionNotFoundError(name if name is not None else f"#{id}")
    return Collection(**row)


def read_collections(conn: psycopg.Connection[Any]) -> list[Collection]:
    """Every registered collection, by name, on ``conn``."""
    rows = conn.cursor(row_factory=dict_row).execute(_SELECT + sql.SQL(" ORDER BY name")).fetchall()
    return [Collection(**r) for r in rows]


def register(
    conn: psycopg.Connection[Any],
    *,
    name: str,
    dimensions: int,
    metric: str,
    hnsw_m: int,
    hnsw_ef_construction: int,
    default_ef_search: int,
    partitions: int,
    model: str | None,
    options: dict[str, Any],
    language: str = "simple",
    text_fields: tuple[str, ...] = (),
) -> Collection:
    """Add a registry row inside the caller's transaction (which then creates the table); the
    collection's id is drawn first because its table name carries it."""
    # Serialise creations of one name so the loser gets a clean CollectionExistsError.
    conn.execute("SELECT pg_advisory_xact_lock(hashtext('memstore.collection.' || %s))", (name,))
    if conn.execute("SELECT 1 FROM memstore_collections WHERE name = %s", (name,)).fetchone():
        raise CollectionExistsError(name)
    row = conn.execute("SELECT nextval(pg_get_serial_sequence('memstore_collections', 'id'))").fetchone()
    assert row is not None
    c = Collection(
        id=int(row[0]),
        name=name,
        table_name=f"c{int(row[0])}_{name}",
        dimensions=dimensions,
        metric=metric,  # type: ignore[arg-type]
        hnsw_m=hnsw_m,
        hnsw_ef_construction=hnsw_ef_construction,
        default_ef_search=default_ef_search,
        partitions=partitions,
        model=model,
        options=options,
        language=language,
        text_fields=text_fields,
    )
    conn.execute(
        """
        INSERT INTO memstore_collections (id, name, table_name, dimensions, metric, hnsw_m,
            hnsw_ef_construction, default_ef_search, partitions, model, options, language, text_fields)
        OVERRIDING SYSTEM VALUE VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
        """,
        (c.id, name, c.table_name, dimensions, metric, hnsw_m, hnsw_ef_construction, default_ef_search,
         partitions, model, Jsonb(options), language, list(text_fields)),
    )  # fmt: skip
    return c


def deregister(conn: psycopg.Connection[Any], c: Collection) -> None:
    """Remove the registry row inside the caller's transaction (which then drops the table)."""
    if conn.execute("DELETE FROM memstore_collections WHERE id = %s RETURNING id", (c.id,)).fetchone() is None:
        raise CollectionNotFoundError(c.name)


def set_keywords(
    conn: psycopg.Connection[Any], c: Collection, *, language: str, text_fields: tuple[str, ...]
) -> Collection:
    """Record what the collection's keyword index now holds (its index was built for it first)."""
    conn.execute(
        "UPDATE memstore_collections SET language = %s, text_fields = %s WHERE id = %s",
        (language, list(text_fields), c.id),
    )
    return replace(c, language=language, text_fields=text_fields)


def set_option(conn: psycopg.Connection[Any], c: Collection, key: str, value: Any) -> Collection:
    """Set ``options[key]`` (what a collection's index holds); other processes see it within CACHE_SECONDS."""
    conn.execute(
        "UPDATE memstore_collections SET options = jsonb_set(options, %s, %s) WHERE id = %s",
        ([key], Jsonb(value), c.id),
    )
    return replace(c, options={**c.options, key: value})


def set_default_ef_search(conn: psycopg.Connection[Any], c: Collection, ef_search: int) -> Collection:
    """Change the ef_search of searches that name none (what the recall target's tuning sets); other
    processes see it within CACHE_SECONDS."""
    if isinstance(ef_search, bool) or not isinstance(ef_search, int) or not 1 <= ef_search <= 1000:
        raise ValueError(f"ef_search must be an integer between 1 and 1000, not {ef_search!r}")
    conn.execute("UPDATE memstore_collections SET default_ef_search = %s WHERE id = %s", (ef_search, c.id))
    return replace(c, default_ef_search=ef_search)


def set_hnsw_density(conn: psycopg.Connection[Any], c: Collection, *, m: int, ef_construction: int) -> Collection:
    """Record the graph density the collection's indexes are (re)built with (``memstore.catalog.density``)."""
    conn.execute(
        "UPDATE memstore_collections SET hnsw_m = %s, hnsw_ef_construction = %s WHERE id = %s",
        (m, ef_construction, c.id),
    )
    return replace(c, hnsw_m=m, hnsw_ef_construction=ef_construction)


def clear_option(conn: psycopg.Connection[Any], c: Collection, key: str) -> Collection:
    """Remove ``options[key]``; other processes see it within CACHE_SECONDS."""
    conn.execute("UPDATE memstore_collections SET options = options - %s WHERE id = %s", (key, c.id))
    return replace(c, options={k: v for k, v in c.options.items() if k != key})


@contextlib.contextmanager
def registry_schema() -> Iterator[None]:
    """A registry read or write on a database whose migrations have not run says so, as memstore's
    own error, instead of PostgreSQL's "relation memstore_collections does not exist"."""
    try:
        yield
    except psycopg.errors.UndefinedTable as exc:
        if "memstore_collections" in str(exc):
            raise SchemaNotReadyError() from None
        raise


class Registry:
    """Registry rows by name or id through ``db``, cached for ``ttl`` seconds (a segmented
    collection's for ``layout_ttl`` at most)."""

    def __init__(self, db: Database, *, ttl: float = CACHE_SECONDS, layout_ttl: float = LAYOUT_CACHE_SECONDS) -> None:
        self.db = db
        self.ttl, self.layout_ttl = ttl, layout_ttl
        self._by_name: dict[str, tuple[float, Collection]] = {}
        self._lock = threading.Lock()

    def get(self, name: str, *, fresh: bool = False) -> Collection:
        validate_name(name)
        if not fresh and (hit := self.cached(name)) is not None:
            return hit
        try:
            return self._read(name=name)
        except CollectionNotFoundError:
            self.forget(name)
            raise

    def by_id(self, cid: int, *, fresh: bool = False) -> Collection | None:
        """The collection with id ``cid`` (None if it is gone): what the ingest workers resolve."""
        if not fresh:
            with self._lock:
                for at, c in self._by_name.values():
                    if c.id == cid and self._trusted(at, c):
                        return c
        try:
            return self._read(id=cid)
        except CollectionNotFoundError:
            return None

    def all(self) -> list[Collection]:
        with registry_schema(), self.db.read_primary() as conn:
            every = read_collections(conn)
        now = time.monotonic()
        for c in every:
            self._keep(now, c)
        return every

    def cached(self, name: str) -> Collection | None:
        """The row if it was read within ``ttl``, without touching the database."""
        with self._lock:
            hit = self._by_name.get(name)
        return hit[1] if hit and self._trusted(*hit) else None

    def _trusted(self, at: float, c: Collection) -> bool:
        ttl = min(self.ttl, self.layout_ttl) if segments.segmented(c) else self.ttl
        return time.monotonic() - at < ttl

    def forget(self, name: str) -> None:
        """Drop a cached row (dropped, switched, or its table turned out to be gone)."""
        with self._lock:
            self._by_name.pop(name, None)

    def _read(self, *, name: str | None = None, id: int | None = None) -> Collection:
        now = time.monotonic()  # before the read: a row is never trusted past ttl from when it was read
        with registry_schema(), self.db.read_primary() as conn:
            c = read_collection(conn, name=name, id=id)
        self._keep(now, c)
        return c

    def _keep(self, at: float, c: Collection) -> None:
        with self._lock:
            self._by_name[c.name] = (at, c)
