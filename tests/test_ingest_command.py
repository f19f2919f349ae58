"""``memstore ingest`` on a folder as people have them: a few files the server refuses or that cannot be
items (a text named .png, a text with a NUL, empty and blank texts, a file that is not UTF-8) among good
ones, CRLF line endings; against the tiny-model server. Only the bad files are left out, each said with
its reason, the texts are stored byte for byte, and the summary's counts add up."""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from PIL import Image

from memstore.cli import main
from memstore.commands import ingest
from tests.api.api_helpers import make_image

CRLF = b"line one\r\nline two\r\n"
GOOD = {"crlf.txt", "normal.txt", "notes.md", "sub/a.jpg", "sub/orient6.jpg", "sub/z.png"}
SENT_AND_REFUSED = {"nul.txt", "sub/text_as.png"}
NOT_SENT = {"blank.md": "empty text", "empty.txt": "empty text", "latin1.txt": "not UTF-8 text"}
SENT_CHANGES = ("created", "updated", "metadata", "unchanged", "rejected")


def _rotated_jpeg() -> bytes:
    """A JPEG whose EXIF says to turn it (orientation 6), as phones write them."""
    img = Image.open(io.BytesIO(make_image(6)))
    exif = Image.Exif()
    exif[0x0112] = 6
    buf = io.BytesIO()
    img.save(buf, format="JPEG", exif=exif)
    return buf.getvalue()


def _folder(root: Path) -> Path:
    folder = root / "fold"
    (folder / "sub").mkdir(parents=True)
    (folder / "crlf.txt").write_bytes(CRLF)
    (folder / "normal.txt").write_bytes(b"a plain note about the garden\n")
    (folder / "notes.md").write_bytes(b"# notes\nthe bicycle needs new brakes\n")
    (folder / "nul.txt").write_bytes(b"a text with a \x00 inside")  # UTF-8, but the server refuses it
    (folder / "empty.txt").write_bytes(b"")
    (folder / "blank.md").write_bytes(b"  \r\n\t\n")
    (folder / "latin1.txt").write_bytes("caf\xe9 cr\xe8me".encode("latin-1"))
    (folder / "data.bin").write_bytes(b"\x00\x01 neither an image nor a text")
    (folder / "sub" / "a.jpg").write_bytes(make_image(1))
    (folder / "sub" / "orient6.jpg").write_bytes(_rotated_jpeg())
    (folder / "sub" / "text_as.png").write_bytes(b"this is a text file with a .png suffix\n")
    (folder / "sub" / "z.png").write_bytes(make_image(2, fmt="PNG"))
    return folder


@pytest.fixture
def api(server: Any, admin_key: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {admin_key}"}, timeout=60) as c:
        yield c


def _items(api: httpx.Client, name: str) -> dict[str, dict[str, Any]]:
    listed = api.get(f"/v1/collections/{name}/items", params={"limit": 1000})
    assert listed.status_code == 200, listed.text
    return {i["external_id"]: i for i in listed.json()["items"]}


def _adds_up(summary: dict[str, Any]) -> None:
    """Every file found lands in one place: already there, not sent, or sent and counted by what the
    server did with it."""
    assert summary["sent"] == sum(summary[k] for k in SENT_CHANGES), summary
    assert summary["found"] == summary["skipped"] + summary["not_sent"] + summary["sent"], summary


def test_bad_files_are_left_out_alone_and_texts_are_stored_as_they_are(
    tmp_path: Path, server: Any, admin_key: str, api: httpx.Client, collection_name: str, capsys
) -> None:
    folder = _folder(tmp_path)
    common = ["--collection", collection_name, "--url", server.url, "--key", admin_key, "--no-progress"]

    assert main(["ingest", str(folder), *common, "--wait", "--json"]) == 1
    first = json.loads(capsys.readouterr().out)
    _adds_up(first)
    assert (first["found"], first["ignored"], first["skipped"]) == (11, 1, 0)
    assert (first["sent"], first["not_sent"], first["created"], first["rejected"]) == (8, 3, 6, 2)
    assert first["pending"] == 0 and first["failed"] == 0
    errors = {e.split(": ", 1)[0]: e.split(": ", 1)[1] for e in first["errors"]}
    assert set(errors) == SENT_AND_REFUSED | set(NOT_SENT), errors  # each bad file alone, no batch blamed
    assert errors["sub/text_as.png"].startswith("422 Image rejected") and "text_as.png" in errors["sub/text_as.png"]
    assert errors["nul.txt"].startswith("422 Invalid input") and "NUL" in errors["nul.txt"]
    for eid, why in NOT_SENT.items():
        assert errors[eid] == f"{why}, not sent"

    items = _items(api, collection_name)
    assert set(items) == GOOD
    assert all(i["status"] == "ready" for i in items.values())
    crlf = items["crlf.txt"]
    assert crlf["text"] == CRLF.decode()
    content = api.get(f"/v1/collections/{collection_name}/items/{crlf['id']}/content")
    assert content.status_code == 200 and content.content == CRLF
    assert crlf["metadata"]["sha256"] == hashlib.sha256(content.content).hexdigest()
    assert crlf["metadata"]["size"] == len(CRLF)

    # A run started again sends only what the collection does not hold: the refused files, refused
    # again, and stores nothing else; the text summary says the same as the JSON.
    assert main(["ingest", str(folder), *common]) == 1
    out, err = capsys.readouterr()
    assert (
        "2 sent (0 new, 0 changed, 0 metadata only, 0 unchanged, 2 rejected), 3 not sent (empty or unreadable), "
        "6 already there"
    ) in out
    for eid in [*SENT_AND_REFUSED, *NOT_SENT]:
        assert f"  {eid}: " in err
    assert "more in its batch" not in err
    assert main(["ingest", str(folder), *common, "--json"]) == 1
    again = json.loads(capsys.readouterr().out)
    _adds_up(again)
    assert (again["skipped"], again["sent"], again["rejected"], again["not_sent"], again["created"]) == (6, 2, 2, 3, 0)
    after = _items(api, collection_name)
    assert set(after) == GOOD
    assert after["crlf.txt"]["text"] == CRLF.decode() and after["crlf.txt"]["id"] == crlf["id"]

    # One text file, given alone, is stored as it is too.
    single = tmp_path / "one" / "single.txt"
    single.parent.mkdir()
    single.write_bytes(b"first\r\nsecond\rthird\n")
    assert main(["ingest", str(single), *common, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["created"] == 1
    one = _items(api, collection_name)["single.txt"]
    assert one["text"] == "first\r\nsecond\rthird\n"
    assert one["metadata"]["sha256"] == hashlib.sha256(single.read_bytes()).hexdigest()


def test_a_jsonl_keeps_its_texts_and_leaves_out_blank_ones(
    tmp_path: Path, server: Any, admin_key: str, api: httpx.Client, collection_name: str, capsys
) -> None:
    rows = [
        {"external_id": "a", "text": "first\r\nof two lines"},
        {"external_id": "blank", "text": " \n "},
        {"external_id": "b", "text": "second"},
    ]
    path = tmp_path / "texts.jsonl"
    # CRLF between lines, and a lone CR (JSON whitespace) inside one: still three lines.
    path.write_bytes(b"\r\n".join(json.dumps(r).replace(", ", ",\r ", 1).encode() for r in rows) + b"\r\n")
    common = ["--collection", collection_name, "--url", server.url, "--key", admin_key, "--no-progress", "--json"]
    assert main(["ingest", str(path), *common]) == 0  # a blank text is reported, not a failure of the run
    out = json.loads(capsys.readouterr().out)
    _adds_up(out)
    assert (out["found"], out["sent"], out["not_sent"], out["created"], out["rejected"]) == (3, 2, 1, 2, 0)
    assert out["errors"] == ["blank: empty text, not sent"]
    items = _items(api, collection_name)
    assert set(items) == {"a", "b"} and items["a"]["text"] == "first\r\nof two lines"


def test_a_batch_refused_for_one_item_is_sent_again_item_by_item() -> None:
    """413 (a file over the server's limit) as 422: the others of the batch are stored."""
    sizes: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        items = json.loads(request.content)["items"]
        sizes.append(len(items))
        if len(items) > 1 or items[0]["external_id"] == "big.txt":
            problem = {"type": "/problems/payload-too-large", "title": "Payload too large", "status": 413}
            return httpx.Response(413, json={**problem, "detail": "items[1].text is too large"})
        ack = {"id": len(sizes), "external_id": items[0]["external_id"], "status": "pending", "change": "created"}
        return httpx.Response(202, json={"items": [ack]})

    client = ingest.Client("http://memstore.test", "k", "c")
    client.http = httpx.Client(base_url="http://memstore.test", transport=httpx.MockTransport(handler))
    batch = [ingest.Source(name, "text", text=name) for name in ("a.txt", "big.txt", "c.txt")]
    answers = client.deliver(batch)
    assert sizes == [3, 1, 1, 1]
    assert [(sent[0].external_id, getattr(answer, "status", "ok")) for sent, answer in answers] == [
        ("a.txt", "ok"),
        ("big.txt", 413),
        ("c.txt", "ok"),
    ]


def test_a_folder_is_walked_without_its_hidden_files_or_links_out_of_it(tmp_path: Path) -> None:
    root = tmp_path / "notes"
    (root / "sub").mkdir(parents=True)
    (root / ".git").mkdir()
    (tmp_path / "elsewhere").mkdir()
    (root / "a.txt").write_bytes(b"a")
    (root / "sub" / "b.md").write_bytes(b"b")
    (root / ".hidden.txt").write_bytes(b"hidden")
    (root / ".git" / "x.md").write_bytes(b"git's")
    (tmp_path / "outside.txt").write_bytes(b"not the folder's")
    (tmp_path / "elsewhere" / "c.txt").write_bytes(b"not the folder's either")
    (root / "link_in.txt").symlink_to(root / "a.txt")
    (root / "link_out.txt").symlink_to(tmp_path / "outside.txt")
    (root / "dangling.txt").symlink_to(root / "missing.txt")
    (root / "linked_folder").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    ignored: list[Path] = []
    found = [s.external_id for s in ingest.walk(root, ignored)]
    assert found == ["a.txt", "link_in.txt", "sub/b.md"]
    assert sorted(p.name for p in ignored) == [".hidden.txt", "dangling.txt", "link_out.txt"]


def test_a_file_that_cannot_be_opened_is_not_sent_and_the_run_goes_on(tmp_path: Path) -> None:
    root = tmp_path / "pictures"
    root.mkdir()
    (root / "a.png").write_bytes(make_image(1, fmt="PNG"))
    (root / "gone.png").write_bytes(make_image(2, fmt="PNG"))
    sources = list(ingest.walk(root))
    (root / "gone.png").unlink()  # between the folder's walk and its batch
    errors: list[str] = []
    sendable, blank = ingest._sendable(sources, errors)
    assert [s.external_id for s in sendable] == ["a.png"] and blank == 0
    assert errors == ["gone.png: No such file or directory, not sent"]
