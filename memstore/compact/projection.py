"""Low-rank projections: fit by PCA on a sample of a collection, stored versioned, applied in numpy and SQL.

For cosine collections rows are L2-normalised first and centred on the sample mean, so Euclidean
distance between projections approximates the distance between the unit vectors (centring does not
change differences; it only picks the subspace by variance rather than by the shared mean direction).
For ``l2`` the raw vectors are centred; for ``inner_product`` nothing is centred, because inner
products are not invariant to a shift.

The SQL twin is ``memstore_project(x, components, offsets, unit)`` (migration 0004): the same
arithmetic, so the side table's rows and the query projected here in numpy live in one space.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
import psycopg
from pgvector import Vector
from psycopg import sql
from psycopg.types.json import Jsonb

from memstore.catalog.collections import Collection

# Ranks tried when none is given: multiples that keep halfvec rows aligned.
RANK_CANDIDATES = (8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
DEFAULT_SAMPLE_ROWS = 20_000
# The candidate recall a chosen rank must reach on the sample (held-out queries, exact re-ranking).
DEFAULT_RANK_TARGET = 0.99
MIN_FIT_ROWS = 200


@dataclass(frozen=True)
class Projection:
    collection_id: int
    version: int
    components: np.ndarray  # (rank, dimensions) float32, orthonormal rows
    offsets: np.ndarray  # (rank,) float32: components @ mean (zero for inner product)
    normalize: bool
    sample_rows: int
    kept_variance: float | None = None
    id: int | None = None

    @property
    def rank(self) -> int:
        return int(self.components.shape[0])

    @property
    def dimensions(self) -> int:
        return int(self.components.shape[1])

    def apply(self, vectors: np.ndarray) -> np.ndarray:
        """Project rows of ``vectors`` ((n, d) or (d,)) exactly as ``memstore_project`` does."""
        x = np.asarray(vectors, dtype=np.float32)
        if self.normalize:
            norms = np.linalg.norm(x, axis=-1, keepdims=True)
            x = (x / np.where(norms > 0, norms, np.float32(1.0))).astype(np.float32)
        return (x @ self.components.T - self.offsets).astype(np.float32)


def _prepare(sample: np.ndarray, metric: str) -> tuple[np.ndarray, np.ndarray]:
    x = np.asarray(sample, dtype=np.float64)
    if metric == "cosine":
        norms = np.linalg.norm(x, axis=1, keepdims=True)
        x = x[norms[:, 0] > 0] / norms[norms[:, 0] > 0]
    mean = np.zeros(x.shape[1]) if metric == "inner_product" else x.mean(axis=0)
    return x, mean


def _eigen(x: np.ndarray, mean: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Eigenvalues (descending) and eigenvectors (as rows) of the centred second-moment matrix."""
    centred = x - mean
    values, vectors = np.linalg.eigh(centred.T @ centred / max(1, len(centred)))
    order = np.argsort(values)[::-1]
    return np.clip(values[order], 0.0, None), vectors[:, order].T


def fit(sample: np.ndarray, *, metric: str, rank: int, collection_id: int = 0, version: int = 1) -> Projection:
    """The top-``rank`` principal directions of ``sample`` (rows are vectors)."""
    if len(sample) < 2:
        raise ValueError(f"need at least 2 rows to fit a projection, not {len(sample)}")
    x, mean = _prepare(sample, metric)
    values, vectors = _eigen(x, mean)
    components = vectors[:rank].astype(np.float32)
    total = float(values.sum())
    return Projection(
        collection_id=collection_id,
        version=version,
        components=components,
        offsets=(components.astype(np.float64) @ mean).astype(np.float32),
        normalize=metric == "cosine",
        sample_rows=len(sample),
        kept_variance=float(values[:rank].sum() / total) if total > 0 else None,
    )


def _neighbours(base: np.ndarray, queries: np.ndarray, n: int, *, inner: bool) -> np.ndarray:
    scores = queries @ base.T if inner else -(np.sum(base * base, axis=1)[None, :] - 2 * queries @ base.T)
    n = min(n, base.shape[0])
    top = np.argpartition(-scores, n - 1, axis=1)[:, :n]
    return top


def candidate_recall(
    projection: Projection, base: np.ndarray, queries: np.ndarray, *, metric: str, k: int, pool: int
) -> float:
    """Share of each query's exact k nearest that fall among the ``pool`` nearest by projection."""
    inner = metric != "l2"
    b, q = np.asarray(base, np.float32), np.asarray(queries, np.float32)
    if metric == "cosine":
        b = b / np.linalg.norm(b, axis=1, keepdims=True)
        q = q / np.linalg.norm(q, axis=1, keepdims=True)
    truth = _neighbours(b, q, k, inner=inner)
    # Rounded to half precision as the index stores them.
    pb = projection.apply(base).astype(np.float16).astype(np.float32)
    pq = projection.apply(queries).astype(np.float16).astype(np.float32)
    found = _neighbours(pb, pq, pool, inner=metric == "inner_product")
    hits = [len(set(t.tolist()) & set(f.tolist())) for t, f in zip(truth, found, strict=True)]
    return float(np.mean(hits)) / k


def choose_rank(
    sample: np.ndarray,
    *,
    metric: str,
    pool: int,
    k: int = 10,
    population: int | None = None,
    target: float = DEFAULT_RANK_TARGET,
    max_rank: int | None = None,
) -> int:
    """The smallest candidate rank whose projection, fitted on part of the sample, keeps ``target`` of
    the exact nearest neighbours of held-out sample rows among its candidates.

    A neighbour that is t-th nearest in a collection of ``population`` rows is about
    t * sample/population-th in a uniform sample of it, so k and the pool shrink by that share (their
    ratio, which is what a projection must survive, stays): without it a 20k sample of 100k rows picks
    r = 16 (recall 0.79 in the collection) where r = 96 is needed.
    """
    dims = int(sample.shape[1])
    limit = min(dims - 1, max_rank or dims)
    ranks = [r for r in RANK_CANDIDATES if r <= limit] or [max(1, limit)]
    held = max(1, min(200, len(sample) // 5))
    base, queries = sample[held:], sample[:held]
    share = min(1.0, len(base) / population) if population else 1.0
    k_s = max(1, min(len(base), round(k * share)))
    pool_s = max(k_s, round(pool * share))
    x, mean = _prepare(base, metric)
    _values, vectors = _eigen(x, mean)
    for r in ranks:
        components = vectors[:r].astype(np.float32)
        p = Projection(0, 0, components, (components @ mean).astype(np.float32), metric == "cosine", len(base))
        if candidate_recall(p, base, queries, metric=metric, k=k_s, pool=pool_s) >= target:
            return r
    return ranks[-1]


# ---------------------------------------------------------------------- database


def sample_vectors(
    conn: psycopg.Connection[Any], c: Collection, n: int = DEFAULT_SAMPLE_ROWS
) -> tuple[np.ndarray, int]:
    """Up to ``n`` stored vectors drawn uniformly (Bernoulli sampling on large tables), and how many
    vectors the collection holds."""
    row = conn.execute(sql.SQL("SELECT count(*) FROM {} WHERE embedding IS NOT NULL").format(c.table)).fetchone()
    count = int(row[0]) if row else 0
    if count == 0:
        return np.empty((0, c.dimensions), dtype=np.float32), 0
    if count <= 2 * n:
        query = sql.SQL("SELECT embedding FROM {} WHERE embedding IS NOT NULL ORDER BY random() LIMIT %s").format(
            c.table
        )
        rows = conn.execute(query, (n,)).fetchall()
    else:
        percent = min(100.0, 100.0 * 1.2 * n / count)
        query = sql.SQL(
            "SELECT embedding FROM {} TABLESAMPLE BERNOULLI (%s) WHERE embedding IS NOT NULL LIMIT %s"
        ).format(c.table)
        rows = conn.execute(query, (percent, n)).fetchall()
    return np.stack([np.asarray(r[0].to_numpy(), dtype=np.float32) for r in rows]), count


def save(conn: psycopg.Connection[Any], p: Projection, *, details: dict[str, Any] | None = None) -> Projection:
    """Store ``p`` as the collection's next version (status 'building'); returns it with id and version."""
    row = conn.execute(
        """
        INSERT INTO memstore_projections (collection_id, version, rank, dimensions, unit_norm, components,
            offsets, sample_rows, kept_variance, details)
        SELECT %(cid)s, coalesce(max(version), 0) + 1, %(rank)s, %(dims)s, %(normalize)s, %(components)s,
            %(offsets)s, %(rows)s, %(kept)s, %(details)s
        FROM memstore_projections WHERE collection_id = %(cid)s
        RETURNING id, version
        """,
        {
            "cid": p.collection_id,
            "rank": p.rank,
            "dims": p.dimensions,
            "normalize": p.normalize,
            "components": [Vector(v) for v in p.components],
            "offsets": p.offsets.astype(float).tolist(),
            "rows": p.sample_rows,
            "kept": p.kept_variance,
            "details": Jsonb(details or {}),
        },
    ).fetchone()
    assert row is not None
    saved = Projection(
        p.collection_id, int(row[1]), p.components, p.offsets, p.normalize, p.sample_rows, p.kept_variance, int(row[0])
    )
    with _cache_lock:
        _cache[saved.id] = saved  # type: ignore[index]
    return saved


_cache: dict[int, Projection] = {}
_cache_lock = threading.Lock()


def load(conn: psycopg.Connection[Any], projection_id: int) -> Projection:
    """A stored projection (cached for the life of the process: a version never changes)."""
    with _cache_lock:
        hit = _cache.get(projection_id)
    if hit is not None:
        return hit
    row = conn.execute(
        "SELECT collection_id, version, unit_norm, sample_rows, kept_variance, offsets, "
        "(SELECT array_agg(c::real[] ORDER BY i) FROM unnest(components) WITH ORDINALITY AS u(c, i)) "
        "FROM memstore_projections WHERE id = %s",
        (projection_id,),
    ).fetchone()
    if row is None:
        raise LookupError(f"projection {projection_id} does not exist")
    p = Projection(
        collection_id=int(row[0]),
        version=int(row[1]),
        components=np.asarray(row[6], dtype=np.float32),
        offsets=np.asarray(row[5], dtype=np.float32),
        normalize=bool(row[2]),
        sample_rows=int(row[3]),
        kept_variance=row[4],
        id=projection_id,
    )
    with _cache_lock:
        _cache[projection_id] = p
    return p
