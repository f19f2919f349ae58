"""Data for ``bench.churn``: the default clustered synthetic set, ``--data FILE.npz``, and bge-m3.

``python -m bench.churn_data --out FILE.npz`` (``--bge-m3 DIR`` for another folder) turns the bge-m3 embeddings (raw
little-endian float32 files, 1024 dimensions) into an npz with ``base`` and held-out ``queries``.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from bench.data import BGE_M3_DIR, load_bge_m3

Matrix = npt.NDArray[np.float32]
SEED = 20261130


@dataclass(frozen=True)
class Dataset:
    name: str
    base: Matrix  # every vector the benchmark may store (the table starts with the first `rows`)
    queries: Matrix


def _normalise(x: npt.NDArray[np.floating]) -> Matrix:
    x = np.asarray(x, dtype=np.float32)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return np.ascontiguousarray(x / np.maximum(norms, 1e-12), dtype=np.float32)


def synthetic(n: int, *, dims: int = 128, queries: int = 200, clusters: int = 256, seed: int = SEED) -> Dataset:
    """Clustered vectors with a low intrinsic dimension, like real embeddings (not uniform noise).

    Each cluster is a centre plus a 16-dimensional latent spread mapped into ``dims`` through a
    cluster-specific projection, plus small isotropic noise; queries come from the same process.
    """
    rng = np.random.default_rng(seed)
    latent = 16
    centres = rng.normal(size=(clusters, dims)).astype(np.float32)
    projections = rng.normal(scale=1.0 / np.sqrt(latent), size=(clusters, latent, dims)).astype(np.float32)

    def draw(count: int) -> Matrix:
        which = rng.integers(0, clusters, size=count)
        z = rng.normal(size=(count, latent)).astype(np.float32)
        out = np.empty((count, dims), dtype=np.float32)
        for c in np.unique(which):
            sel = which == c
            out[sel] = centres[c] * 0.9 + z[sel] @ projections[c]
        out += rng.normal(scale=0.05, size=out.shape).astype(np.float32)
        return _normalise(out)

    return Dataset(name=f"synthetic-{dims}d-clustered", base=draw(n), queries=draw(queries))


def load_npz(path: Path) -> Dataset:
    with np.load(path) as z:
        if "base" not in z or "queries" not in z:
            raise ValueError(f"{path}: expected arrays 'base' and 'queries', found {sorted(z.files)}")
        base, queries = np.asarray(z["base"], dtype=np.float32), np.asarray(z["queries"], dtype=np.float32)
    if base.ndim != 2 or queries.ndim != 2 or base.shape[1] != queries.shape[1]:
        raise ValueError(f"{path}: base {base.shape} and queries {queries.shape} must be 2-D with equal width")
    return Dataset(name=path.stem, base=np.ascontiguousarray(base), queries=np.ascontiguousarray(queries))


def bge_m3(folder: Path = BGE_M3_DIR, *, queries: int = 100, seed: int = SEED) -> Dataset:
    """All ``*.f32`` files of ``folder`` (1024-d, unit length); a random ``queries`` rows held out."""
    every = load_bge_m3(folder)
    order = np.random.default_rng(seed).permutation(len(every))
    return Dataset(name="bge-m3-1024", base=every[order[queries:]].copy(), queries=every[order[:queries]].copy())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.churn_data", description=__doc__)
    parser.add_argument(
        "--bge-m3", type=Path, default=BGE_M3_DIR, help=f"folder with the bge-m3 *.f32 files (default {BGE_M3_DIR})"
    )
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    ds = bge_m3(args.bge_m3, queries=args.queries)
    np.savez(args.out, base=ds.base, queries=ds.queries)
    print(f"wrote {args.out}: base {ds.base.shape}, queries {ds.queries.shape}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
