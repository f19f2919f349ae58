"""``memstore load FILE --collection NAME``: many vectors at index-build speed through the API.

FILE is NDJSON (``memstore.items.load_file``: ``external_id`` and ``vector`` on every line, ``metadata`` and
``text`` optional; ``-`` reads standard input). It is streamed to ``POST /v1/collections/NAME/load``
with a progress bar of the bytes sent; the server checks it whole, loads it, and answers once every
item is searchable. A bad line refuses the load with its number, and nothing is written.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import click
import httpx
from tqdm import tqdm

from encoder.cli_support import EXIT_USAGE, json_option, print_json
from memstore.commands.api_access import api_options, auth_headers, post

CHUNK = 1024 * 1024


def _chunks(stream: IO[bytes], bar: tqdm) -> Iterator[bytes]:
    while chunk := stream.read(CHUNK):
        bar.update(len(chunk))
        yield chunk


@click.command("load", short_help="load an NDJSON file of vectors at index-build speed")
@click.argument("file", type=click.Path(dir_okay=False, allow_dash=True, path_type=Path))
@click.option("--collection", "-c", required=True, metavar="NAME", help="the collection to load into")
@api_options
@json_option("print the API's answer as JSON")
def command(file: Path, collection: str, url: str, key: str | None, as_json: bool) -> int:
    """Load FILE (NDJSON: one {"external_id", "vector", "metadata"?, "text"?} per line) into COLLECTION.
    Re-running it updates what changed and leaves the rest (status unchanged)."""
    stdin = str(file) == "-"
    if not stdin and not file.is_file():
        click.echo(f"memstore load: no such file: {file}", err=True)
        return EXIT_USAGE
    size = None if stdin else file.stat().st_size
    stream = sys.stdin.buffer if stdin else file.open("rb")
    try:
        with tqdm(total=size, unit="B", unit_scale=True, desc="sending", disable=as_json, file=sys.stderr) as bar:
            r = post(
                "memstore load",
                url,
                f"/v1/collections/{collection}/load",
                content=_chunks(stream, bar),
                headers={**auth_headers(key), "Content-Type": "application/x-ndjson"},
                timeout=httpx.Timeout(60, read=None),  # the answer comes once the index is built
            )
    finally:
        if not stdin:
            stream.close()
    if r is None:
        return EXIT_USAGE
    answer = r.json()
    if as_json:
        print_json(answer)
        return 0
    how = "without the index, then built it" if answer["deferred_index"] else "into the live index"
    click.echo(
        f"{answer['rows']} items ({answer['created']} created, {answer['updated']} updated, "
        f"{answer['unchanged']} unchanged) loaded {how} in {answer['load_s'] + answer['build_s']:.1f} s"
    )
    return 0
