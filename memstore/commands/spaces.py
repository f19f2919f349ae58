"""``memstore spaces``: a collection's embedding spaces through the API (``memstore.spaces.lifecycle``):
create one of another model, follow its filling with a progress bar, activate it, drop the old one.

The whole migration of a collection to a new model::

    memstore spaces create -c photos v2 --model ViT-B-32
    memstore spaces status -c photos v2 --wait      # a progress bar until it is ready
    memstore spaces activate -c photos v2
    memstore spaces delete -c photos old            # a space searches no longer use
"""

from __future__ import annotations

import sys
import time
from typing import Any

import click
import httpx
from tqdm import tqdm

from encoder.cli_support import EXIT_USAGE, emit, json_option
from memstore.commands.api_access import api_options, auth_headers, call

PROG = "memstore spaces"
POLL_S = 1.0


def _collection_option(command: Any) -> Any:
    return click.option("--collection", "-c", required=True, metavar="NAME", help="the collection")(command)


def _describe(s: dict[str, Any]) -> str:
    flags = " (active)" if s["active"] else ""
    line = f"{s['name']}{flags}: {s['model']}, {s['dimensions']}-d {s['metric']}, {s['state']}"
    line += f", {s['done']} of {s['total']}"
    if s["pending"]:
        line += f", {s['pending']} queued"
    if s["failed"]:
        line += f", {s['failed']} failed"
    if s["without_original"]:
        line += f", {s['without_original']} stored as bare vectors without one here"
    if s.get("eta_s") is not None and s["state"] == "filling":
        line += f", about {s['eta_s']:.0f} s left"
    return line


@click.group("spaces", short_help="embedding spaces: re-embed a collection with another model")
def command() -> None:
    """A collection's embedding spaces: each holds one model's vectors of its items, with its own
    index. A new space is filled in the background from the stored originals while searches go on;
    activating it switches searches to it; the old one can then be dropped."""


@command.command("list", short_help="the collection's spaces and how far each is filled")
@_collection_option
@api_options
@json_option()
def list_spaces(collection: str, url: str, key: str | None, as_json: bool) -> int:
    """The spaces of COLLECTION: model, state, how many items have a vector in each."""
    r = call(PROG, "GET", url, f"/v1/collections/{collection}/spaces", headers=auth_headers(key), timeout=60)
    if r is None:
        return EXIT_USAGE
    listed = r.json()["spaces"]
    emit(as_json, r.json(), lambda: "\n".join(_describe(s) for s in listed))
    return 0


@command.command("create", short_help="a new space of another model, filled in the background")
@_collection_option
@click.argument("space")
@click.option("--model", required=True, metavar="MODEL", help="a model the server runs (MEMSTORE_MODELS)")
@click.option("--metric", type=click.Choice(["cosine", "l2", "inner_product"]), help="default: the collection's")
@api_options
@json_option()
def create(
    collection: str, space: str, model: str, metric: str | None, url: str, key: str | None, as_json: bool
) -> int:
    """Create SPACE in COLLECTION for MODEL; the ingest workers fill it from the stored originals."""
    body: dict[str, Any] = {"name": space, "model": model}
    if metric:
        body["metric"] = metric
    r = call(PROG, "POST", url, f"/v1/collections/{collection}/spaces", ok=(202,), json=body,
             headers=auth_headers(key), timeout=httpx.Timeout(60, read=600))  # fmt: skip
    if r is None:
        return EXIT_USAGE
    emit(
        as_json,
        r.json(),
        lambda: _describe(r.json()) + f"\nfollow it: memstore spaces status -c {collection} {space} --wait",
    )
    return 0


@command.command("status", short_help="how far a space is filled (--wait: a progress bar until it is ready)")
@_collection_option
@click.argument("space")
@click.option("--wait", is_flag=True, help="follow the filling with a progress bar until the space is ready")
@api_options
@json_option()
def status(collection: str, space: str, wait: bool, url: str, key: str | None, as_json: bool) -> int:
    """How far SPACE of COLLECTION is filled: done, total, queued, failed, time left."""
    path = f"/v1/collections/{collection}/spaces/{space}"
    r = call(PROG, "GET", url, path, headers=auth_headers(key), timeout=60)
    if r is None:
        return EXIT_USAGE
    state = r.json()
    if wait and state["state"] != "ready":
        with tqdm(total=state["total"], initial=state["done"], unit="item", desc=space, file=sys.stderr,
                  disable=as_json) as bar:  # fmt: skip
            while state["state"] != "ready":
                time.sleep(POLL_S)
                r = call(PROG, "GET", url, path, headers=auth_headers(key), timeout=60)
                if r is None:
                    return EXIT_USAGE
                state = r.json()
                bar.total = max(state["total"], state["done"])
                bar.update(state["done"] - bar.n)
                bar.set_postfix_str("building the index" if not state["pending"] else f"{state['pending']} queued")
    emit(as_json, state, lambda: _describe(state))
    return 0


@command.command("activate", short_help="make searches use this space")
@_collection_option
@click.argument("space")
@click.option("--force", is_flag=True, help="activate although items stored as bare vectors have none in it")
@api_options
@json_option()
def activate(collection: str, space: str, force: bool, url: str, key: str | None, as_json: bool) -> int:
    """Make searches of COLLECTION that name no space use SPACE (refused while it is filling)."""
    r = call(PROG, "POST", url, f"/v1/collections/{collection}/spaces/{space}/activate", json={"force": force},
             headers=auth_headers(key), timeout=60)  # fmt: skip
    if r is None:
        return EXIT_USAGE
    emit(as_json, r.json(), lambda: _describe(r.json()))
    return 0


@command.command("delete", short_help="drop a space searches do not use, its vectors and index")
@_collection_option
@click.argument("space")
@api_options
@json_option()
def delete(collection: str, space: str, url: str, key: str | None, as_json: bool) -> int:
    """Drop SPACE of COLLECTION with its vectors and index (not the active space, nor default)."""
    r = call(PROG, "DELETE", url, f"/v1/collections/{collection}/spaces/{space}", ok=(204,),
             headers=auth_headers(key), timeout=60)  # fmt: skip
    if r is None:
        return EXIT_USAGE
    emit(as_json, {"collection": collection, "space": space, "dropped": True},
         lambda: f"space {space} of {collection} dropped")  # fmt: skip
    return 0
