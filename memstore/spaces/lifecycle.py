"""Embedding spaces after the first: their side tables, their filling, activation and removal.

A space is a model's vectors of a collection's items, with its own HNSW index. The first space,
``default``, is the ``embedding`` column of the collection's table; each other one is a row of
``memstore_spaces`` and a table ``c<collection id>_s<space id>`` of ``(id, embedding)``
(docs/spaces.md measured why: re-embedding into a side table runs 1.8x faster than into a second
column and leaves the first index untouched).

A new space is filled from the stored originals through the durable ingest queue (rows with its
``space_id``), at the bulk priority, so the encoder's background class does the work and new items
go first. The ingest workers' ``SpacePass`` queues the backlog a batch at a time
(``queue_backlog_step``), and builds the space's index once the queue holds none of its rows
(``build_index``), concurrently, so writes go on; until then a search of the space
is an exact scan of the vectors made so far. Triggers on the item table (``memstore_spaces_sync``,
migration 0010) keep every space in step: a new or changed original is queued for each space, a
deleted item's vectors go with it.

Items stored as bare vectors have no original to embed: they are listed (``progress``), and
activation refuses until the caller writes their vectors (``put_vectors``) or forces it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg import sql

from memstore.catalog import registry
from memstore.catalog.collections import (
    DEFAULT_SPACE,
    METRICS,
    Collection,
    Space,
    validate_collection_params,
    validate_space_name,
)
from memstore.db import online_ddl
from memstore.errors import ConflictError, InvalidInputError
from memstore.queue.jobs import CHANNEL, PRIORITY_BULK

# Items queued per transaction while a new space is filled (each batch commits with the cursor).
QUEUE_BATCH = 5000
# Items without an original named in a space's progress (the count is always complete).
LISTED_WITHOUT_ORIGINAL = 20
ACTIVE_OPTION = "active_space"
_TRIGGERS = ("memstore_spaces_write", "memstore_spaces_change")
# Key space of the session advisory lock a space's index build holds (second key: the space id).
_BUILD_LOCK = 0x6D737062  # "mspb"


@dataclass(frozen=True)
class Progress:
    """How far a space's filling is (``GET /v1/collections/{name}/spaces/{space}``)."""

    space: Space
    active: bool
    vectors: int  # items with a vector in the space
    total: int  # items that have one or should: every item with an original, and every item that has one
    pending: int  # queued for the space, not embedded yet
    failed: int  # gave up after the queue's attempts (their errors in the queue rows)
    without_original: int  # bare-vector items without a vector in the space: only their owner can give one
    without_original_ids: list[str]  # the first LISTED_WITHOUT_ORIGINAL of them, by id
    rate_per_s: float | None  # vectors made per second since the space was created (while filling)
    eta_s: float | None  # pending / rate

    def as_dict(self) -> dict[str, Any]:
        s = self.space
        return {
            "name": s.name,
            "model": s.model,
            "pretrained": s.pretrained,
            "dimensions": s.dimensions,
            "metric": s.metric,
            "state": s.state,
            "active": self.active,
            "created_at": s.created_at,
            "ready_at": s.ready_at,
            "done": self.vectors,
            "total": self.total,
            "pending": self.pending,
            "failed": self.failed,
            "without_original": self.without_original,
            "without_original_ids": self.without_original_ids,
            "rate_per_s": self.rate_per_s,
            "eta_s": self.eta_s,
        }


def create(
    conn: psycopg.Connection[Any],
    c: Collection,
    *,
    name: str,
    model: str,
    pretrained: str | None,
    dimensions: int,
    metric: str | None = None,
    hnsw_m: int | None = None,
    hnsw_ef_construction: int | None = None,
    ef_search: int | None = None,
) -> Space:
    """Register the space, create its side table and the triggers that keep it in step, in one
    transaction on ``conn`` (autocommit). Creating the triggers waits for the writes in flight on the
    item table (a short lock, retried): every item written after this returns is queued for the space
    by its trigger, every item written before is visible to ``queue_backlog_step``."""
    validate_space_name(name)
    if name == DEFAULT_SPACE:
        raise InvalidInputError(f"{DEFAULT_SPACE!r} is the collection's first space; choose another name")
    metric = metric or c.metric
    hnsw_m = c.hnsw_m if hnsw_m is None else hnsw_m
    hnsw_ef_construction = c.hnsw_ef_construction if hnsw_ef_construction is None else hnsw_ef_construction
    ef_search = c.default_ef_search if ef_search is None else ef_search
    validate_collection_params(
        dimensions=dimensions,
        metric=metric,
        hnsw_m=hnsw_m,
        hnsw_ef_construction=hnsw_ef_construction,
        ef_search=ef_search,
        partitions=1,
    )
    if not isinstance(model, str) or not model:
        raise InvalidInputError("a space needs the name of the model that fills it")
    online_ddl.set_lock_timeout(conn)
    for attempt in online_ddl.lock_retries():
        with attempt, conn.transaction():
            space = _register(conn, c, name, model, pretrained, dimensions, metric, hnsw_m, hnsw_ef_construction,
                              ef_search)  # fmt: skip
            conn.execute(
                sql.SQL("CREATE TABLE {} (id bigint PRIMARY KEY, embedding vector({}) NOT NULL)").format(
                    sql.Identifier(space.table_name), sql.Literal(dimensions)
                )
            )
            _create_triggers(conn, c)
    return space


def _register(
    conn: psycopg.Connection[Any],
    c: Collection,
    name: str,
    model: str,
    pretrained: str | None,
    dimensions: int,
    metric: str,
    hnsw_m: int,
    hnsw_ef_construction: int,
    ef_search: int,
) -> Space:
    conn.execute("SELECT pg_advisory_xact_lock(hashtext('memstore.spaces.lifecycle.' || %s))", (str(c.id),))
    if conn.execute("SELECT 1 FROM memstore_spaces WHERE collection_id = %s AND name = %s", (c.id, name)).fetchone():
        raise ConflictError(f"collection {c.name!r} already has a space {name!r}")
    row = conn.execute(
        """
        INSERT INTO memstore_spaces (collection_id, name, model, pretrained, dimensions, metric, hnsw_m,
            hnsw_ef_construction, default_ef_search, table_name)
        VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, '')
        RETURNING id
        """,
        (c.id, name, model, pretrained, dimensions, metric, hnsw_m, hnsw_ef_construction, ef_search),
    ).fetchone()
    assert row is not None
    table_name = f"c{c.id}_s{int(row[0])}"
    conn.execute("UPDATE memstore_spaces SET table_name = %s WHERE id = %s", (table_name, row[0]))
    return _read(conn, c, int(row[0]))


def _read(conn: psycopg.Connection[Any], c: Collection, space_id: int) -> Space:
    found = registry.read_collection(conn, id=c.id).space_by_id(space_id)
    if found is None:
        raise LookupError(f"space #{space_id} of collection {c.name!r} is gone")
    return found


def _create_triggers(conn: psycopg.Connection[Any], c: Collection) -> None:
    """The two triggers of ``memstore_spaces_sync`` on the item table (replaced if present: creating
    one waits for the transactions writing the table, which is what closes the race with the backlog)."""
    cid = sql.Literal(str(c.id))
    conn.execute(
        sql.SQL(
            "CREATE OR REPLACE TRIGGER {} AFTER INSERT OR DELETE ON {} "
            "FOR EACH ROW EXECUTE FUNCTION memstore_spaces_sync({})"
        ).format(sql.Identifier(_TRIGGERS[0]), c.table, cid)
    )
    conn.execute(
        sql.SQL(
            "CREATE OR REPLACE TRIGGER {} AFTER UPDATE OF text, content ON {} FOR EACH ROW "
            "WHEN (OLD.text IS DISTINCT FROM NEW.text OR OLD.content IS DISTINCT FROM NEW.content) "
            "EXECUTE FUNCTION memstore_spaces_sync({})"
        ).format(sql.Identifier(_TRIGGERS[1]), c.table, cid)
    )


def queue_backlog_step(conn: psycopg.Connection[Any], c: Collection, space: Space) -> int | None:
    """Queue the next QUEUE_BATCH stored originals of ``c`` (by id) for ``space``, at the bulk priority,
    and move the space's cursor past them, in one transaction (autocommit ``conn``): a crash loses
    nothing and repeats nothing. Returns how many rows it queued, or None once the backlog is all
    queued (the space is then marked queued). Workers taking turns wait on the space's row lock."""
    with conn.transaction():
        row = conn.execute(
            "SELECT queued_through, queued_at FROM memstore_spaces WHERE id = %s FOR UPDATE", (space.id,)
        ).fetchone()
        if row is None or row[1] is not None:
            return None
        after = int(row[0])
        found = conn.execute(
            sql.SQL("SELECT max(id) FROM (SELECT id FROM {} WHERE id > %s ORDER BY id LIMIT %s) AS b").format(c.table),
            (after, QUEUE_BATCH),
        ).fetchone()
        last = None if found is None or found[0] is None else int(found[0])
        if last is None:
            conn.execute("UPDATE memstore_spaces SET queued_at = now() WHERE id = %s", (space.id,))
            return None
        # Items written since the space was created are queued by their trigger too: the conflict
        # and the vector already made are skipped.
        cur = conn.execute(
            sql.SQL(
                "INSERT INTO memstore_ingest_queue (collection_id, item_id, space_id, priority) "
                "SELECT %s, t.id, %s, %s FROM {t} t WHERE t.id > %s AND t.id <= %s "
                "AND (t.text IS NOT NULL OR t.content IS NOT NULL) "
                "AND NOT EXISTS (SELECT 1 FROM {side} s WHERE s.id = t.id) "
                "ON CONFLICT (collection_id, item_id, space_id) DO NOTHING"
            ).format(t=c.table, side=sql.Identifier(space.table_name)),
            (c.id, space.id, PRIORITY_BULK, after, last),
        )
        conn.execute("UPDATE memstore_spaces SET queued_through = %s WHERE id = %s", (last, space.id))
        conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, str(c.id)))  # delivered at commit
        return max(cur.rowcount, 0)


def pending(conn: psycopg.Connection[Any], c: Collection, space: Space) -> tuple[int, int]:
    """(pending, failed) queue rows of the space."""
    row = conn.execute(
        "SELECT count(*) FILTER (WHERE status = 'pending'), count(*) FILTER (WHERE status = 'failed') "
        "FROM memstore_ingest_queue WHERE collection_id = %s AND space_id = %s",
        (c.id, space.id),
    ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def progress(conn: psycopg.Connection[Any], c: Collection, space: Space) -> Progress:
    """Counts of the space's filling (a scan of the item table and the side table: for a status page,
    not for a loop)."""
    active = c.active_space_name == space.name
    if not space.side:
        row = conn.execute(
            sql.SQL("SELECT count(*) FILTER (WHERE embedding IS NOT NULL), count(*) FROM {}").format(c.table)
        ).fetchone()
        assert row is not None
        waiting = conn.execute(
            "SELECT count(*) FILTER (WHERE status = 'pending'), count(*) FILTER (WHERE status = 'failed') "
            "FROM memstore_ingest_queue WHERE collection_id = %s AND space_id = 0",
            (c.id,),
        ).fetchone()
        assert waiting is not None
        return Progress(space, active, int(row[0]), int(row[1]), int(waiting[0]), int(waiting[1]), 0, [], None, None)
    side = sql.Identifier(space.table_name)
    row = conn.execute(
        sql.SQL(
            "SELECT count(s.id), "
            "count(*) FILTER (WHERE t.text IS NOT NULL OR t.content IS NOT NULL OR s.id IS NOT NULL), "
            "count(*) FILTER (WHERE t.text IS NULL AND t.content IS NULL AND s.id IS NULL) "
            "FROM {t} t LEFT JOIN {side} s ON s.id = t.id"
        ).format(t=c.table, side=side)
    ).fetchone()
    assert row is not None
    vectors, total, bare = int(row[0]), int(row[1]), int(row[2])
    listed = [
        str(r[0])
        for r in conn.execute(
            sql.SQL(
                "SELECT t.external_id FROM {t} t WHERE t.text IS NULL AND t.content IS NULL "
                "AND NOT EXISTS (SELECT 1 FROM {side} s WHERE s.id = t.id) ORDER BY t.id LIMIT %s"
            ).format(t=c.table, side=side),
            (LISTED_WITHOUT_ORIGINAL,),
        )
    ]
    waiting, failed = pending(conn, c, space)
    rate = eta = None
    if space.state == "filling" and space.created_at is not None and vectors:
        elapsed = (datetime.now(UTC) - space.created_at).total_seconds()
        rate = vectors / elapsed if elapsed > 0 else None
        eta = waiting / rate if rate else None
    return Progress(space, active, vectors, total, waiting, failed, bare, listed, rate, eta)


def build_index(conn: psycopg.Connection[Any], c: Collection, space: Space, *, workers: int | None = None) -> bool:
    """Once the space's backlog is queued and embedded, build its HNSW index concurrently and mark
    it ready (autocommit ``conn``). False when it is not due yet, or another process is building it.
    ``workers``: the build's parallel workers (the session's setting when None)."""
    if space.state != "filling" or space.queued_at is None:
        return False
    if pending(conn, c, space)[0]:
        return False
    got = conn.execute("SELECT pg_try_advisory_lock(%s, %s)", (_BUILD_LOCK, space.id)).fetchone()
    if not (got and got[0]):
        return False
    try:
        state = conn.execute("SELECT state FROM memstore_spaces WHERE id = %s", (space.id,)).fetchone()
        if state is None or state[0] != "filling":
            return False
        online_ddl.set_lock_timeout(conn)
        if workers is not None:
            online_ddl.set_build_workers(conn, workers)
        definition = sql.SQL("USING hnsw (embedding {ops}) WITH (m = {m}, ef_construction = {ef})").format(
            ops=sql.SQL(METRICS[space.metric].opclass),
            m=sql.Literal(space.hnsw_m),
            ef=sql.Literal(space.hnsw_ef_construction),
        )
        online_ddl.build_table_index(conn, space.index_name, sql.Identifier(space.table_name), definition)
        conn.execute(sql.SQL("ANALYZE {}").format(sql.Identifier(space.table_name)))
        conn.execute("UPDATE memstore_spaces SET state = 'ready', ready_at = now() WHERE id = %s", (space.id,))
        return True
    finally:
        conn.execute("SELECT pg_advisory_unlock(%s, %s)", (_BUILD_LOCK, space.id))


def finish_filled(conn: psycopg.Connection[Any], c: Collection, space: Space) -> bool:
    """Build the index of a filling space whose every item already has its vector (written by
    ``put_vectors``) and nothing queued, here and now (autocommit ``conn``): there is nothing for an
    ingest worker to embed, and a process with none (the library alone) would otherwise wait for
    ever. False when there is work left, or another process is building it."""
    if not space.side or space.state != "filling":
        return False
    p = progress(conn, c, space)
    if p.vectors < p.total or p.without_original or p.pending:
        return False
    conn.execute("UPDATE memstore_spaces SET queued_at = coalesce(queued_at, now()) WHERE id = %s", (space.id,))
    fresh = registry.read_collection(conn, id=c.id)
    return build_index(conn, fresh, fresh.space(space.name))


def activate(conn: psycopg.Connection[Any], c: Collection, name: str, *, force: bool = False) -> Collection:
    """Make ``name`` the space searches use by default. Refused while it is filling, or, unless
    ``force``, while items have no vector in it: those whose embedding failed, and those stored
    without an original (with ``force`` they are found by no vector search of the collection until
    they get one)."""
    space = c.space(name)
    if space.side:
        if space.state != "ready":
            p = progress(conn, c, space)
            raise ConflictError(
                f"space {name!r} is still filling ({p.vectors} of {p.total} vectors, {p.pending} queued); "
                "activate it once its state is ready"
            )
        if not force:
            p = progress(conn, c, space)
            if p.failed:
                raise ConflictError(
                    f"{p.failed} item(s) of {c.name!r} could not be embedded into space {name!r} (their errors: "
                    "the queue's last_error; GET .../spaces/{space} counts them): fix and re-send them, or "
                    "activate with force to leave them out of its searches"
                )
            if p.without_original:
                raise ConflictError(
                    f"{p.without_original} item(s) of {c.name!r} were stored as bare vectors and have none in "
                    f"space {name!r} (first: {', '.join(p.without_original_ids)}): write their vectors into the "
                    "space first, or activate with force to leave them out of its searches"
                )
    with conn.transaction():
        if name == DEFAULT_SPACE:
            return registry.clear_option(conn, c, ACTIVE_OPTION)
        return registry.set_option(conn, c, ACTIVE_OPTION, name)


def delete(conn: psycopg.Connection[Any], c: Collection, name: str) -> None:
    """Drop a space that searches do not use: its row, its queued rows and its side table (with its
    index), in one transaction under a short lock wait; the triggers go with the last space."""
    space = c.space(name)
    if not space.side:
        raise ConflictError(
            f"{DEFAULT_SPACE!r} holds the vectors in the collection's own table and cannot be dropped; "
            "activate the space you moved to and leave it unused"
        )
    if c.active_space_name == name:
        raise ConflictError(f"space {name!r} is the one searches use: activate another space first")
    online_ddl.set_lock_timeout(conn)
    for attempt in online_ddl.lock_retries():
        with attempt, conn.transaction():
            conn.execute("DELETE FROM memstore_spaces WHERE id = %s", (space.id,))
            conn.execute(
                "DELETE FROM memstore_ingest_queue WHERE collection_id = %s AND space_id = %s", (c.id, space.id)
            )
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(space.table_name)))
            left = conn.execute("SELECT 1 FROM memstore_spaces WHERE collection_id = %s", (c.id,)).fetchone()
            if left is None:
                for trigger in _TRIGGERS:
                    conn.execute(sql.SQL("DROP TRIGGER IF EXISTS {} ON {}").format(sql.Identifier(trigger), c.table))


def drop_statements(c: Collection) -> list[sql.Composed]:
    """What dropping the collection drops besides its table: each space's side table."""
    return [sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(s.table_name)) for s in c.spaces]


def put_vectors(conn: psycopg.Connection[Any], c: Collection, space: Space, vectors: dict[int, Any]) -> int:
    """Write the given items' vectors into a side space (what items stored as bare vectors need
    before activation); returns how many were written. Ids of items that do not exist are refused."""
    if not space.side:
        raise InvalidInputError(f"write vectors of the {DEFAULT_SPACE!r} space through the items API")
    if not vectors:
        return 0
    with conn.transaction():
        found = {
            int(r[0])
            for r in conn.execute(
                sql.SQL("SELECT id FROM {} WHERE id = ANY(%s) FOR KEY SHARE").format(c.table), (list(vectors),)
            )
        }
        missing = [i for i in vectors if i not in found]
        if missing:
            raise InvalidInputError(f"collection {c.name!r} has no item {missing[0]}")
        with conn.cursor() as cur:
            cur.executemany(
                sql.SQL(
                    "INSERT INTO {} (id, embedding) VALUES (%s, %s) "
                    "ON CONFLICT (id) DO UPDATE SET embedding = EXCLUDED.embedding"
                ).format(sql.Identifier(space.table_name)),
                [(i, v) for i, v in vectors.items()],
            )
    return len(vectors)
