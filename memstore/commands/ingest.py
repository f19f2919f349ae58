"""``memstore ingest PATH --collection NAME``: bulk upload through the API's durable queue.

What PATH is decides what is sent:
- a folder: every image (by suffix) and every plain-text file (``.txt``, ``.md``) under it, at any
  depth; other files are counted as ignored;
- a ``.jsonl`` file: one text item per line (``{"text", "external_id"?, "metadata"?}``);
- any other file: that one file, an image if its suffix or first bytes say so, else a text if it
  is UTF-8.

Each item's external id is its path relative to the folder (a single file: its name; a JSONL line:
its ``external_id``, else ``line-N``), so an interrupted run started again skips what the server
already holds and re-sending never duplicates.

A file's item records ``path``, ``filename``, ``source`` (the folder it came from: its absolute path,
or ``--source``), ``size``, ``modified`` and ``sha256`` in its metadata. ``--sync`` lists the items of
that ``source`` (by a metadata filter) and sends again the files whose record differs; ``--delete``
deletes, by a filter that names the source, the items whose files are gone (never those of another
source, and nothing when the folder has no files).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import httpx

from encoder.cli_support import EXIT_USAGE, json_object_option, json_option, print_json
from memstore.commands.api_access import api_options

if TYPE_CHECKING:
    import memstore_client

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".webp", ".gif", ".bmp", ".tif", ".tiff"}
TEXT_SUFFIXES = {".txt", ".md"}
# Tries of one request in all: on connection errors after 1, 2, 4 ... 30 s (about a minute and a half).
ATTEMPTS = 8
# The metadata field that names the folder an item came from (what --sync --delete keeps to).
SOURCE = "source"
# --wait: how often the collection is polled, and how long OCR may read nothing before the wait ends.
POLL_S = 0.5
OCR_STALL_S = 60
# What the server answers when one item of a request is bad (invalid input, an image it cannot read,
# a file over its limit): it refuses the whole request, so such a batch is sent again item by item.
ONE_BAD_ITEM = {413, 422}


@dataclass
class Source:
    """One item to send: an image or a text file (``path``), or a text of a JSONL line (``text``).

    A file's ``metadata`` holds its ``size`` and ``modified`` as ``os.stat`` gives them, and is
    completed by ``file_metadata`` (its hash needs its bytes, read only when needed)."""

    external_id: str
    kind: str  # image or text
    path: Path | None = None
    text: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    sha256: str | None = None

    def digest(self) -> str:
        """The SHA-256 of the file's bytes (of the text, for a JSONL line), read once."""
        if self.sha256 is None:
            data = self.path.read_bytes() if self.path is not None else (self.text or "").encode()
            self.sha256 = hashlib.sha256(data).hexdigest()
        return self.sha256

    def load_text(self) -> str:
        """A text item's text: a file's is read when it is sent (UnicodeDecodeError: not UTF-8).

        Decoded from the bytes, not read in text mode: universal newlines would store ``\\r\\n`` as
        ``\\n``, a text other than the one ``size`` and ``sha256`` describe. The hash is taken from the
        same read, so that a file edited meanwhile is not recorded with another version's hash."""
        if self.text is None and self.path is not None:
            data = self.path.read_bytes()
            self.sha256 = hashlib.sha256(data).hexdigest()
            self.text = data.decode("utf-8")
        return self.text or ""


def _modified(st: os.stat_result) -> str:
    """A file's modification time as ISO 8601 in UTC, to the microsecond (what date-range filters compare)."""
    moment = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=st.st_mtime_ns // 1000)
    return moment.isoformat(timespec="microseconds").replace("+00:00", "Z")


def _file(rel: str, f: Path, kind: str, source: str, extra: dict[str, Any]) -> Source:
    st = f.stat()
    meta = {**extra, "path": rel, "filename": f.name, "source": source, "size": st.st_size, "modified": _modified(st)}
    return Source(rel, kind, path=f, metadata=meta)


def file_metadata(s: Source) -> dict[str, Any]:
    """What a file's item records: ``path``, ``filename``, ``source``, ``size``, ``modified`` and ``sha256``
    (a JSONL line's metadata is its own)."""
    if s.path is None:
        return s.metadata
    return {**s.metadata, "sha256": s.digest()}


def source_of(path: Path) -> str:
    """The folder an item records it came from (``metadata.source``): a folder's absolute path; for one
    file, the folder that holds it (so that it is the same item as when its folder is ingested)."""
    resolved = path.resolve()
    return str(resolved if resolved.is_dir() else resolved.parent)


def is_image(path: Path) -> bool:
    """By its suffix, else by its header: one of the formats the API decodes (Pillow reads the header
    only)."""
    if path.suffix.lower() in IMAGE_SUFFIXES:
        return True
    from PIL import Image, UnidentifiedImageError

    from encoder.images import ALLOWED_FORMATS

    try:
        with Image.open(path, formats=ALLOWED_FORMATS):
            return True
    except Image.DecompressionBombError:
        return True  # an image, too large: the server says so
    except (UnidentifiedImageError, OSError):
        return False


def read_text(path: Path, where: str) -> str:
    """A text file's text as it is (its line endings kept: see ``Source.load_text``)."""
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise SystemExit(
            f"memstore ingest: {where} is neither an image nor UTF-8 text; give a folder, a .jsonl file, "
            "an image or a text file"
        ) from None


def walk(
    path: Path,
    ignored: list[Path] | None = None,
    *,
    source: str | None = None,
    metadata: dict[str, Any] | None = None,
) -> Iterator[Source]:
    """The items PATH holds (see the module's docstring); files a folder holds that are neither
    images nor text files are appended to ``ignored``. Files' items record ``source`` (default:
    ``source_of(path)``) and ``metadata`` besides their own facts."""
    src = source or source_of(path)
    extra = dict(metadata or {})
    if path.is_dir():
        for f in _folder_files(path, ignored):
            rel = f.relative_to(path).as_posix()
            if f.suffix.lower() in IMAGE_SUFFIXES:
                yield _file(rel, f, "image", src, extra)
            elif f.suffix.lower() in TEXT_SUFFIXES:
                yield _file(rel, f, "text", src, extra)
            elif ignored is not None:
                ignored.append(f)
        return
    if path.suffix.lower() == ".jsonl":
        yield from _jsonl(path, extra)
    elif is_image(path):
        yield _file(path.name, path, "image", src, extra)
    else:
        item = _file(path.name, path, "text", src, extra)
        item.text = read_text(path, str(path))
        yield item


def _folder_files(root: Path, ignored: list[Path] | None) -> list[Path]:
    """The files under ``root``, in path order, less what a folder of one's own holds but is not its
    content: hidden files and folders (``.git``, ``.DS_Store``; a hidden folder is not walked), links
    to anything outside ``root`` and links to nothing. What is left out is added to ``ignored``; a
    linked folder is not walked (its files are found where they are)."""
    inside = root.resolve()
    found: list[Path] = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in files:
            f = Path(folder, name)
            if name.startswith("."):
                left_out = True
            elif f.is_symlink():
                target = f.resolve()
                left_out = not target.is_file() or not target.is_relative_to(inside)
            else:
                left_out = not f.is_file()
            if not left_out:
                found.append(f)
            elif ignored is not None:
                ignored.append(f)
    return sorted(found)


def _jsonl(path: Path, extra: dict[str, Any]) -> Iterator[Source]:
    # In binary, lines end at \n only, as JSON Lines says: text mode would also end one at a lone \r.
    with path.open("rb") as fh:
        try:
            for n, raw in enumerate(fh, 1):
                line = raw.decode("utf-8")
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except ValueError as exc:
                    raise SystemExit(f"memstore ingest: {path}:{n}: not JSON ({exc})") from None
                if not isinstance(row, dict) or not isinstance(row.get("text"), str):
                    raise SystemExit(f'memstore ingest: {path}:{n}: expected {{"text": ...}}')
                meta = {**extra, **(row.get("metadata") or {})}
                yield Source(str(row.get("external_id") or f"line-{n}"), "text", text=row["text"], metadata=meta)
        except UnicodeDecodeError:
            raise SystemExit(f"memstore ingest: {path} is not UTF-8 text (a .jsonl file holds JSON lines)") from None


def batches_of(sources: list[Source], size: int) -> list[list[Source]]:
    """Batches of at most ``size``, each all images (multipart) or all texts (JSON), in order."""
    out: list[list[Source]] = []
    for s in sources:
        last = out[-1] if out else None
        if last is None or len(last) >= size or last[0].kind != s.kind:
            out.append([s])
        else:
            last.append(s)
    return out


class Client:
    """``memstore ingest``'s side of the API: ``memstore_client.Client`` with the command's retry
    policy (8 tries over about a minute and a half, each retry said on stderr) and its own exits: a
    key that is refused, or a server that cannot be reached, stops the run with one line."""

    def __init__(self, url: str, key: str | None, collection: str) -> None:
        import memstore_client

        self.api = memstore_client.Client(
            url,
            api_key=key,
            timeout=120,
            retry=memstore_client.RetryPolicy(attempts=ATTEMPTS, backoff_s=1.0, max_backoff_s=30.0),
            on_retry=self._say_retry,
        )
        self.base = f"/v1/collections/{collection}"
        self.collection = collection

    @property
    def http(self) -> httpx.Client:
        return self.api.http

    @http.setter
    def http(self, value: httpx.Client) -> None:
        self.api.http = value

    def call(self, method: str, url: str, **kw: Any) -> httpx.Response:
        """One request, retried (8 tries in all) on 429/503, after the server's Retry-After, and on
        connection errors, after 1, 2, 4 ... 30 s; a server that stays busy answers with its last reply."""
        import memstore_client

        try:
            return self.api.request(method, url, raise_for_status=False, **kw)
        except memstore_client.ConnectionFailedError as error:
            raise SystemExit(f"memstore ingest: cannot reach {self.api.url}: {error.cause}") from None

    def _say_retry(self, event: memstore_client.RetryEvent) -> None:
        """One line on stderr per retry, so that a wrong --url or a busy server is not a silent minute."""
        import memstore_client

        error = event.error
        why = (
            f"cannot reach {self.api.url} ({error.cause})"
            if isinstance(error, memstore_client.ConnectionFailedError)
            else f"the server is busy ({getattr(error, 'status', '?')})"
        )
        click.echo(
            f"memstore ingest: {why}; trying again in {event.sleep_s:.0f} s (attempt {event.attempt} of {ATTEMPTS})",
            err=True,
        )

    def _exit(self, error: memstore_client.MemstoreError, doing: str = "") -> SystemExit:
        import memstore_client

        if isinstance(error, memstore_client.ConnectionFailedError):
            return SystemExit(f"memstore ingest: cannot reach {self.api.url}: {error.cause}")
        return SystemExit(f"memstore ingest: {doing}{error}")

    def find(self) -> memstore_client.Collection | None:
        """The collection, or None when there is none of that name."""
        import memstore_client

        try:
            return self.api.get_collection(self.collection)
        except memstore_client.NotFoundError:
            return None
        except memstore_client.MemstoreError as error:
            raise self._exit(error) from None

    def ensure_collection(self) -> bool:
        import memstore_client

        if self.find() is not None:
            return False
        try:
            self.api.create_collection(self.collection)
        except memstore_client.MemstoreError as error:
            raise self._exit(error, f"cannot create collection {self.collection!r}: ") from None
        return True

    def existing(self, ids: list[str]) -> dict[str, int]:
        """Which of these external ids the collection holds: external id -> item id."""
        import memstore_client

        try:
            return self.api.lookup(self.collection, ids)
        except memstore_client.MemstoreError as error:
            raise self._exit(error) from None

    def from_source(self, source: str, path: str | None = None) -> dict[str, memstore_client.Item]:
        """The items that record ``source`` as the folder they came from (and ``path``, if given), by
        external id: listed by their metadata filter, 1,000 a request; the rest of the collection is
        never read."""
        import memstore_client

        wanted: dict[str, Any] = {SOURCE: source} if path is None else {SOURCE: source, "path": path}
        try:
            return {i.external_id: i for i in self.api.iter_items(self.collection, filter=wanted, page_size=1000)}
        except memstore_client.MemstoreError as error:
            raise self._exit(error) from None

    def delete(self, source: str, paths: list[str]) -> int:
        """Delete the items of ``source`` at these paths: the filter names the source, so an item that
        records another is never deleted, whatever its path."""
        import memstore_client

        deleted = 0
        try:
            for chunk in _filter_chunks(paths):
                deleted += self.api.delete_items(self.collection, filter={SOURCE: source, "path": {"$in": chunk}})
        except memstore_client.MemstoreError as error:
            raise self._exit(error, "cannot delete: ") from None
        return deleted

    def stats(self) -> memstore_client.Collection:
        import memstore_client

        try:
            return self.api.get_collection(self.collection)
        except memstore_client.MemstoreError as error:
            raise self._exit(error) from None

    def send(self, batch: list[Source]) -> memstore_client.ItemsAck | memstore_client.APIError:
        """One batch: its acknowledgements, or the server's refusal (a connection that stays down ends the run)."""
        import memstore_client

        try:
            if batch[0].kind == "text":
                items = [
                    {"external_id": s.external_id, "text": s.load_text(), "metadata": file_metadata(s)} for s in batch
                ]
                return self.api.add_items(self.collection, items)
            files = [(s.path.name, s.path.read_bytes()) for s in batch if s.path is not None]
            return self.api.upload(
                self.collection,
                files,
                external_ids=[s.external_id for s in batch],
                metadata=[file_metadata(s) for s in batch],
            )
        except memstore_client.APIError as error:
            return error
        except memstore_client.ConnectionFailedError as error:
            raise self._exit(error) from None

    def deliver(
        self, batch: list[Source]
    ) -> list[tuple[list[Source], memstore_client.ItemsAck | memstore_client.APIError]]:
        """A batch sent, as (items, answer) pairs: the batch and its answer, or, when the server refused
        the batch for what one of its items holds, each item and its own answer, so that a bad file is
        rejected alone, with its reason, and its neighbours are stored. One request an item, not a
        search by halves: a refused batch is rare, and the server's answer may name one bad item of
        several."""
        import memstore_client

        answer = self.send(batch)
        if len(batch) > 1 and isinstance(answer, memstore_client.APIError) and answer.status in ONE_BAD_ITEM:
            return [([s], self.send([s])) for s in batch]
        return [(batch, answer)]


def _filter_chunks(paths: list[str], budget: int = 12_000) -> Iterator[list[str]]:
    """Paths in lists that keep a filter within the filter language's bounds (16 KiB, 512 values)."""
    chunk: list[str] = []
    size = 0
    for p in paths:
        n = len(json.dumps(p)) + 2
        if chunk and (size + n > budget or len(chunk) >= 500):
            yield chunk
            chunk, size = [], 0
        chunk.append(p)
        size += n
    if chunk:
        yield chunk


@dataclass
class Plan:
    """What a run does: the items to send (new ones, changed ones, ones recorded without this folder),
    the ones left as they are, and the paths whose items are deleted (their files are gone)."""

    new: list[Source] = field(default_factory=list)
    changed: list[Source] = field(default_factory=list)
    adopted: list[Source] = field(default_factory=list)
    unchanged: list[Source] = field(default_factory=list)
    delete: list[str] = field(default_factory=list)

    @property
    def send(self) -> list[Source]:
        return [*self.new, *self.changed, *self.adopted]


def same_record(s: Source, stored: dict[str, Any]) -> bool:
    """Whether an item's stored metadata already says what this file's would: the same content (by
    its hash; a file whose size and modification time are the recorded ones is not read again) and the
    same facts and --metadata."""
    if s.path is None:
        return False
    recorded = stored.get("sha256")
    if not isinstance(recorded, str):
        return False
    if all(stored.get(k) == s.metadata.get(k) for k in ("size", "modified")):
        s.sha256 = recorded  # unchanged, as rsync and git judge it: not read again
    ours = file_metadata(s)
    return all(stored.get(k) == v for k, v in ours.items())


def plan_sync(client: Client | None, sources: list[Source], source: str, delete: bool) -> Plan:
    """Compare the folder with the items that record it (``client`` None: a collection not yet made)."""
    plan = Plan()
    # One file (not a folder to delete from) looks up its own item only.
    only = sources[0].metadata.get("path") if len(sources) == 1 and not delete else None
    listed = client.from_source(source, only) if client is not None else {}
    others: list[Source] = []
    for s in sources:
        item = listed.get(s.external_id)
        if item is None:
            others.append(s)
        elif same_record(s, item.metadata):
            plan.unchanged.append(s)
        else:
            plan.changed.append(s)
    found: dict[str, int] = {}
    if client is not None:
        for i in range(0, len(others), 1000):
            found.update(client.existing([s.external_id for s in others[i : i + 1000]]))
    for s in others:
        (plan.adopted if s.external_id in found else plan.new).append(s)
    if delete:
        here = {s.external_id for s in sources}
        plan.delete = sorted(str(item.metadata.get("path", eid)) for eid, item in listed.items() if eid not in here)
    return plan


def plan_resume(client: Client | None, sources: list[Source]) -> Plan:
    """Without --sync: send what the collection does not hold yet (a run started again resumes)."""
    plan = Plan()
    for i in range(0, len(sources), 1000):
        chunk = sources[i : i + 1000]
        have = client.existing([s.external_id for s in chunk]) if client is not None else {}
        for s in chunk:
            (plan.unchanged if s.external_id in have else plan.new).append(s)
    return plan


@click.command("ingest", short_help="upload a folder, a JSONL of texts or one file (resumable, --sync)")
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--collection", required=True, metavar="NAME", help="target collection (created if missing)")
@api_options
@click.option(
    "--sync",
    is_flag=True,
    help="also send again the files whose content changed since they were sent (by their SHA-256)",
)
@click.option("--delete", is_flag=True, help="with --sync: delete the items of this folder whose files are gone")
@click.option("--dry-run", is_flag=True, help="say what would be sent and deleted; send and delete nothing")
@click.option(
    "--source",
    metavar="LABEL",
    help="what the items record as the folder they came from (metadata.source; default: the folder's "
    "absolute path): give the same label when the folder moves",
)
@click.option(
    "--metadata",
    "extra",
    metavar="JSON",
    callback=json_object_option('{"tags": ["phone"]}'),
    help='metadata for every item, e.g. {"tags": ["phone"]} (the file facts take precedence)',
)
@click.option("--batch", type=int, metavar="N", default=16, help="items per request")
@click.option("--concurrency", type=int, metavar="N", default=2, help="requests in flight")
@click.option(
    "--wait", is_flag=True, help="after uploading, wait until every vector is written (and, with OCR on, read)"
)
@click.option("--no-progress", is_flag=True, help="no progress bar")
@json_option("print the summary as JSON")
def command(
    path: Path,
    collection: str,
    url: str,
    key: str | None,
    sync: bool,
    delete: bool,
    dry_run: bool,
    source: str | None,
    extra: dict[str, Any] | None,
    batch: int,
    concurrency: int,
    wait: bool,
    no_progress: bool,
    as_json: bool,
) -> int:
    """Upload PATH into a collection through the API's durable queue.

    PATH is a folder (its images and .txt/.md files, at any depth), a .jsonl file (one text item per
    line: {"text": ..., "external_id"?: ..., "metadata"?: {...}}), or one image or text file.

    Each item's external id is its path relative to the folder (a single file: its name; a JSONL
    line: its external_id, else line-N), so a run started again skips what the server already holds
    and sending again never duplicates. A file's item records path, filename, source (the folder),
    size, modified and sha256 in its metadata.

    --sync makes the collection follow the folder (safe to run from cron): files whose content
    changed are sent again, new ones sent, and with --delete the items of this folder (those whose
    metadata.source is this folder) whose files are gone are deleted; items from elsewhere are never
    touched. --dry-run says what it would do.
    """
    from tqdm import tqdm

    try:
        import memstore_client
    except ImportError:  # the client distribution, client/ in the repository
        raise SystemExit("memstore ingest: needs the memstore-client package (pip install ./client)") from None
    if not path.exists():
        click.echo(f"memstore ingest: {path} does not exist", err=True)
        return EXIT_USAGE
    folder = path.is_dir()
    if delete and not sync:
        click.echo("memstore ingest: --delete goes with --sync", err=True)
        return EXIT_USAGE
    if sync and not folder and path.suffix.lower() == ".jsonl":
        click.echo("memstore ingest: --sync follows a folder or a file; a .jsonl's lines are not files", err=True)
        return EXIT_USAGE
    if delete and not folder:
        click.echo("memstore ingest: --delete needs a folder (its items whose files are gone are deleted)", err=True)
        return EXIT_USAGE
    label = source or source_of(path)
    ignored: list[Path] = []
    sources = list(walk(path, ignored, source=label, metadata=extra))
    client = Client(url, key, collection)
    started = time.monotonic()
    created = False
    if dry_run:
        target = client if client.find() is not None else None
    else:
        created = client.ensure_collection()
        target = client
    plan = plan_sync(target, sources, label, delete) if sync else plan_resume(target, sources)
    withheld = ""
    if plan.delete and not sources:
        # An empty folder (a disk not mounted, a wrong path) never empties the collection.
        withheld = f"the folder has no files: the {len(plan.delete)} item(s) of {label} are not deleted"
        plan.delete = []
    # Each item to send ends in one of: not sent (``not_sent``), or sent and counted by what the server
    # did with it (created, updated, metadata, unchanged, rejected).
    counts = {"created": 0, "updated": 0, "metadata": 0, "unchanged": 0, "rejected": 0}
    errors: list[str] = []
    deleted = 0
    todo = plan.send
    not_sent = blank = 0
    waited: dict[str, int | None] = {"pending": None, "ocr_pending": None}
    if not dry_run:
        todo, blank = _sendable(todo, errors)
        not_sent = len(plan.send) - len(todo)
        queued = 0  # items this run left to embed
        images = 0  # and images among them, for OCR
        bar = tqdm(total=len(todo), unit="item", disable=no_progress, desc="upload", file=sys.stderr)
        batches = batches_of(todo, max(1, batch))
        with ThreadPoolExecutor(max(1, concurrency)) as pool:
            for answers in pool.map(client.deliver, batches):
                for sent, answer in answers:
                    if isinstance(answer, memstore_client.ItemsAck):
                        for item in answer.items:
                            counts[item.change] = counts.get(item.change, 0) + 1
                            if item.status == "pending":
                                queued += 1
                                images += sent[0].kind == "image"
                    elif answer.status in (401, 403):  # the key, not the items: no other batch would pass
                        raise SystemExit(f"memstore ingest: {answer}")
                    else:
                        counts["rejected"] += len(sent)
                        rest = f" and {len(sent) - 1} more in its batch" if len(sent) > 1 else ""
                        errors.append(f"{sent[0].external_id}{rest}: {answer}")
                    bar.update(len(sent))
        bar.close()
        if plan.delete:
            deleted = client.delete(label, plan.delete)
        if wait:
            waited = _wait(client, queued, images, no_progress)
    stats = client.stats() if target is not None else None
    seconds = time.monotonic() - started
    summary: dict[str, Any] = {
        "collection": collection,
        "collection_created": created,
        "source": label,
        "sync": sync,
        "dry_run": dry_run,
        "found": len(sources),
        "ignored": len(ignored),
        "skipped": len(plan.unchanged),
        "sent": 0 if dry_run else len(todo),
        "not_sent": not_sent,
        "new": len(plan.new),
        "changed": len(plan.changed),
        "adopted": len(plan.adopted),
        "deleted": len(plan.delete) if dry_run else deleted,
        **counts,
        "pending": stats.pending if stats is not None else None,
        "failed": stats.failed if stats is not None else None,
        "ocr_pending": stats.ocr_pending if stats is not None else None,
        "seconds": round(seconds, 2),
        "items_per_s": round(len(todo) / seconds, 2) if seconds > 0 and not dry_run else None,
        "errors": errors[:20],
    }
    if sync or dry_run:
        summary["paths"] = {
            "new": [s.external_id for s in plan.new][:1000],
            "changed": [s.external_id for s in plan.changed + plan.adopted][:1000],
            "deleted": plan.delete[:1000],
        }
    if withheld:
        summary["warning"] = withheld
    if as_json:
        print_json(summary)
    else:
        click.echo(_report(summary, len(ignored)))
        if dry_run:
            for what, ids in summary["paths"].items():
                for eid in ids[:50]:
                    click.echo(f"  {what:8} {eid}")
        for e in errors[:20]:
            click.echo(f"  {e}", err=True)
    if withheld:
        click.echo(f"memstore ingest: {withheld}", err=True)
    if waited.get("ocr_stalled"):
        click.echo(
            f"memstore ingest: {waited['ocr_pending']} image(s) still wait for OCR and none was read in "
            f"{OCR_STALL_S} s: is Tesseract installed where the workers run (Debian: apt-get install "
            "tesseract-ocr tesseract-ocr-eng)? The server's log says why.",
            err=True,
        )
    return 1 if counts["rejected"] or not_sent > blank or withheld else 0


def _report(summary: dict[str, Any], ignored: int) -> str:
    """The summary as one line: what the run did (or would do), and the collection's state."""
    name = summary["collection"]
    if summary["dry_run"]:
        would = (
            f"{name}: dry run, nothing sent or deleted: would send {summary['new']} new and "
            f"{summary['changed'] + summary['adopted']} changed, delete {summary['deleted']}; "
            f"{summary['skipped']} unchanged"
        )
        return would + (f"; ignored {ignored} file(s) that are neither images nor .txt/.md" if ignored else "")
    sent = (
        f"{summary['sent']} sent ({summary['created']} new, {summary['updated']} changed, "
        f"{summary['metadata']} metadata only, {summary['unchanged']} unchanged, {summary['rejected']} rejected)"
    )
    if summary["not_sent"]:
        sent += f", {summary['not_sent']} not sent (empty or unreadable)"
    if summary["sync"]:
        head = (
            f"{name}: sync of {summary['source']}: {summary['new']} new, {summary['changed']} changed, "
            f"{summary['deleted']} deleted, {summary['skipped']} unchanged"
            + (f", {summary['adopted']} recorded as this folder's" if summary["adopted"] else "")
            + f"; {sent}"
        )
    else:
        head = f"{name}: {sent}, {summary['skipped']} already there"
    tail = f"; {summary['pending']} pending, {summary['failed']} failed in the collection"
    if summary.get("ocr_pending"):
        tail += f", {summary['ocr_pending']} waiting for OCR"
    return (
        head
        + tail
        + f"; {summary['seconds']:.1f} s"
        + (f"; ignored {ignored} file(s) that are neither images nor .txt/.md" if ignored else "")
    )


def _sendable(todo: list[Source], errors: list[str]) -> tuple[list[Source], int]:
    """The items to send, less those that cannot be items: files that cannot be read, texts that are
    not UTF-8, and blank texts, which the server refuses (each said in ``errors``); and how many were
    blank (a placeholder file is no failure of the run)."""
    out = []
    blank = 0
    for s in todo:
        if s.kind == "text":
            try:
                text = s.load_text()
            except UnicodeDecodeError:
                errors.append(f"{s.external_id}: not UTF-8 text, not sent")
                continue
            except OSError as exc:
                errors.append(f"{s.external_id}: {exc}, not sent")
                continue
            if not text.strip():
                errors.append(f"{s.external_id}: empty text, not sent")
                blank += 1
                continue
        elif s.path is not None:
            try:  # read when its batch is sent; one that cannot be opened must not end the run then
                with s.path.open("rb"):
                    pass
            except OSError as exc:
                errors.append(f"{s.external_id}: {exc.strerror or exc}, not sent")
                continue
        out.append(s)
    return out, blank


def _wait(client: Client, queued: int, images: int, quiet: bool) -> dict[str, Any]:
    """Wait until nothing is pending in the collection, then, with OCR on, until its images are read.

    The bars count this run's items (``queued`` to embed, ``images`` to read) or what the collection
    has waiting, whichever is more; OCR that reads nothing for OCR_STALL_S (no Tesseract on the
    workers' hosts) ends the wait with ``ocr_stalled``."""
    from tqdm import tqdm

    stats = client.stats()
    pending = stats.pending or 0
    total = max(queued, pending)
    bar = tqdm(total=total, initial=total - pending, unit="item", disable=quiet, desc="embed", file=sys.stderr)
    while pending:
        time.sleep(POLL_S)
        stats = client.stats()
        pending = stats.pending or 0
        bar.n = max(0, total - pending)
        bar.refresh()
    bar.close()
    out: dict[str, Any] = {"pending": 0, "ocr_pending": stats.ocr_pending, "ocr_stalled": False}
    if not stats.ocr:
        return out
    waiting = stats.ocr_pending or 0
    total = max(images, waiting)
    bar = tqdm(total=total, initial=total - waiting, unit="image", disable=quiet, desc="ocr", file=sys.stderr)
    last, since = waiting, time.monotonic()
    while waiting:
        time.sleep(POLL_S)
        stats = client.stats()
        waiting = stats.ocr_pending or 0
        if waiting != last:
            last, since = waiting, time.monotonic()
        elif time.monotonic() - since > OCR_STALL_S:
            out["ocr_stalled"] = True
            break
        bar.n = max(0, total - waiting)
        bar.refresh()
    bar.close()
    out["ocr_pending"] = waiting
    return out
