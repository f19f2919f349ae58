"""Photos' own facts: when, with what and where a picture was taken, and its size, read from the
EXIF and XMP in its header (no pixel is decoded), for the item's metadata.

The facts are one object, every key left out when the picture does not say it::

    "image": {
        "taken_at": "2024-07-14T15:30:05+02:00",   ISO 8601; without an offset when the camera wrote none
        "camera": {"make": "Canon", "model": "Canon EOS R6"},
        "gps": {"lat": 48.8583701, "lon": 2.2944813, "alt": 35.2},   decimal degrees, metres
        "width": 4000, "height": 6000               as shown: after the EXIF orientation
    }

- ``taken_at``: EXIF DateTimeOriginal (with SubSecTimeOriginal and OffsetTimeOriginal when present),
  else DateTimeDigitized (with its own sub-seconds and offset), else XMP's ``exif:DateTimeOriginal``,
  ``photoshop:DateCreated`` or ``xmp:CreateDate``. EXIF writes the camera's local time; without an
  offset the string has none, and the filter language reads such a string as UTC
  (``memstore.search.filter_language``): a range compares it as if the clock had been on UTC.
- ``camera``: EXIF Make and Model (else XMP's ``tiff:Make``/``tiff:Model``), trimmed, control
  characters dropped, at most MAX_TEXT characters each.
- ``gps``: the GPS IFD's latitude and longitude (with their N/S, E/W references) and altitude
  (negative below sea level), else XMP's ``exif:GPS*``; rounded to 7 and 2 decimals. A position
  out of range, or exactly 0, 0 (what a camera without a fix writes), is left out.
- ``width``, ``height``: from the frame header, swapped for the orientations that turn the picture
  a quarter (5 to 8).

Cost and safety: JPEG's header segments are walked here (at most MAX_HEADER_SEGMENTS, stopping at the
frame header); other formats are opened by Pillow, which reads their header only (a PNG's eXIf chunk
is found by ``encoder.decode_budget.png_exif``'s walk, since Pillow's own ``getexif`` decodes the
picture to look past the pixel data). An EXIF block over MAX_EXIF_BYTES or an XMP packet over
MAX_XMP_BYTES is not parsed. ``read`` never raises: a picture whose EXIF is broken gets the facts
that could be read (often just its size), or none.

Merging (``merge``): the client's metadata always wins. Without an ``image`` key the facts are
added as they are; with an ``image`` object, only the facts' keys it lacks are added (a key the
client gave, ``camera`` say, is kept whole, never merged into); with an ``image`` of any other
value (``null`` included), nothing is added. Metadata that the facts would push past the metadata
limits is stored as the client sent it.
"""

from __future__ import annotations

import contextlib
import html
import io
import logging
import math
import re
from datetime import datetime
from typing import Any

from PIL import Image

from encoder.decode_budget import ALLOWED_FORMATS, SOF_MARKERS, png_exif
from encoder.images import TRANSPOSED, oriented_by_pillow
from memstore.errors import InvalidInputError
from memstore.inputs import check_metadata

log = logging.getLogger(__name__)

KEY = "image"
# A JPEG's APP1 segment holds 64 KiB at most; a PNG's eXIf chunk or a WebP's EXIF chunk could hold
# anything: past this, the block is not parsed.
MAX_EXIF_BYTES = 256 * 1024
MAX_XMP_BYTES = 256 * 1024
# Segments walked in a JPEG's header before the frame header (a real file has tens, an ICC profile
# split in 64 KiB parts a few more).
MAX_HEADER_SEGMENTS = 512
MAX_TEXT = 128

_EXIF_IFD = 0x8769
_GPS_IFD = 0x8825
_MAKE, _MODEL, _ORIENTATION = 0x010F, 0x0110, 0x0112
# (date, sub-seconds, offset): DateTimeOriginal, then DateTimeDigitized.
_DATE_TAGS = ((0x9003, 0x9291, 0x9011), (0x9004, 0x9292, 0x9012))
_XMP_HEADER = b"http://ns.adobe.com/xap/1.0/\x00"

_EXIF_DATE = re.compile(
    r"\s*([0-9]{4})[:-]([0-9]{2})[:-]([0-9]{2})[ T]([0-9]{2}):([0-9]{2})(?::([0-9]{2}))?(?:\.([0-9]+))?\s*"
)
_OFFSET = re.compile(r"\s*(Z|[+-][0-9]{2}:?[0-9]{2})\s*")
_XMP_DATE = re.compile(
    r"\s*([0-9]{4})-([0-9]{2})-([0-9]{2})"
    r"(?:T([0-9]{2}):([0-9]{2})(?::([0-9]{2})(?:\.([0-9]+))?)?(Z|[+-][0-9]{2}:[0-9]{2})?)?\s*"
)
_XMP_COORDINATE = re.compile(r"\s*([0-9]{1,3}),([0-9]{1,2}(?:\.[0-9]+)?)(?:,([0-9]{1,2}(?:\.[0-9]+)?))?([NSEW])\s*")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]+")


def read(data: bytes) -> dict[str, Any]:
    """The facts of an encoded picture (see the module's docstring); {} when it says none, or when
    its header cannot be read. Never raises."""
    try:
        return _read(data)
    except Exception as exc:  # a malformed header is the picture's business, never the caller's
        log.debug("photo facts: unreadable header (%s: %s)", type(exc).__name__, exc)
        return {}


def merge(metadata: dict[str, Any] | None, facts: dict[str, Any]) -> dict[str, Any] | None:
    """``metadata`` with ``facts`` added under ``image`` as the module's docstring says; ``metadata``
    itself (the same object) when nothing is added."""
    if not facts or not isinstance(metadata, dict | None):
        return metadata  # not an object: the queue refuses it as the client sent it
    meta = dict(metadata or {})
    if KEY not in meta:
        meta[KEY] = dict(facts)
    else:
        given = meta[KEY]
        if not isinstance(given, dict):
            return metadata
        missing = {k: v for k, v in facts.items() if k not in given}
        if not missing:
            return metadata
        meta[KEY] = {**given, **missing}
    try:
        check_metadata(meta)
    except InvalidInputError:
        return metadata
    return meta


def with_facts(metadata: dict[str, Any] | None, data: bytes) -> dict[str, Any] | None:
    """``merge(metadata, read(data))``."""
    return merge(metadata, read(data))


# ---------------------------------------------------------------------------------------- the header


class _Header:
    def __init__(self) -> None:
        self.size: tuple[int, int] | None = None
        self.exif: bytes | None = None  # a TIFF structure, "Exif\0\0" first or not
        self.exif_image: Image.Image | None = None  # a TIFF file: its own first directory is the EXIF
        self.xmp: bytes | None = None
        self.oriented = False  # the size is already as shown (encoder.images.oriented_by_pillow)


def _read(data: bytes) -> dict[str, Any]:
    if data[:3] == b"\xff\xd8\xff":
        header = _jpeg_header(data)
        return _facts(header)
    with Image.open(io.BytesIO(data), formats=ALLOWED_FORMATS) as img:
        header = _pillow_header(data, img)
        return _facts(header)


def _jpeg_header(data: bytes) -> _Header:
    """The first EXIF and XMP APP1 segments and the frame's size, walking the segments up to the frame header."""
    header = _Header()
    n, pos, segments = len(data), 2, 0
    while pos + 4 <= n and segments < MAX_HEADER_SEGMENTS:
        if data[pos] != 0xFF:
            break
        marker = data[pos + 1]
        if marker == 0xFF:  # a fill byte
            pos += 1
            segments += 1
            continue
        if 0xD0 <= marker <= 0xD8 or marker == 0x01:  # RSTn, SOI, TEM: no length
            pos += 2
            continue
        if marker in (0xD9, 0xDA):  # EOI, or a scan: the header is over
            break
        length = (data[pos + 2] << 8) | data[pos + 3]
        if length < 2:
            break
        segments += 1
        body = data[pos + 4 : pos + 2 + length]
        if marker == 0xE1:
            if body.startswith(b"Exif\x00\x00"):
                header.exif = header.exif or body
            elif body.startswith(_XMP_HEADER):
                header.xmp = header.xmp or body[len(_XMP_HEADER) :]
        elif marker in SOF_MARKERS:
            if len(body) >= 5:
                height, width = (body[1] << 8) | body[2], (body[3] << 8) | body[4]
                if width and height:
                    header.size = (width, height)
            break
        pos += 2 + length
    return header


def _pillow_header(data: bytes, img: Image.Image) -> _Header:
    header = _Header()
    header.size = img.size
    exif = img.info.get("exif")
    if exif is None and img.format == "PNG":
        exif = png_exif(data)  # after the pixel data: found by walking the chunks
    if isinstance(exif, bytes):
        header.exif = exif
    elif img.format == "TIFF":
        header.exif_image = img
        header.oriented = oriented_by_pillow(img)
    xmp = img.info.get("xmp") or img.info.get("XML:com.adobe.xmp")
    if xmp is None and img.format == "TIFF":
        xmp = getattr(img, "tag_v2", {}).get(700)
    if isinstance(xmp, str):
        xmp = xmp.encode("utf-8", "replace")
    if isinstance(xmp, bytes):
        header.xmp = xmp
    return header


# ---------------------------------------------------------------------------------------- the facts


def _facts(header: _Header) -> dict[str, Any]:
    exif = _exif(header)
    xmp = _xmp_text(header.xmp)
    facts: dict[str, Any] = {}
    taken = (_exif_taken_at(exif) if exif is not None else None) or _xmp_taken_at(xmp)
    if taken:
        facts["taken_at"] = taken
    camera = _camera(exif, xmp)
    if camera:
        facts["camera"] = camera
    gps = (_exif_gps(exif) if exif is not None else None) or _xmp_gps(xmp)
    if gps:
        facts["gps"] = gps
    if header.size is not None:
        width, height = header.size
        if not header.oriented and _orientation(exif, xmp) in TRANSPOSED:
            width, height = height, width
        if width > 0 and height > 0:
            facts["width"], facts["height"] = int(width), int(height)
    return facts


def _exif(header: _Header) -> Image.Exif | None:
    """The EXIF directory, or None when there is none, it is too large, or it cannot be parsed."""
    try:
        if header.exif_image is not None:
            return header.exif_image.getexif()  # a TIFF's tags, read at open
        if header.exif is None or len(header.exif) > MAX_EXIF_BYTES:
            return None
        exif = Image.Exif()
        exif.load(header.exif)
        return exif
    except Exception:
        return None


def _ifd(exif: Image.Exif, tag: int) -> dict[int, Any]:
    try:
        return exif.get_ifd(tag)
    except Exception:
        return {}


def _exif_taken_at(exif: Image.Exif) -> str | None:
    sub = _ifd(exif, _EXIF_IFD)
    for date_tag, subsec_tag, offset_tag in _DATE_TAGS:
        # DateTimeOriginal belongs to the Exif directory; some writers put it in the first one.
        date = _text(sub.get(date_tag)) or _text(exif.get(date_tag))
        if not date:
            continue
        taken = _exif_date(date, _text(sub.get(subsec_tag)), _text(sub.get(offset_tag)))
        if taken:
            return taken
    return None


def _exif_date(date: str, subsec: str | None, offset: str | None) -> str | None:
    """EXIF's ``YYYY:MM:DD HH:MM:SS`` (with its sub-seconds and offset) as ISO 8601, or None for a
    blank or impossible date (``0000:00:00 00:00:00``)."""
    match = _EXIF_DATE.fullmatch(date)
    if match is None:
        return None
    y, mo, d, h, mi, s, fraction = match.groups()
    if fraction is None and subsec is not None and subsec.strip().isdigit():
        fraction = subsec.strip()
    return _iso(y, mo, d, h, mi, s, fraction, _offset(offset))


def _offset(text: str | None) -> str | None:
    if text is None:
        return None
    match = _OFFSET.fullmatch(text)
    if match is None:
        return None
    value = match.group(1)
    if value == "Z":
        return "Z"
    digits = value[1:].replace(":", "")
    hours, minutes = int(digits[:2]), int(digits[2:])
    if hours > 14 or minutes > 59:
        return None
    return f"{value[0]}{hours:02d}:{minutes:02d}"


def _iso(
    y: str, mo: str, d: str, h: str | None, mi: str | None, s: str | None, fraction: str | None, offset: str | None
) -> str | None:
    try:
        moment = datetime(int(y), int(mo), int(d), int(h or 0), int(mi or 0), int(s or 0))
    except ValueError:
        return None
    if h is None:
        return moment.strftime("%Y-%m-%d")
    text = moment.strftime("%Y-%m-%dT%H:%M:%S")
    digits = (fraction or "")[:6].rstrip("0")
    if digits:
        text += "." + digits
    return text + (offset or "")


def _camera(exif: Image.Exif | None, xmp: str | None) -> dict[str, str]:
    camera: dict[str, str] = {}
    for key, tag, name in (("make", _MAKE, "tiff:Make"), ("model", _MODEL, "tiff:Model")):
        value = _clean(_text(exif.get(tag)) if exif is not None else None) or _clean(_xmp_value(xmp, name))
        if value:
            camera[key] = value
    return camera


def _exif_gps(exif: Image.Exif) -> dict[str, float] | None:
    gps = _ifd(exif, _GPS_IFD)
    if not gps:
        return None
    lat = _degrees(gps.get(2), _text(gps.get(1)), "NS")
    lon = _degrees(gps.get(4), _text(gps.get(3)), "EW")
    return _position(lat, lon, _number(gps.get(6)), _altitude_below(gps.get(5)))


def _degrees(value: Any, ref: str | None, refs: str) -> float | None:
    """Degrees, minutes, seconds (rationals) and N/S or E/W as signed decimal degrees."""
    if not isinstance(value, tuple | list) or not 1 <= len(value) <= 3:
        return None
    parts = [_number(v) for v in value]
    if any(p is None or p < 0 for p in parts):
        return None
    total = sum(p / 60**i for i, p in enumerate(parts) if p is not None)
    ref = (ref or refs[0]).strip().upper()[:1]
    if ref not in refs:
        return None
    return -total if ref == refs[1] else total


def _altitude_below(value: Any) -> bool:
    """GPSAltitudeRef: 1 (a byte, often read as b"\\x01") is below sea level."""
    if isinstance(value, bytes):
        return value[:1] == b"\x01"
    if isinstance(value, int | str):
        return str(value).strip() == "1"
    return False


def _position(lat: float | None, lon: float | None, alt: float | None, below: bool) -> dict[str, float] | None:
    if lat is None or lon is None or not (-90 <= lat <= 90 and -180 <= lon <= 180) or (lat == 0 and lon == 0):
        return None
    position = {"lat": round(lat, 7), "lon": round(lon, 7)}
    if alt is not None and abs(alt) < 100_000:
        position["alt"] = round(-alt if below else alt, 2)
    return position


def _orientation(exif: Image.Exif | None, xmp: str | None) -> int:
    value = exif.get(_ORIENTATION) if exif is not None else None
    if value is None:
        value = _xmp_value(xmp, "tiff:Orientation")
    try:
        return int(value) if value is not None else 1
    except (TypeError, ValueError):
        return 1


# ---------------------------------------------------------------------------------------- XMP


def _xmp_text(packet: bytes | None) -> str | None:
    if not packet or len(packet) > MAX_XMP_BYTES:
        return None
    return packet.decode("utf-8", "replace")


def _xmp_value(xmp: str | None, name: str) -> str | None:
    """A simple property's value, written as an attribute (``tiff:Make="Canon"``) or an element
    (``<tiff:Make>Canon</tiff:Make>``). Regular expressions with bounded values, never an XML
    parser: no entity is expanded but the five predefined ones and character references."""
    if xmp is None:
        return None
    escaped = re.escape(name)
    match = re.search(rf"[\s<]{escaped}\s*=\s*(?:\"([^\"<]{{0,512}})\"|'([^'<]{{0,512}})')", xmp) or re.search(
        rf"<{escaped}>([^<]{{0,512}})</{escaped}>", xmp
    )
    if match is None:
        return None
    value = next(g for g in match.groups() if g is not None)
    return html.unescape(value)


def _xmp_taken_at(xmp: str | None) -> str | None:
    for name in ("exif:DateTimeOriginal", "photoshop:DateCreated", "xmp:CreateDate"):
        value = _xmp_value(xmp, name)
        match = _XMP_DATE.fullmatch(value) if value else None
        if match is not None:
            y, mo, d, h, mi, s, fraction, offset = match.groups()
            taken = _iso(y, mo, d, h, mi, s, fraction, _offset(offset))
            if taken:
                return taken
    return None


def _xmp_gps(xmp: str | None) -> dict[str, float] | None:
    lat = _xmp_coordinate(_xmp_value(xmp, "exif:GPSLatitude"), "NS")
    lon = _xmp_coordinate(_xmp_value(xmp, "exif:GPSLongitude"), "EW")
    alt = _xmp_rational(_xmp_value(xmp, "exif:GPSAltitude"))
    return _position(lat, lon, alt, _xmp_value(xmp, "exif:GPSAltitudeRef") == "1")


def _xmp_coordinate(value: str | None, refs: str) -> float | None:
    """XMP's ``DDD,MM.mmk`` or ``DDD,MM,SSk`` (k: N, S, E or W)."""
    match = _XMP_COORDINATE.fullmatch(value) if value else None
    if match is None:
        return None
    degrees, minutes, seconds, ref = match.groups()
    if ref not in refs:
        return None
    total = int(degrees) + float(minutes) / 60 + float(seconds or 0) / 3600
    return -total if ref == refs[1] else total


def _xmp_rational(value: str | None) -> float | None:
    if not value:
        return None
    num, _, den = value.strip().partition("/")
    try:
        result = float(num) / float(den) if den else float(num)
    except (ValueError, ZeroDivisionError):
        return None
    return result if math.isfinite(result) else None


# ---------------------------------------------------------------------------------------- values


def _text(value: Any) -> str | None:
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if not isinstance(value, str):
        return None
    value = value.split("\x00", 1)[0]
    if not value.isascii():
        # EXIF's ASCII tags, which Pillow reads as Latin-1: cameras and editors write UTF-8 there
        # ("Café" read as "CafÃ©"). Text that is not UTF-8 stays as read.
        with contextlib.suppress(UnicodeEncodeError, UnicodeDecodeError):
            value = value.encode("latin-1").decode("utf-8")
    return value


def _clean(value: str | None) -> str | None:
    if value is None:
        return None
    value = " ".join(_CONTROL.sub(" ", value).split())[:MAX_TEXT].strip()
    return value or None


def _number(value: Any) -> float | None:
    """A rational or number as a finite float (a zero denominator reads as nothing)."""
    try:
        result = float(value)
    except (TypeError, ValueError, ZeroDivisionError):
        return None
    return result if math.isfinite(result) else None
