"""Thumbnails: how they are made, made up for on first view (the migration adds the column empty), and
backfilled."""

from __future__ import annotations

import io
import struct
from collections.abc import Iterator

import numpy as np
import pytest
import sqlalchemy as sa
from alembic import command
from PIL import Image

from memstore.db import migrate
from memstore.db.core import Database, create_engine
from memstore.media import thumbnails
from memstore.queue import jobs
from memstore.queue.jobs import PendingItem
from memstore.store import VectorStore
from tests.api.api_helpers import make_image
from tests.databases import scratch_database


def _decoded(data: bytes | None) -> Image.Image:
    assert data is not None
    img = Image.open(io.BytesIO(data))
    img.load()
    return img


def test_a_thumbnail_is_a_webp_at_most_256_pixels_keeping_the_aspect() -> None:
    img = _decoded(thumbnails.make(make_image(1, size=(1600, 900))))
    assert img.format == "WEBP" and img.size == (256, 144)
    small = _decoded(thumbnails.make(make_image(2, size=(100, 50), fmt="PNG")))
    assert small.size == (100, 50)  # never enlarged


def test_transparency_is_kept_and_exif_rotation_applied() -> None:
    clear = Image.new("RGBA", (300, 300), (255, 0, 0, 0))
    buf = io.BytesIO()
    clear.save(buf, format="PNG")
    assert _decoded(thumbnails.make(buf.getvalue())).mode == "RGBA"
    wide = Image.new("RGB", (800, 400), (0, 128, 255))
    exif = Image.Exif()
    exif[0x0112] = 6  # rotated 90 degrees: shown upright, it is tall
    buf = io.BytesIO()
    wide.save(buf, format="JPEG", exif=exif)
    assert _decoded(thumbnails.make(buf.getvalue())).size == (128, 256)


def _rgb_profile(red: tuple[float, ...], green: tuple[float, ...], blue: tuple[float, ...]) -> bytes:
    """A minimal ICC v2 display profile: its primaries (XYZ, D50) and a 2.2 gamma curve."""

    def s15(x: float) -> bytes:
        return struct.pack(">i", round(x * 65536))

    def xyz(v: tuple[float, ...]) -> bytes:
        return b"XYZ " + b"\0" * 4 + b"".join(s15(x) for x in v)

    curve = b"curv" + b"\0" * 4 + struct.pack(">IH", 1, round(2.2 * 256)) + b"\0\0"
    white = (0.9642, 1.0, 0.8249)
    tags = [(b"wtpt", xyz(white)), (b"rXYZ", xyz(red)), (b"gXYZ", xyz(green)), (b"bXYZ", xyz(blue))]
    tags += [(b"rTRC", curve), (b"gTRC", curve), (b"bTRC", curve)]
    table, body = struct.pack(">I", len(tags)), b""
    for sig, data in tags:
        table += sig + struct.pack(">II", 128 + 4 + 12 * len(tags) + len(body), len(data))
        body += data
    size = 128 + len(table) + len(body)
    header = struct.pack(">I4sI", size, b"", 0x02100000) + b"mntrRGB XYZ " + b"\0" * 12 + b"acsp" + b"\0" * 28
    header += b"".join(s15(x) for x in white) + b"\0" * 48
    return header + table + body


def test_a_thumbnail_shows_the_colours_of_the_originals_profile() -> None:
    """A photo's colour profile (a phone's Display P3) is applied: a profile whose red primary is
    sRGB's green makes a red-numbered picture green, as a browser shows it."""
    srgb_red, srgb_green, srgb_blue = (0.4361, 0.2225, 0.0139), (0.3851, 0.7169, 0.0971), (0.1431, 0.0606, 0.7141)
    swapped = _rgb_profile(srgb_green, srgb_red, srgb_blue)
    for fmt in ("JPEG", "PNG"):
        tagged, plain = io.BytesIO(), io.BytesIO()
        Image.new("RGB", (64, 32), (255, 0, 0)).save(tagged, fmt, icc_profile=swapped)
        Image.new("RGB", (64, 32), (255, 0, 0)).save(plain, fmt)
        r, g, _ = _decoded(thumbnails.make(tagged.getvalue())).convert("RGB").getpixel((32, 16))
        assert g > 200 and r < 60, (fmt, r, g)
        r, g, _ = _decoded(thumbnails.make(plain.getvalue())).convert("RGB").getpixel((32, 16))
        assert r > 200 and g < 60, (fmt, r, g)
        broken = io.BytesIO()
        Image.new("RGB", (64, 32), (255, 0, 0)).save(broken, fmt, icc_profile=b"not a profile")
        r, g, _ = _decoded(thumbnails.make(broken.getvalue())).convert("RGB").getpixel((32, 16))
        assert r > 200 and g < 60, (fmt, r, g)  # the pixels as they are


def test_what_is_not_a_decodable_image_has_no_thumbnail() -> None:
    assert thumbnails.make(b"plain text, not a picture") is None
    whole = make_image(3, size=(400, 300))
    assert thumbnails.make(whole[: len(whole) // 3]) is None  # truncated
    bomb = io.BytesIO()
    Image.new("1", (9000, 8000)).save(bomb, format="PNG")  # 72 million pixels, a few KiB
    assert thumbnails.make(bomb.getvalue()) is None


def test_a_ready_image_without_one_gets_it_on_first_view(store: VectorStore, engine, collection_name) -> None:
    """A vector written by hand over a queued image: ready, yet no worker made its thumbnail."""
    c = store.create_collection(name=collection_name, dimensions=4)
    item = PendingItem(content=make_image(4), content_type="image/jpeg")
    with Database(engine).write() as conn:
        pending = jobs._enqueue(conn, c, {item.key(): item}, jobs.PRIORITY_DEFAULT)[item.key()]
        # Queued, but due in an hour: the session's test server runs an ingest worker on this database,
        # which would otherwise claim the job and rewrite the row while the test reads it.
        conn.execute(
            "UPDATE memstore_ingest_queue SET not_before = now() + interval '1 hour' WHERE collection_id = %s",
            (c.id,),
        )
    assert thumbnails.read(Database(engine), c, pending.id) is None  # pending: nothing to show yet
    store.update_item(collection=c.name, id=pending.id, vector=np.ones(4))
    assert thumbnails.previews(Database(engine), c, [pending.id])[pending.id].has_thumbnail is False
    made = thumbnails.read(Database(engine), c, pending.id)
    assert _decoded(made).format == "WEBP"
    assert thumbnails.previews(Database(engine), c, [pending.id])[pending.id].has_thumbnail is True  # stored
    assert thumbnails.read(Database(engine), c, pending.id) == made


def test_an_image_that_cannot_be_thumbnailed_is_decoded_once_not_on_every_view(
    store: VectorStore, engine, collection_name, monkeypatch
) -> None:
    c = store.create_collection(name=collection_name, dimensions=4)
    [pending] = jobs.enqueue(Database(engine), c, [PendingItem(content=make_image(4), content_type="image/jpeg")])
    store.update_item(collection=c.name, id=pending.id, vector=np.ones(4))
    calls: list[int] = []

    def failing(content: bytes) -> None:
        calls.append(len(content))
        return None

    monkeypatch.setattr(thumbnails, "make", failing)
    for _ in range(5):
        assert thumbnails.read(Database(engine), c, pending.id) is None
    assert len(calls) == 1


@pytest.fixture
def scratch_url(server_url: str) -> Iterator[str]:
    """A database of its own, to move between revisions."""
    with scratch_database(server_url, "memstore_ui", migrated=False) as url:
        yield url


def _column_exists(engine: sa.Engine, table: str) -> bool:
    with engine.connect() as conn:
        found = conn.exec_driver_sql(
            "SELECT 1 FROM information_schema.columns WHERE table_name = %(t)s AND column_name = 'thumbnail'",
            {"t": table},
        ).fetchone()
    return found is not None


def test_the_migration_adds_the_column_and_first_views_fill_it(scratch_url: str, settings) -> None:
    """Revision 0007 adds the column to every collection table (each partition's too) and makes no
    thumbnail (it is frozen: it cannot decode images with the code of the day); the first view of a
    ready image makes and stores its thumbnail, a broken image and a text item get none."""
    migrate.upgrade(scratch_url)
    engine = create_engine(scratch_url)
    try:
        store = VectorStore(engine, settings=settings.model_copy(update={"database_url": scratch_url}))
        made = {}
        for name, partitions in (("plain", 1), ("parted", 2)):
            c = store.create_collection(name=name, dimensions=4, partitions=partitions)
            images = [PendingItem(content=make_image(10 + i), content_type="image/jpeg") for i in range(3)]
            broken = make_image(20)
            items = [*images, PendingItem(content=broken[:200], content_type="image/jpeg"), PendingItem(text="a note")]
            done = jobs.enqueue(Database(engine), c, items)
            for d in done:
                store.update_item(collection=name, id=d.id, vector=np.ones(4))
            made[name] = (c, [d.id for d in done])
        command.downgrade(migrate.alembic_config(scratch_url), "0006")
        assert not _column_exists(engine, "c1_plain")
        migrate.upgrade(scratch_url)
        for c, ids in made.values():
            assert all(_column_exists(engine, t) for t in c.partition_tables())
            shown = thumbnails.previews(Database(engine), c, ids)
            assert [shown[i].has_thumbnail for i in ids] == [False] * 5  # the column comes empty
            first = [thumbnails.read(Database(engine), c, i) for i in ids]
            assert [_decoded(t).format for t in first[:3]] == ["WEBP"] * 3
            assert first[3:] == [None, None]
            shown = thumbnails.previews(Database(engine), c, ids)
            assert [shown[i].has_thumbnail for i in ids] == [True, True, True, False, False]  # stored
    finally:
        engine.dispose()


def test_the_backfill_works_in_batches_and_resumes(store: VectorStore, engine, collection_name) -> None:
    from memstore.db.core import dedicated_connection

    c = store.create_collection(name=collection_name, dimensions=4)
    done = jobs.enqueue(
        Database(engine), c, [PendingItem(content=make_image(30 + i), content_type="image/jpeg") for i in range(5)]
    )
    for d in done:
        store.update_item(collection=c.name, id=d.id, vector=np.ones(4))
    conn = dedicated_connection(engine, application_name="test-backfill")
    try:
        assert thumbnails.backfill_table(conn, c.table_name, batch=2) == 5  # three batches
        assert thumbnails.backfill_table(conn, c.table_name, batch=2) == 0  # nothing left to make
    finally:
        conn.close()
    assert all(p.has_thumbnail for p in thumbnails.previews(Database(engine), c, [d.id for d in done]).values())
