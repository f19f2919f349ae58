"""``memstore_query_samples``: the query vectors the API keeps for the recall probes. The one owner of
the table: the API's sampler writes through ``keep``, and every recall probe (the maintenance
worker's and the compact indexes') draws through ``draw``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import psycopg


def keep(conn: psycopg.Connection[Any], batch: Sequence[tuple[int, np.ndarray]], *, per_collection: int) -> None:
    """Store ``(collection_id, vector)`` samples (of collections that still exist), then trim each
    collection to its newest ``per_collection``: the table must not grow for ever."""
    with conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO memstore_query_samples (collection_id, embedding) "
            "SELECT %s, %s WHERE EXISTS (SELECT 1 FROM memstore_collections WHERE id = %s)",
            [(cid, vec, cid) for cid, vec in batch],
        )
        cur.executemany(
            "DELETE FROM memstore_query_samples WHERE collection_id = %(c)s AND id <= ("
            "SELECT id FROM memstore_query_samples WHERE collection_id = %(c)s "
            "ORDER BY id DESC OFFSET %(keep)s LIMIT 1)",
            [{"c": cid, "keep": per_collection} for cid in {cid for cid, _ in batch}],
        )


def as_numpy(value: Any) -> np.ndarray:
    """pgvector's loader gives ``Vector`` objects (or arrays, depending on the version)."""
    return np.asarray(value.to_numpy() if hasattr(value, "to_numpy") else value, dtype=np.float32)


def draw(
    conn: psycopg.Connection[Any], collection_id: int, n: int, *, dimensions: int, exclude: Sequence[int] = ()
) -> list[tuple[int, np.ndarray]]:
    """A random draw of ``n`` kept samples, other than ``exclude`` (a confirming draw leaves out the
    first's), as ``(id, vector)``: not the newest few, which repeat from one probe to the next and
    may all come from one user's burst of similar queries. Samples of another width (the collection
    was recreated under the same id range) are left out."""
    rows = (
        conn.cursor(binary=True)
        .execute(
            "SELECT id, embedding FROM memstore_query_samples "
            "WHERE collection_id = %(collection_id)s AND id <> ALL (%(exclude)s::bigint[]) "
            "ORDER BY random() LIMIT %(n)s",
            {"collection_id": collection_id, "n": n, "exclude": list(exclude)},
            prepare=True,
        )
        .fetchall()
    )
    out = []
    for sample_id, value in rows:
        vector = as_numpy(value)
        if vector.shape == (dimensions,):
            out.append((int(sample_id), vector))
    return out
