"""The database server killed while it builds a segmented collection's graph: after the restart every
acknowledged row is there and found, the layout names no graph that was not finished, and the next
seal drops what the dead build left and builds the graph."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import psycopg

from memstore.db import migrate
from memstore.db.core import create_engine, libpq_url
from memstore.db.embedded import start_embedded_server
from memstore.items import sealing
from memstore.models import ItemIn
from memstore.settings import Settings
from memstore.store import VectorStore
from tests.reliability.test_db_restart import JOIN, _postmaster, _wait_gone, stop_server


def test_a_server_killed_mid_seal_loses_nothing(tmp_path: Path) -> None:
    url = start_embedded_server(tmp_path, maintenance_work_mem="64MB", max_parallel_maintenance_workers=1)
    migrate.upgrade(url)
    engine = create_engine(url, pool_size=2, max_overflow=0)
    settings = Settings(
        database_url=url,
        data_dir=tmp_path,
        seal_interval_s=3600.0,
        max_parallel_maintenance_workers=0,
        seal_rows=100_000,
    )
    store = VectorStore(engine, settings=settings)
    try:
        c = store.create_collection(name="stream", dimensions=16, write_path="segments")
        x = np.random.default_rng(7).standard_normal((20_000, 16)).astype(np.float32)
        for start in range(0, len(x), 5_000):
            store.upsert_items(
                collection="stream",
                items=[ItemIn(vector=v, external_id=f"r{start + i}") for i, v in enumerate(x[start : start + 5_000])],
            )
        failed: list[BaseException] = []

        def build() -> None:
            try:
                sealing.seal(store.db, c, settings, min_rows=1)
            except BaseException as exc:
                failed.append(exc)

        t = threading.Thread(target=build)
        t.start()
        killed = False
        with psycopg.connect(libpq_url(url), autocommit=True) as watch:
            deadline = time.monotonic() + 60
            while t.is_alive() and time.monotonic() < deadline:
                # In the build itself, not its last phases: the postmaster killed there, its backend
                # ends at its next wait (the build's later phases wait on other transactions), before
                # the seal can record its graph.
                row = watch.execute(
                    "SELECT count(*) FROM pg_stat_progress_create_index WHERE phase LIKE 'building index%'"
                ).fetchone()
                if row and row[0]:
                    old = _postmaster(tmp_path)
                    os.kill(old, signal.SIGKILL)
                    killed = True
                    break
                time.sleep(0.01)
        t.join(120)
        assert killed, "the build ended before the server could be killed"
        _wait_gone(old)
        subprocess.run([sys.executable, "-c", JOIN, str(tmp_path)], check=True, timeout=120)

        store.forget_collection("stream")
        stats = store.collection_stats(name="stream")
        assert stats.items == len(x)
        found = stats.extra["segments"]
        if found["graphs"]:
            # On a loaded machine the kill may be sent only once the seal has recorded its graph (it
            # then fails letting go of its lock, or not at all): the graph is whole and valid.
            whole = {"index": found["graphs"][0]["index"], "lo": 0, "hi": len(x)}
            assert found == {"graphs": [whole], "tail_rows": 0}
        else:
            assert failed, "the seal did not notice its server died"
            assert found == {"graphs": [], "tail_rows": len(x)}
        for i in range(0, len(x), 3_999):
            assert store.search(collection="stream", vector=x[i], k=1)[0].external_id == f"r{i}"
        done = sealing.seal(store.db, c, settings, min_rows=1)
        if found["graphs"]:
            assert done is None  # nothing left to seal
            graph = found["graphs"][0]["index"]
        else:
            assert done is not None and done.rows == len(x)
            graph = done.graph.index
        with psycopg.connect(libpq_url(url)) as conn:
            left = conn.execute(
                "SELECT i.relname, x.indisvalid FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid "
                "WHERE starts_with(i.relname, %s)",
                (f"c{c.id}_g",),
            ).fetchall()
        assert left == [(graph, True)]
        store.forget_collection("stream")
        for i in range(0, len(x), 3_999):
            assert store.search(collection="stream", vector=x[i], k=1)[0].external_id == f"r{i}"
    finally:
        store.sealer.close()
        engine.dispose()
        stop_server(tmp_path)
