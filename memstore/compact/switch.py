"""Changing a collection's index representation online, and refitting its projection.

The order is what keeps searches answering throughout: build the new index (concurrently, or a new
side table kept in step by triggers) while the old one serves; flip the collection's options (every
process sees the flip within its collection cache time); wait that long; drop the old index; give the
new one the usual name. A search that still runs on the old representation meanwhile either uses the
old index (still there) or, past the drop, is retried by the store on the new one.

Everything runs under one advisory lock per collection, and every call first reconciles what is in the
database with the options (a crash mid-switch leaves a built-but-unflipped index or an orphaned side
table behind; both are dropped, or promoted when the flip had happened).
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import Any

import psycopg

from memstore.catalog import index_spec as specs
from memstore.catalog.collections import Collection
from memstore.catalog.registry import CACHE_SECONDS, read_collection, set_option
from memstore.compact import ddl
from memstore.compact import projection as proj
from memstore.db import online_ddl
from memstore.db.core import Database
from memstore.errors import InvalidInputError

log = logging.getLogger(__name__)

# How long a flip takes to reach every process: the registry's cache time plus a margin.
DEFAULT_GRACE_S = CACHE_SECONDS + 1.0


def write_spec(conn: psycopg.Connection[Any], c: Collection, spec: specs.IndexSpec) -> Collection:
    """Flip: the collection's searches use ``spec`` from now on (within the cache time)."""
    return set_option(conn, c, specs.OPTIONS_KEY, spec.to_json())


def _set_projection_status(conn: psycopg.Connection[Any], projection_id: int, status: str) -> None:
    stamp = {"active": ", activated_at = now()", "retired": ", retired_at = now()"}.get(status, "")
    conn.execute(f"UPDATE memstore_projections SET status = %s{stamp} WHERE id = %s", (status, projection_id))


def reconcile(conn: psycopg.Connection[Any], c: Collection) -> list[str]:
    """Make the database match the collection's options; returns what was done (for the record)."""
    spec = specs.index_spec(c)
    done: list[str] = []
    partitioned = c.partitions > 1
    indexes = {ix["name"]: ix for ix in ddl.main_indexes(conn, c)}
    nxt = indexes.get(specs.next_index(c.id))
    usual = indexes.get(c.index_name)
    wanted_on_main = spec.representation != "lowrank"

    def fits(ix: dict[str, Any] | None) -> bool:
        return bool(ix and ix["valid"] and ddl.index_matches(ix["definition"], spec.representation, c.metric))

    if nxt is not None:
        if wanted_on_main and fits(nxt) and not fits(usual):
            # Flipped before a crash: the new index is the one in use; finish the promotion.
            if usual is not None:
                online_ddl.drop_index(conn, c.index_name, partitioned=partitioned)
            ddl.promote_next_index(conn, c)
            done.append(f"promoted {specs.next_index(c.id)}")
        else:
            online_ddl.drop_index(conn, specs.next_index(c.id), partitioned=partitioned)
            done.append(f"dropped unfinished {specs.next_index(c.id)}")
    elif usual is not None and not wanted_on_main and spec.version is not None:
        online_ddl.drop_index(conn, c.index_name, partitioned=partitioned)
        done.append(f"dropped {c.index_name} (the low-rank index serves)")
    for version in ddl.side_versions(conn, c):
        if spec.representation == "lowrank" and version == spec.version:
            continue
        ddl.drop_side(conn, c, version)
        done.append(f"dropped side table v{version}")
    conn.execute(
        "UPDATE memstore_projections SET status = CASE WHEN status = 'building' THEN 'failed' ELSE 'retired' END, "
        "retired_at = now() WHERE collection_id = %s AND status IN ('building', 'active') AND id IS DISTINCT FROM %s",
        (c.id, spec.projection_id if spec.representation == "lowrank" else None),
    )
    return done


def _fit(
    conn: psycopg.Connection[Any], c: Collection, spec: specs.IndexSpec, rank: int | None, min_rank: int | None
) -> proj.Projection:
    sample, population = proj.sample_vectors(conn, c)
    if len(sample) < proj.MIN_FIT_ROWS:
        raise InvalidInputError(
            f"collection {c.name!r} has {len(sample)} vectors; a projection needs at least {proj.MIN_FIT_ROWS}"
        )
    chosen = rank
    if chosen is None:
        # A refit never shrinks the rank: it runs because recall fell.
        auto = proj.choose_rank(sample, metric=c.metric, pool=spec.pool(10), population=population)
        chosen = max(min_rank or 0, auto)
        chosen = min(chosen, c.dimensions - 1, specs.MAX_RANK)
    fitted = proj.fit(sample, metric=c.metric, rank=chosen, collection_id=c.id)
    return proj.save(conn, fitted, details={"rank_given": rank is not None, "min_rank": min_rank})


def _inline_vectors(conn: psycopg.Connection[Any], c: Collection) -> None:
    row = conn.execute(
        "SELECT attstorage FROM pg_attribute WHERE attrelid = to_regclass(%s) AND attname = 'embedding'",
        (c.table_name,),
    ).fetchone()
    if row and row[0] != "m":
        online_ddl.execute(conn, specs.inline_vectors_statement(c.table))


def _retire_old(conn: psycopg.Connection[Any], c: Collection, old: specs.IndexSpec, new: specs.IndexSpec) -> None:
    partitioned = c.partitions > 1
    if old.representation == "lowrank" and old.version is not None:
        ddl.drop_side(conn, c, old.version)
        if old.projection_id is not None:
            _set_projection_status(conn, old.projection_id, "retired")
    elif any(ix["name"] == c.index_name for ix in ddl.main_indexes(conn, c)):
        online_ddl.drop_index(conn, c.index_name, partitioned=partitioned)
    if new.representation != "lowrank":
        ddl.promote_next_index(conn, c)


def set_representation(
    db: Database,
    *,
    collection: str,
    representation: str,
    rank: int | None = None,
    pool_factor: float | None = None,
    refit: bool = False,
    grace_s: float = DEFAULT_GRACE_S,
    wait_s: float = 0.0,
) -> specs.IndexSpec:
    """Switch ``collection``'s index to ``representation`` online (or refit its projection with ``refit``).

    Returns the spec now in force. A low-rank switch on a collection with too few vectors to fit on is
    recorded as pending (the full index keeps serving) and made by ``maintain_compact_index`` later.
    """
    with ddl.connect(db) as conn:
        c = read_collection(conn, name=collection)
        specs.validate_choice(
            representation=representation, dimensions=c.dimensions, rank=rank, pool_factor=pool_factor
        )
        with ddl.collection_lock(conn, c, wait_s=wait_s):
            c = read_collection(conn, name=collection)
            reconcile(conn, c)
            old = specs.index_spec(c)
            factor = pool_factor if pool_factor is not None else old.pool_factor
            same = representation == old.representation and (representation != "lowrank" or not refit)
            if same and (rank is None or rank == old.rank):
                new = replace(old, pool_factor=factor, pending=None)
                write_spec(conn, c, new)
                return new
            if representation != "full":
                _inline_vectors(conn, c)
            if representation == "lowrank":
                return _to_lowrank(conn, c, old, rank, factor, grace_s)
            ddl.build_next_index(conn, c, representation)
            new = specs.IndexSpec(representation=representation, pool_factor=factor)
            write_spec(conn, c, new)
            time.sleep(grace_s)
            _retire_old(conn, c, old, new)
            return new


def _to_lowrank(
    conn: psycopg.Connection[Any],
    c: Collection,
    old: specs.IndexSpec,
    rank: int | None,
    factor: float | None,
    grace_s: float,
) -> specs.IndexSpec:
    probe = specs.IndexSpec(representation="lowrank", pool_factor=factor)
    try:
        p = _fit(conn, c, probe, rank, old.rank if old.representation == "lowrank" else None)
    except InvalidInputError:
        if old.representation == "lowrank":
            raise
        pending = replace(old, pending={"representation": "lowrank", "rank": rank, "pool_factor": factor})
        write_spec(conn, c, pending)
        return pending
    assert p.id is not None
    try:
        ddl.build_side(conn, c, p)
    except BaseException:
        with_cleanup(conn, c, p)
        raise
    new = specs.IndexSpec(
        representation="lowrank", rank=p.rank, projection_id=p.id, version=p.version, pool_factor=factor
    )
    with conn.transaction():  # the flip and the registry agree, whatever happens next
        write_spec(conn, c, new)
        _set_projection_status(conn, p.id, "active")
    time.sleep(grace_s)
    _retire_old(conn, c, old, new)
    return new


def with_cleanup(conn: psycopg.Connection[Any], c: Collection, p: proj.Projection) -> None:
    """Undo a half-built side table (best effort: reconcile finishes the job next time)."""
    try:
        ddl.drop_side(conn, c, p.version)
        if p.id is not None:
            _set_projection_status(conn, p.id, "failed")
    except psycopg.Error as exc:  # the connection may be the thing that failed
        log.warning("cleaning up projection v%s of %s failed: %s", p.version, c.name, exc)
