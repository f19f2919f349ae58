"""Photos' own facts read from their header (memstore.media.photo_facts), without a database: real JPEG,
PNG, WebP and TIFF files with EXIF and XMP written by Pillow, the merge that never overwrites the
client's metadata, and broken or absurd headers that give no facts but never raise."""

from __future__ import annotations

import io
import random
import struct
import time
import zlib
from datetime import UTC, datetime
from typing import Any

import pytest
from PIL import Image, PngImagePlugin
from PIL.TiffImagePlugin import IFDRational

from memstore.inputs import MAX_METADATA_BYTES, check_metadata
from memstore.media import photo_facts
from memstore.search.filter_language import parse_timestamp


def exif_block(
    *,
    taken: str | None = "2024:07:14 15:30:05",
    offset: str | None = "+02:00",
    subsec: str | None = None,
    digitized: str | None = None,
    make: str | None = "Canon",
    model: str | None = "Canon EOS R6",
    orientation: int | None = None,
    gps: dict[int, Any] | None = None,
    in_first_ifd: bool = False,
) -> Image.Exif:
    exif = Image.Exif()
    if make is not None:
        exif[0x010F] = make
    if model is not None:
        exif[0x0110] = model
    if orientation is not None:
        exif[0x0112] = orientation
    sub = exif if in_first_ifd else exif.get_ifd(0x8769)
    if taken is not None:
        sub[0x9003] = taken
    if offset is not None:
        sub[0x9011] = offset
    if subsec is not None:
        sub[0x9291] = subsec
    if digitized is not None:
        sub[0x9004] = digitized
    if gps is not None:
        exif.get_ifd(0x8825).update(gps)
    return exif


PARIS = {
    1: "N",
    2: (IFDRational(48), IFDRational(51), IFDRational(3013, 100)),
    3: "E",
    4: (IFDRational(2), IFDRational(17), IFDRational(40)),
    5: b"\x00",
    6: IFDRational(352, 10),
}


def picture(exif: Image.Exif | bytes | None = None, *, fmt: str = "JPEG", size: tuple[int, int] = (64, 48)) -> bytes:
    buf = io.BytesIO()
    extra: dict[str, Any] = {}
    if exif is not None:
        extra["exif"] = exif.tobytes() if isinstance(exif, Image.Exif) else exif
    Image.new("RGB", size, (10, 120, 200)).save(buf, fmt, **extra)
    return buf.getvalue()


def test_a_jpeg_gives_every_fact_and_its_date_is_an_instant_the_filter_reads() -> None:
    facts = photo_facts.read(picture(exif_block(subsec="120", gps=PARIS)))
    assert facts == {
        "taken_at": "2024-07-14T15:30:05.12+02:00",
        "camera": {"make": "Canon", "model": "Canon EOS R6"},
        "gps": {"lat": 48.8583694, "lon": 2.2944444, "alt": 35.2},
        "width": 64,
        "height": 48,
    }
    assert parse_timestamp(facts["taken_at"]) == datetime(2024, 7, 14, 13, 30, 5, 120_000, tzinfo=UTC)
    assert check_metadata({"image": facts}) == {"image": facts}


def test_without_an_offset_the_local_time_is_written_without_one() -> None:
    facts = photo_facts.read(picture(exif_block(offset=None)))
    assert facts["taken_at"] == "2024-07-14T15:30:05"
    # The filter language reads it as UTC.
    assert parse_timestamp(facts["taken_at"]) == datetime(2024, 7, 14, 15, 30, 5, tzinfo=UTC)


def test_date_fallbacks_and_blank_dates() -> None:
    digitized = photo_facts.read(picture(exif_block(taken=None, offset=None, digitized="2020:01:02 03:04:05")))
    assert digitized["taken_at"] == "2020-01-02T03:04:05"
    misplaced = photo_facts.read(picture(exif_block(offset=None, in_first_ifd=True)))
    assert misplaced["taken_at"] == "2024-07-14T15:30:05"
    for blank in ("0000:00:00 00:00:00", "    :  :     :  :  ", "2024:02:30 10:00:00", "yesterday"):
        assert "taken_at" not in photo_facts.read(picture(exif_block(taken=blank))), blank
    # An offset that cannot be one is dropped, the local time kept.
    assert photo_facts.read(picture(exif_block(offset="+25:00")))["taken_at"] == "2024-07-14T15:30:05"


def test_the_size_is_as_shown_after_the_orientation() -> None:
    for fmt in ("JPEG", "PNG", "WEBP", "TIFF"):
        turned = photo_facts.read(picture(exif_block(orientation=6), fmt=fmt))
        assert (turned["width"], turned["height"]) == (48, 64), fmt
        upright = photo_facts.read(picture(exif_block(orientation=1), fmt=fmt))
        assert (upright["width"], upright["height"]) == (64, 48), fmt


@pytest.mark.parametrize("fmt", ["PNG", "WEBP", "TIFF"])
def test_other_formats_give_the_same_facts(fmt: str) -> None:
    facts = photo_facts.read(picture(exif_block(gps=PARIS), fmt=fmt))
    assert facts["taken_at"] == "2024-07-14T15:30:05+02:00"
    assert facts["camera"] == {"make": "Canon", "model": "Canon EOS R6"}
    assert facts["gps"]["lat"] == 48.8583694


def _png_chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def test_a_png_exif_chunk_after_the_pixels_is_found_without_decoding() -> None:
    plain = picture(fmt="PNG")
    at = plain.rindex(b"IEND") - 4
    data = plain[:at] + _png_chunk(b"eXIf", exif_block(offset=None).tobytes()) + plain[at:]
    with Image.open(io.BytesIO(data)) as img:
        assert "exif" not in img.info  # Pillow stops at the pixels
    assert photo_facts.read(data)["taken_at"] == "2024-07-14T15:30:05"


def test_gps_signs_altitude_and_positions_that_are_none() -> None:
    south_west = {**PARIS, 1: "S", 3: "W", 5: b"\x01"}
    assert photo_facts.read(picture(exif_block(gps=south_west)))["gps"] == {
        "lat": -48.8583694,
        "lon": -2.2944444,
        "alt": -35.2,
    }
    no_altitude = {k: v for k, v in PARIS.items() if k not in (5, 6)}
    assert photo_facts.read(picture(exif_block(gps=no_altitude)))["gps"] == {"lat": 48.8583694, "lon": 2.2944444}
    zero = {**PARIS, 2: (IFDRational(0), IFDRational(0), IFDRational(0))}
    zero[4] = zero[2]
    assert "gps" not in photo_facts.read(picture(exif_block(gps=zero)))  # no fix
    out_of_range = {**PARIS, 2: (IFDRational(95), IFDRational(0), IFDRational(0))}
    assert "gps" not in photo_facts.read(picture(exif_block(gps=out_of_range)))
    divided_by_zero = {**PARIS, 2: (IFDRational(48, 0), IFDRational(0), IFDRational(0))}
    assert "gps" not in photo_facts.read(picture(exif_block(gps=divided_by_zero)))


def test_camera_strings_are_trimmed_and_bounded() -> None:
    facts = photo_facts.read(picture(exif_block(make="  NIKON\x01 CORPORATION  ", model="x" * 500)))
    assert facts["camera"] == {"make": "NIKON CORPORATION", "model": "x" * photo_facts.MAX_TEXT}
    assert "camera" not in photo_facts.read(picture(exif_block(make="   ", model=None)))


XMP = (
    b'<x:xmpmeta xmlns:x="adobe:ns:meta/"><rdf:RDF xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#">'
    b'<rdf:Description exif:DateTimeOriginal="2023-12-24T18:00:00.5-05:00" tiff:Make="Nikon &amp; Co"'
    b' exif:GPSLatitude="40,44.5N" exif:GPSLongitude="73,59,15W" exif:GPSAltitude="105/10"'
    b' exif:GPSAltitudeRef="1" tiff:Orientation="8"><tiff:Model>D850</tiff:Model></rdf:Description>'
    b"</rdf:RDF></x:xmpmeta>"
)
XMP_FACTS = {
    "taken_at": "2023-12-24T18:00:00.5-05:00",
    "camera": {"make": "Nikon & Co", "model": "D850"},
    "gps": {"lat": 40.7416667, "lon": -73.9875, "alt": -10.5},
    "width": 20,
    "height": 30,
}


def test_xmp_gives_the_facts_exif_lacks() -> None:
    buf = io.BytesIO()
    Image.new("RGB", (30, 20)).save(buf, "JPEG", xmp=XMP)
    assert photo_facts.read(buf.getvalue()) == XMP_FACTS
    info = PngImagePlugin.PngInfo()
    info.add_itxt("XML:com.adobe.xmp", XMP.decode())
    buf = io.BytesIO()
    Image.new("RGB", (30, 20)).save(buf, "PNG", pnginfo=info)
    assert photo_facts.read(buf.getvalue()) == XMP_FACTS
    # EXIF comes first where both say it.
    buf = io.BytesIO()
    Image.new("RGB", (30, 20)).save(buf, "JPEG", xmp=XMP, exif=exif_block(orientation=1).tobytes())
    both = photo_facts.read(buf.getvalue())
    assert both["taken_at"] == "2024-07-14T15:30:05+02:00" and both["camera"]["make"] == "Canon"
    assert both["gps"] == XMP_FACTS["gps"] and both["width"] == 30


def test_a_picture_without_metadata_has_its_size_only() -> None:
    assert photo_facts.read(picture()) == {"width": 64, "height": 48}
    assert photo_facts.read(picture(fmt="GIF")) == {"width": 64, "height": 48}


@pytest.mark.filterwarnings("ignore::UserWarning")  # Pillow warns of the corrupt EXIF it reads
def test_broken_headers_give_no_facts_and_never_raise() -> None:
    good = picture(exif_block(gps=PARIS))
    at = good.index(b"Exif\x00\x00") + 6
    garbage = good[:at] + b"\xaa" * 40 + good[at + 40 :]
    assert photo_facts.read(garbage) == {"width": 64, "height": 48}
    # Offsets pointing outside the block, and a block cut short.
    wrong_offset = good[:at] + good[at : at + 4] + b"\xff\xff\xff\x00" + good[at + 8 :]
    assert "taken_at" not in photo_facts.read(wrong_offset)
    for data in (b"", b"not an image", good[:40], b"\xff\xd8\xff", b"\x89PNG\r\n\x1a\n", good[:200]):
        assert isinstance(photo_facts.read(data), dict)
    # Bytes of the EXIF block changed at random: whatever is read is valid metadata.
    rng = random.Random(7)
    end = good.index(b"\xff\xdb")
    for _ in range(300):
        data = bytearray(good)
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(at, end)] = rng.randrange(256)
        facts = photo_facts.read(bytes(data))
        check_metadata({"image": facts})


def test_absurd_blocks_are_not_parsed_and_cost_little() -> None:
    # An EXIF block past the limit (in a PNG chunk, which has no 64 KiB bound).
    big = exif_block(offset=None)
    big[0x010E] = "x" * (photo_facts.MAX_EXIF_BYTES + 1)  # ImageDescription
    facts = photo_facts.read(picture(big, fmt="PNG"))
    assert facts == {"width": 64, "height": 48}
    # A JPEG whose header is thousands of tiny segments: the walk stops at its bound.
    plain = picture()
    comments = b"\xff\xfe\x00\x03x" * 200_000
    started = time.perf_counter()
    assert photo_facts.read(plain[:2] + comments + plain[2:]) == {}
    assert time.perf_counter() - started < 0.5


def test_merge_never_overwrites_the_clients_metadata() -> None:
    facts = {"taken_at": "2024-07-14T15:30:05", "camera": {"make": "Canon", "model": "R6"}, "width": 6, "height": 4}
    assert photo_facts.merge(None, facts) == {"image": facts}
    assert photo_facts.merge({"album": "x"}, facts) == {"album": "x", "image": facts}
    # An image object of the client's: its keys kept whole, only the missing ones added.
    client = {"image": {"taken_at": "1999-01-01", "camera": {"make": "Mine"}, "caption": "c"}}
    assert photo_facts.merge(client, facts) == {
        "image": {"taken_at": "1999-01-01", "camera": {"make": "Mine"}, "caption": "c", "width": 6, "height": 4}
    }
    assert client == {"image": {"taken_at": "1999-01-01", "camera": {"make": "Mine"}, "caption": "c"}}
    # Any other image value, null included, is left alone (the very object comes back).
    for given in ({"image": None}, {"image": "yes"}, {"image": [1]}, {"image": dict(facts)}):
        assert photo_facts.merge(given, facts) is given
    assert photo_facts.merge({"a": 1}, {}) == {"a": 1}
    # Facts that would push the metadata past its limit are not added.
    full = {"blob": "x" * (MAX_METADATA_BYTES - 30)}
    assert photo_facts.merge(full, facts) is full
    not_an_object: Any = ["a"]
    assert photo_facts.merge(not_an_object, facts) is not_an_object


def test_a_camera_written_in_utf8_reads_as_written() -> None:
    """EXIF's text tags are ASCII by the standard, UTF-8 in practice; Pillow reads them as Latin-1."""
    exif = Image.Exif()
    exif[0x010F] = "Café Caméras".encode()
    exif[0x0110] = b"\xff\xfeModel"  # not UTF-8: kept as read
    assert photo_facts.read(picture(exif))["camera"] == {"make": "Café Caméras", "model": "ÿþModel"}
