"""Images with known words, rendered with Pillow: the OCR tests' and ``bench.ocr``'s inputs.

Each image holds a few lines of words drawn from a fixed vocabulary, in one of the fonts this machine
has (DejaVu and Liberation where installed, Pillow's own built-in font always), at a given letter
size, turned by a small angle, on a noisy or textured background of varied colour.
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter, ImageFont

# Ordinary English words of four letters or more (what a search would look for).
_VOCABULARY = (
    "build failed invoice payment garden window planet orange silver market violet summer ticket "
    "travel museum coffee rocket wallet printer server backup monday harbor circle engine yellow "
    "forest dinner letter winter signal bridge castle pocket copper meadow thunder lantern station "
    "battery cabinet journal pattern holiday blanket machine theater picture kitchen morning "
    "receipt account deliver refund network release warning error success update install"
)
WORDS = tuple(_VOCABULARY.split())

_FONT_DIRS = ("/usr/share/fonts/truetype/dejavu", "/usr/share/fonts/truetype/liberation")
_FONT_FILES = (
    "DejaVuSans.ttf",
    "DejaVuSerif.ttf",
    "DejaVuSansMono.ttf",
    "DejaVuSans-Bold.ttf",
    "LiberationSans-Regular.ttf",
    "LiberationSerif-Regular.ttf",
    "LiberationMono-Regular.ttf",
)
BUILTIN = "pillow-builtin"


def fonts() -> list[str]:
    """The font files found here, and Pillow's built-in font (which needs none)."""
    found = [str(p) for d in _FONT_DIRS for f in _FONT_FILES if (p := Path(d) / f).is_file()]
    return [*found, BUILTIN]


def _font(name: str, size: int) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    if name == BUILTIN:
        return ImageFont.load_default(size=size)
    return ImageFont.truetype(name, size)


@dataclass(frozen=True)
class Rendered:
    content: bytes  # PNG
    words: tuple[str, ...]
    font: str
    size: int
    angle: float


def render(
    seed: int,
    *,
    font: str,
    size: int = 28,
    angle: float = 0.0,
    lines: int = 2,
    per_line: int = 3,
    noise: float = 18.0,
    fmt: str = "PNG",
) -> Rendered:
    """``lines`` x ``per_line`` distinct words in dark ink on a light, noisy background (or the
    reverse), rotated by ``angle`` degrees, with a margin around them."""
    rng = np.random.default_rng(seed)
    chosen = [str(w) for w in rng.choice(WORDS, size=lines * per_line, replace=False)]
    face = _font(font, size)
    text = "\n".join(" ".join(chosen[i * per_line : (i + 1) * per_line]) for i in range(lines))
    probe = ImageDraw.Draw(Image.new("L", (1, 1)))
    left, top, right, bottom = probe.multiline_textbbox((0, 0), text, font=face, spacing=size // 2)
    margin = size * 2
    width, height = int(right - left) + 2 * margin, int(bottom - top) + 2 * margin
    dark_on_light = bool(rng.integers(0, 4))  # one image in four is light text on a dark background
    paper = rng.integers(200, 250) if dark_on_light else rng.integers(20, 70)
    ink = int(rng.integers(0, 60)) if dark_on_light else int(rng.integers(210, 255))
    tint = rng.integers(-20, 20, size=3)
    background = np.clip(paper + tint + rng.normal(0, noise, size=(height, width, 3)), 0, 255).astype(np.uint8)
    image = Image.fromarray(background).filter(ImageFilter.GaussianBlur(0.6))
    draw = ImageDraw.Draw(image)
    draw.multiline_text((margin - left, margin - top), text, font=face, fill=(ink, ink, ink), spacing=size // 2)
    if angle:
        fill = tuple(int(x) for x in background[0, 0])
        image = image.rotate(angle, resample=Image.Resampling.BICUBIC, expand=True, fillcolor=fill)
    buf = io.BytesIO()
    image.save(buf, format=fmt)
    return Rendered(buf.getvalue(), tuple(chosen), Path(font).stem, size, angle)


def rendered_set(
    *, sizes: tuple[int, ...] = (20, 28, 40), angles: tuple[float, ...] = (0.0, -3.0, 4.0)
) -> list[Rendered]:
    """One image per font, letter size and angle."""
    out = []
    for i, font in enumerate(fonts()):
        for j, size in enumerate(sizes):
            for k, angle in enumerate(angles):
                out.append(render(1000 * i + 10 * j + k, font=font, size=size, angle=angle))
    return out


_WORD = re.compile(r"[a-z]+")


def recall(expected: tuple[str, ...], text: str) -> float:
    """The share of ``expected`` words found as words of ``text`` (case-insensitive)."""
    seen = set(_WORD.findall(text.lower()))
    return sum(w in seen for w in expected) / len(expected)
