"""Image decoding and view extraction with Pillow (no torch).

Order of checks: byte size, format allow-list and pixel count from the header (nothing decoded
yet), then the decode itself. Views are returned as uint8 HWC arrays: a quarter of the memory of
float tensors while they wait in the queue; normalisation happens per micro-batch on the device.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from .errors import DecompressionBombError, ImageRejectedError
from .tiling import TilePlan, plan_tiles

Image.init()  # load every plugin once, so the allow-list below can name formats Pillow registers late
# MPO: the multi-picture JPEG many cameras write. WEBP is left out if Pillow was built without it.
ALLOWED_FORMATS = tuple(f for f in ("JPEG", "MPO", "PNG", "WEBP", "GIF", "BMP", "TIFF") if f in Image.OPEN)
_TRANSPOSED = {5, 6, 7, 8}  # EXIF orientations that swap width and height
_INTERPOLATION = {
    "bicubic": Image.Resampling.BICUBIC,
    "bilinear": Image.Resampling.BILINEAR,
    "nearest": Image.Resampling.NEAREST,
    "lanczos": Image.Resampling.LANCZOS,
}


@dataclass(frozen=True)
class ImageOptions:
    max_tiles: int = 36
    tile_threshold: float = 2.0  # tile when the longer side exceeds this many model input sizes
    global_weight: float = 0.5  # share of the global view in the combined vector
    max_pixels: int = 64_000_000
    max_bytes: int = 32 * 1024 * 1024


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


def probe_image(data: bytes, options: ImageOptions) -> ImageProbe:
    """Check an encoded image from its header alone; raises ImageRejectedError or a subclass."""
    if not data:
        raise ImageRejectedError("empty image data")
    if len(data) > options.max_bytes:
        raise ImageRejectedError(
            f"image is {len(data)} bytes; the limit is {options.max_bytes} "
            "(MEMSTORE_ENCODER_MAX_IMAGE_BYTES): re-encode or downscale it"
        )
    with _open(data) as img:
        width, height = img.size
        fmt = img.format or "unknown"
        if width * height > options.max_pixels:
            raise DecompressionBombError(
                f"image is {width}x{height} = {width * height} pixels; the limit is {options.max_pixels} "
                "(MEMSTORE_ENCODER_MAX_IMAGE_PIXELS): downscale it before sending"
            )
        try:
            orientation = int(img.getexif().get(0x0112, 1))
        except Exception:  # a broken EXIF block is not worth rejecting the picture for
            orientation = 1
    if orientation in _TRANSPOSED:
        width, height = height, width
    return ImageProbe(fmt, width, height, orientation)


def plan_for(probe: ImageProbe, spec: ImageSpec, options: ImageOptions) -> TilePlan:
    return plan_tiles(
        probe.width, probe.height, spec.size, max_tiles=options.max_tiles, tile_threshold=options.tile_threshold
    )


def _to_rgb(img: Image.Image) -> Image.Image:
    if img.mode == "RGB":
        return img
    if img.mode in ("RGBA", "LA", "PA", "RGBa", "La") or (img.mode == "P" and "transparency" in img.info):
        rgba = img.convert("RGBA")
        flat = Image.new("RGB", rgba.size, (255, 255, 255))  # transparent areas read as white paper
        flat.paste(rgba, mask=rgba.getchannel("A"))
        return flat
    if img.mode.startswith("I") or img.mode == "F":
        # 16-bit / 32-bit greyscale: Pillow's convert would clip everything above 255 to white.
        arr = np.asarray(img, dtype=np.float64)
        top = float(arr.max()) if arr.size else 0.0
        if top > 255.0:
            arr = arr * (255.0 / top)
        grey = np.clip(np.rint(arr), 0, 255).astype(np.uint8)
        return Image.fromarray(grey).convert("RGB")
    return img.convert("RGB")


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
    resized = img.resize((nw, nh), interp) if (nw, nh) != (w, h) else img
    left, top = round((nw - s) / 2.0), round((nh - s) / 2.0)
    return resized.crop((left, top, left + s, top + s))


def _draft_size(probe: ImageProbe, plan: TilePlan, spec: ImageSpec) -> tuple[int, int]:
    """Smallest raw JPEG size that still feeds every view without upscaling."""
    w, h = probe.width, probe.height
    scale = spec.size / min(w, h)
    if plan.tiles:
        scale = max(scale, plan.content[2] / w, plan.content[3] / h)
    need = (math.ceil(w * min(1.0, scale)), math.ceil(h * min(1.0, scale)))
    return (need[1], need[0]) if probe.orientation in _TRANSPOSED else need


def load_views(data: bytes, probe: ImageProbe, plan: TilePlan, spec: ImageSpec) -> np.ndarray:
    """Decode an image into its views: uint8 array (1 + len(plan.tiles), size, size, 3).

    View 0 is the global view; view i + 1 is plan.tiles[i].
    """
    with _open(data) as img:
        if img.format in ("JPEG", "MPO"):
            img.draft(img.mode, _draft_size(probe, plan, spec))  # DCT-domain downscale: faster decode
        try:
            img.load()
            # The probe already read the orientation: skip parsing EXIF again for upright images.
            upright = (ImageOps.exif_transpose(img) or img) if probe.orientation != 1 else img
            rgb = _to_rgb(upright)
        except Image.DecompressionBombError as exc:
            raise DecompressionBombError(f"image refused as a decompression bomb: {exc}") from None
        except (OSError, SyntaxError, ValueError) as exc:
            raise ImageRejectedError(f"corrupt or truncated image data: {exc}") from None
    views = [np.asarray(_global_view(rgb, spec))]
    if plan.tiles:
        s = spec.size
        ox, oy, fw, fh = plan.content
        fill = tuple(round(m * 255) for m in spec.mean)  # normalises to ~0: padding reads as "nothing"
        canvas = Image.new("RGB", plan.canvas, fill)
        canvas.paste(rgb.resize((fw, fh), _INTERPOLATION.get(spec.interpolation, Image.Resampling.BICUBIC)), (ox, oy))
        for tile in plan.tiles:
            x, y = tile.col * s, tile.row * s
            views.append(np.asarray(canvas.crop((x, y, x + s, y + s))))
    return np.stack(views)
