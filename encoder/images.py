"""Image decoding and view extraction with Pillow (no torch).

Order of checks: byte size, the structure walks (a JPEG's markers: scans, segments, junk; a PNG's
chunks; a GIF's blocks and frames), format allow-list, pixel count, mode and frames from the header
(nothing decoded yet), then the decode itself, under the decode budget (``encoder.decode_budget``:
in this process when the checks prove it cheap, else in a worker process killed past the time
limit). ``decode_image`` is the one way memstore decodes an image: the encoder's views, thumbnails
and OCR all go through it. Views are returned as uint8 HWC arrays: a quarter of the memory of float
tensors while they wait in the queue; normalisation happens per micro-batch on the device.

Decoded once per ingest: ``load_views`` takes an optional ``SharedDecode``, another use of the same
picture (the ingest worker's thumbnail, when the encoder runs in its process). The decode is sized
for the views alone (so an image's vector never depends on what else used its decode), and the
picture is handed over once the views are cut from it, in the decoding thread, when it is at least
as large as the other use needs (a JPEG decoded at a reduced scale may not be: that use then decodes
on its own). It is never held past its decode: the memory a decode takes is what it was.
"""

from __future__ import annotations

import functools
import io
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from PIL import Image, UnidentifiedImageError

from .decode_budget import (
    ALLOWED_FORMATS,
    ALLOWED_MODES,
    HIGH_BIT_MODES,
    PNG_SIGNATURE,
    DecodeJob,
    JpegLayout,
    decode_error,
    decode_here,
    gif_frames,
    jpeg_layout,
    png_chunks,
    png_exif,
    pool,
    tiff_pages,
)
from .errors import DecompressionBombError, ImageRejectedError
from .tiling import TilePlan, plan_tiles
from .types import Priority

log = logging.getLogger(__name__)

__all__ = [
    "ALLOWED_FORMATS",
    "ImageOptions",
    "ImageProbe",
    "ImageSpec",
    "SharedDecode",
    "decode_image",
    "load_views",
    "probe_image",
]

TRANSPOSED = frozenset({5, 6, 7, 8})  # EXIF orientations that swap width and height
_INTERPOLATION = {
    "bicubic": Image.Resampling.BICUBIC,
    "bilinear": Image.Resampling.BILINEAR,
    "nearest": Image.Resampling.NEAREST,
    "lanczos": Image.Resampling.LANCZOS,
}
# Formats whose decode is linear in pixels and bytes, decoded in the calling process when small.
_SIMPLE_FORMATS = frozenset({"PNG", "GIF", "BMP", "WEBP"})
INLINE_MAX_BYTES = 4 * 1024 * 1024  # ... and at most this many bytes (PNG and GIF walk chunks in Python)
# A light image (``is_light``) has at most this many pixels: about 1024 x 1024, a few milliseconds to
# decode and resize; a 4000 x 3000 photo takes about 100.
LIGHT_MAX_PIXELS = 1_048_576


@dataclass(frozen=True)
class ImageOptions:
    max_tiles: int = 36
    tile_threshold: float = 2.0  # tile when the longer side exceeds this many model input sizes
    global_weight: float = 0.5  # share of the global view in the combined vector
    max_pixels: int = 64_000_000
    max_bytes: int = 32 * 1024 * 1024
    # The decode budget. A progressive JPEG is decoded once per scan: a normal one has about 10.
    max_jpeg_scans: int = 64
    # Frames of an animated GIF/WebP/PNG, TIFF pages, MPO pictures: only the first is decoded.
    max_frames: int = 1000
    # A decode running longer is stopped (its worker process killed): the image is refused.
    decode_timeout_s: float = 5.0
    # Worker processes for the decodes not proven cheap (0: decode everything in-process, no time limit).
    decode_workers: int = 2
    # PNG/GIF/BMP/WebP of at most this many pixels (and INLINE_MAX_BYTES) and baseline JPEGs of any
    # size decode in the calling process; everything else in a worker.
    inline_max_pixels: int = 4_000_000


@dataclass(frozen=True)
class ImageSpec:
    """The model's input contract (open_clip's preprocess configuration)."""

    size: int
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    interpolation: str = "bicubic"
    resize_mode: str = "shortest"  # open_clip: shortest (resize + centre crop), longest, squash
    fill_color: int = 0


@dataclass(frozen=True)
class ImageProbe:
    format: str
    width: int  # after EXIF rotation
    height: int
    orientation: int
    mode: str = "RGB"
    frames: int = 1
    jpeg: JpegLayout | None = None  # JPEG and MPO: what the markers declare
    options: ImageOptions = field(default_factory=ImageOptions, compare=False, repr=False)  # checked against


def _open(data: bytes) -> Image.Image:
    try:
        return Image.open(io.BytesIO(data), formats=ALLOWED_FORMATS)
    except Image.DecompressionBombError as exc:
        raise DecompressionBombError(f"image refused as a decompression bomb: {exc}") from None
    except UnidentifiedImageError:
        raise ImageRejectedError(
            "unsupported or unrecognised image format; send JPEG, PNG, WebP, GIF, BMP or TIFF"
        ) from None
    except (OSError, SyntaxError, ValueError) as exc:
        raise ImageRejectedError(f"corrupt image header: {exc}") from None


def _frames(data: bytes, img: Image.Image, limit: int, gif: int | None) -> int:
    """How many frames the file holds (GIF and TIFF counted up to limit + 1 by a bounded walk, never
    with Pillow's n_frames, which walks them all in Python; ``gif``: the GIF's, counted before it was
    opened); others declare it in their header."""
    if img.format == "GIF":
        return gif if gif is not None else gif_frames(data, limit)
    if img.format == "TIFF":
        return tiff_pages(data, limit)
    if img.format in ("WEBP", "MPO", "PNG"):
        return int(getattr(img, "n_frames", 1) or 1)
    return 1


@functools.cache
def _pillow_orients_tiff() -> bool:
    """Whether this Pillow turns a TIFF upright itself (Pillow 13 does: the size swapped at open, the
    pixels turned as they load, every orientation), told by a 2 x 1 TIFF tagged "turn 90°"."""
    buffer = io.BytesIO()
    Image.new("L", (2, 1)).save(buffer, "TIFF", tiffinfo={0x0112: 6})
    with Image.open(buffer) as probe:
        return probe.size == (1, 2)


def oriented_by_pillow(img: Image.Image) -> bool:
    """Whether Pillow has turned this picture upright itself, so that its orientation tag must not be
    applied a second time (a TIFF, with a Pillow that does: ``_pillow_orients_tiff``)."""
    return img.format == "TIFF" and _pillow_orients_tiff()


def _orientation(data: bytes, img: Image.Image) -> int:
    """The EXIF orientation still to apply (1: upright, or already made so by Pillow). A PNG's EXIF
    is found by walking its chunks: Pillow's getexif decodes the whole PNG to look for it after the
    pixel data."""
    try:
        if oriented_by_pillow(img):
            return 1
        if img.format == "PNG" and "exif" not in img.info:
            body = png_exif(data)
            if body is None:
                return 1
            exif = Image.Exif()
            exif.load(body)
            return int(exif.get(0x0112, 1))
        return int(img.getexif().get(0x0112, 1))
    except DecompressionBombError:
        raise
    except Exception:  # a broken EXIF block is not worth rejecting the picture for
        return 1


def probe_image(data: bytes, options: ImageOptions) -> ImageProbe:
    """Check an encoded image from its header and structure alone; raises ImageRejectedError or a
    subclass (DecompressionBombError for every limit on the work it declares)."""
    if not data:
        raise ImageRejectedError("empty image data")
    if len(data) > options.max_bytes:
        raise ImageRejectedError(
            f"image is {len(data)} bytes; the limit is {options.max_bytes} "
            "(MEMSTORE_ENCODER_MAX_IMAGE_BYTES): re-encode or downscale it"
        )
    # Before Pillow reads it: Pillow's own walk to the frame header is as long as the file, and so are
    # its walks over a PNG's chunks and over the blocks before a GIF's first frame.
    jpeg = jpeg_layout(data, max_scans=options.max_jpeg_scans) if data[:3] == b"\xff\xd8\xff" else None
    if data[: len(PNG_SIGNATURE)] == PNG_SIGNATURE:
        png_chunks(data)
    gif = gif_frames(data, options.max_frames) if data[:6] in (b"GIF87a", b"GIF89a") else None
    with _open(data) as img:
        width, height = img.size
        fmt = img.format or "unknown"
        if width * height > options.max_pixels:
            raise DecompressionBombError(
                f"image is {width}x{height} = {width * height} pixels; the limit is {options.max_pixels} "
                "(MEMSTORE_ENCODER_MAX_IMAGE_PIXELS): downscale it before sending",
                limit=options.max_pixels,
            )
        if img.mode not in ALLOWED_MODES:
            raise ImageRejectedError(
                f"image mode {img.mode} is not supported; send greyscale (8 or 16 bits, or float), RGB(A), "
                "palette or CMYK"
            )
        frames = _frames(data, img, options.max_frames, gif)
        if frames > options.max_frames:
            raise DecompressionBombError(
                f"image has more than {options.max_frames} frames; the limit is {options.max_frames} "
                "(MEMSTORE_ENCODER_MAX_IMAGE_FRAMES): only the first is used, send it alone",
                limit=options.max_frames,
            )
        orientation = _orientation(data, img)
        mode = img.mode
    if orientation in TRANSPOSED:
        width, height = height, width
    return ImageProbe(fmt, width, height, orientation, mode, frames, jpeg, options)


def _inline(data: bytes, probe: ImageProbe, options: ImageOptions) -> bool:
    """Whether the probe proves the decode cheap: linear in pixels, with few of them."""
    if options.decode_workers <= 0:
        return True
    if probe.mode in HIGH_BIT_MODES:
        return False
    if probe.jpeg is not None:  # sequential JPEG: one scan per component at most
        return not probe.jpeg.progressive and probe.jpeg.scans <= max(1, probe.jpeg.components)
    return (
        probe.format in _SIMPLE_FORMATS
        and probe.width * probe.height <= options.inline_max_pixels
        and len(data) <= INLINE_MAX_BYTES
    )


def is_light(data: bytes, probe: ImageProbe, plan: TilePlan) -> bool:
    """Whether preparing this image's views is cheap and short: one view of a small picture decoded
    in this process. The preprocessing pool takes such images before their tenant's heavy ones of the
    same class (``encoder.workers``), so a query's picture does not queue behind its tenant's burst
    of huge decodes."""
    return plan.n_units == 1 and probe.width * probe.height <= LIGHT_MAX_PIXELS and _inline(data, probe, probe.options)


def decode_image(
    data: bytes,
    options: ImageOptions | None = None,
    *,
    probe: ImageProbe | None = None,
    min_size: tuple[int, int] | Callable[[int, int], tuple[int, int]] | None = None,
    grey: bool = False,
    priority: Priority = Priority.BACKGROUND,
) -> Image.Image:
    """Decode the first frame of an image under the decode budget: upright (EXIF orientation
    applied), 8-bit, mode L, RGB or RGBA (RGBA where it has transparency; L always when ``grey``).

    ``min_size`` (upright width, height, or a function of the upright size giving them) is the
    smallest picture the caller needs: JPEGs decode at a reduced scale and 16-bit or float rasters
    are box-reduced down to it; other images keep their size. ``probe`` is the header check already
    made (``probe_image``); without it the check runs here, against ``options``. ``priority``: the
    caller's class, which orders the wait for a decode worker (a query's picture first; thumbnails,
    OCR and bulk ingest, the default, last).
    Raises ImageRejectedError, DecompressionBombError, or DecodeTimeoutError past the time limit.
    """
    if probe is None:
        probe = probe_image(data, options or ImageOptions())
    opts = options or probe.options
    want = min_size(probe.width, probe.height) if callable(min_size) else min_size
    min_raw = None if want is None else ((want[1], want[0]) if probe.orientation in TRANSPOSED else want)
    return _decode(data, probe, DecodeJob(min_raw, probe.orientation, grey), opts, priority)


def _decode(
    data: bytes, probe: ImageProbe, job: DecodeJob, opts: ImageOptions, priority: Priority = Priority.BACKGROUND
) -> Image.Image:
    """The decode itself, once the checks have passed: the one place pixels are decoded, in this
    process when ``_inline`` proves it cheap, else in a worker of the decode pool."""
    if _inline(data, probe, opts):
        try:
            return decode_here(data, job)
        except Exception as exc:
            raise decode_error(exc) from None
    return pool(opts.decode_workers).decode(data, job, opts.decode_timeout_s, priority=priority)


def plan_for(probe: ImageProbe, spec: ImageSpec, options: ImageOptions) -> TilePlan:
    return plan_tiles(
        probe.width, probe.height, spec.size, max_tiles=options.max_tiles, tile_threshold=options.tile_threshold
    )


def _to_rgb(img: Image.Image) -> Image.Image:
    """RGB from decode_image's L, RGB or RGBA; transparent areas read as white paper."""
    if img.mode == "RGB":
        return img
    if img.mode == "RGBA":
        flat = Image.new("RGB", img.size, (255, 255, 255))
        flat.paste(img, mask=img.getchannel("A"))
        return flat
    return img.convert("RGB")


# The "shortest" view resizes the whole picture and crops it (as open_clip does) while that resized
# picture holds at most this many views' pixels; past it (a 1 x 20000 strip would resize to 224 x
# 4,480,000, gigabytes), only the crop is resampled.
_RESIZED_VIEWS = 16


def _global_view(img: Image.Image, spec: ImageSpec) -> Image.Image:
    """The model's standard preprocessing, mirroring open_clip/torchvision sizes and rounding."""
    s, interp = spec.size, _INTERPOLATION.get(spec.interpolation, Image.Resampling.BICUBIC)
    w, h = img.size
    if spec.resize_mode == "squash":
        return img.resize((s, s), interp)
    if spec.resize_mode == "longest":
        scale = s / max(w, h)
        fitted = img.resize((max(1, round(w * scale)), max(1, round(h * scale))), interp)
        canvas = Image.new("RGB", (s, s), (spec.fill_color,) * 3)
        canvas.paste(fitted, ((s - fitted.width) // 2, (s - fitted.height) // 2))
        return canvas
    # "shortest": shorter side to s (torchvision's int() rounding), then centre crop.
    nw, nh = (s, int(s * h / w)) if w <= h else (int(s * w / h), s)
    left, top = round((nw - s) / 2.0), round((nh - s) / 2.0)
    if (nw, nh) == (w, h):
        return img.crop((left, top, left + s, top + s))
    if nw * nh > _RESIZED_VIEWS * s * s:
        # The crop's rectangle in source pixels, resampled alone: Pillow maps each output pixel's
        # centre through the box as through resize-then-crop, with the same filter; only the order of
        # its two passes may differ, and with it the rounding between them (a level or so on a photo).
        sx, sy = w / nw, h / nh
        box = (left * sx, top * sy, min(w, (left + s) * sx), min(h, (top + s) * sy))
        return img.resize((s, s), interp, box=box)
    return img.resize((nw, nh), interp).crop((left, top, left + s, top + s))


def _needed_size(probe: ImageProbe, plan: TilePlan, spec: ImageSpec) -> tuple[int, int]:
    """Smallest upright size that still feeds every view without upscaling."""
    w, h = probe.width, probe.height
    scale = spec.size / min(w, h)
    if plan.tiles:
        scale = max(scale, plan.content[2] / w, plan.content[3] / h)
    return math.ceil(w * min(1.0, scale)), math.ceil(h * min(1.0, scale))


@dataclass(frozen=True)
class SharedDecode:
    """Another use of the picture ``load_views`` decodes, so the image is decoded once for both.

    ``min_size`` (a function of the upright width and height, as ``decode_image``'s) is the smallest
    picture the use needs; ``take`` is called only when the views' decode covers it. ``take`` receives the decoded
    picture (upright, 8-bit L, RGB or RGBA) once the views are made, in the decoding thread; it may
    change it (it is no longer used), and should keep only what it needs of it. Its errors are logged,
    never the views' failure; it is not called when the decode fails (a refused image, a bomb).
    """

    min_size: Callable[[int, int], tuple[int, int]]
    take: Callable[[Image.Image], None]


def load_views(
    data: bytes,
    probe: ImageProbe,
    plan: TilePlan,
    spec: ImageSpec,
    *,
    share: SharedDecode | None = None,
    priority: Priority = Priority.BACKGROUND,
) -> np.ndarray:
    """Decode an image into its views: uint8 array (1 + len(plan.tiles), size, size, 3).

    View 0 is the global view; view i + 1 is plan.tiles[i]. The decode runs under the budget of the
    options the probe was checked against. ``share``: another use of the decoded picture (above).
    ``priority``: the request's class, its place in the wait for a decode worker (``decode_image``).
    """
    # The decode is sized for the views alone, shared or not: a larger one (JPEG's reduced decode at
    # another scale) would cut slightly different views, and an image must get the same vector at
    # ingest as when it is searched with.
    decoded = decode_image(data, probe=probe, min_size=_needed_size(probe, plan, spec), priority=priority)
    rgb = _to_rgb(decoded)
    views = [np.asarray(_global_view(rgb, spec))]
    if plan.tiles:
        s = spec.size
        ox, oy, fw, fh = plan.content
        fill = tuple(round(m * 255) for m in spec.mean)  # normalises to ~0: padding reads as "nothing"
        canvas = Image.new("RGB", plan.canvas, fill)
        canvas.paste(rgb.resize((fw, fh), _INTERPOLATION.get(spec.interpolation, Image.Resampling.BICUBIC)), (ox, oy))
        # One conversion of the canvas and numpy slices of it: a Pillow crop and conversion per tile
        # held the interpreter lock for most of a huge image's preparation, which every other thread
        # (the scheduler's, a query's decode) then waited for. The pixels are the same.
        pixels = np.asarray(canvas)
        for tile in plan.tiles:
            x, y = tile.col * s, tile.row * s
            views.append(pixels[y : y + s, x : x + s])
    stacked = np.stack(views)
    del views, rgb
    if share is not None and _covers(decoded, share.min_size(probe.width, probe.height), probe):
        try:
            share.take(decoded)
        except Exception as exc:  # the other use's failure, not the embedding's
            log.info("a shared decode's other use failed: %s: %s", type(exc).__name__, exc)
    return stacked


def _covers(picture: Image.Image, need: tuple[int, int], probe: ImageProbe) -> bool:
    """The decoded picture is at least as large as the other use needs, or is the whole image (else
    that use decodes on its own)."""
    return picture.width >= min(need[0], probe.width) and picture.height >= min(need[1], probe.height)
