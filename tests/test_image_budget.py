"""Every image is decoded under a budget: the work a file declares is bounded before decoding (JPEG
scans, frames, modes), a decode that runs too long is stopped, and 16-bit and float rasters become
8-bit without full-resolution float copies. Each test reproduces a finding as it was found."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from bench.cost import scan_bomb
from encoder import decode_budget
from encoder.errors import DecodeTimeoutError, DecompressionBombError, ImageRejectedError
from encoder.images import ImageOptions, decode_image, probe_image
from memstore.media import ocr, thumbnails

ROOT = Path(__file__).resolve().parent.parent


def png_of(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return buf.getvalue()


# -- finding 1: the decode-time bomb -----------------------------------------------------------------


def test_a_progressive_jpeg_with_thousands_of_scans_is_refused_from_its_markers() -> None:
    bomb = scan_bomb(4000, 4000, 20_000)
    assert len(bomb) < 1_000_000  # small, and 16 megapixels: inside the query limits
    options = ImageOptions(max_pixels=16_000_000)
    with pytest.raises(DecompressionBombError, match=r"more than 64 scans.*MEMSTORE_ENCODER_MAX_JPEG_SCANS") as info:
        probe_image(bomb, options)
    assert info.value.limit == 64
    # Every consumer refuses it the same way: the encoder's views, thumbnails and OCR.
    with pytest.raises(DecompressionBombError, match="scans"):
        decode_image(bomb, options)
    assert thumbnails.make(bomb) is None
    with pytest.raises(ocr.OcrFailedError, match="scans"):
        ocr.prepare(bomb)


def test_the_marker_walk_counts_scans_as_the_decoder_reads_them() -> None:
    buf = io.BytesIO()
    rng = np.random.default_rng(0)
    picture = Image.fromarray(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8))
    picture.save(buf, "JPEG", progressive=True)
    layout = decode_budget.jpeg_layout(buf.getvalue(), max_scans=64)
    assert layout.progressive and 6 <= layout.scans <= 12 and layout.components == 3
    # Noisy entropy-coded data holds 0xFF00 stuffing; restart markers appear inside the scans.
    buf = io.BytesIO()
    picture.save(buf, "JPEG", restart_marker_blocks=1)
    data = buf.getvalue()
    assert b"\xff\x00" in data and b"\xff\xd0" in data
    layout = decode_budget.jpeg_layout(data, max_scans=64)
    assert (layout.progressive, layout.scans, layout.components) == (False, 1, 3)
    # Scans hidden behind garbage between segments still count (libjpeg skips the garbage too).
    eoi = data.rindex(b"\xff\xd9")
    sos = data.rindex(b"\xff\xda")
    hidden = data[:eoi] + (b"junk" + data[sos:eoi]) * 70 + data[eoi:]
    with pytest.raises(DecompressionBombError, match="more than 64 scans"):
        decode_budget.jpeg_layout(hidden, max_scans=64)


def test_a_normal_progressive_jpeg_decodes_and_the_limit_is_configurable() -> None:
    data = scan_bomb(64, 48, 10)
    assert decode_image(data, ImageOptions()).size == (64, 48)
    with pytest.raises(DecompressionBombError, match="more than 8 scans"):
        probe_image(data, ImageOptions(max_jpeg_scans=8))


def test_a_decode_past_the_time_limit_is_stopped_and_the_pool_serves_the_next_image() -> None:
    slow = scan_bomb(2000, 2000, 3000)  # seconds of decoding, allowed in by a test-only scan limit
    options = ImageOptions(max_jpeg_scans=10_000, decode_timeout_s=0.2, decode_workers=1)
    pool = decode_budget.pool(1)
    killed = pool.killed
    with pytest.raises(DecodeTimeoutError, match=r"time limit of 0.2 s.*MEMSTORE_ENCODER_DECODE_TIMEOUT_S") as info:
        decode_image(slow, options)
    assert isinstance(info.value, DecompressionBombError) and info.value.limit == 0.2
    assert pool.killed == killed + 1
    small = Image.fromarray(np.random.default_rng(1).integers(0, 256, (64, 64, 3), dtype=np.uint8))
    through_pool = ImageOptions(decode_workers=1, inline_max_pixels=0)  # a PNG the pool must decode
    decoded = decode_image(png_of(small), through_pool)
    assert decoded.mode == "RGB" and np.array_equal(np.asarray(decoded), np.asarray(small))
    assert pool.killed == killed + 1


def test_a_decoder_error_in_a_worker_is_a_rejection_and_the_worker_stays() -> None:
    options = ImageOptions(decode_workers=1, inline_max_pixels=0)
    whole = png_of(Image.new("RGB", (300, 300), (1, 2, 3)))
    pool = decode_budget.pool(1)
    killed = pool.killed
    with pytest.raises(ImageRejectedError, match="corrupt or truncated"):
        decode_image(whole[: len(whole) // 2], options)
    assert decode_image(whole, options).getpixel((0, 0)) == (1, 2, 3)
    assert pool.killed == killed


def test_cheap_images_decode_in_process_and_costly_ones_in_a_worker() -> None:
    baseline = io.BytesIO()
    Image.new("RGB", (4000, 3000)).save(baseline, "JPEG")
    options = ImageOptions()
    inline = decode_budget.decode_here
    calls: list[str] = []

    def spy(data: bytes, job: decode_budget.DecodeJob) -> Image.Image:
        calls.append("inline")
        return inline(data, job)

    import encoder.images as images

    original = images.decode_here
    images.decode_here = spy  # type: ignore[assignment]
    try:
        decode_image(baseline.getvalue(), options, min_size=(500, 375))
        decode_image(png_of(Image.new("RGB", (64, 64))), options)
        assert calls == ["inline", "inline"]
        decode_image(scan_bomb(200, 200, 2), options)  # progressive: the worker
        tiff = io.BytesIO()
        Image.new("RGB", (64, 64)).save(tiff, "TIFF")
        decode_image(tiff.getvalue(), options)  # TIFF: the worker
        assert calls == ["inline", "inline"]
    finally:
        images.decode_here = original  # type: ignore[assignment]


# -- frames: only the first is decoded, and there are not too many ------------------------------------


def test_a_multi_frame_gif_decodes_its_first_frame_only() -> None:
    frames = [Image.new("P", (40, 30), i) for i in range(5)]
    for i, frame in enumerate(frames):
        frame.putpalette([v for c in range(256) for v in ((c * 40) % 256, i * 50, 0)])
    buf = io.BytesIO()
    frames[0].save(buf, "GIF", save_all=True, append_images=frames[1:], duration=10, loop=0)
    data = buf.getvalue()
    probe = probe_image(data, ImageOptions())
    assert probe.frames == 5
    first = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    assert np.array_equal(np.asarray(decode_image(data, ImageOptions()).convert("RGB")), first)
    # Pillow is never asked to go past the first frame.
    with pytest.raises(DecompressionBombError, match=r"more than 3 frames.*MEMSTORE_ENCODER_MAX_IMAGE_FRAMES"):
        probe_image(data, ImageOptions(max_frames=3))


def test_tiff_pages_and_webp_frames_count_against_the_frame_limit() -> None:
    pages = [Image.new("L", (16, 16), i * 40) for i in range(4)]
    buf = io.BytesIO()
    pages[0].save(buf, "TIFF", save_all=True, append_images=pages[1:])
    assert probe_image(buf.getvalue(), ImageOptions()).frames == 4
    assert decode_image(buf.getvalue(), ImageOptions()).getpixel((0, 0)) == 0
    with pytest.raises(DecompressionBombError, match="frames"):
        probe_image(buf.getvalue(), ImageOptions(max_frames=2))
    if "WEBP" in decode_budget.ALLOWED_FORMATS:
        buf = io.BytesIO()
        pages[0].convert("RGB").save(buf, "WEBP", save_all=True, append_images=[p.convert("RGB") for p in pages[1:]])
        with pytest.raises(DecompressionBombError, match="frames"):
            probe_image(buf.getvalue(), ImageOptions(max_frames=2))


def test_a_mode_outside_the_allow_list_is_refused() -> None:
    lab = io.BytesIO()
    Image.new("LAB", (8, 8)).save(lab, "TIFF")
    with pytest.raises(ImageRejectedError, match="image mode LAB is not supported"):
        probe_image(lab.getvalue(), ImageOptions())


# -- finding 2: 16-bit and float rasters --------------------------------------------------------------


def test_a_float_tiff_and_a_sixteen_bit_png_are_mapped_to_eight_bits_sensibly() -> None:
    ramp = np.linspace(0.0, 1.0, 256, dtype=np.float32).reshape(1, 256).repeat(4, axis=0)
    buf = io.BytesIO()
    Image.fromarray(ramp, "F").save(buf, "TIFF")
    grey = np.asarray(decode_image(buf.getvalue(), ImageOptions()))
    assert grey.shape == (4, 256) and grey[0, 0] == 0 and grey[0, -1] == 255  # [0, 1] floats: 0..255
    assert np.abs(grey[0].astype(int) - np.arange(256)).max() <= 1
    wide = np.linspace(-50.0, 950.0, 256, dtype=np.float32).reshape(1, 256).repeat(4, axis=0)
    buf = io.BytesIO()
    Image.fromarray(wide, "F").save(buf, "TIFF")
    grey = np.asarray(decode_image(buf.getvalue(), ImageOptions()))
    assert grey[0, 0] == 0 and grey[0, -1] == 255 and np.all(np.diff(grey[0].astype(int)) >= 0)
    sixteen = (np.arange(256, dtype=np.uint16) * 257).reshape(1, 256).repeat(4, axis=0)  # 0..65535
    grey = np.asarray(decode_image(png_of(Image.fromarray(sixteen)), ImageOptions()))
    assert np.abs(grey[0].astype(int) - np.arange(256)).max() <= 1  # scaled, not clipped to white
    # Thumbnails and OCR read them too (Pillow's plain path failed or clipped).
    assert thumbnails.make(png_of(Image.fromarray(sixteen))) is not None
    assert ocr.prepare(png_of(Image.fromarray(sixteen))).mode == "L"


def test_a_high_bit_depth_raster_is_reduced_to_what_the_caller_needs() -> None:
    big = np.zeros((1200, 1600), dtype=np.uint16)
    big[:, 800:] = 60_000
    data = png_of(Image.fromarray(big))
    reduced = decode_image(data, ImageOptions(), min_size=(400, 300))
    assert reduced.size == (400, 300)
    pixels = np.asarray(reduced)
    assert pixels[:, :190].max() == 0 and pixels[:, 210:].min() == 255


MEASURE = textwrap.dedent(
    """
    import json, sys
    sys.path.insert(0, {root!r})

    def peak_kib():  # VmHWM: this process's own peak (ru_maxrss carries the parent's across exec)
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) for line in status if line.startswith("VmHWM"))

    data = open(sys.argv[1], "rb").read()
    from encoder.images import ImageOptions, ImageSpec, load_views, plan_for, probe_image
    options = ImageOptions(decode_workers=0)  # in this process, where its peak memory is measured
    spec = ImageSpec(224, (0.5, 0.5, 0.5), (0.25, 0.25, 0.25))
    before = peak_kib()
    probe = probe_image(data, options)
    views = load_views(data, probe, plan_for(probe, spec, options), spec)
    after = peak_kib()
    print(json.dumps({{"growth_kib": after - before, "shape": list(views.shape), "mean": float(views.mean())}}))
    """
)


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads VmHWM from /proc")
def test_converting_a_large_float_tiff_takes_bounded_memory(tmp_path: Path) -> None:
    """The finding: an 8000x8000 float TIFF of 388 KB took a process from 1.0 to 3.0 GB. Its raster
    alone is 4 bytes a pixel (as Pillow holds RGB); the conversion may add little to the decode."""
    side = 4000
    values = np.zeros((side, side), dtype=np.float32)
    values[::7, ::5] = 1000.0
    path = tmp_path / "float.tif"
    Image.fromarray(values, "F").save(path, compression="tiff_deflate")
    del values
    done = subprocess.run(
        [sys.executable, "-c", MEASURE.format(root=str(ROOT)), str(path)],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    rgb_bytes = side * side * 3
    assert result["shape"][1:] == [224, 224, 3] and result["mean"] > 0
    # Before: float64 copies at full resolution, 9x the RGB size; now 2.6x (the raster, decoded once).
    assert 0 < result["growth_kib"] * 1024 < 5 * rgb_bytes, result


def test_probing_a_png_reads_its_exif_without_decoding_it() -> None:
    """Pillow's getexif on a PNG decodes the whole picture (looking for eXIf after the pixel data):
    the probe walks the chunks instead, so a PNG with broken pixel data still probes."""
    exif = Image.Exif()
    exif[0x0112] = 6
    buf = io.BytesIO()
    Image.new("RGB", (40, 20), (9, 9, 9)).save(buf, "PNG", exif=exif)
    data = buf.getvalue()
    assert probe_image(data, ImageOptions()).orientation == 6
    assert decode_image(data, ImageOptions()).size == (20, 40)  # upright
    start = data.index(b"IDAT") + 4
    broken = data[:start] + b"\x00" * 8 + data[start + 8 :]
    probe = probe_image(broken, ImageOptions())
    assert (probe.width, probe.height, probe.orientation) == (20, 40, 6)
    with pytest.raises(ImageRejectedError):
        decode_image(broken, ImageOptions())


def test_the_decode_budget_is_configured_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from encoder.settings import EncoderSettings

    for name, value in {
        "MEMSTORE_ENCODER_MAX_JPEG_SCANS": "12",
        "MEMSTORE_ENCODER_MAX_IMAGE_FRAMES": "3",
        "MEMSTORE_ENCODER_DECODE_TIMEOUT_S": "1.5",
        "MEMSTORE_ENCODER_DECODE_WORKERS": "0",
        "MEMSTORE_ENCODER_INLINE_MAX_PIXELS": "1000",
    }.items():
        monkeypatch.setenv(name, value)
    options = EncoderSettings().image_options()
    assert (options.max_jpeg_scans, options.max_frames, options.decode_timeout_s) == (12, 3, 1.5)
    assert (options.decode_workers, options.inline_max_pixels) == (0, 1000)
