"""High-resolution tiling geometry and the rule that combines view vectors (pure, no torch).

An image whose longer side exceeds `tile_threshold` model input sizes gets, besides the global
view, a grid of tiles at the model's input size. The grid is chosen LLaVA-NeXT "anyres" style:
among all grids with 2..max_tiles tiles, the one that keeps the most image resolution after an
aspect-preserving fit, then the one that wastes the least canvas, then the one with fewer tiles.
The fitted image is centred on the canvas; tiles that hold no image content are dropped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

Box = tuple[int, int, int, int]


@dataclass(frozen=True)
class Tile:
    col: int
    row: int
    weight: float  # share of the tile covered by image content (the rest is padding)
    box: Box  # (x0, y0, x1, y1): the region of the source image this tile shows


@dataclass(frozen=True)
class TilePlan:
    width: int  # source image size (after EXIF rotation)
    height: int
    tile_size: int
    grid: tuple[int, int]  # (columns, rows); (0, 0) when the image gets the global view only
    content: Box  # (x, y, w, h) of the fitted image inside the tiling canvas
    tiles: tuple[Tile, ...]

    @property
    def n_units(self) -> int:
        """Model passes this image needs: the global view plus one per tile."""
        return 1 + len(self.tiles)

    @property
    def canvas(self) -> tuple[int, int]:
        return self.grid[0] * self.tile_size, self.grid[1] * self.tile_size


def _fit(width: int, height: int, canvas_w: int, canvas_h: int) -> tuple[int, int]:
    scale = min(canvas_w / width, canvas_h / height)
    return min(canvas_w, max(1, round(width * scale))), min(canvas_h, max(1, round(height * scale)))


def choose_grid(width: int, height: int, tile_size: int, max_tiles: int) -> tuple[int, int]:
    """The anyres grid (columns, rows) for an image, with 2 <= columns * rows <= max_tiles."""
    if max_tiles < 2:
        raise ValueError(f"a tiled image needs max_tiles >= 2, not {max_tiles}")
    best: tuple[int, int] | None = None
    best_key: tuple[int, int, int] | None = None
    for cols in range(1, max_tiles + 1):
        for rows in range(1, max_tiles // cols + 1):
            if cols * rows < 2:
                continue
            cw, ch = cols * tile_size, rows * tile_size
            fw, fh = _fit(width, height, cw, ch)
            effective = min(fw * fh, width * height)  # upscaling adds no information
            waste = cw * ch - effective
            key = (-effective, waste, cols * rows)
            if best_key is None or key < best_key:
                best, best_key = (cols, rows), key
    assert best is not None
    return best


def plan_tiles(width: int, height: int, tile_size: int, *, max_tiles: int, tile_threshold: float) -> TilePlan:
    """Where the tiles of a width x height image go, or a global-view-only plan for small images."""
    if width < 1 or height < 1:
        raise ValueError(f"image size must be positive, not {width}x{height}")
    if max_tiles < 2 or max(width, height) <= tile_threshold * tile_size:
        return TilePlan(width, height, tile_size, (0, 0), (0, 0, 0, 0), ())
    cols, rows = choose_grid(width, height, tile_size, max_tiles)
    cw, ch = cols * tile_size, rows * tile_size
    fw, fh = _fit(width, height, cw, ch)
    ox, oy = (cw - fw) // 2, (ch - fh) // 2
    sx, sy = width / fw, height / fh
    tiles = []
    for row in range(rows):
        for col in range(cols):
            x0, y0 = max(col * tile_size, ox), max(row * tile_size, oy)
            x1, y1 = min((col + 1) * tile_size, ox + fw), min((row + 1) * tile_size, oy + fh)
            if x1 <= x0 or y1 <= y0:
                continue  # pure padding: costs a model pass and says nothing
            weight = (x1 - x0) * (y1 - y0) / (tile_size * tile_size)
            box = (
                math.floor((x0 - ox) * sx),
                math.floor((y0 - oy) * sy),
                min(width, math.ceil((x1 - ox) * sx)),
                min(height, math.ceil((y1 - oy) * sy)),
            )
            tiles.append(Tile(col, row, weight, box))
    return TilePlan(width, height, tile_size, (cols, rows), (ox, oy, fw, fh), tuple(tiles))


def _unit(v: np.ndarray) -> np.ndarray:
    norm = np.linalg.norm(v, axis=-1, keepdims=True)
    return np.divide(v, norm, out=np.zeros_like(v), where=norm > 0)


def aggregate(
    global_vector: np.ndarray, tile_vectors: np.ndarray, weights: list[float] | np.ndarray, global_weight: float
) -> np.ndarray:
    """The image vector: normalise(a * g + (1 - a) * sum(w_i * t_i) / sum(w_i)).

    g and every t_i are L2-normalised first, w_i is tile i's content share and a is
    `global_weight`. Without tiles the result is the model's (already unit) global vector itself, so
    small images get exactly the vector a plain open_clip pass would give.
    """
    if len(tile_vectors) == 0:  # the model's own unit vector, untouched
        return np.array(global_vector, dtype=np.float32)
    g = _unit(np.asarray(global_vector, dtype=np.float64))
    tiles = np.asarray(tile_vectors, dtype=np.float64).reshape(-1, g.shape[-1])
    w = np.asarray(weights, dtype=np.float64)
    if w.shape != (len(tiles),) or np.any(w < 0) or w.sum() <= 0:
        raise ValueError(f"expected {len(tiles)} non-negative tile weights with a positive sum")
    mean = (w[:, None] * _unit(tiles)).sum(axis=0) / w.sum()
    combined = _unit(global_weight * g + (1.0 - global_weight) * mean)
    if not np.any(combined):  # the two parts cancelled out exactly; fall back to the global view
        combined = g
    return combined.astype(np.float32)
