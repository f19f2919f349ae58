"""What decoding an image may cost: the work bound read from its structure, and decoding that can be stopped.

Two defences, for files whose pixel count is harmless but whose decode is not:

* **Work read from the structure, before any pixel is decoded.** A JPEG's marker segments are walked
  here (not by Pillow: its own walk before the frame header is a Python loop as long as the file)
  and its scans counted: a progressive JPEG is decoded once per scan, so a few hundred kilobytes
  holding thousands of identical scans cost as much as thousands of images. GIF and TIFF frames are
  counted by walking their blocks and directories (bounded walks: they stop at the limit), WebP, MPO
  and APNG frames from their headers. Only the first frame is ever decoded.
* **A time limit that really stops a decode.** Pillow's decoders hold the interpreter in C and cannot
  be interrupted from another thread, so every image whose cost the structure does not prove small
  (progressive JPEG, TIFF, high-bit-depth modes, large PNG/WebP/GIF/BMP) is decoded in a small pool of
  long-lived worker processes (``python -c``, started with ``subprocess``: no fork of a process that
  has threads and a database pool); one that runs past the limit is killed and replaced. Cheap images
  (a baseline JPEG, a small PNG) are decoded in the calling process: no round trip.

The decoded picture crosses the pipe as raw 8-bit pixels, already reduced to what the caller needs
(JPEG draft, and a box reduction of 16-bit and float rasters before they are made 8-bit, in strips of
rows: no full-resolution float copy is ever made).
"""

from __future__ import annotations

import atexit
import contextlib
import heapq
import io
import itertools
import json
import logging
import math
import os
import re
import select
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from PIL import Image, PngImagePlugin

from .errors import DecodeTimeoutError, DecodeUnavailableError, DecompressionBombError, EncoderError, ImageRejectedError
from .types import Priority

log = logging.getLogger(__name__)

Image.init()  # load every plugin once, so the allow-list below can name formats Pillow registers late
# MPO: the multi-picture JPEG many cameras write. WEBP is left out if Pillow was built without it.
# A PNG's text chunks are read at open, in every process that opens pictures (this module is where
# they all start). Pillow refuses a file whose one chunk holds more than 1 MiB of text, and so
# pictures that carry a large embedded document (an image generator's workflow); its bound on all of
# a file's text together (MAX_TEXT_MEMORY, 64 MiB) is what limits the work, and stays.
PngImagePlugin.MAX_TEXT_CHUNK = max(PngImagePlugin.MAX_TEXT_CHUNK, 16 * 1024 * 1024)
ALLOWED_FORMATS = tuple(f for f in ("JPEG", "MPO", "PNG", "WEBP", "GIF", "BMP", "TIFF") if f in Image.OPEN)

# Modes an image may open in. Others (LAB, HSV, signed or 32-bit variants) are refused.
EIGHT_BIT_MODES = frozenset({"1", "L", "LA", "La", "P", "PA", "RGB", "RGBA", "RGBa", "RGBX", "CMYK", "YCbCr"})
HIGH_BIT_MODES = frozenset({"I;16", "I;16L", "I;16B", "I;16N", "I", "F"})
ALLOWED_MODES = EIGHT_BIT_MODES | HIGH_BIT_MODES
_ALPHA_MODES = frozenset({"RGBA", "LA", "PA", "RGBa", "La"})

# A JPEG's marker segments (APPn, DQT, DHT, COM, ...): a real file has tens, an ICC profile split
# into APP2 chunks at most 255 more. Walking is bounded by this, so is Pillow's own walk after it.
MAX_JPEG_SEGMENTS = 4096
# PNG chunks: a 32 MiB PNG written in libpng's 8 KiB IDAT chunks has 4,096.
MAX_PNG_CHUNKS = 65_536
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# GIF blocks (extensions' and frames' sub-blocks): a 32 MiB GIF in 255-byte sub-blocks has 130,000.
# Pillow reads those before the first frame one Python call each when it opens the file.
_MAX_GIF_BLOCKS = 500_000
# Bytes between a JPEG's marker segments before its first scan (junk, fill bytes): libjpeg skips them
# in C, but Pillow's own walk to the frame header reads them one Python step a byte. A real file has a
# few at most; this bounds Pillow's walk to milliseconds.
MAX_JPEG_JUNK_BYTES = 65_536

SOF_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}  # DHT, JPG and DAC share the range
_PROGRESSIVE_SOF = frozenset({0xC2, 0xC6, 0xCA, 0xCE})
# Between segments, as libjpeg's next_marker: skip anything up to 0xFF, fill bytes 0xFF, and 0xFF00.
# (Written "\xff\xff*", not "\xff+": a literal first byte lets the regex engine skip ahead, 30x faster.)
_NEXT_MARKER = re.compile(rb"\xff\xff*[^\x00\xff]")
# Inside entropy-coded data: 0xFF00 is a stuffed data byte, 0xFFD0-D7 a restart marker of the scan.
_SCAN_END = re.compile(rb"\xff\xff*[^\x00\xd0-\xd7\xff]")

_STRIP_BYTES = 8 * 1024 * 1024  # rows converted at a time from 16-bit or float to 8-bit


@dataclass(frozen=True)
class JpegLayout:
    """What a JPEG's markers declare: its frame type and how many scans its decoder will run."""

    progressive: bool
    scans: int
    components: int
    segments: int
    frames: int  # SOF markers (more than one is an error for libjpeg)


def jpeg_layout(data: bytes, *, max_scans: int) -> JpegLayout:
    """Walk a JPEG's marker segments, skipping entropy-coded data (0xFF00 stuffing and RST markers
    included), the way libjpeg reads them. Raises DecompressionBombError past ``max_scans`` scans,
    MAX_JPEG_SEGMENTS segments or MAX_JPEG_JUNK_BYTES bytes between segments before the first scan,
    at the first one over: the walk itself stays short."""
    n = len(data)
    pos = 2  # after SOI
    scans = segments = frames = components = junk = 0
    progressive = False
    while True:
        found = _NEXT_MARKER.search(data, pos)
        if found is None:
            break  # truncated: the decoder reports it
        if not scans:  # what Pillow steps over, a byte at a time, before the marker's last 0xFF
            junk += found.end() - 2 - pos
            if junk > MAX_JPEG_JUNK_BYTES:
                raise DecompressionBombError(
                    f"JPEG has more than {MAX_JPEG_JUNK_BYTES} bytes of junk between its marker segments; "
                    f"the limit is {MAX_JPEG_JUNK_BYTES}: re-encode it",
                    limit=MAX_JPEG_JUNK_BYTES,
                )
        pos = found.end()
        code = data[pos - 1]
        if code == 0xD9:  # EOI: libjpeg stops here (an MPO's further pictures are never read)
            break
        if 0xD0 <= code <= 0xD8 or code == 0x01:  # RSTn, SOI, TEM: no length field
            continue
        if pos + 2 > n:
            break
        length = (data[pos] << 8) | data[pos + 1]
        if length < 2:
            break  # libjpeg refuses the file
        segments += 1
        if segments > MAX_JPEG_SEGMENTS:
            raise DecompressionBombError(
                f"JPEG has more than {MAX_JPEG_SEGMENTS} marker segments; the limit is {MAX_JPEG_SEGMENTS}",
                limit=MAX_JPEG_SEGMENTS,
            )
        if code in SOF_MARKERS:
            frames += 1
            progressive = progressive or code in _PROGRESSIVE_SOF
            if pos + 7 < n:
                components = data[pos + 7]
        pos += length
        if code == 0xDA:  # SOS: the scan's entropy-coded data follows its header
            scans += 1
            if scans > max_scans:
                raise DecompressionBombError(
                    f"JPEG has more than {max_scans} scans (each one a decoding pass over the whole picture); "
                    f"the limit is {max_scans} (MEMSTORE_ENCODER_MAX_JPEG_SCANS): re-encode it as a baseline JPEG",
                    limit=max_scans,
                )
            end = _SCAN_END.search(data, pos)
            if end is None:
                break
            pos = end.start()
    return JpegLayout(progressive, scans, components, segments, frames)


def png_chunks(data: bytes) -> int:
    """How many chunks a PNG holds, counted by walking every chunk header (pixel data skipped by its
    length) to IEND or the end of the data. Raises DecompressionBombError past MAX_PNG_CHUNKS: Pillow
    reads each chunk with Python calls, those before the pixel data when it opens the file and those
    after it when it decodes, so the whole list is counted before Pillow sees any of it."""
    pos, chunks, n = len(PNG_SIGNATURE), 0, len(data)
    while pos + 8 <= n:
        chunks += 1
        if chunks > MAX_PNG_CHUNKS:
            raise DecompressionBombError(
                f"PNG has more than {MAX_PNG_CHUNKS} chunks; the limit is {MAX_PNG_CHUNKS}", limit=MAX_PNG_CHUNKS
            )
        if data[pos + 4 : pos + 8] == b"IEND":
            break
        pos += 12 + int.from_bytes(data[pos : pos + 4], "big")
    return chunks


def png_exif(data: bytes) -> bytes | None:
    """The body of a PNG's eXIf chunk, found by walking chunk headers (IDAT skipped by its length).
    Pillow's own getexif decodes the whole picture to look past IDAT. Raises DecompressionBombError
    past MAX_PNG_CHUNKS chunks (Pillow reads every chunk with a Python call)."""
    pos, chunks, n = 8, 0, len(data)
    while pos + 8 <= n:
        length = int.from_bytes(data[pos : pos + 4], "big")
        kind = data[pos + 4 : pos + 8]
        chunks += 1
        if chunks > MAX_PNG_CHUNKS:
            raise DecompressionBombError(
                f"PNG has more than {MAX_PNG_CHUNKS} chunks; the limit is {MAX_PNG_CHUNKS}", limit=MAX_PNG_CHUNKS
            )
        if kind == b"eXIf":
            return data[pos + 8 : pos + 8 + length]
        if kind == b"IEND":
            break
        pos += 12 + length
    return None


def gif_frames(data: bytes, stop: int) -> int:
    """Image descriptors in a GIF, counted up to ``stop`` + 1. Raises DecompressionBombError past
    _MAX_GIF_BLOCKS blocks: a file that holds more is refused, not counted short (Pillow would walk
    them, and a count cut short would let any number of frames through)."""
    n = len(data)
    if n < 13:
        return 1
    flags = data[10]
    pos = 13 + (3 * (2 << (flags & 7)) if flags & 0x80 else 0)
    frames = blocks = 0

    def skip_sub_blocks(at: int) -> int:
        nonlocal blocks
        while at < n:
            blocks += 1
            if blocks > _MAX_GIF_BLOCKS:
                raise DecompressionBombError(
                    f"GIF has more than {_MAX_GIF_BLOCKS} data blocks; the limit is {_MAX_GIF_BLOCKS}",
                    limit=_MAX_GIF_BLOCKS,
                )
            size = data[at]
            at += 1 + size
            if size == 0:
                break
        return at

    while pos < n and frames <= stop:
        kind = data[pos]
        if kind == 0x21:  # extension: label, then sub-blocks
            pos = skip_sub_blocks(pos + 2)
        elif kind == 0x2C:  # image descriptor
            frames += 1
            if pos + 10 > n:
                break
            local = data[pos + 9]
            pos += 10 + (3 * (2 << (local & 7)) if local & 0x80 else 0)
            pos = skip_sub_blocks(pos + 1)  # after the LZW minimum code size
        else:  # trailer (0x3B) or garbage: decoders stop here too
            break
    return max(frames, 1)


def tiff_pages(data: bytes, stop: int) -> int:
    """Image file directories in a TIFF's main chain, counted up to ``stop`` + 1 (loops end the walk)."""
    if len(data) < 8 or data[:2] not in (b"II", b"MM"):
        return 1
    order = "<" if data[:2] == b"II" else ">"
    (magic,) = struct.unpack_from(order + "H", data, 2)
    big = magic == 43
    if big:
        if len(data) < 16:
            return 1
        (offset,) = struct.unpack_from(order + "Q", data, 8)
    else:
        (offset,) = struct.unpack_from(order + "I", data, 4)
    count_fmt, entry, next_fmt = (order + "Q", 20, order + "Q") if big else (order + "H", 12, order + "I")
    count_size, next_size = struct.calcsize(count_fmt), struct.calcsize(next_fmt)
    seen: set[int] = set()
    pages = 0
    while offset and offset not in seen and pages <= stop and offset + count_size <= len(data):
        seen.add(offset)
        pages += 1
        (count,) = struct.unpack_from(count_fmt, data, offset)
        at = offset + count_size + count * entry
        if at + next_size > len(data):
            break
        (offset,) = struct.unpack_from(next_fmt, data, at)
    return max(pages, 1)


# -- the decode itself (run in this process or in a worker) ---------------------------------------

_TRANSPOSE = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}


@dataclass(frozen=True)
class DecodeJob:
    """How to decode: the smallest raw size (before EXIF rotation) the caller needs, the EXIF
    orientation to apply, and whether the caller wants greyscale."""

    min_raw: tuple[int, int] | None = None
    orientation: int = 1
    grey: bool = False


def _reduce_to(img: Image.Image, min_raw: tuple[int, int] | None) -> Image.Image:
    """Box-average by the largest whole factor that keeps both sides at least ``min_raw``."""
    if min_raw is None:
        return img
    w, h = img.size
    factor = min(w // max(1, min_raw[0]), h // max(1, min_raw[1]))
    if factor < 2:
        return img
    return img.resize((w // factor, h // factor), Image.Resampling.BOX)


def high_bit_to_l(img: Image.Image) -> Image.Image:
    """A 16-bit or 32-bit (integer or float) greyscale raster as 8-bit greyscale, a strip of rows at
    a time (float32 strips; never a full-resolution float copy). Integers 0..max map to 0..255 when
    the maximum is over 255 (Pillow's plain convert would clip all of it to white); floats within
    [0, 1] map to 0..255, other float ranges from min(0, lowest)..highest; NaN reads as black."""
    import numpy as np

    w, h = img.size
    out = Image.new("L", (w, h))
    if w == 0 or h == 0:
        return out
    rows = max(1, _STRIP_BYTES // (w * 4))

    def strip(y: int) -> Any:
        return np.asarray(img.crop((0, y, w, min(h, y + rows))))

    lo, hi = math.inf, -math.inf
    for y in range(0, h, rows):
        part = strip(y)
        if img.mode == "F":
            part = part[np.isfinite(part)]
        if part.size:
            lo, hi = min(lo, float(part.min())), max(hi, float(part.max()))
    if not math.isfinite(lo):
        return out
    offset, scale = 0.0, 1.0
    if img.mode == "F" and lo >= 0.0 and hi <= 1.0:
        scale = 255.0
    elif img.mode == "F" and lo < 0.0:
        offset = lo
        scale = 255.0 / (hi - lo) if hi > lo else 1.0
    elif hi > 255.0:
        scale = 255.0 / hi
    for y in range(0, h, rows):
        values = strip(y).astype(np.float32)
        if offset:
            values -= offset
        if scale != 1.0:
            values *= scale
        np.nan_to_num(values, copy=False, nan=0.0, posinf=255.0, neginf=0.0)
        np.clip(values, 0.0, 255.0, out=values)
        np.rint(values, out=values)
        out.paste(Image.fromarray(values.astype(np.uint8), "L"), (0, y))
    return out


def _eight_bit(img: Image.Image, grey: bool) -> Image.Image:
    """L, RGB or RGBA (RGBA only where the picture has transparency and colour was asked for)."""
    if grey:
        return img if img.mode == "L" else img.convert("L")
    if img.mode in ("RGB", "L"):
        return img
    if img.mode == "1":
        return img.convert("L")
    if img.mode in _ALPHA_MODES or (img.mode == "P" and "transparency" in img.info):
        return img.convert("RGBA")
    return img.convert("RGB")


def decode_here(data: bytes, job: DecodeJob) -> Image.Image:
    """Decode the first frame of ``data`` in this process: upright, 8-bit (L, RGB or RGBA), at least
    ``job.min_raw`` where the format can decode smaller (JPEG) or the raster is high-bit-depth."""
    with Image.open(io.BytesIO(data), formats=ALLOWED_FORMATS) as img:
        if img.format in ("JPEG", "MPO") and job.min_raw is not None:
            # DCT-domain downscale: a fraction of the work. "L" from a colour JPEG skips the chroma.
            img.draft("L" if job.grey and img.mode in ("RGB", "YCbCr", "L") else img.mode, job.min_raw)
        img.load()
        out: Image.Image = img
        if img.mode in HIGH_BIT_MODES:
            out = high_bit_to_l(_reduce_to(img, job.min_raw))
        elif img.mode not in EIGHT_BIT_MODES:
            raise ImageRejectedError(f"image mode {img.mode} is not supported")
        out = _eight_bit(out, job.grey)
        method = _TRANSPOSE.get(job.orientation)
        if method is not None:
            out = out.transpose(method)
        if out is img:
            out = img.copy()  # detach from the file before it closes
    return out


# -- the worker pool -------------------------------------------------------------------------------

_HEADER = struct.Struct(">II")  # JSON header length, payload length


def _read_exact(stream: IO[bytes], size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = stream.read(left)
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _send(stream: IO[bytes], header: dict[str, Any], payload: bytes = b"") -> None:
    head = json.dumps(header).encode()
    stream.write(_HEADER.pack(len(head), len(payload)))
    stream.write(head)
    stream.write(payload)
    stream.flush()


def worker_main() -> None:
    """A decode worker: reads jobs on stdin, answers on stdout, until stdin closes."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent's Ctrl-C is the parent's business
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing else may write on the answer channel
    stdout.write(b"R")
    stdout.flush()
    while True:
        try:
            head_len, data_len = _HEADER.unpack(_read_exact(stdin, _HEADER.size))
            header = json.loads(_read_exact(stdin, head_len))
            data = _read_exact(stdin, data_len)
        except EOFError:
            return
        job = DecodeJob(
            (int(header["min_raw"][0]), int(header["min_raw"][1])) if header["min_raw"] else None,
            int(header["orientation"]),
            bool(header["grey"]),
        )
        try:
            img = decode_here(data, job)
            pixels = img.tobytes()
            _send(stdout, {"mode": img.mode, "size": list(img.size)}, pixels)
        except Exception as exc:  # reported to the caller, which raises it again
            error = decode_error(exc)
            _send(
                stdout,
                {
                    "error": str(error),
                    "bomb": isinstance(error, DecompressionBombError),
                    "transient": isinstance(error, DecodeUnavailableError),
                },
            )


def decode_error(exc: Exception) -> EncoderError:
    """What a failed decode is reported as: running out of memory is the process's state, not the
    image's (DecodeUnavailableError, retried later); anything else is the image's (``as_rejection``)."""
    if isinstance(exc, DecodeUnavailableError):
        return exc
    if isinstance(exc, MemoryError):
        return DecodeUnavailableError("out of memory while decoding the image; retry shortly")
    return as_rejection(exc)


def as_rejection(exc: Exception) -> ImageRejectedError:
    """The ImageRejectedError (or DecompressionBombError) that tells the caller why a decode failed."""
    if isinstance(exc, ImageRejectedError):
        return exc
    if isinstance(exc, Image.DecompressionBombError):
        return DecompressionBombError(f"image refused as a decompression bomb: {exc}")
    if isinstance(exc, (OSError, SyntaxError, ValueError, EOFError)):
        return ImageRejectedError(f"corrupt or truncated image data: {exc}")
    return ImageRejectedError(f"cannot decode image: {type(exc).__name__}: {exc}")


_START_TIMEOUT_S = 60.0  # a decode worker that has not said it is ready by then is given up


class _Worker:
    def __init__(self) -> None:
        root = str(Path(__file__).resolve().parent.parent)
        code = f"import sys; sys.path.insert(0, {root!r}); from encoder.decode_budget import worker_main; worker_main()"
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            close_fds=True,
            env={**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"},
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.stdin: IO[bytes] = self.proc.stdin
        self.stdout: IO[bytes] = self.proc.stdout
        self._buffer = b""
        self._deadline = time.monotonic() + _START_TIMEOUT_S
        try:
            if self._recv(1) != b"R":
                raise EOFError
        except BaseException:
            self.kill()  # never left running, half started
            raise

    def _recv(self, size: int) -> bytes:
        """``size`` bytes from the worker, or TimeoutError once the deadline passes."""
        fd = self.stdout.fileno()
        parts, left = [], size
        while left:
            wait = self._deadline - time.monotonic()
            if wait <= 0 or not select.select([fd], [], [], wait)[0]:
                raise TimeoutError
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                raise EOFError
            parts.append(chunk)
            left -= len(chunk)
        return b"".join(parts)

    def run(self, data: bytes, job: DecodeJob, timeout_s: float) -> Image.Image:
        header = {
            "min_raw": list(job.min_raw) if job.min_raw else None,
            "orientation": job.orientation,
            "grey": job.grey,
        }
        _send(self.stdin, header, data)
        self._deadline = time.monotonic() + timeout_s
        head_len, payload_len = _HEADER.unpack(self._recv(_HEADER.size))
        answer = json.loads(self._recv(head_len))
        payload = self._recv(payload_len) if payload_len else b""
        if "error" in answer:
            if answer.get("transient"):
                raise DecodeUnavailableError(str(answer["error"]))
            raise (DecompressionBombError if answer.get("bomb") else ImageRejectedError)(str(answer["error"]))
        return Image.frombytes(answer["mode"], tuple(answer["size"]), payload)

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            self.proc.kill()
        self.proc.wait()
        for stream in (self.stdin, self.stdout):
            with contextlib.suppress(OSError):
                stream.close()


class _Waiter:
    """A caller waiting for a decode slot; the releasing thread hands the slot to it directly."""

    __slots__ = ("granted", "worker")

    def __init__(self) -> None:
        self.granted = False
        self.worker: _Worker | None = None


class DecodePool:
    """``size`` long-lived decode processes, started on first use; one that overruns is killed.

    Slots go to waiting callers by priority, then by arrival: the engine's query images, the OCR
    pass, thumbnails and bulk ingest share one pool per process, and a query's picture must not wait
    behind bulk decodes that may take the whole time limit each (the wait is not charged to it)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._cond = threading.Condition()
        # Free slots (None: no worker started yet). Never non-empty while someone waits: a released
        # slot goes straight to the first waiter.
        self._idle: list[_Worker | None] = [None] * size
        self._waiters: list[tuple[int, int, _Waiter]] = []  # heap of (-priority, arrival, waiter)
        self._arrivals = itertools.count()
        self.killed = 0  # workers killed for running past the limit (or dying)

    @property
    def waiting(self) -> int:
        """Callers waiting for a free slot."""
        with self._cond:
            return len(self._waiters)

    def _acquire(self, priority: Priority) -> _Worker | None:
        with self._cond:
            if self._idle:
                return self._idle.pop()
            waiter = _Waiter()
            entry = (-int(priority), next(self._arrivals), waiter)
            heapq.heappush(self._waiters, entry)
            try:
                while not waiter.granted:
                    self._cond.wait()
            except BaseException:
                if waiter.granted:
                    self._release_locked(waiter.worker)
                else:
                    self._waiters.remove(entry)
                    heapq.heapify(self._waiters)
                raise
            return waiter.worker

    def _release(self, worker: _Worker | None) -> None:
        with self._cond:
            self._release_locked(worker)

    def _release_locked(self, worker: _Worker | None) -> None:
        if self._waiters:
            _, _, waiter = heapq.heappop(self._waiters)
            waiter.worker, waiter.granted = worker, True
            self._cond.notify_all()
        else:
            self._idle.append(worker)

    def decode(
        self, data: bytes, job: DecodeJob, timeout_s: float, *, priority: Priority = Priority.BACKGROUND
    ) -> Image.Image:
        """The decoded picture. The image's faults raise ImageRejectedError (DecodeTimeoutError past
        the time limit); the pool's own (a worker that does not start, or dies under the image: the
        machine out of memory, a killed process) raise DecodeUnavailableError, to be retried.
        ``priority`` orders the callers waiting for a slot (a query first; a caller that does not say
        waits with bulk work)."""
        worker = self._acquire(priority)  # waiting for a free worker is not charged to the time limit
        try:
            if worker is None or worker.proc.poll() is not None:
                if worker is not None:
                    worker.kill()
                worker = None  # a start that fails leaves the slot empty, for the next call to try again
                worker = self._start()
            return worker.run(data, job, timeout_s)
        except (ImageRejectedError, DecodeUnavailableError):
            raise  # the worker answered with the reason (it is fit for the next image), or none started
        except TimeoutError:
            self._discard(worker)
            worker = None
            raise DecodeTimeoutError(
                f"decoding the image ran past the time limit of {timeout_s:g} s and was stopped "
                "(MEMSTORE_ENCODER_DECODE_TIMEOUT_S): re-encode it as a baseline JPEG or PNG",
                limit=timeout_s,
            ) from None
        except (EOFError, OSError, ValueError) as exc:
            # The worker died or its answer broke off: nothing says the image is bad (the kernel's
            # out-of-memory killer, a signal, a broken pipe), so the caller retries; an image that
            # itself brings the decoder down fails once its retries are spent.
            self._discard(worker)
            worker = None
            raise DecodeUnavailableError(
                f"the image decoder process stopped while decoding ({type(exc).__name__}); retry shortly"
            ) from None
        except BaseException:
            self._discard(worker)
            worker = None
            raise
        finally:
            self._release(worker)

    @staticmethod
    def _start() -> _Worker:
        try:
            return _Worker()
        except (TimeoutError, EOFError, OSError, ValueError) as exc:
            raise DecodeUnavailableError(
                f"no image decoder process could be started ({type(exc).__name__}: {exc}); retry shortly"
            ) from None

    def _discard(self, worker: _Worker | None) -> None:
        if worker is not None:
            worker.kill()
            self.killed += 1
        return None

    def close(self) -> None:
        """Stop the idle workers; busy ones are left to finish and come back as usual."""
        with self._cond:
            workers, self._idle = self._idle, [None] * len(self._idle)
        for worker in workers:
            if worker is not None:
                worker.kill()


_POOLS: dict[int, DecodePool] = {}
_POOLS_LOCK = threading.Lock()


def pool(size: int) -> DecodePool:
    """The process's decode pool of ``size`` workers (one per size asked for, made on first use)."""
    with _POOLS_LOCK:
        found = _POOLS.get(size)
        if found is None:
            found = _POOLS[size] = DecodePool(size)
        return found


@atexit.register
def _close_pools() -> None:
    with _POOLS_LOCK:
        for p in _POOLS.values():
            p.close()
