"""kill -9 in the middle of a re-embedding, with real processes.

A collection of texts and images of the tiny model gets a space of the wide one (96 dimensions),
filled by ``memstore worker`` running as its own process. Mid fill one process is SIGKILLed:

- the ingest worker (its encoder in process); another worker is started and finishes the fill;
- the standalone encoder service the worker uses (``python -m encoder``, both models); it is
  started again on the same port and the same worker carries on: its claims are handed back and
  retried, none is failed, although the outage lasts longer than the worker's retry budget.

Either way every item with an original ends with exactly one vector in the space, the very vector
the wide model makes of it, no queue row failed, and the space becomes ``ready`` with a valid HNSW
index. A live API server (no ingest worker of its own) answers searches of both spaces throughout;
then the space is activated and searches naming no space switch exactly at the activate call, and
an item added with ``?wait=true`` is found in the new space as soon as the answer comes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psycopg
import pytest

from encoder.client import RemoteEncoder
from memstore.catalog import registry
from memstore.catalog.collections import Collection
from memstore.db.core import libpq_url
from memstore.settings import Settings
from tests.api.api_helpers import TINY, WIDE, LiveServer, free_port, make_image, start_server, two_model_engine
from tests.databases import scratch_database

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]  # the children import this checkout's packages

NAME = "photos"
SPACE = "wide"
TEXTS = 240
IMAGES = 60
# The fill is stopped once the space holds this many vectors (of TEXTS + IMAGES).
KILL_AT = 40
# Items a worker claims at a time: small, so the fill lasts long enough to be caught midway.
BATCH = 4
START_TIMEOUT_S = 60.0
FILL_TIMEOUT_S = 90.0


# --- processes -------------------------------------------------------------------------------------


def _env(database_url: str, tmp_path: Path, **extra: str) -> dict[str, str]:
    """The environment of a child process: the tiny offline models, the test's database, nothing
    of the developer's own MEMSTORE_ settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSTORE_")}
    env.update(
        MEMSTORE_DATABASE_URL=database_url,
        MEMSTORE_DATA_DIR=str(tmp_path / "data"),
        MEMSTORE_MODEL=TINY,
        MEMSTORE_PRETRAINED="none",
        MEMSTORE_MODELS=f"{WIDE}=none",
        MEMSTORE_ENCODER_DEVICE="cpu",
        MEMSTORE_ENCODER_TORCH_THREADS="1",
        HF_HUB_OFFLINE="1",
        **extra,
    )
    return env


@dataclass
class Child:
    """A child process and its log."""

    name: str
    proc: subprocess.Popen[bytes]
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)


@contextmanager
def children() -> Iterator[list[Child]]:
    """Every child started in the block is stopped after it, whatever happened."""
    started: list[Child] = []
    try:
        yield started
    finally:
        for child in reversed(started):
            child.stop()


def _spawn(started: list[Child], name: str, args: list[str], env: dict[str, str], tmp_path: Path) -> Child:
    log = tmp_path / f"{name}-{len(started)}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, *args], cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    child = Child(name, proc, log)
    started.append(child)
    return child


def start_worker(started: list[Child], env: dict[str, str], tmp_path: Path, *extra: str) -> Child:
    """``memstore worker`` in a process of its own (the database is migrated already)."""
    # nice 10, not the default idle priority: with another test process busy on every core, an idle
    # worker could wait for it; what this test checks is what survives a kill, not the priority.
    args = ["-m", "memstore.cli", "worker", "--no-migrate", "--batch-size", str(BATCH), "--cpu-priority", "low", *extra]
    return _spawn(started, "worker", args, env, tmp_path)


def start_encoder(started: list[Child], env: dict[str, str], tmp_path: Path, port: int) -> Child:
    """The standalone encoder service serving both models; returns once it answers."""
    child = _spawn(started, "encoder", ["-m", "encoder", "--port", str(port), "--log-level", "warning"], env, tmp_path)
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return child
        except httpx.TransportError:
            pass
        assert child.proc.poll() is None, f"the encoder exited: {child.output()}"
        assert time.monotonic() < deadline, f"the encoder did not start: {child.output()}"
        time.sleep(0.2)


# --- the database, read directly -------------------------------------------------------------------


@dataclass(frozen=True)
class Fill:
    vectors: int  # rows of the space's side table
    originals: int  # items with a text or an image
    pending: int  # the space's queue rows still waiting
    failed: int  # queue rows (of any space) given up on
    state: str


def collection(url: str) -> Collection:
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        return registry.read_collection(conn, name=NAME)


def fill(url: str) -> Fill:
    c = collection(url)
    space = c.space(SPACE)
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        vectors = conn.execute(f'SELECT count(*) FROM "{space.table_name}"').fetchone()
        originals = conn.execute(
            f'SELECT count(*) FROM "{c.table_name}" WHERE text IS NOT NULL OR content IS NOT NULL'
        ).fetchone()
        queue = conn.execute(
            "SELECT count(*) FILTER (WHERE space_id = %s AND status = 'pending'), "
            "count(*) FILTER (WHERE status = 'failed') FROM memstore_ingest_queue",
            (space.id,),
        ).fetchone()
    assert vectors is not None and originals is not None and queue is not None
    return Fill(int(vectors[0]), int(originals[0]), int(queue[0]), int(queue[1]), space.state)


def wait_fill(url: str, until: Callable[[Fill], bool], *, watch: list[Child], timeout: float = FILL_TIMEOUT_S) -> Fill:
    """Poll the side table until ``until`` holds; fails with the children's logs if it never does or
    one of them exits."""
    deadline = time.monotonic() + timeout
    while True:
        now = fill(url)
        if until(now):
            return now
        for child in watch:
            assert child.proc.poll() is None, f"{child.name} exited ({child.proc.returncode}): {child.output()}"
        assert time.monotonic() < deadline, f"no progress to the expected point: {now}; " + "; ".join(
            f"{c.name}: {c.output()}" for c in watch
        )
        time.sleep(0.02)


def stored_vectors(url: str) -> dict[int, tuple[str | None, bytes | None, np.ndarray]]:
    """Every item's original and its vector in the space (item id -> text, image bytes, vector)."""
    c = collection(url)
    space = c.space(SPACE)
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        rows = conn.execute(
            f'SELECT t.id, t.text, t.content, s.embedding::text FROM "{c.table_name}" t '
            f'JOIN "{space.table_name}" s ON s.id = t.id'
        ).fetchall()
    return {int(r[0]): (r[1], None if r[2] is None else bytes(r[2]), np.asarray(json.loads(r[3]))) for r in rows}


def index_is_valid(url: str) -> bool:
    name = collection(url).space(SPACE).index_name
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        row = conn.execute(
            "SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid WHERE c.relname = %s",
            (name,),
        ).fetchone()
    return bool(row and row[0])


# --- the API: data in, searches throughout ---------------------------------------------------------


def load_collection(client: httpx.Client) -> None:
    """TEXTS texts and IMAGES images, embedded into the default space before the new space exists."""
    assert client.post("/v1/collections", json={"name": NAME, "model": TINY}).status_code == 201
    for start in range(0, TEXTS, 80):
        items = [
            {"external_id": f"t{i}", "text": f"note number {i} about {i % 7} things"} for i in range(start, start + 80)
        ]
        r = client.post(f"/v1/collections/{NAME}/items", params={"wait": True}, json={"items": items})
        assert r.status_code == 201, r.text
    for start in range(0, IMAGES, 20):
        files = [("files", (f"i{i}.png", make_image(i, fmt="PNG"), "image/png")) for i in range(start, start + 20)]
        r = client.post(f"/v1/collections/{NAME}/items", params={"wait": True}, files=files)
        assert r.status_code == 201, r.text
    got = client.get(f"/v1/collections/{NAME}").json()
    assert (got["items"], got["pending"], got["failed"]) == (TEXTS + IMAGES, 0, 0), got


def query(dims: int, seed: int) -> list[float]:
    return [float(x) for x in np.random.default_rng(seed).standard_normal(dims)]


@dataclass
class SearchStream:
    """A thread searching the collection until stopped: vectors of the default space (naming no space
    and naming it) and of the new one, and, where the server's encoder is meant to be up, a text
    query embedded by the new space's model. ``failures`` are answers other than 200 (and errors);
    text searches also list their statuses, since the test may take their encoder away."""

    base_url: str
    texts: bool = True
    searches: int = 0
    failures: list[str] = field(default_factory=list)
    text_statuses: dict[int, int] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    BODIES = (
        {"vector": query(64, 1), "k": 5},
        {"vector": query(64, 2), "k": 5, "using": "default"},
        {"vector": query(96, 3), "k": 5, "using": SPACE},
    )

    def __enter__(self) -> SearchStream:
        self._thread = threading.Thread(target=self._run, name="search-stream", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(30)

    def _run(self) -> None:
        with httpx.Client(base_url=self.base_url, timeout=30) as client:
            i = 0
            while not self._stop.is_set():
                body = self.BODIES[i % len(self.BODIES)]
                self._search(client, body)
                if self.texts and i % len(self.BODIES) == 0:
                    text = {"text": f"note number {i}", "mode": "vector", "k": 3, "using": SPACE}
                    status = self._search(client, text, counted=False)
                    self.text_statuses[status] = self.text_statuses.get(status, 0) + 1
                i += 1
                self._stop.wait(0.01)  # leave the CPUs to the fill

    def _search(self, client: httpx.Client, body: dict[str, Any], *, counted: bool = True) -> int:
        try:
            r = client.post(f"/v1/collections/{NAME}/search", json=body)
        except httpx.HTTPError as exc:
            if counted:
                self.failures.append(f"{body.get('using')}: {exc!r}")
            return -1
        self.searches += 1
        if counted and r.status_code != 200:
            self.failures.append(f"{body.get('using')}: {r.status_code} {r.text[:200]}")
        return r.status_code


@dataclass(frozen=True)
class Answer:
    sent: float
    answered: float
    dims: int
    status: int


def activate_and_check_switch(client: httpx.Client, base_url: str) -> None:
    """Searches naming no space, 64-d and 96-d in turn, run across the activate call: each answered
    before the call was made is the default space's (64-d accepted, 96-d refused), each sent after it
    returned is the new space's, and the first search after it answers from the new space."""
    answers: list[Answer] = []
    stop = threading.Event()

    def alternate() -> None:
        with httpx.Client(base_url=base_url, timeout=30) as c:
            i = 0
            while not stop.is_set():
                dims = 64 if i % 2 == 0 else 96
                sent = time.monotonic()
                r = c.post(f"/v1/collections/{NAME}/search", json={"vector": query(dims, 10 + i), "k": 3})
                answers.append(Answer(sent, time.monotonic(), dims, r.status_code))
                i += 1

    runner = threading.Thread(target=alternate, daemon=True)
    runner.start()
    time.sleep(0.5)
    called = time.monotonic()
    r = client.post(f"/v1/collections/{NAME}/spaces/{SPACE}/activate", json={})
    returned = time.monotonic()
    assert r.status_code == 200 and r.json()["active"] is True, r.text
    # The first searches after the call: the new space's vectors are accepted, the old space's refused.
    wide = client.post(f"/v1/collections/{NAME}/search", json={"vector": query(96, 7), "k": 5})
    assert wide.status_code == 200, wide.text
    narrow = client.post(f"/v1/collections/{NAME}/search", json={"vector": query(64, 7), "k": 5})
    assert narrow.status_code == 422 and "96" in narrow.json()["detail"], narrow.text
    named = client.post(f"/v1/collections/{NAME}/search", json={"vector": query(96, 7), "k": 5, "using": SPACE})
    assert [h["id"] for h in wide.json()["results"]] == [h["id"] for h in named.json()["results"]]
    assert len(wide.json()["results"]) == 5
    time.sleep(0.5)
    stop.set()
    runner.join(30)

    assert {a.status for a in answers} <= {200, 422}, answers
    before = [a for a in answers if a.answered < called]
    after = [a for a in answers if a.sent > returned]
    assert before and after, f"{len(answers)} searches, none on one side of the activation"
    assert all(a.status == (200 if a.dims == 64 else 422) for a in before), before
    assert all(a.status == (200 if a.dims == 96 else 422) for a in after), after


def check_a_new_item_is_searchable_at_once(client: httpx.Client, started: list[Child]) -> None:
    """With the new space active and no worker running, an item added with ``?wait=true`` is found by
    a search of the active space as soon as the answer comes: the API embedded it into every space."""
    for child in started:
        if child.name == "worker":
            child.stop()
    late = {"items": [{"external_id": "late", "text": "late"}]}
    r = client.post(f"/v1/collections/{NAME}/items", params={"wait": True}, json=late)
    assert r.status_code == 201, r.text
    hits = client.post(f"/v1/collections/{NAME}/search", json={"text": "late", "mode": "vector", "k": 1})
    assert hits.status_code == 200 and [h["external_id"] for h in hits.json()["results"]] == ["late"], hits.text


# --- the end: what a finished fill must be ---------------------------------------------------------


def check_filled(url: str, embed: Callable[[list[str], list[bytes]], tuple[np.ndarray, np.ndarray]]) -> Fill:
    """Exactly one vector per item with an original, each the wide model's vector of that original."""
    done = fill(url)
    assert done.state == "ready" and index_is_valid(url), done
    assert (done.vectors, done.originals, done.pending, done.failed) == (TEXTS + IMAGES, TEXTS + IMAGES, 0, 0), done
    stored = stored_vectors(url)
    assert len(stored) == TEXTS + IMAGES
    text_ids = sorted(i for i, (text, _, _) in stored.items() if text is not None)
    image_ids = sorted(i for i, (text, _, _) in stored.items() if text is None)
    texts, images = embed([stored[i][0] or "" for i in text_ids], [stored[i][1] or b"" for i in image_ids])
    got_texts = np.stack([stored[i][2] for i in text_ids])
    got_images = np.stack([stored[i][2] for i in image_ids])
    assert got_texts.shape == (TEXTS, 96) and got_images.shape == (IMAGES, 96)
    np.testing.assert_allclose(got_texts, texts, atol=1e-4)
    np.testing.assert_allclose(got_images, images, atol=1e-4)
    return done


def embedder(backend: Any) -> Callable[[list[str], list[bytes]], tuple[np.ndarray, np.ndarray]]:
    def embed(texts: list[str], images: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
        return (
            np.asarray(backend.embed_texts(texts, model=WIDE)),
            np.asarray(backend.embed_images(images, model=WIDE)),
        )

    return embed


def create_space(client: httpx.Client) -> None:
    r = client.post(f"/v1/collections/{NAME}/spaces", json={"name": SPACE, "model": WIDE})
    assert r.status_code == 202 and r.json()["state"] == "filling", r.text


@contextmanager
def api_server(settings: Settings, url: str, backend: Any) -> Iterator[LiveServer]:
    """The API on the test's database, with no ingest worker of its own: only the worker processes
    fill the space."""
    with start_server(
        settings.model_copy(update={"database_url": url}), backend=backend, workers=0, auth="off"
    ) as live:
        yield live


# --- the tests -------------------------------------------------------------------------------------


def test_a_worker_killed_mid_fill_is_taken_over(
    settings: Settings, server_url: str, tiny_engine: Any, tmp_path: Path
) -> None:
    with (
        two_model_engine(tiny_engine) as engine,
        scratch_database(server_url, "memstore_reembed_worker") as url,
        api_server(settings, url, engine) as live,
        httpx.Client(base_url=live.url, timeout=60) as client,
        children() as started,
    ):
        load_collection(client)
        env = _env(url, tmp_path)
        create_space(client)
        with SearchStream(live.url) as searches:
            first = start_worker(started, env, tmp_path)
            at_kill = wait_fill(url, lambda f: f.vectors >= KILL_AT, watch=[first])
            first.kill9()
            after_kill = fill(url)
            assert after_kill.vectors < TEXTS + IMAGES, f"the fill ended before the kill: {after_kill}"
            assert after_kill.state == "filling", after_kill

            second = start_worker(started, env, tmp_path)
            wait_fill(url, lambda f: f.state == "ready", watch=[second])
            time.sleep(0.3)  # searches of the indexed space too
        assert searches.failures == [], searches.failures[:10]
        assert searches.searches > 50 and searches.text_statuses.keys() == {200}, searches.text_statuses
        done = check_filled(url, embedder(engine))
        assert KILL_AT <= at_kill.vectors <= after_kill.vectors < done.vectors
        activate_and_check_switch(client, live.url)
        check_a_new_item_is_searchable_at_once(client, started)
        print(
            f"worker killed at {at_kill.vectors} of {done.vectors} vectors; {searches.searches} searches, "
            f"{len(searches.failures)} failed"
        )


def test_the_encoder_service_killed_mid_fill_and_restarted(settings: Settings, server_url: str, tmp_path: Path) -> None:
    port = free_port()
    encoder_url = f"http://127.0.0.1:{port}"
    with (
        scratch_database(server_url, "memstore_reembed_encoder") as url,
        children() as started,
    ):
        # The worker gives an item two attempts, 0.2 s apart: far less than the outage below, so a
        # claim that counted the encoder's absence against its item would fail.
        env = _env(
            url,
            tmp_path,
            MEMSTORE_INGEST_MAX_ATTEMPTS="2",
            MEMSTORE_INGEST_BACKOFF_BASE_S="0.2",
            MEMSTORE_INGEST_BACKOFF_MAX_S="0.5",
        )
        encoder = start_encoder(started, env, tmp_path, port)
        with (
            RemoteEncoder(encoder_url) as remote,
            api_server(settings, url, remote) as live,
            httpx.Client(base_url=live.url, timeout=60) as client,
        ):
            load_collection(client)
            create_space(client)
            with SearchStream(live.url) as searches:
                worker = start_worker(started, env, tmp_path, "--encoder-url", encoder_url)
                at_kill = wait_fill(url, lambda f: f.vectors >= KILL_AT, watch=[worker, encoder])
                encoder.kill9()
                time.sleep(3)  # the outage: the worker's calls are refused
                during = fill(url)
                assert during.vectors < TEXTS + IMAGES, f"the fill ended before the kill: {during}"
                assert during.failed == 0, f"the encoder's outage failed items: {during}"
                assert worker.proc.poll() is None, worker.output()

                encoder = start_encoder(started, env, tmp_path, port)
                wait_fill(url, lambda f: f.state == "ready", watch=[worker, encoder])
                time.sleep(0.3)
            # Vector searches need no encoder: they answered throughout. Text searches answered,
            # or said the encoder was unavailable while it was down; never an internal error.
            assert searches.failures == [], searches.failures[:10]
            assert searches.searches > 50 and searches.text_statuses.get(200, 0) > 0, searches.text_statuses
            assert searches.text_statuses.keys() <= {200, 503}, searches.text_statuses
            done = check_filled(url, embedder(remote))
            assert KILL_AT <= at_kill.vectors <= during.vectors < done.vectors
            activate_and_check_switch(client, live.url)
            assert worker.proc.poll() is None, "the worker died with the encoder"
            check_a_new_item_is_searchable_at_once(client, started)
            print(
                f"encoder killed at {at_kill.vectors} of {done.vectors} vectors; {searches.searches} searches, "
                f"{len(searches.failures)} failed; text searches by status: {searches.text_statuses}"
            )
