"""``memstore ingest --sync``: a real folder of photos (with EXIF) and notes follows its edits and
deletions into a collection, against the tiny-model server; what items record (path, filename,
source, size, modified, sha256), filters on them, the progress bars and waiting for OCR."""

from __future__ import annotations

import hashlib
import io
import json
import os
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from PIL import Image

from memstore.cli import main
from memstore.commands import ingest
from tests.api.api_helpers import make_image


def _photo(seed: int, taken: str) -> bytes:
    """A JPEG with EXIF: the camera and the moment it was taken."""
    rng = np.random.default_rng(seed)
    img = Image.fromarray(rng.integers(0, 255, size=(6, 8, 3), dtype=np.uint8)).resize((96, 72))
    exif = Image.Exif()
    exif[0x010F] = "Fictional Camera Co"  # Make
    exif[0x0132] = taken  # DateTime
    buf = io.BytesIO()
    img.save(buf, format="JPEG", exif=exif)
    return buf.getvalue()


def _at(path: Path, day: str) -> None:
    moment = datetime.fromisoformat(day).replace(tzinfo=UTC).timestamp()
    os.utime(path, (moment, moment))


@pytest.fixture
def api(server: Any, admin_key: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {admin_key}"}, timeout=60) as c:
        yield c


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
    code = main(["ingest", *args, "--json", "--no-progress"])
    return code, json.loads(capsys.readouterr().out)


def _words(api: httpx.Client, name: str, words: str, **extra: Any) -> list[str]:
    body = {"text": words, "mode": "keyword", "k": 50, **extra}
    r = api.post(f"/v1/collections/{name}/search", json=body)
    assert r.status_code == 200, r.text
    return [h["external_id"] for h in r.json()["results"]]


def _ids(api: httpx.Client, name: str) -> dict[str, int]:
    items = api.get(f"/v1/collections/{name}/items", params={"limit": 1000}).json()["items"]
    return {i["external_id"]: i["id"] for i in items}


def test_sync_follows_edits_and_deletions_of_a_folder(tmp_path, server, admin_key, api, collection_name, capsys):
    folder = tmp_path / "memories"
    (folder / "screens").mkdir(parents=True)
    (folder / "holiday-1.jpg").write_bytes(_photo(1, "2023:01:15 09:30:00"))
    (folder / "holiday-2.jpg").write_bytes(_photo(2, "2024:06:02 18:00:00"))
    (folder / "screens" / "error.png").write_bytes(make_image(3, fmt="PNG"))
    (folder / "groceries.txt").write_text("buy apples and oat milk")
    (folder / "plumber.md").write_text("# call the plumber\nthe kitchen tap drips")
    (folder / "parking.txt").write_text("an obsolete reminder about parking permits")
    _at(folder / "holiday-1.jpg", "2023-01-15T09:30:00")
    for f in ("holiday-2.jpg", "screens/error.png", "groceries.txt", "plumber.md", "parking.txt"):
        _at(folder / f, "2024-06-02T18:00:00")
    elsewhere = tmp_path / "work"
    elsewhere.mkdir()
    (elsewhere / "budget.txt").write_text("the parking budget for next year")
    common = ["--collection", collection_name, "--url", server.url, "--key", admin_key]

    code, first = _run(capsys, str(folder), *common, "--sync", "--wait", "--metadata", '{"tags": ["home"]}')
    assert code == 0, first
    assert (first["new"], first["created"], first["changed"], first["deleted"], first["pending"]) == (6, 6, 0, 0, 0)
    assert first["source"] == str(folder.resolve())
    code, other = _run(capsys, str(elsewhere), *common, "--sync")
    assert code == 0 and other["created"] == 1 and other["source"] == str(elsewhere.resolve())
    before = _ids(api, collection_name)
    assert set(before) == {
        "holiday-1.jpg",
        "holiday-2.jpg",
        "screens/error.png",
        "groceries.txt",
        "plumber.md",
        "parking.txt",
        "budget.txt",
    }
    note = api.get(f"/v1/collections/{collection_name}/items/{before['groceries.txt']}").json()
    meta = note["metadata"]
    assert (meta["path"], meta["filename"], meta["source"], meta["tags"]) == (
        "groceries.txt",
        "groceries.txt",
        str(folder.resolve()),
        ["home"],
    )
    assert meta["sha256"] == hashlib.sha256(b"buy apples and oat milk").hexdigest()
    assert meta["modified"] == "2024-06-02T18:00:00.000000Z" and meta["size"] == 23
    # A text file is found by its name, as an image is.
    assert _words(api, collection_name, "groceries") == ["groceries.txt"]
    assert set(_words(api, collection_name, "holiday")) == {"holiday-1.jpg", "holiday-2.jpg"}

    # Run again untouched (as cron does): nothing is sent, nothing deleted.
    code, again = _run(capsys, str(folder), *common, "--sync", "--delete", "--metadata", '{"tags": ["home"]}')
    assert code == 0 and (again["sent"], again["skipped"], again["deleted"]) == (0, 6, 0), again

    (folder / "groceries.txt").write_text("buy bananas, coffee beans and rice")
    (folder / "parking.txt").unlink()
    dry_args = ["--sync", "--delete", "--dry-run", "--metadata", '{"tags": ["home"]}']
    code, dry = _run(capsys, str(folder), *common, *dry_args)
    assert code == 0 and dry["dry_run"] is True
    assert dry["paths"] == {"new": [], "changed": ["groceries.txt"], "deleted": ["parking.txt"]}
    assert (dry["sent"], dry["skipped"]) == (0, 4)
    assert _ids(api, collection_name) == before  # a dry run changes nothing
    assert main(["ingest", str(folder), *common, *dry_args]) == 0
    said = capsys.readouterr().out
    assert "dry run" in said and "changed  groceries.txt" in said and "deleted  parking.txt" in said

    code, synced = _run(
        capsys, str(folder), *common, "--sync", "--delete", "--wait", "--metadata", '{"tags": ["home"]}'
    )
    assert code == 0, synced
    assert (synced["new"], synced["changed"], synced["deleted"], synced["skipped"]) == (0, 1, 1, 4)
    assert (synced["updated"], synced["pending"], synced["failed"]) == (1, 0, 0)
    after = _ids(api, collection_name)
    assert "parking.txt" not in after
    assert after == {k: v for k, v in before.items() if k != "parking.txt"}  # the others keep their ids
    assert _words(api, collection_name, "bananas coffee") == ["groceries.txt"]
    assert _words(api, collection_name, "apples") == []
    assert _words(api, collection_name, "parking") == ["budget.txt"]  # from elsewhere: never deleted

    # memstore search shows the hit without the ingest's bookkeeping (--json gives it all).
    assert (
        main(["search", collection_name, "bananas", "--mode", "keyword", "--url", server.url, "--key", admin_key]) == 0
    )
    shown = capsys.readouterr().out
    assert "groceries.txt" in shown and '"tags": ["home"]' in shown and "sha256" not in shown, shown

    # Filters on what the items record: the tag given with --metadata, a range of modification dates.
    assert set(_words(api, collection_name, "holiday", filter={"tags": "home"})) == {"holiday-1.jpg", "holiday-2.jpg"}
    listed = api.post(
        f"/v1/collections/{collection_name}/items/list",
        json={"filter": {"tags": "home", "modified": {"$gte": "2023-01-01", "$lt": "2023-02-01"}}},
    ).json()["items"]
    assert [i["external_id"] for i in listed] == ["holiday-1.jpg"]
    counted = api.post(
        f"/v1/collections/{collection_name}/items/count", json={"filter": {"modified": {"$gte": "2024-06-01"}}}
    ).json()
    assert counted["count"] == 5  # holiday-2, error.png, plumber.md; groceries.txt and budget.txt written today

    # The text summary says what it did.
    (folder / "new-note.txt").write_text("a fresh note")
    assert main(["ingest", str(folder), *common, "--sync", "--delete", "--no-progress"]) == 0
    line = capsys.readouterr().out
    assert "sync of" in line and "1 new, " in line and "0 deleted" in line, line


def test_delete_never_empties_a_collection_from_an_empty_folder(
    tmp_path, server, admin_key, api, collection_name, capsys
):
    folder = tmp_path / "mount"
    folder.mkdir()
    for i in range(2):
        (folder / f"n{i}.txt").write_text(f"note {i}")
    common = [str(folder), "--collection", collection_name, "--url", server.url, "--key", admin_key]
    assert _run(capsys, *common, "--sync")[0] == 0
    for f in folder.iterdir():
        f.unlink()  # as a disk that is not mounted looks
    code, out = _run(capsys, *common, "--sync", "--delete")
    assert code == 1 and out["deleted"] == 0 and "not deleted" in out["warning"]
    assert main(["ingest", *common, "--sync", "--delete", "--no-progress"]) == 1
    assert "not deleted" in capsys.readouterr().err
    assert set(_ids(api, collection_name)) == {"n0.txt", "n1.txt"}
    assert main(["ingest", *common, "--delete"]) == 2  # --delete goes with --sync
    assert "--delete goes with --sync" in capsys.readouterr().err


def test_items_ingested_before_sync_are_recorded_then_followed(
    tmp_path, server, admin_key, api, collection_name, capsys
):
    """Items sent without a source (an older ingest, or by hand) are sent again once to record it, and
    are then followed like the rest; the server keeps their content (no new embedding)."""
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "a.txt").write_text("alpha")
    (folder / "b.txt").write_text("beta")
    assert api.post("/v1/collections", json={"name": collection_name}).status_code == 201
    r = api.post(
        f"/v1/collections/{collection_name}/items?wait=true",
        json={"items": [{"external_id": "a.txt", "text": "alpha"}]},
    )
    assert r.status_code == 201, r.text
    common = [str(folder), "--collection", collection_name, "--url", server.url, "--key", admin_key]
    code, out = _run(capsys, *common, "--sync")
    assert code == 0 and (out["new"], out["adopted"], out["created"], out["metadata"]) == (1, 1, 1, 1), out
    (folder / "a.txt").unlink()
    code, out = _run(capsys, *common, "--sync", "--delete")
    assert code == 0 and out["paths"]["deleted"] == ["a.txt"] and out["deleted"] == 1


def test_the_progress_bars_count_every_item_sent(tmp_path, server, admin_key, collection_name, capsys) -> None:
    folder = tmp_path / "mixed"
    folder.mkdir()
    for i in range(3):
        (folder / f"p{i}.jpg").write_bytes(make_image(40 + i))
    for i in range(4):
        (folder / f"t{i}.txt").write_text(f"text number {i}")
    args = [str(folder), "--collection", collection_name, "--url", server.url, "--key", admin_key, "--wait"]
    assert main(["ingest", *args]) == 0
    lines = capsys.readouterr().err.replace("\r", "\n").splitlines()
    upload = [line for line in lines if line.startswith("upload")]
    embed = [line for line in lines if line.startswith("embed")]
    assert upload and "7/7" in upload[-1], lines
    assert embed and "7/7" in embed[-1], lines  # images and texts alike


def test_wait_waits_for_ocr_when_the_collection_reads_images(tmp_path, server, admin_key, api, collection_name, capsys):
    assert api.post("/v1/collections", json={"name": collection_name, "ocr": True}).status_code == 201
    folder = tmp_path / "screens"
    folder.mkdir()
    for i in range(2):
        (folder / f"s{i}.png").write_bytes(make_image(60 + i, fmt="PNG"))
    common = [str(folder), "--collection", collection_name, "--url", server.url, "--key", admin_key, "--wait"]
    code, out = _run(capsys, *common)
    assert code == 0 and out["created"] == 2 and out["ocr_pending"] == 0, out
    for item_id in _ids(api, collection_name).values():
        assert api.get(f"/v1/collections/{collection_name}/items/{item_id}").json()["ocr"]["status"] in (
            "done",
            "failed",
        )


class _Stats:
    def __init__(self, pending: int, ocr_pending: int) -> None:
        self.pending, self.ocr_pending, self.ocr, self.failed = pending, ocr_pending, True, 0


def test_a_wait_for_ocr_that_reads_nothing_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    """No Tesseract where the workers run: the images wait for ever; --wait gives up after OCR_STALL_S."""
    answers = iter([_Stats(2, 3), _Stats(0, 3)] + [_Stats(0, 3)] * 1000)

    class Fake:
        def stats(self) -> _Stats:
            return next(answers)

    monkeypatch.setattr(ingest, "POLL_S", 0.001)
    monkeypatch.setattr(ingest, "OCR_STALL_S", 0.05)
    out = ingest._wait(Fake(), 2, 2, quiet=True)  # type: ignore[arg-type]
    assert out["ocr_stalled"] is True and out["ocr_pending"] == 3


def test_one_file_a_dry_run_on_no_collection_and_what_sync_refuses(
    tmp_path, server, admin_key, api, collection_name, capsys
) -> None:
    note = tmp_path / "todo.md"
    note.write_text("water the plants")
    common = ["--collection", collection_name, "--url", server.url, "--key", admin_key]
    code, dry = _run(capsys, str(note), *common, "--sync", "--dry-run")
    assert code == 0 and dry["new"] == 1 and dry["collection_created"] is False
    assert api.get(f"/v1/collections/{collection_name}").status_code == 404  # a dry run creates nothing
    code, first = _run(capsys, str(note), *common, "--sync", "--wait")
    assert code == 0 and first["created"] == 1 and first["source"] == str(tmp_path.resolve())
    note.write_text("water the plants and feed the cat")
    code, second = _run(capsys, str(note), *common, "--sync", "--wait")
    assert code == 0 and (second["changed"], second["updated"]) == (1, 1), second
    assert _words(api, collection_name, "cat") == ["todo.md"]
    lines = tmp_path / "lines.jsonl"
    lines.write_text('{"text": "one"}\n')
    assert main(["ingest", str(lines), *common, "--sync"]) == 2
    assert "not files" in capsys.readouterr().err
    assert main(["ingest", str(note), *common, "--sync", "--delete"]) == 2
    assert "--delete needs a folder" in capsys.readouterr().err
    assert main(["ingest", str(note), *common, "--metadata", "[1]"]) == 2
