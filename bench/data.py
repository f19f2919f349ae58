"""Synthetic data shaped like real embeddings, and loading of ``--data FILE.npz`` (arrays base, queries)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

# The real embeddings the project carries (with their licence and provenance note in tests/data/).
BGE_M3_DIR = Path(__file__).resolve().parents[1] / "tests" / "data" / "bge-m3-1024"


def load_bge_m3(folder: Path = BGE_M3_DIR) -> np.ndarray:
    """Every ``*.f32`` file of ``folder`` (raw little-endian float32, 1024-d, unit length), in name order."""
    files = sorted(folder.glob("*.f32"))
    if not files:
        raise FileNotFoundError(f"no *.f32 files in {folder} (the bge-m3 rows belong in tests/data/bge-m3-1024)")
    return np.concatenate([np.fromfile(f, dtype="<f4").reshape(-1, 1024) for f in files])


def clustered(n: int, dimensions: int, *, clusters: int = 100, spread: float = 0.35, seed: int = 0) -> np.ndarray:
    """A Gaussian mixture: ``clusters`` random unit centres, each point a centre plus isotropic noise.

    With spread 0.35 in 128 dimensions a point is much nearer its own centre than any other, but the
    neighbours inside a cluster are close together, which is what makes HNSW search non-trivial.
    """
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(clusters, dimensions))
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    labels = rng.integers(0, clusters, size=n)
    noise = rng.normal(scale=spread / np.sqrt(dimensions), size=(n, dimensions))
    points = centres[labels] + noise
    return points.astype(np.float32)


def low_rank(
    n: int,
    dimensions: int = 768,
    *,
    latent: int = 64,
    noise: float = 0.5,
    clusters: int = 200,
    spread: float = 0.5,
    seed: int = 0,
) -> np.ndarray:
    """Unit vectors with a low intrinsic dimension, as real embeddings have.

    ``latent`` factors (a Gaussian mixture of ``clusters`` centres with ``spread`` inside each, the
    factor scales decaying as 1/sqrt(1 + j/8)) are mapped into ``dimensions`` by a random orthonormal
    basis; isotropic noise with ``noise`` times the signal's RMS norm is added and rows are normalised.
    With the defaults the top 64 principal components hold about 81% of the variance (bge-m3: 72% in
    64, 81% in 96), so the exact neighbours depend partly on the noise a projection throws away.
    """
    rng = np.random.default_rng(seed)
    basis, _ = np.linalg.qr(rng.normal(size=(dimensions, latent)))
    scales = 1.0 / np.sqrt(1.0 + np.arange(latent) / 8.0)
    centres = rng.normal(size=(clusters, latent))
    labels = rng.integers(0, clusters, size=n)
    z = (centres[labels] + spread * rng.normal(size=(n, latent))) * scales
    x = z @ basis.T
    rms = np.sqrt((x**2).sum(axis=1).mean())
    x += rng.normal(scale=noise * rms / np.sqrt(dimensions), size=(n, dimensions))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x.astype(np.float32)


def load_npz(path: Path) -> tuple[np.ndarray, np.ndarray]:
    with np.load(path) as data:
        missing = {"base", "queries"} - set(data.files)
        if missing:
            raise SystemExit(f"{path}: missing arrays {sorted(missing)} (expected 'base' and 'queries')")
        return np.asarray(data["base"], dtype=np.float32), np.asarray(data["queries"], dtype=np.float32)


def exact_neighbours(base: np.ndarray, queries: np.ndarray, k: int, *, metric: str = "cosine") -> np.ndarray:
    """Indices of the k nearest base rows for each query, by brute force in blocks."""
    if metric == "cosine":
        b = base / np.linalg.norm(base, axis=1, keepdims=True)
        q = queries / np.linalg.norm(queries, axis=1, keepdims=True)
    else:
        b, q = base, queries
    out = np.empty((len(queries), k), dtype=np.int64)
    for start in range(0, len(q), 256):
        block = q[start : start + 256]
        scores = -(np.sum(b * b, axis=1)[None, :] - 2 * block @ b.T) if metric == "l2" else block @ b.T
        top = np.argpartition(-scores, k, axis=1)[:, :k]
        order = np.argsort(-np.take_along_axis(scores, top, axis=1), axis=1)
        out[start : start + 256] = np.take_along_axis(top, order, axis=1)
    return out


def recall_at_k(found: list[list[int]], truth: np.ndarray) -> float:
    k = truth.shape[1]
    return float(np.mean([len(set(f) & set(t.tolist())) / k for f, t in zip(found, truth, strict=True)]))
