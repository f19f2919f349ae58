"""``memstore ingest PATH --collection NAME``: bulk upload through the API's durable queue.

A folder is walked for images; a ``.jsonl`` file is read as texts (``{"text", "external_id"?,
"metadata"?}`` per line). Each item's external id is its path relative to the folder (or its line's
``external_id``, else ``line-N``), so an interrupted run started again skips what the server already
holds and re-sending never duplicates.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".webp", ".gif", ".bmp", ".tif", ".tiff"}


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from memstore.settings import get_settings

    s = get_settings()
    p = sub.add_parser("ingest", help="upload a folder of images or a JSONL of texts (resumable)")
    p.add_argument("path", type=Path, help="a folder of images, or a .jsonl file of texts")
    p.add_argument("--collection", required=True, help="target collection (created if missing)")
    p.add_argument(
        "--url",
        default=os.environ.get("MEMSTORE_API_URL", f"http://{s.host}:{s.port}"),
        help="the API (default $MEMSTORE_API_URL or %(default)s)",
    )
    p.add_argument("--key", default=os.environ.get("MEMSTORE_API_KEY"), help="API key (default $MEMSTORE_API_KEY)")
    p.add_argument("--batch", type=int, default=16, help="items per request (default %(default)s)")
    p.add_argument("--concurrency", type=int, default=2, help="requests in flight (default %(default)s)")
    p.add_argument("--wait", action="store_true", help="after uploading, wait until every vector is written")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=_ingest)


@dataclass(frozen=True)
class Source:
    external_id: str
    path: Path | None = None
    text: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)


def walk(path: Path) -> Iterator[Source]:
    if path.is_dir():
        for f in sorted(path.rglob("*")):
            if f.is_file() and f.suffix.lower() in IMAGE_SUFFIXES:
                rel = f.relative_to(path).as_posix()
                yield Source(rel, path=f, metadata={"path": rel})
        return
    with path.open(encoding="utf-8") as fh:
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


class Client:
    def __init__(self, url: str, key: str | None, collection: str) -> None:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.http = httpx.Client(base_url=url, headers=headers, timeout=120)
        self.base = f"/v1/collections/{collection}"
        self.collection = collection

    def call(self, method: str, url: str, **kw: Any) -> httpx.Response:
        """One request, retried on 429/503 (after Retry-After) and on connection errors."""
        for attempt in range(8):
            try:
                r = self.http.request(method, url, **kw)
            except httpx.TransportError as exc:
                if attempt == 7:
                    raise SystemExit(f"memstore ingest: cannot reach {self.http.base_url}: {exc}") from None
                time.sleep(min(30, 2**attempt))
                continue
            if r.status_code not in (429, 503):
                return r
            time.sleep(float(r.headers.get("Retry-After", 2**attempt)))
        return r

    def ensure_collection(self) -> bool:
        r = self.call("GET", self.base)
        if r.status_code == 200:
            return False
        if r.status_code != 404:
            raise SystemExit(f"memstore ingest: {problem(r)}")
        r = self.call("POST", "/v1/collections", json={"name": self.collection})
        if r.status_code != 201:
            raise SystemExit(f"memstore ingest: cannot create collection {self.collection!r}: {problem(r)}")
        return True

    def existing(self, ids: list[str]) -> set[str]:
        r = self.call("POST", f"{self.base}/items/lookup", json={"external_ids": ids})
        if r.status_code != 200:
            raise SystemExit(f"memstore ingest: {problem(r)}")
        return set(r.json()["found"])

    def send(self, batch: list[Source]) -> httpx.Response:
        if batch[0].path is None:
            items = [{"external_id": s.external_id, "text": s.text, "metadata": s.metadata} for s in batch]
            return self.call("POST", f"{self.base}/items", json={"items": items})
        files = [("files", (s.path.name, s.path.read_bytes())) for s in batch if s.path is not None]
        data = {"external_id": [s.external_id for s in batch], "metadata": [json.dumps(s.metadata) for s in batch]}
        return self.call("POST", f"{self.base}/items", files=files, data=data)


def problem(r: httpx.Response) -> str:
    try:
        body = r.json()
        return f"{r.status_code} {body.get('title', '')}: {body.get('detail', r.text)}"
    except ValueError:
        return f"{r.status_code} {r.text[:200]}"


def _ingest(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    if not args.path.exists():
        print(f"memstore ingest: {args.path} does not exist", file=sys.stderr)
        return 2
    sources = list(walk(args.path))
    client = Client(args.url, args.key, args.collection)
    created = client.ensure_collection()
    started = time.monotonic()
    todo: list[Source] = []
    for i in range(0, len(sources), 1000):  # resume: skip what the server already holds
        chunk = sources[i : i + 1000]
        have = client.existing([s.external_id for s in chunk])
        todo.extend(s for s in chunk if s.external_id not in have)
    counts = {"created": 0, "updated": 0, "metadata": 0, "unchanged": 0, "rejected": 0}
    errors: list[str] = []
    batches = [todo[i : i + max(1, args.batch)] for i in range(0, len(todo), max(1, args.batch))]
    bar = tqdm(total=len(todo), unit="item", disable=args.no_progress, desc="upload", file=sys.stderr)
    with ThreadPoolExecutor(max(1, args.concurrency)) as pool:
        for batch, r in zip(batches, pool.map(client.send, batches), strict=True):
            if r.status_code in (201, 202):
                for item in r.json()["items"]:
                    counts[item["change"]] = counts.get(item["change"], 0) + 1
            else:
                counts["rejected"] += len(batch)
                errors.append(f"{batch[0].external_id}..: {problem(r)}")
            bar.update(len(batch))
    bar.close()
    pending = 0
    if args.wait:
        pending = _wait(client, args.no_progress)
    stats = client.call("GET", client.base).json()
    seconds = time.monotonic() - started
    summary = {
        "collection": args.collection,
        "collection_created": created,
        "found": len(sources),
        "skipped": len(sources) - len(todo),
        "sent": len(todo),
        **counts,
        "pending": stats.get("pending", pending),
        "failed": stats.get("failed"),
        "seconds": round(seconds, 2),
        "items_per_s": round(len(todo) / seconds, 2) if seconds > 0 else None,
        "errors": errors[:20],
    }
    if args.json:
        print(json.dumps(summary))
    else:
        print(
            f"{args.collection}: {len(todo)} sent ({counts['created']} new, {counts['updated']} changed, "
            f"{counts['unchanged']} unchanged, {counts['rejected']} rejected), {summary['skipped']} already there; "
            f"{summary['pending']} pending, {summary['failed']} failed in the collection; {seconds:.1f} s"
        )
        for e in errors[:20]:
            print(f"  {e}", file=sys.stderr)
    return 1 if counts["rejected"] else 0


def _wait(client: Client, quiet: bool) -> int:
    from tqdm import tqdm

    first = client.call("GET", client.base).json()
    total = int(first.get("pending", 0))
    bar = tqdm(total=total, unit="item", disable=quiet, desc="embed", file=sys.stderr)
    pending = total
    while pending:
        time.sleep(0.5)
        pending = int(client.call("GET", client.base).json().get("pending", 0))
        bar.n = max(0, total - pending)
        bar.refresh()
    bar.close()
    return pending
