"""Concurrency soak: ingest, update, delete and search through the API while maintenance runs.

`memstore serve --no-encoder --maintenance` serves one collection of raw vectors. Writer threads,
each owning a slice of the key space (so each keeps an exact model of what was acknowledged), ingest,
update metadata and vectors, and delete; a reader searches throughout. Afterwards the stored set
equals the model exactly, no request got a 5xx, and recall@10 at the default search settings is at
least 0.95. ``MEMSTORE_SOAK_SECONDS`` runs it longer (default 15).
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psycopg
import pytest

from memstore.db.core import libpq_url

DIMS = 32
SECONDS = float(os.environ.get("MEMSTORE_SOAK_SECONDS", "15"))
WRITERS = 3
FIGURES: dict[str, Any] = {}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Writer(threading.Thread):
    def __init__(self, base: str, index: int, stop: threading.Event, errors: list[str]) -> None:
        super().__init__()
        self.base, self.index, self.stop, self.errors = base, index, stop, errors
        self.model: dict[str, tuple[list[float], dict[str, Any]]] = {}
        self.ids: dict[str, int] = {}
        self.ops = 0
        self.rng = random.Random(index)

    def vector(self) -> list[float]:
        return [self.rng.gauss(0, 1) for _ in range(DIMS)]

    def check(self, r: httpx.Response, ok: tuple[int, ...]) -> bool:
        self.ops += 1
        if r.status_code >= 500 or r.status_code not in ok:
            self.errors.append(f"{r.request.method} {r.request.url.path}: {r.status_code} {r.text[:200]}")
            return False
        return True

    def run(self) -> None:
        n = 0
        with httpx.Client(base_url=self.base, timeout=30) as c:
            while not self.stop.is_set():
                roll = self.rng.random()
                if roll < 0.5 or len(self.model) < 20:
                    batch = []
                    for _ in range(self.rng.randint(1, 40)):
                        eid = f"w{self.index}-{n}"
                        n += 1
                        batch.append({"external_id": eid, "vector": self.vector(), "metadata": {"w": self.index}})
                    r = c.post("/v1/collections/soak/items", json={"items": batch})
                    if self.check(r, (200, 201, 202)):
                        for sent, got in zip(batch, r.json()["items"], strict=True):
                            self.model[sent["external_id"]] = (sent["vector"], sent["metadata"])
                            self.ids[sent["external_id"]] = got["id"]
                elif roll < 0.7:
                    eid = self.rng.choice(sorted(self.model))
                    meta = {"w": self.index, "v": self.rng.randint(0, 9)}
                    r = c.patch(f"/v1/collections/soak/items/{self.ids[eid]}", json={"metadata": meta})
                    if self.check(r, (200,)):
                        self.model[eid] = (self.model[eid][0], meta)
                elif roll < 0.85:
                    eid = self.rng.choice(sorted(self.model))
                    vec = self.vector()
                    r = c.patch(f"/v1/collections/soak/items/{self.ids[eid]}", json={"vector": vec})
                    if self.check(r, (200,)):
                        self.model[eid] = (vec, self.model[eid][1])
                else:
                    eid = self.rng.choice(sorted(self.model))
                    r = c.delete(f"/v1/collections/soak/items/{self.ids[eid]}")
                    if self.check(r, (204,)):
                        del self.model[eid]
                        del self.ids[eid]


def maintenance_probes(
    database_url: str, proc: subprocess.Popen[bytes], log: Path, wait_s: float = 120.0
) -> tuple[int, bool]:
    """The maintenance worker's probes of the soak's collection. Its passes run every 2 s, but how many
    fall within the soak depends on the machine's load (a pass waits for nothing, yet a loaded machine
    can take the whole soak for one): when none was recorded, a pass is asked for, as the web pages'
    "probe now" does, and awaited. Returns the probes and whether one had to be asked for."""
    query = "SELECT count(*) FROM memstore_maintenance_probes WHERE collection = 'soak'"
    with psycopg.connect(libpq_url(database_url), autocommit=True) as conn:
        row = conn.execute(query).fetchone()
        if row and row[0]:
            return int(row[0]), False
        conn.execute("INSERT INTO memstore_maintenance_requests (collection, requested_by) VALUES ('soak', 'test')")
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and proc.poll() is None:
            row = conn.execute(query).fetchone()
            if row and row[0]:
                return int(row[0]), True
            time.sleep(0.5)
    raise AssertionError(
        f"the maintenance worker never probed the collection, not even {wait_s:.0f} s after a pass was asked for: "
        + log.read_text()[-3000:]
    )


@pytest.mark.slow
def test_soak(database_url: str, tmp_path: Path) -> None:
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSTORE_")}
    env.update(MEMSTORE_DATABASE_URL=database_url, MEMSTORE_MAINT_INTERVAL_S="2", MEMSTORE_DATA_DIR=str(tmp_path))
    log = (tmp_path / "serve.log").open("w")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "memstore.cli",
            "-v",  # the maintenance worker's passes in serve.log
            "serve",
            "--port",
            str(port),
            "--no-auth",
            "--no-encoder",
            "--maintenance",
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    stop = threading.Event()
    errors: list[str] = []
    searches = 0
    try:
        with httpx.Client(base_url=base, timeout=30) as c:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    if c.get("/health").status_code == 200:
                        break
                except httpx.HTTPError:
                    time.sleep(0.3)
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()
            r = c.post("/v1/collections", json={"name": "soak", "dimensions": DIMS})
            assert r.status_code == 201, r.text
            writers = [Writer(base, i, stop, errors) for i in range(WRITERS)]
            for w in writers:
                w.start()
            rng = np.random.default_rng(0)
            end = time.monotonic() + SECONDS
            while time.monotonic() < end:
                r = c.post("/v1/collections/soak/search", json={"vector": rng.normal(size=DIMS).tolist(), "k": 10})
                searches += 1
                if r.status_code != 200:
                    errors.append(f"search: {r.status_code} {r.text[:200]}")
            stop.set()
            for w in writers:
                w.join(timeout=60)
            assert errors == [], errors[:5]

            model = {eid: entry for w in writers for eid, entry in w.model.items()}
            stored: dict[str, Any] = {}
            after = 0
            while True:
                page = c.get("/v1/collections/soak/items", params={"after": after, "limit": 1000}).json()["items"]
                if not page:
                    break
                stored.update({it["external_id"]: it for it in page})
                after = page[-1]["id"]
            assert set(stored) == set(model)
            assert all(stored[eid]["metadata"] == meta for eid, (_, meta) in model.items())
            sample = random.Random(1).sample(sorted(model), min(30, len(model)))
            for eid in sample:
                got = c.get(f"/v1/collections/soak/items/{stored[eid]['id']}", params={"with_vector": True}).json()
                assert np.allclose(got["vector"], model[eid][0], rtol=1e-6, atol=1e-6)
            hits = total = 0
            for q in rng.normal(size=(50, DIMS)):
                body = {"vector": q.tolist(), "k": 10}
                exact = c.post("/v1/collections/soak/search", json={**body, "exact": True}).json()["results"]
                found = c.post("/v1/collections/soak/search", json=body).json()["results"]
                hits += len({r["id"] for r in exact} & {r["id"] for r in found})
                total += len(exact)
            recall = hits / total
            probes, asked = maintenance_probes(database_url, proc, tmp_path / "serve.log")
            FIGURES.update(
                maintenance_probes=probes,
                maintenance_pass_asked_for=asked,
                operations=sum(w.ops for w in writers),
                searches=searches,
                items=len(model),
                recall=round(recall, 4),
            )
            print(f"soak: {FIGURES}")
            assert recall >= 0.95
            assert proc.poll() is None
    finally:
        stop.set()
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = None
    assert code == 0, (tmp_path / "serve.log").read_text()[-3000:]
