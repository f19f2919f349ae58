"""``memstore search COLLECTION QUERY``: search through the API and print a readable table."""

from __future__ import annotations

import json
import shutil
from typing import Any

import click

from encoder.cli_support import EXIT_USAGE, json_object_option, json_option, print_json
from memstore.commands.api_access import api_options, auth_headers, post


@click.command("search", short_help="search a collection by words (hybrid, keyword or vector)")
@click.argument("collection")
@click.argument("query")
@click.option(
    "--mode",
    type=click.Choice(["hybrid", "keyword", "vector"]),
    help="default: hybrid (the words embedded and matched as keywords); ask for keyword where the server "
    "cannot embed them for this collection (a collection of your own vectors, or another model's)",
)
@click.option(
    "--filter",
    "filter_",
    metavar="JSON",
    callback=json_object_option('{"tag": "cat"}'),
    help='metadata filter, e.g. {"tag": "cat"}',
)
@click.option("-k", "k", type=click.IntRange(1, 1000), default=10, help="hits to show")
@click.option("--offset", type=click.IntRange(0, 999), default=0, help="hits to skip (the next page)")
@api_options
@json_option("print the API's answer as JSON")
def command(
    collection: str,
    query: str,
    mode: str | None,
    filter_: dict[str, Any] | None,
    k: int,
    offset: int,
    url: str,
    key: str | None,
    as_json: bool,
) -> int:
    """Search COLLECTION for QUERY: the words are matched as keywords and, in a vector or hybrid
    search, embedded by the server's model. Each hit shows where the vector and keyword lists ranked
    it (see docs/search.md)."""
    body: dict[str, Any] = {"text": query, "k": k, "offset": offset}
    if mode:
        body["mode"] = mode
    if filter_ is not None:
        body["filter"] = filter_
    r = post(
        "memstore search", url, f"/v1/collections/{collection}/search", json=body, headers=auth_headers(key), timeout=60
    )
    if r is None:
        return EXIT_USAGE
    hits = r.json()["results"]
    if as_json:
        print_json(r.json())
        return 0
    click.echo(table(hits, offset, shutil.get_terminal_size((120, 20)).columns))
    return 0


# What ``memstore ingest`` records to follow a folder (memstore.commands.ingest): left out of the table.
BOOKKEEPING = ("sha256", "size", "source")


def shown_metadata(external_id: str, metadata: dict[str, Any]) -> dict[str, Any]:
    """The metadata a table line shows: without the ingest's bookkeeping, nor a ``path`` or
    ``filename`` that the external id already says."""
    out = {k: v for k, v in metadata.items() if k not in BOOKKEEPING}
    if out.get("path") == external_id:
        del out["path"]
    if out.get("filename") == external_id.rsplit("/", 1)[-1]:
        del out["filename"]
    return out


def table(hits: list[dict[str, Any]], offset: int, width: int) -> str:
    """One line per hit: rank, score, the two lists' ranks, external id and the metadata, cut to ``width``."""
    if not hits:
        return "no hits"
    lines = [f"{'#':>4}  {'score':>8}  {'vector':>6}  {'keyword':>7}  external_id / metadata"]
    for i, h in enumerate(hits, start=offset + 1):
        ranks = h.get("ranks") or {}
        vr = "-" if ranks.get("vector") is None else str(ranks["vector"])
        kr = "-" if ranks.get("keyword") is None else str(ranks["keyword"])
        meta = json.dumps(shown_metadata(h["external_id"], h.get("metadata") or {}), ensure_ascii=False)
        line = f"{i:>4}  {h['score']:>8.4f}  {vr:>6}  {kr:>7}  {h['external_id']}  {meta}"
        lines.append(line if len(line) <= width else line[: max(width - 1, 40)] + "…")
    return "\n".join(lines)
