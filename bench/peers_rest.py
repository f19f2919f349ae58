"""bench.peers' REST system: a real ``memstore serve`` (no encoder: vectors only) on the same server,
one request at a time.

Searches go through the standard library's ``http.client`` on one kept-alive connection: the figure is
meant to be the server's, and the client a Python user picks costs what it costs on top. httpx, for
example, spends about 1.5 ms of CPU per search request on the 2-core development machine, more than
the server and the database together; it is measured in the same run as its own figure
(``HttpxSearches``). Loads, updates and deletes go through httpx (streamed bodies, large requests)."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
from tqdm import tqdm

from bench.peers_measure import K
from bench.peers_pg import maintenance_pass
from bench.startup import free_port
from memstore.access import keys
from memstore.db.core import Database, create_engine
from memstore.store import VectorStore

REQUEST_BYTES = 48 << 20
BYTES_PER_NUMBER = 24


class Serve:
    """``memstore serve --no-encoder`` in its own process, with an admin key to reach it."""

    def __init__(
        self, url: str, data_dir: Path, max_items: int, *, access_log: str | None = None, tiny_encoder: bool = False
    ) -> None:
        """``access_log``: MEMSTORE_API_ACCESS_LOG (all, sampled, off); None: the server's default."""
        db = Database(create_engine(url))
        _, self.key = keys.create_key(db, name=f"bench-peers-{uuid.uuid4().hex[:6]}", scopes=["admin"])
        db.engine.dispose()
        self.port = free_port()
        env = os.environ | {
            "MEMSTORE_DATABASE_URL": url,
            "MEMSTORE_DATA_DIR": str(data_dir),
            # The items endpoint takes 1,000 items a request by default; a bulk client sends more.
            "MEMSTORE_API_MAX_ITEMS_PER_REQUEST": str(max(1000, max_items)),
        }
        if access_log is not None:
            env["MEMSTORE_API_ACCESS_LOG"] = access_log
        if tiny_encoder:  # the untrained tiny model, for images and texts without weights to download
            env |= {"MEMSTORE_MODEL": "memstore-tiny", "MEMSTORE_PRETRAINED": "none"}
        self.tiny_encoder = tiny_encoder
        encoder = [] if tiny_encoder else ["--no-encoder"]
        cmd = [sys.executable, "-m", "memstore.cli", "serve", *encoder, "--no-migrate"]
        cmd += ["--host", "127.0.0.1", "--port", str(self.port)]
        self.log = (data_dir / "serve.log").open("wb")
        self.proc = subprocess.Popen(cmd, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        self.client = httpx.Client(
            base_url=f"http://127.0.0.1:{self.port}", headers={"Authorization": f"Bearer {self.key}"}, timeout=600
        )
        try:
            self._wait_ready(deadline=time.monotonic() + 120)
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"memstore serve exited with {self.proc.returncode}; see {self.log.name}")
            try:
                if self.client.get("/v1/collections").status_code == 200 and (
                    not self.tiny_encoder or self.client.get("/health").json().get("status") == "ok"
                ):
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.3)
        raise RuntimeError(f"memstore serve did not answer within 120 s; see {self.log.name}")

    def connect(self) -> SearchConnection:
        return SearchConnection(self.port, self.key)

    def call(self, method: str, path: str, body: Any) -> Any:
        r = self.client.request(method, path, json=body)
        if r.status_code >= 300:
            raise RuntimeError(f"{method} {path}: {r.status_code} {r.text[:300]}")
        return r.json() if r.content else None

    def stop(self) -> None:
        self.client.close()
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


class SearchConnection:
    """One kept-alive HTTP/1.1 connection of the standard library, posting JSON bodies."""

    def __init__(self, port: int, key: str) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        self.headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}

    def post(self, path: str, body: dict[str, Any]) -> Any:
        # bytes, not str: http.client then sends the headers and the body in one write. orjson writes
        # a float32 array's values in their shortest exact form (the same vector, half the digits of
        # json.dumps over tolist()) in a tenth of the time: a client's JSON work is not the server's.
        payload = orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)
        try:
            response = self._exchange(path, payload)
        except (BrokenPipeError, ConnectionResetError, http.client.RemoteDisconnected):
            # the server closes a connection left idle past its keep-alive time (uvicorn: 5 s); a
            # search is safe to send again, on a new connection
            self.conn.close()
            response = self._exchange(path, payload)
        data = response.read()
        if response.status >= 300:
            raise RuntimeError(f"POST {path}: {response.status} {data[:300]!r}")
        return orjson.loads(data)

    def _exchange(self, path: str, payload: bytes) -> http.client.HTTPResponse:
        self.conn.request("POST", path, payload, self.headers)
        return self.conn.getresponse()

    def close(self) -> None:
        self.conn.close()


class MemstoreRest:
    """The REST API: the bulk route for the first load (``POST .../load``), items in large JSON batches
    for updates (``POST .../items``), ``POST .../search`` per query."""

    name = "memstore_rest"
    label = "memstore (REST API, one connection)"
    cleanup_name = "maintenance pass (memstore-maint run --once)"

    def __init__(
        self,
        serve: Serve,
        store: VectorStore,
        dims: int,
        representation: str,
        batch: int,
        name: str = "bench_peers_rest",
    ) -> None:
        # JSON numbers take about 20 bytes each: keep a request under the server's default 64 MiB body
        # limit (MEMSTORE_API_MAX_BODY_BYTES), as a client that leaves the server's settings alone must.
        batch = max(1, min(batch, REQUEST_BYTES // (dims * BYTES_PER_NUMBER)))
        self.serve, self.store, self.collection, self.batch = serve, store, name, batch
        if name in {c.name for c in store.list_collections()}:
            store.drop_collection(name=name)
        body = {"name": name, "dimensions": dims, "hnsw_m": 16, "hnsw_ef_construction": 64}
        serve.call("POST", "/v1/collections", body)
        if representation != "full":  # the REST API creates full indexes; the switch is the store's
            store.set_index_representation(collection=name, representation=representation, grace_s=0)
        self.ef = store.settings.default_ef_search
        self.searches = serve.connect()
        self.ingest_path = "POST /load (NDJSON, one request); updates: POST /items, " + f"{batch} vectors a request"
        self.search_path = f"/v1/collections/{name}/search"

    def _send(self, ids: np.ndarray, vectors: np.ndarray, desc: str) -> None:
        path = f"/v1/collections/{self.collection}/items?wait=true"
        with tqdm(total=len(ids), desc=f"{self.name}: {desc}", file=sys.stderr, leave=False) as bar:
            for start in range(0, len(ids), self.batch):
                part = slice(start, start + self.batch)
                items = [
                    {"external_id": str(i), "vector": v.tolist()}
                    for i, v in zip(ids[part].tolist(), vectors[part], strict=True)
                ]
                self.serve.call("POST", path, {"items": items})
                bar.update(len(items))

    def ingest(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        """The bulk route: every vector in one streamed NDJSON body (``POST .../load``), answered once
        the index is built."""
        path = f"/v1/collections/{self.collection}/load"

        def lines() -> Iterator[bytes]:
            with tqdm(total=len(ids), desc=f"{self.name}: POST load", file=sys.stderr, leave=False) as bar:
                for start in range(0, len(ids), 1000):
                    part = slice(start, start + 1000)
                    yield "".join(
                        json.dumps({"external_id": str(i), "vector": v.tolist()}) + "\n"
                        for i, v in zip(ids[part].tolist(), vectors[part], strict=True)
                    ).encode()
                    bar.update(len(ids[part]))

        r = self.serve.client.post(path, content=lines(), headers={"Content-Type": "application/x-ndjson"})
        if r.status_code != 200:
            raise RuntimeError(f"POST {path}: {r.status_code} {r.text[:300]}")

    def set_ef(self, ef: int) -> None:
        self.ef = ef

    def body(self, vector: Any) -> dict[str, Any]:
        """A search's JSON body; ``vector`` as the client's encoder takes it (orjson: the array)."""
        return {"vector": vector, "k": K, "ef_search": self.ef}

    def search(self, query: np.ndarray) -> list[int]:
        out = self.searches.post(self.search_path, self.body(query))
        return [int(hit["external_id"]) for hit in out["results"]]

    def update(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        self._send(ids, vectors, "update items")

    def delete(self, ids: np.ndarray) -> None:
        for start in range(0, len(ids), 1000):
            chunk = [str(i) for i in ids[start : start + 1000].tolist()]
            self.serve.call("POST", f"/v1/collections/{self.collection}/items/delete", {"external_ids": chunk})

    def cleanup(self) -> str:
        # The server's pooled backends report their dead tuples to the statistics within about ten
        # seconds of going idle (PostgreSQL's idle flush); the policy decides on those counts.
        time.sleep(11)
        return maintenance_pass(self.store, self.collection)

    def close(self) -> None:
        self.searches.close()
        if self.collection in {c.name for c in self.store.list_collections()}:
            self.store.drop_collection(name=self.collection)


class HttpxSearches:
    """The REST collection's searches sent with httpx instead (the same server, collection and ef): the
    cost of a popular client, for the interleaved measurement only."""

    name = "memstore_rest_httpx"

    def __init__(self, rest: MemstoreRest) -> None:
        self.rest = rest

    def search(self, query: np.ndarray) -> list[int]:
        out = self.rest.serve.call("POST", self.rest.search_path, self.rest.body(query.tolist()))
        return [int(hit["external_id"]) for hit in out["results"]]
