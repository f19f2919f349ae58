"""Text inside images: Tesseract run on an image's bytes, on a bounded rescale and under a time limit.

Tesseract is Debian's ``tesseract-ocr`` with ``tesseract-ocr-eng``, run as its command-line program
once per image, the image on its standard input and the text on its output. The program rather than
pytesseract (a wrapper around the same program, one more dependency): each run gets its own
environment, so Tesseract's OpenMP threads are limited per run (``OcrSettings.threads``, 1: a host
runs several workers, each reading one image at a time, beside the encoder; Tesseract's own advice
for parallel runs is ``OMP_THREAD_LIMIT=1``, and setting that for the whole process would also
limit torch's threads); ``subprocess.run``'s timeout kills a run that takes too long; and no
temporary files are written. A crash of the program is a failed item, never a failed worker.

The image is decoded with Pillow under the encoder's decode budget (``encoder.images.decode_image``:
scans, frames and mode checked first, a costly decode run in a worker process that is stopped past
its time limit), turned upright (EXIF orientation), made grey and rescaled so its
longest side lies between ``OcrSettings.min_side`` and ``max_side``: a huge scan costs a bounded
amount of work, and small text (a thumbnail-sized screenshot) is enlarged to the size Tesseract reads
best. Which items are read, and when, is ``memstore.workers.ocr_pass``'s business.
"""

from __future__ import annotations

import io
import math
import os
import re
import shutil
import subprocess
from dataclasses import dataclass

from PIL import Image

from encoder.errors import DecompressionBombError, ImageRejectedError
from encoder.images import decode_image
from encoder.settings import stored_options
from encoder.types import Priority

# Longest side after rescaling: a 2,000 px page holds body text at the 20-30 px letter height
# Tesseract reads best, and bounds its time on a 50-megapixel photo.
MAX_SIDE = 2000
# Smaller images are enlarged (at most UPSCALE times) until their longest side reaches this.
MIN_SIDE = 1000
MAX_UPSCALE = 3.0
TIMEOUT_S = 30.0
# Images with more pixels are not decoded (the encoder's own bound, MEMSTORE_ENCODER_MAX_IMAGE_PIXELS'
# default): read from the header, so a decompression bomb costs nothing.
MAX_PIXELS = 64_000_000
# What is kept of an image's text (a page of small print is a few thousand characters).
MAX_TEXT = 20_000


class OcrFailedError(Exception):
    """Tesseract could not read this image (its reason is the message): the OCR fails, not the item."""


class OcrUnavailableError(Exception):
    """The ``tesseract`` program (or its English data) is not installed where this process runs."""


@dataclass(frozen=True)
class OcrSettings:
    language: str = "eng"
    max_side: int = MAX_SIDE
    min_side: int = MIN_SIDE
    max_upscale: float = MAX_UPSCALE
    timeout_s: float = TIMEOUT_S
    threads: int | None = 1  # Tesseract's OpenMP threads per run (OMP_THREAD_LIMIT); None: its default


def _run(args: list[str], *, data: bytes | None = None, timeout: float = 30.0, threads: int | None = 1) -> str:
    env = {**os.environ, "OMP_THREAD_LIMIT": str(threads)} if threads else None
    done = subprocess.run(["tesseract", *args], input=data, capture_output=True, timeout=timeout, env=env, check=False)
    if done.returncode != 0:
        reason = done.stderr.decode(errors="replace").strip().splitlines()
        raise OcrFailedError(f"tesseract failed: {reason[-1] if reason else f'exit status {done.returncode}'}")
    return done.stdout.decode(errors="replace")


def tesseract_version() -> str | None:
    """The installed Tesseract's version, or None when the program is missing."""
    if shutil.which("tesseract") is None:
        return None
    try:
        first = _run(["--version"], timeout=10).splitlines()
    except (OSError, OcrFailedError, subprocess.TimeoutExpired):
        return None
    return first[0].removeprefix("tesseract ").strip() if first else None


def require_tesseract(language: str = "eng") -> None:
    """Raise OcrUnavailableError unless Tesseract and its ``language`` data are installed."""
    if tesseract_version() is None:
        raise OcrUnavailableError("the tesseract program is not installed (Debian: apt-get install tesseract-ocr)")
    try:
        languages = _run(["--list-langs"], timeout=10).split()
    except (OSError, OcrFailedError, subprocess.TimeoutExpired) as exc:
        raise OcrUnavailableError(f"tesseract cannot list its languages: {exc}") from exc
    if language not in languages:
        raise OcrUnavailableError(
            f"tesseract has no {language!r} data (Debian: apt-get install tesseract-ocr-{language})"
        )


def prepare(content: bytes, settings: OcrSettings = OcrSettings()) -> Image.Image:
    """The image Tesseract reads: upright, grey, its longest side within [min_side, max_side].
    Decoded by ``encoder.images.decode_image``, under the encoder's decode budget."""

    def needed(width: int, height: int) -> tuple[int, int]:
        # A JPEG decodes at a reduced size directly (much faster for a large photo), 16-bit and
        # float rasters are reduced before they are made 8-bit.
        scale = min(1.0, settings.max_side / max(width, height, 1))
        return max(1, math.ceil(width * scale)), max(1, math.ceil(height * scale))

    try:
        # Bulk work: a query's picture takes a free decode worker before it.
        image = decode_image(
            content, stored_options(MAX_PIXELS), min_size=needed, grey=True, priority=Priority.BACKGROUND
        )
    except DecompressionBombError as exc:  # too many pixels, scans or frames, or past the time limit
        raise OcrFailedError(str(exc)) from exc
    except ImageRejectedError as exc:
        raise OcrFailedError(f"the image cannot be decoded: {exc}") from exc
    longest = max(image.size)
    if longest == 0:
        raise OcrFailedError("the image is empty")
    scale = 1.0
    if longest > settings.max_side:
        scale = settings.max_side / longest
    elif longest < settings.min_side:
        scale = min(settings.max_upscale, settings.min_side / longest)
    if scale != 1.0:
        size = (max(1, round(image.width * scale)), max(1, round(image.height * scale)))
        image = image.resize(size, Image.Resampling.LANCZOS)
    return image


_SPACES = re.compile(r"[ \t\f\v]+")
_BLANK_LINES = re.compile(r"\n\s*\n+")


def tidy(text: str) -> str:
    """Tesseract's output without runs of spaces and empty lines, bounded to MAX_TEXT characters."""
    text = _SPACES.sub(" ", text.replace("\x00", ""))
    text = _BLANK_LINES.sub("\n", "\n".join(line.strip() for line in text.splitlines()))
    return text.strip()[:MAX_TEXT]


def extract(content: bytes, settings: OcrSettings = OcrSettings()) -> str:
    """The text Tesseract reads in the image ``content`` ('' when it finds none). OcrFailedError when
    the image cannot be decoded, Tesseract fails on it, or it runs past ``settings.timeout_s``."""
    image = prepare(content, settings)
    png = io.BytesIO()
    image.save(png, "PNG", compress_level=1)  # fast: it is read at once
    try:
        text = _run(
            ["stdin", "stdout", "-l", settings.language],
            data=png.getvalue(),
            timeout=settings.timeout_s,
            threads=settings.threads,
        )
    except FileNotFoundError as exc:
        raise OcrUnavailableError("the tesseract program is not installed") from exc
    except subprocess.TimeoutExpired as exc:  # subprocess.run has killed it
        raise OcrFailedError(f"tesseract ran past its time limit of {settings.timeout_s:g} s") from exc
    return tidy(text)
