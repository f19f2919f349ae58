"""A collection's worth of photo-like JPEGs of varied sizes (``bench.reembed``'s stored images).

Widths are drawn log-uniformly from thumbnails to a few megapixels, in the usual aspect ratios, so
most images are small and a few are large, as in a photo library; the large ones are tiled by the
encoder (``max_tiles``), which is what makes a re-embedding's batches uneven.
"""

from __future__ import annotations

import sys

import numpy as np
from tqdm import tqdm

from bench.encoder import picture

ASPECTS = ((4, 3), (3, 4), (16, 9), (1, 1), (3, 2))
SMALLEST = 64  # the long side of a thumbnail
LARGEST = 2400  # the long side of the largest image (5.8 megapixels when square)


def image_sizes(n: int, seed: int, *, largest: int = LARGEST) -> list[tuple[int, int]]:
    """``n`` (width, height) pairs: the long side log-uniform in [SMALLEST, largest]."""
    rng = np.random.default_rng(seed)
    longs = np.exp(rng.uniform(np.log(SMALLEST), np.log(max(SMALLEST, largest)), n)).astype(int)
    sizes = []
    for long_side, aspect in zip(longs, rng.integers(0, len(ASPECTS), n), strict=True):
        a, b = ASPECTS[int(aspect)]
        short = max(16, int(long_side) * min(a, b) // max(a, b))
        sizes.append((int(long_side), short) if a >= b else (short, int(long_side)))
    return sizes


def image_set(n: int, seed: int = 0, *, largest: int = LARGEST) -> list[bytes]:
    """``n`` distinct JPEGs (smooth noise, which compresses like a photo)."""
    sizes = image_sizes(n, seed, largest=largest)
    return [
        picture(w, h, seed * 1_000_003 + i)
        for i, (w, h) in enumerate(tqdm(sizes, desc="images", file=sys.stderr, leave=False))
    ]


def describe(images: list[bytes], sizes: list[tuple[int, int]]) -> dict[str, float]:
    """What the set holds: counts by size class, megapixels and bytes."""
    pixels = np.array([w * h for w, h in sizes], dtype=float)
    return {
        "thumbnails_lt_0.1mp": int((pixels < 100_000).sum()),
        "medium_0.1_1mp": int(((pixels >= 100_000) & (pixels < 1_000_000)).sum()),
        "large_ge_1mp": int((pixels >= 1_000_000).sum()),
        "largest_mp": round(float(pixels.max()) / 1e6, 2),
        "mean_kb": round(sum(len(b) for b in images) / len(images) / 1024, 1),
    }
