"""Every image is decoded under a budget: the work a file declares is bounded before decoding (JPEG
scans, frames, modes), a decode that runs too long is stopped, and 16-bit and float rasters become
8-bit without full-resolution float copies. Each test reproduces a finding as it was found."""

from __future__ import annotations

import io
import json
import struct
import subprocess
import sys
import textwrap
import threading
import types
import zlib
from collections.abc import Callable
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


# -- structure walks before Pillow reads the file ------------------------------------------------------


def _chunk(kind: bytes, body: bytes = b"") -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def _refused_before_pillow_opens(monkeypatch: pytest.MonkeyPatch, data: bytes, match: str) -> None:
    """``data`` is refused by the walk over its structure, Pillow never asked to open it."""
    import encoder.images as images

    def never(_: bytes) -> Image.Image:
        raise AssertionError("Pillow was asked to open the file")

    monkeypatch.setattr(images, "_open", never)
    with pytest.raises(DecompressionBombError, match=match):
        probe_image(data, ImageOptions())


def test_every_chunk_of_a_png_is_counted_before_it_is_opened(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pillow reads a PNG's chunks one Python call each, those after the pixel data as it decodes;
    the count stopped at an eXIf chunk (and was not made when Pillow had found the EXIF itself), so
    hundreds of thousands of empty chunks after the pixels went through."""
    exif = Image.Exif()
    exif[0x0112] = 6
    buf = io.BytesIO()
    Image.new("RGB", (8, 8)).save(buf, "PNG", exif=exif)
    picture = buf.getvalue()
    assert picture.index(b"eXIf") < picture.index(b"IDAT")
    end = picture.index(b"IEND") - 4
    padded = picture[:end] + _chunk(b"zzZz") * (decode_budget.MAX_PNG_CHUNKS + 1) + picture[end:]
    assert len(padded) < 1_000_000
    assert probe_image(picture, ImageOptions()).orientation == 6  # the picture alone is fine
    _refused_before_pillow_opens(monkeypatch, padded, "more than 65536 chunks")
    # Chunks before the pixel data, without any EXIF: refused before Pillow walks them too.
    plain = png_of(Image.new("RGB", (8, 8)))
    idat = plain.index(b"IDAT") - 4
    _refused_before_pillow_opens(
        monkeypatch, plain[:idat] + _chunk(b"zzZz") * (decode_budget.MAX_PNG_CHUNKS + 1) + plain[idat:], "chunks"
    )


def _gif_with_comment(sub_blocks: int) -> bytes:
    """A one-frame GIF whose comment, before the frame, is ``sub_blocks`` one-byte sub-blocks."""
    buf = io.BytesIO()
    Image.new("P", (4, 4), 1).save(buf, "GIF")
    data = buf.getvalue()
    flags = data[10]
    frame_at = 13 + (3 * (2 << (flags & 7)) if flags & 0x80 else 0)
    comment = b"\x21\xfe" + b"\x01x" * sub_blocks + b"\x00"
    return data[:frame_at] + comment + data[frame_at:]


def test_a_gif_with_more_blocks_than_the_walk_allows_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """The walk counting frames stopped at _MAX_GIF_BLOCKS and answered one frame: any number of
    frames, or of blocks Pillow then walks in Python, went through."""
    monkeypatch.setattr(decode_budget, "_MAX_GIF_BLOCKS", 200)
    assert probe_image(_gif_with_comment(100), ImageOptions()).frames == 1
    _refused_before_pillow_opens(monkeypatch, _gif_with_comment(300), "more than 200 data blocks")


def test_junk_between_a_jpegs_segments_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pillow's walk to the frame header reads junk between segments a byte per Python step (the
    marker walk skipped it uncounted): seconds for a file of junk."""
    buf = io.BytesIO()
    Image.new("RGB", (16, 16), (200, 10, 10)).save(buf, "JPEG")
    data = buf.getvalue()
    after_app0 = 4 + int.from_bytes(data[4:6], "big")  # SOI, then the JFIF segment
    assert data[2:4] == b"\xff\xe0" and data[after_app0] == 0xFF

    def with_junk(n: int) -> bytes:
        return data[:after_app0] + b"\x00" * n + data[after_app0:]

    assert probe_image(with_junk(100), ImageOptions()).format == "JPEG"  # a few stray bytes are tolerated
    limit = decode_budget.MAX_JPEG_JUNK_BYTES
    _refused_before_pillow_opens(monkeypatch, with_junk(limit + 1), f"more than {limit} bytes of junk")


# -- the decoder's own failures are not the image's -----------------------------------------------------


def test_a_decode_worker_that_dies_or_never_starts_is_the_decoders_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    """Both were reported as the image's fault (ImageRejectedError, or a DecodeTimeoutError for a
    worker slow to start), which ingest fails for good: they are DecodeUnavailableError, retried."""
    from encoder.errors import DecodeUnavailableError

    whole = png_of(Image.new("RGB", (300, 300), (1, 2, 3)))
    options = ImageOptions(decode_workers=1, inline_max_pixels=0)  # through the pool
    from encoder import images

    pool = decode_budget.DecodePool(1)
    monkeypatch.setattr(images, "pool", lambda size: pool)
    try:
        run = decode_budget._Worker.run

        def killed_first(self, data, job, timeout_s):  # the worker dies as the job is handed over
            self.proc.kill()
            self.proc.wait()
            return run(self, data, job, timeout_s)

        monkeypatch.setattr(decode_budget._Worker, "run", killed_first)
        with pytest.raises(DecodeUnavailableError, match="stopped while decoding") as died:
            decode_image(whole, options)
        assert not isinstance(died.value, ImageRejectedError) and pool.killed == 1
        monkeypatch.setattr(decode_budget._Worker, "run", run)

        monkeypatch.setattr(decode_budget, "_START_TIMEOUT_S", 0.0)  # no worker is ready in no time
        with pytest.raises(DecodeUnavailableError, match="could be started") as slow:
            decode_image(whole, options)
        assert not isinstance(slow.value, ImageRejectedError)
        monkeypatch.setattr(decode_budget, "_START_TIMEOUT_S", 60.0)
        assert decode_image(whole, options).getpixel((0, 0)) == (1, 2, 3)  # the pool recovers
    finally:
        pool.close()


def test_running_out_of_memory_while_decoding_is_not_the_images_fault(monkeypatch: pytest.MonkeyPatch) -> None:
    from encoder import images
    from encoder.errors import DecodeUnavailableError

    def exhausted(data: bytes, job: decode_budget.DecodeJob) -> Image.Image:
        raise MemoryError

    monkeypatch.setattr(images, "decode_here", exhausted)
    with pytest.raises(DecodeUnavailableError, match="out of memory") as info:
        decode_image(png_of(Image.new("RGB", (8, 8))), ImageOptions())
    assert not isinstance(info.value, ImageRejectedError)
    # The same verdict from a worker's answer; a real decoder error stays the image's.
    assert isinstance(decode_budget.decode_error(MemoryError()), DecodeUnavailableError)
    assert isinstance(decode_budget.decode_error(OSError("broken data stream")), ImageRejectedError)


# -- finding: priority inversion in the decode pool ---------------------------------------------------


class _HeldWorker:
    """A stand-in decode worker: records the order it serves callers in; the first holds its slot
    until the test lets it go."""

    def __init__(self, order: list[bytes], hold: threading.Event, running: threading.Event) -> None:
        self.order, self.hold, self.running = order, hold, running
        self.proc = types.SimpleNamespace(poll=lambda: None)

    def run(self, data: bytes, job: decode_budget.DecodeJob, timeout_s: float) -> Image.Image:
        self.order.append(data)
        if data == b"first-bulk":
            self.running.set()
            assert self.hold.wait(30), "the test never let the first decode finish"
        return Image.new("L", (1, 1))

    def kill(self) -> None:
        pass


def _until(condition: Callable[[], bool]) -> None:
    """Wait for another thread to reach a state (a bound only so a broken pool fails, not hangs)."""
    for _ in range(30_000):
        if condition():
            return
        threading.Event().wait(0.001)
    raise AssertionError("the state was never reached")


def test_a_query_waiting_for_a_decode_worker_goes_before_earlier_bulk_decodes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pool's slots were a FIFO queue shared by query images, OCR, thumbnails and bulk ingest: a
    query's progressive JPEG waited behind bulk decodes of up to the time limit each. Slots go by
    priority now, in arrival order within one."""
    from encoder.types import Priority

    order: list[bytes] = []
    hold, running = threading.Event(), threading.Event()
    pool = decode_budget.DecodePool(1)
    monkeypatch.setattr(pool, "_start", lambda: _HeldWorker(order, hold, running))
    job = decode_budget.DecodeJob()

    def decode(name: bytes, priority: Priority) -> threading.Thread:
        thread = threading.Thread(target=pool.decode, args=(name, job, 5.0), kwargs={"priority": priority})
        thread.start()
        return thread

    threads = [decode(b"first-bulk", Priority.BACKGROUND)]
    assert running.wait(30)  # the only slot is busy
    threads.append(decode(b"bulk-1", Priority.BACKGROUND))
    _until(lambda: pool.waiting == 1)
    threads.append(decode(b"sync-1", Priority.SYNC_INGEST))
    _until(lambda: pool.waiting == 2)
    threads.append(decode(b"bulk-2", Priority.BACKGROUND))
    _until(lambda: pool.waiting == 3)
    threads.append(decode(b"query", Priority.QUERY))
    _until(lambda: pool.waiting == 4)
    hold.set()
    for thread in threads:
        thread.join(30)
    assert order == [b"first-bulk", b"query", b"sync-1", b"bulk-1", b"bulk-2"]
    assert pool.waiting == 0


def test_each_caller_of_the_decode_pool_says_its_priority(monkeypatch: pytest.MonkeyPatch) -> None:
    """Query images ask for a decode worker at their request's class; OCR and thumbnails, bulk work,
    at the lowest."""
    from encoder import images
    from encoder.engine import EmbeddingEngine
    from encoder.types import Priority
    from tests.encoder.enc_helpers import FakeEncoder, settings_for

    asked: list[Priority] = []

    class Recording:
        def decode(self, data: bytes, job: decode_budget.DecodeJob, timeout_s: float, *, priority: Priority):
            asked.append(priority)
            return decode_budget.decode_here(data, job)

    monkeypatch.setattr(images, "pool", lambda size: Recording())
    progressive = io.BytesIO()
    Image.new("RGB", (64, 48), (9, 9, 9)).save(progressive, "JPEG", progressive=True)
    data = progressive.getvalue()
    engine = EmbeddingEngine(FakeEncoder(), settings_for(preprocess_workers=0))
    engine.submit_images([data], priority=Priority.QUERY)
    engine.submit_images([data], priority=Priority.SYNC_INGEST)
    assert asked == [Priority.QUERY, Priority.SYNC_INGEST]
    asked.clear()
    ocr.prepare(data)
    assert thumbnails.make(data) is not None
    assert asked == [Priority.BACKGROUND, Priority.BACKGROUND]
