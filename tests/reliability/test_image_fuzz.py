"""Property-based fuzzing of image checks, decoding and tiling.

Random bytes, and valid images of every accepted format with bytes flipped, cut or spliced, go
through the same path an upload takes: the header check, the tile plan, the decode into views. The
only failure allowed is ImageRejectedError (a clear 4xx at the API); a success yields views of the
model's shape, one per planned tile plus the global view. ``MEMSTORE_FUZZ_EXAMPLES`` runs it longer.
"""

from __future__ import annotations

import io
import os

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from encoder.errors import ImageRejectedError
from encoder.images import ImageOptions, ImageSpec, load_views, plan_for, probe_image

EXAMPLES = int(os.environ.get("MEMSTORE_FUZZ_EXAMPLES", "150"))
SPEC = ImageSpec(16, (0.5, 0.5, 0.5), (0.25, 0.25, 0.25))
OPTIONS = ImageOptions(max_tiles=8, max_pixels=4_000_000, max_bytes=2_000_000)


def _encoded(fmt: str, width: int, height: int, mode: str, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    channels = {"L": 1, "RGB": 3, "RGBA": 4}[mode]
    pixels = rng.integers(0, 256, size=(height, width, channels), dtype=np.uint8)
    img = Image.fromarray(pixels[:, :, 0] if channels == 1 else pixels, mode)
    if fmt == "JPEG" and mode == "RGBA":
        img = img.convert("RGB")
    buf = io.BytesIO()
    img.save(buf, format=fmt)
    return buf.getvalue()


valid_images = st.builds(
    _encoded,
    st.sampled_from(["PNG", "JPEG", "WEBP", "GIF", "BMP", "TIFF"]),
    st.integers(1, 120),
    st.integers(1, 120),
    st.sampled_from(["L", "RGB", "RGBA"]),
    st.integers(0, 2**16),
)


@st.composite
def mangled(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(valid_images))
    for _ in range(draw(st.integers(0, 6))):
        how = draw(st.sampled_from(["flip", "cut", "splice"]))
        if not data:
            break
        at = draw(st.integers(0, len(data) - 1))
        if how == "flip":
            data[at] ^= draw(st.integers(1, 255))
        elif how == "cut":
            del data[at:]
        else:
            data[at:at] = draw(st.binary(max_size=64))
    return bytes(data)


def _run(data: bytes) -> None:
    try:
        probe = probe_image(data, OPTIONS)
        plan = plan_for(probe, SPEC, OPTIONS)
        views = load_views(data, probe, plan, SPEC)
    except ImageRejectedError:
        return
    assert views.dtype == np.uint8
    assert views.shape == (1 + len(plan.tiles), SPEC.size, SPEC.size, 3)


@settings(max_examples=EXAMPLES, deadline=None)
@given(st.binary(max_size=512))
def test_random_bytes_are_refused_cleanly(data: bytes) -> None:
    _run(data)


@settings(max_examples=EXAMPLES, deadline=None)
@given(mangled())
def test_mangled_images_decode_or_are_refused_cleanly(data: bytes) -> None:
    _run(data)
