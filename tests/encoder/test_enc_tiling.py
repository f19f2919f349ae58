"""Tiling geometry (anyres grid choice, centring, content weights, boxes) and the aggregation rule."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from encoder.tiling import aggregate, choose_grid, plan_tiles


def test_small_images_get_the_global_view_only():
    plan = plan_tiles(448, 300, 224, max_tiles=36, tile_threshold=2.0)
    assert plan.grid == (0, 0) and plan.tiles == () and plan.n_units == 1


def test_max_tiles_below_two_disables_tiling():
    assert plan_tiles(5000, 5000, 224, max_tiles=1, tile_threshold=2.0).n_units == 1


def test_anyres_grid_keeps_the_most_resolution_within_the_cap():
    # 4000x3000 at 224 px, at most 36 tiles: 7x5 keeps 1493x1120, more than 6x6 (1344x1008) or 8x4.
    assert choose_grid(4000, 3000, 224, 36) == (7, 5)
    # A panorama gets a wide grid, a tall strip a tall one.
    cols, rows = choose_grid(6000, 1000, 224, 16)
    assert cols > rows
    cols, rows = choose_grid(500, 4000, 224, 16)
    assert rows > cols
    # Once the image fits at full resolution, the grid that wastes the least canvas wins.
    assert choose_grid(448, 448, 224, 64) == (2, 2)


def test_a_square_image_at_the_cap_fills_the_whole_grid():
    plan = plan_tiles(512, 512, 64, max_tiles=64, tile_threshold=2.0)
    assert plan.grid == (8, 8) and len(plan.tiles) == 64 and plan.n_units == 65
    assert plan.content == (0, 0, 512, 512)
    assert all(t.weight == 1.0 for t in plan.tiles)
    assert plan.tiles[9].box == (64, 64, 128, 128)  # column 1, row 1


def test_fitted_image_is_centred_and_edge_tiles_weigh_their_content_share():
    plan = plan_tiles(1000, 500, 100, max_tiles=8, tile_threshold=2.0)
    cols, rows = plan.grid
    cw, ch = plan.canvas
    ox, oy, fw, fh = plan.content
    assert (cols, rows) == (4, 2)
    assert abs((cw - fw) - 2 * ox) <= 1 and abs((ch - fh) - 2 * oy) <= 1
    total = sum(t.weight for t in plan.tiles) * 100 * 100
    assert total == pytest.approx(fw * fh)


@settings(max_examples=150, deadline=None)
@given(
    w=st.integers(1, 9000),
    h=st.integers(1, 9000),
    size=st.sampled_from([32, 64, 224]),
    max_tiles=st.integers(2, 64),
)
def test_plans_cover_the_image_with_valid_tiles(w, h, size, max_tiles):
    plan = plan_tiles(w, h, size, max_tiles=max_tiles, tile_threshold=2.0)
    assert plan.n_units <= 1 + max_tiles
    if not plan.tiles:
        assert max(w, h) <= 2.0 * size
        return
    cols, rows = plan.grid
    assert 2 <= cols * rows <= max_tiles
    ox, oy, fw, fh = plan.content
    assert ox >= 0 and oy >= 0 and ox + fw <= cols * size and oy + fh <= rows * size
    assert sum(t.weight for t in plan.tiles) * size * size == pytest.approx(fw * fh)
    covered = np.zeros((min(h, 300), min(w, 300)), dtype=bool)  # sample the source on a coarse grid
    ys = np.linspace(0, h - 1, covered.shape[0]).astype(int)
    xs = np.linspace(0, w - 1, covered.shape[1]).astype(int)
    for t in plan.tiles:
        assert 0 < t.weight <= 1
        x0, y0, x1, y1 = t.box
        assert 0 <= x0 < x1 <= w and 0 <= y0 < y1 <= h
        covered |= ((ys >= y0) & (ys < y1))[:, None] & ((xs >= x0) & (xs < x1))[None, :]
    assert covered.all()


def test_aggregate_is_the_normalised_weighted_mean_of_global_and_tiles():
    g = np.array([1.0, 0.0, 0.0], dtype=np.float32)
    tiles = np.array([[0.0, 2.0, 0.0], [0.0, 0.0, 1.0]], dtype=np.float32)  # tile vectors get normalised
    v = aggregate(g, tiles, [1.0, 0.5], global_weight=0.5)
    mean = (1.0 * np.array([0, 1, 0]) + 0.5 * np.array([0, 0, 1])) / 1.5
    expected = 0.5 * np.array([1, 0, 0]) + 0.5 * mean
    np.testing.assert_allclose(v, expected / np.linalg.norm(expected), rtol=1e-6)
    assert v.dtype == np.float32 and np.linalg.norm(v) == pytest.approx(1.0, abs=1e-6)


def test_aggregate_extremes():
    g = np.array([0.6, 0.8], dtype=np.float32)
    tiles = np.array([[1.0, 0.0], [0.0, 1.0]], dtype=np.float32)
    # Without tiles the global vector comes back untouched.
    assert np.array_equal(aggregate(g, np.zeros((0, 2)), [], 0.5), g)
    np.testing.assert_allclose(aggregate(g, tiles, [1, 1], 1.0), g, rtol=1e-6)
    np.testing.assert_allclose(aggregate(g, tiles, [1, 1], 0.0), [np.sqrt(0.5)] * 2, rtol=1e-6)
    with pytest.raises(ValueError, match="tile weights"):
        aggregate(g, tiles, [1.0], 0.5)
