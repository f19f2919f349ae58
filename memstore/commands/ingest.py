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
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import httpx

from memstore.cli_support import EXIT_USAGE, json_option, print_json
from memstore.commands.api_access import api_options

if TYPE_CHECKING:
    import memstore_client

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".webp", ".gif", ".bmp", ".tif", ".tiff"}
TEXT_SUFFIXES = {".txt", ".md"}
# Tries of one request in all: on connection errors after 1, 2, 4 ... 30 s (about a minute and a half).
ATTEMPTS = 8


@dataclass(frozen=True)
class Source:
    external_id: str
    path: Path | None = None
    text: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)


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
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise SystemExit(
            f"memstore ingest: {where} is neither an image nor UTF-8 text; give a folder, a .jsonl file, "
            "an image or a text file"
        ) from None


def walk(path: Path, ignored: list[Path] | None = None) -> Iterator[Source]:
    """The items PATH holds (see the module's docstring); files a folder holds that are neither
    images nor text files are appended to ``ignored``."""
    if path.is_dir():
        for f in sorted(path.rglob("*")):
            if not f.is_file():
                continue
            rel = f.relative_to(path).as_posix()
            if f.suffix.lower() in IMAGE_SUFFIXES:
                yield Source(rel, path=f, metadata={"path": rel})
            elif f.suffix.lower() in TEXT_SUFFIXES:
                yield Source(rel, text=read_text(f, str(f)), metadata={"path": rel})
            elif ignored is not None:
                ignored.append(f)
        return
    if path.suffix.lower() == ".jsonl":
        yield from _jsonl(path)
    elif is_image(path):
        yield Source(path.name, path=path, metadata={"path": path.name})
    else:
        yield Source(path.name, text=read_text(path, str(path)), metadata={"path": path.name})


def _jsonl(path: Path) -> Iterator[Source]:
    with path.open(encoding="utf-8") as fh:
        try:
            for n, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except ValueError as exc:
                    raise SystemExit(f"memstore ingest: {path}:{n}: not JSON ({exc})") from None
                if not isinstance(row, dict) or not isinstance(row.get("text"), str):
                    raise SystemExit(f'memstore ingest: {path}:{n}: expected {{"text": ...}}')
                yield Source(
                    str(row.get("external_id") or f"line-{n}"), text=row["text"], metadata=row.get("metadata") or {}
                )
        except UnicodeDecodeError:
            raise SystemExit(f"memstore ingest: {path} is not UTF-8 text (a .jsonl file holds JSON lines)") from None


def batches_of(sources: list[Source], size: int) -> list[list[Source]]:
    """Batches of at most ``size``, each all images (multipart) or all texts (JSON), in order."""
    out: list[list[Source]] = []
    for s in sources:
        last = out[-1] if out else None
        if last is None or len(last) >= size or (last[0].path is None) != (s.path is None):
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

    def ensure_collection(self) -> bool:
        import memstore_client

        try:
            self.api.get_collection(self.collection)
            return False
        except memstore_client.NotFoundError:
            pass
        except memstore_client.MemstoreError as error:
            raise self._exit(error) from None
        try:
            self.api.create_collection(self.collection)
        except memstore_client.MemstoreError as error:
            raise self._exit(error, f"cannot create collection {self.collection!r}: ") from None
        return True

    def existing(self, ids: list[str]) -> set[str]:
        import memstore_client

        try:
            return set(self.api.lookup(self.collection, ids))
        except memstore_client.MemstoreError as error:
            raise self._exit(error) from None

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
            if batch[0].path is None:
                items = [{"external_id": s.external_id, "text": s.text, "metadata": s.metadata} for s in batch]
                return self.api.add_items(self.collection, items)
            files = [(s.path.name, s.path.read_bytes()) for s in batch if s.path is not None]
            return self.api.upload(
                self.collection,
                files,
                external_ids=[s.external_id for s in batch],
                metadata=[s.metadata for s in batch],
            )
        except memstore_client.APIError as error:
            return error
        except memstore_client.ConnectionFailedError as error:
            raise self._exit(error) from None


@click.command("ingest", short_help="upload a folder, a JSONL of texts or one file (resumable)")
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--collection", required=True, metavar="NAME", help="target collection (created if missing)")
@api_options
@click.option("--batch", type=int, metavar="N", default=16, help="items per request")
@click.option("--concurrency", type=int, metavar="N", default=2, help="requests in flight")
@click.option("--wait", is_flag=True, help="after uploading, wait until every vector is written")
@click.option("--no-progress", is_flag=True, help="no progress bar")
@json_option("print the summary as JSON")
def command(
    path: Path,
    collection: str,
    url: str,
    key: str | None,
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
    and sending again never duplicates.
    """
    from tqdm import tqdm

    try:
        import memstore_client
    except ImportError:  # the client distribution, client/ in the repository
        raise SystemExit("memstore ingest: needs the memstore-client package (pip install ./client)") from None
    if not path.exists():
        click.echo(f"memstore ingest: {path} does not exist", err=True)
        return EXIT_USAGE
    ignored: list[Path] = []
    sources = list(walk(path, ignored))
    client = Client(url, key, collection)
    created = client.ensure_collection()
    started = time.monotonic()
    todo: list[Source] = []
    for i in range(0, len(sources), 1000):  # resume: skip what the server already holds
        chunk = sources[i : i + 1000]
        have = client.existing([s.external_id for s in chunk])
        todo.extend(s for s in chunk if s.external_id not in have)
    counts = {"created": 0, "updated": 0, "metadata": 0, "unchanged": 0, "rejected": 0}
    errors: list[str] = []
    batches = batches_of(todo, max(1, batch))
    bar = tqdm(total=len(todo), unit="item", disable=no_progress, desc="upload", file=sys.stderr)
    with ThreadPoolExecutor(max(1, concurrency)) as pool:
        for sent, answer in zip(batches, pool.map(client.send, batches), strict=True):
            if isinstance(answer, memstore_client.ItemsAck):
                for item in answer.items:
                    counts[item.change] = counts.get(item.change, 0) + 1
            elif answer.status in (401, 403):  # the key, not the items: no other batch would pass
                raise SystemExit(f"memstore ingest: {answer}")
            else:
                counts["rejected"] += len(sent)
                rest = f" and {len(sent) - 1} more in its batch" if len(sent) > 1 else ""
                errors.append(f"{sent[0].external_id}{rest}: {answer}")
            bar.update(len(sent))
    bar.close()
    pending = 0
    if wait:
        pending = _wait(client, no_progress)
    stats = client.stats()
    seconds = time.monotonic() - started
    summary = {
        "collection": collection,
        "collection_created": created,
        "found": len(sources),
        "ignored": len(ignored),
        "skipped": len(sources) - len(todo),
        "sent": len(todo),
        **counts,
        "pending": stats.pending if stats.pending is not None else pending,
        "failed": stats.failed,
        "seconds": round(seconds, 2),
        "items_per_s": round(len(todo) / seconds, 2) if seconds > 0 else None,
        "errors": errors[:20],
    }
    if as_json:
        print_json(summary)
    else:
        click.echo(
            f"{collection}: {len(todo)} sent ({counts['created']} new, {counts['updated']} changed, "
            f"{counts['unchanged']} unchanged, {counts['rejected']} rejected), {summary['skipped']} already there; "
            f"{summary['pending']} pending, {summary['failed']} failed in the collection; {seconds:.1f} s"
            + (f"; ignored {len(ignored)} file(s) that are neither images nor .txt/.md" if ignored else "")
        )
        for e in errors[:20]:
            click.echo(f"  {e}", err=True)
    return 1 if counts["rejected"] else 0


def _wait(client: Client, quiet: bool) -> int:
    from tqdm import tqdm

    total = client.stats().pending or 0
    bar = tqdm(total=total, unit="item", disable=quiet, desc="embed", file=sys.stderr)
    pending = total
    while pending:
        time.sleep(0.5)
        pending = client.stats().pending or 0
        bar.n = max(0, total - pending)
        bar.refresh()
    bar.close()
    return pending
