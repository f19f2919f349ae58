"""Image intake: format allow-list, limits checked before decoding, EXIF, modes, views."""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
import open_clip
import pytest
import torch
from PIL import Image, ImageOps

from encoder.errors import DecompressionBombError, ImageRejectedError
from encoder.images import ImageOptions, ImageSpec, load_views, plan_for, probe_image
from tests.encoder.enc_helpers import make_image

SPEC = ImageSpec(16, (0.5, 0.5, 0.5), (0.25, 0.25, 0.25))
OPTS = ImageOptions(max_tiles=64)


def views_of(data: bytes, spec: ImageSpec = SPEC, opts: ImageOptions = OPTS) -> np.ndarray:
    probe = probe_image(data, opts)
    return load_views(data, probe, plan_for(probe, spec, opts), spec)


def header_only_png(width: int, height: int) -> bytes:
    """A PNG that declares a size but carries no pixel data at all."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IEND", b"")


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP", "GIF", "BMP", "TIFF"])
def test_allowed_formats_decode_to_rgb_views(fmt):
    data = make_image(40, 30, fmt)
    probe = probe_image(data, OPTS)
    assert (probe.width, probe.height) == (40, 30)
    views = views_of(data)
    assert views.shape == (1 + len(plan_for(probe, SPEC, OPTS).tiles), 16, 16, 3) and views.dtype == np.uint8


@pytest.mark.parametrize("fmt", ["PPM", "ICO", "PDF", "TGA"])
def test_other_formats_are_refused_with_the_list_of_accepted_ones(fmt):
    with pytest.raises(ImageRejectedError, match="unsupported or unrecognised image format; send JPEG, PNG"):
        probe_image(make_image(32, 32, fmt), OPTS)


def test_garbage_and_empty_input_are_refused():
    with pytest.raises(ImageRejectedError, match="unsupported or unrecognised"):
        probe_image(b"definitely not an image" * 10, OPTS)
    with pytest.raises(ImageRejectedError, match="empty"):
        probe_image(b"", OPTS)


def test_truncated_file_passes_the_header_check_then_fails_to_decode():
    data = make_image(200, 200, "PNG")
    cut = data[: len(data) // 2]
    probe = probe_image(cut, OPTS)  # the header is intact
    with pytest.raises(ImageRejectedError, match="corrupt or truncated"):
        load_views(cut, probe, plan_for(probe, SPEC, OPTS), SPEC)


def test_too_many_pixels_is_refused_from_the_header_alone():
    # No pixel data exists in this file: refusing it proves nothing was decoded.
    data = header_only_png(9000, 9000)
    with pytest.raises(DecompressionBombError, match=r"9000x9000 = 81000000 pixels; the limit is 64000000"):
        probe_image(data, ImageOptions())
    # Beyond Pillow's own hard limit the answer is the same dedicated error.
    with pytest.raises(DecompressionBombError):
        probe_image(header_only_png(60000, 60000), ImageOptions(max_pixels=10**10))
    assert issubclass(DecompressionBombError, ImageRejectedError)


def test_pixel_and_byte_limits_are_configurable():
    data = make_image(100, 100, "PNG")
    with pytest.raises(DecompressionBombError, match="MEMSTORE_ENCODER_MAX_IMAGE_PIXELS"):
        probe_image(data, ImageOptions(max_pixels=9999))
    with pytest.raises(ImageRejectedError, match="MEMSTORE_ENCODER_MAX_IMAGE_BYTES") as info:
        probe_image(data, ImageOptions(max_bytes=100))
    assert not isinstance(info.value, DecompressionBombError)


def test_exif_orientation_is_applied():
    img = Image.fromarray(np.random.default_rng(1).integers(0, 256, (20, 40, 3), dtype=np.uint8))
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise on display
    buf = io.BytesIO()
    img.save(buf, "JPEG", exif=exif, quality=95)
    data = buf.getvalue()
    probe = probe_image(data, OPTS)
    assert (probe.width, probe.height, probe.orientation) == (20, 40, 6)
    upright = ImageOps.exif_transpose(Image.open(io.BytesIO(data)))
    png = io.BytesIO()
    upright.save(png, "PNG")
    assert np.array_equal(views_of(data), views_of(png.getvalue()))


@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "TIFF"])
@pytest.mark.parametrize("orientation", [3, 6, 8])
def test_every_format_is_turned_upright_once(fmt: str, orientation: int) -> None:
    """The picture as shown, whichever format carries the tag: Pillow turns a TIFF itself (13 and
    later), which must not be turned a second time; JPEG and PNG are turned by the decoder."""
    shown = Image.new("RGB", (40, 20), (255, 0, 0))
    shown.paste((0, 0, 255), (20, 0, 40, 20))  # red left, blue right, as it is shown
    undo = {3: Image.Transpose.ROTATE_180, 6: Image.Transpose.ROTATE_90, 8: Image.Transpose.ROTATE_270}
    stored = shown.transpose(undo[orientation])  # what a camera writes, with the tag that turns it back
    buf = io.BytesIO()
    if fmt == "TIFF":
        stored.save(buf, fmt, tiffinfo={0x0112: orientation})
    else:
        exif = Image.Exif()
        exif[0x0112] = orientation
        stored.save(buf, fmt, exif=exif, **({"quality": 95} if fmt == "JPEG" else {}))
    probe = probe_image(buf.getvalue(), OPTS)
    assert (probe.width, probe.height) == (40, 20)
    png = io.BytesIO()
    shown.save(png, "PNG")
    # JPEG blurs the red/blue edge; a picture turned wrong differs on half of its pixels (a mean near 80).
    assert np.abs(views_of(buf.getvalue()).astype(int) - views_of(png.getvalue()).astype(int)).mean() < 10


def test_a_png_with_a_large_text_chunk_is_a_picture() -> None:
    """An image generator's PNG carries its workflow in a text chunk, often over Pillow's 1 MiB."""
    from PIL import PngImagePlugin

    info = PngImagePlugin.PngInfo()
    info.add_text("workflow", "{}" * 2_500_000, zip=True)
    buf = io.BytesIO()
    Image.new("RGB", (40, 20), (255, 0, 0)).save(buf, "PNG", pnginfo=info)
    assert len(buf.getvalue()) < 100_000
    probe = probe_image(buf.getvalue(), OPTS)
    assert (probe.width, probe.height) == (40, 20)
    assert views_of(buf.getvalue()).shape[-1] == 3


def test_transparency_becomes_white_and_other_modes_become_rgb():
    clear = io.BytesIO()
    Image.new("RGBA", (20, 20), (0, 0, 0, 0)).save(clear, "PNG")
    assert (views_of(clear.getvalue()) == 255).all()
    for mode in ("L", "P", "CMYK", "1", "LA"):
        fmt = "JPEG" if mode == "CMYK" else "PNG"
        assert views_of(make_image(20, 20, fmt, mode=mode)).shape == (1, 16, 16, 3)


def test_sixteen_bit_greyscale_is_scaled_not_clipped():
    ramp = (np.arange(32 * 32, dtype=np.uint16).reshape(32, 32) * 60).astype(np.uint16)  # up to ~61k
    buf = io.BytesIO()
    Image.fromarray(ramp).save(buf, "PNG")
    v = views_of(buf.getvalue())[0]
    assert v.min() < 40 and 100 < v.mean() < 160  # Pillow's plain convert would be almost all white


@pytest.mark.parametrize("mode", ["shortest", "squash", "longest"])
def test_global_view_matches_open_clip_preprocessing_exactly(mode):
    spec = ImageSpec(64, open_clip.OPENAI_DATASET_MEAN, open_clip.OPENAI_DATASET_STD, resize_mode=mode)
    transform = open_clip.image_transform(64, is_train=False, resize_mode=mode)
    for w, h in [(300, 170), (170, 300), (64, 64), (50, 30)]:
        data = make_image(w, h, "PNG", seed=w)
        ours = torch.as_tensor(views_of(data, spec, ImageOptions(max_tiles=0))[:1]).permute(0, 3, 1, 2)
        ours = ours.float().div(255.0).sub(torch.tensor(spec.mean).view(1, 3, 1, 1))
        ours = ours.div(torch.tensor(spec.std).view(1, 3, 1, 1))[0]
        reference = transform(Image.open(io.BytesIO(data)))
        if mode == "longest":  # open_clip pads with fill 0 after normalising; only compare the image area
            assert torch.allclose(ours[:, 20:44, :], reference[:, 20:44, :], atol=1e-5)
        else:
            assert torch.equal(ours, reference), (w, h)


def test_tiles_are_the_pixels_of_their_grid_cell():
    data = make_image(128, 128, "PNG", seed=3)
    pixels = np.asarray(Image.open(io.BytesIO(data)))
    views = views_of(data)  # 16-px model input, threshold 32: an 8x8 grid that fits exactly
    assert views.shape == (65, 16, 16, 3)
    probe = probe_image(data, OPTS)
    plan = plan_for(probe, SPEC, OPTS)
    for view, tile in zip(views[1:], plan.tiles, strict=True):
        x0, y0, x1, y1 = tile.box
        assert np.array_equal(view, pixels[y0:y1, x0:x1])


def test_large_jpeg_decodes_at_reduced_size_with_the_same_picture():
    rng = np.random.default_rng(5)
    small = rng.integers(0, 256, (12, 16, 3), dtype=np.uint8)
    big = Image.fromarray(small).resize((1600, 1200), Image.Resampling.NEAREST)  # flat blocks survive JPEG
    jpeg, png = io.BytesIO(), io.BytesIO()
    big.save(jpeg, "JPEG", quality=95)
    big.save(png, "PNG")
    opts = ImageOptions(max_tiles=0)
    a, b = views_of(jpeg.getvalue(), opts=opts), views_of(png.getvalue(), opts=opts)
    assert a.shape == b.shape
    assert np.abs(a.astype(int) - b.astype(int)).mean() < 4


def smooth_strip(width: int, height: int) -> bytes:
    """A picture whose colour changes smoothly along its long side (as a photo's would)."""
    yy, xx = np.mgrid[0:height, 0:width]
    t = yy / height if height > width else xx / width
    pixels = np.stack([127 + 100 * np.sin(t * 40), 127 + 100 * np.cos(t * 23), 255 * t], axis=-1)
    buf = io.BytesIO()
    Image.fromarray(pixels.astype(np.uint8)).save(buf, "PNG")
    return buf.getvalue()


@pytest.mark.parametrize("size", [(1, 20_000), (20_000, 1)])
def test_a_one_pixel_strip_gets_its_view_without_resizing_all_of_it(monkeypatch, size):
    """A 1 x 20000 PNG is a few hundred bytes and 20,000 pixels, inside every limit; resizing its
    short side to 224 before cropping wrote a 224 x 4,480,000 picture (4 GB) first. Only the view's
    pixels may be written: any resize to more than a few views' size fails the test at once."""
    spec = ImageSpec(224, open_clip.OPENAI_DATASET_MEAN, open_clip.OPENAI_DATASET_STD)
    opts = ImageOptions(max_tiles=0)
    data = smooth_strip(*size)
    assert len(data) < 100_000
    resize = Image.Image.resize
    written: list[tuple[int, int]] = []

    def bounded(self, out_size, *args, **kwargs):
        written.append(tuple(out_size))
        assert out_size[0] * out_size[1] <= 4 * 224 * 224, f"resizing to {out_size}"
        return resize(self, out_size, *args, **kwargs)

    monkeypatch.setattr(Image.Image, "resize", bounded)
    probe = probe_image(data, opts)
    views = load_views(data, probe, plan_for(probe, spec, opts), spec)
    assert views.shape == (1, 224, 224, 3) and written == [(224, 224)]
    # The view is the middle of the strip, stretched: the colour of its middle pixel everywhere.
    middle = np.asarray(Image.open(io.BytesIO(data)).convert("RGB")).reshape(-1, 3)[max(size) // 2]
    assert np.abs(views[0].astype(int) - middle.astype(int)).max() <= 2


@pytest.mark.parametrize("size", [(3, 3000), (3000, 3), (5, 2000), (2000, 7)])
def test_a_long_strips_view_is_open_clips_own(size):
    """Past 16 views' pixels the crop alone is resampled; the pixels are still open_clip's."""
    spec = ImageSpec(64, open_clip.OPENAI_DATASET_MEAN, open_clip.OPENAI_DATASET_STD)
    data = smooth_strip(*size)
    ours = torch.as_tensor(views_of(data, spec, ImageOptions(max_tiles=0))[0]).float()
    reference = open_clip.image_transform(64, is_train=False)(Image.open(io.BytesIO(data)))
    pixels = (reference * torch.tensor(spec.std).view(3, 1, 1) + torch.tensor(spec.mean).view(3, 1, 1)) * 255
    assert torch.allclose(ours, pixels.permute(1, 2, 0), atol=1.01)
