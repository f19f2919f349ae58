"""The background work ``bench.foreground`` runs under its search stream, one kind per run:

- ``reembed``: spaces of the wide model created one after the other, each once the last is ready
  (the workers' space pass re-embeds every stored image, then the space's index is built);
- ``ingest``: new photos queued ``round`` at a time, the next round once fewer than half a round
  wait (the workers embed them, make their thumbnails and insert them into the live graph);
- ``ocr``: the same with screenshots into a collection that reads text in its images (the workers
  embed them, then Tesseract reads each one).

Each keeps its work going without a break and says how many units are done (``done()``, a count
that only grows): vectors written, images embedded, images read.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import sql

from bench.reembed import COLLECTION, WIDE, queue_images
from memstore.catalog.collections import Collection
from memstore.store import VectorStore

KINDS = ("reembed", "ingest", "ocr")
UNITS = {"reembed": "vectors re-embedded", "ingest": "images embedded", "ocr": "images read (OCR)"}
POLL_S = 0.2


class Background:
    """A thread that keeps one kind of work going until ``stop()``; ``started`` counts what it began
    (spaces or rounds), ``done()`` the units finished since it was made."""

    def __init__(self, name: str) -> None:
        self.started = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> Background:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(120)

    def done(self) -> int:
        raise NotImplementedError

    def _run(self) -> None:
        raise NotImplementedError


class Reembedding(Background):
    """Spaces of the wide model created one after the other, each once the last is ready."""

    def __init__(self, store: VectorStore, conn: psycopg.Connection[Any], written: Callable[[], int]) -> None:
        super().__init__("reembedding")
        self.store, self.conn = store, conn
        self._written = written
        self._at_start = written()

    def done(self) -> int:
        return self._written() - self._at_start

    def _run(self) -> None:
        while not self._stop.is_set():
            self.started += 1
            space = self.store.create_space(collection=COLLECTION, name=f"fg{self.started}", model=WIDE, dimensions=96)
            ready = sql.SQL("SELECT state = 'ready' FROM memstore_spaces WHERE id = {}").format(sql.Literal(space.id))
            while not self._stop.is_set():
                row = self.conn.execute(ready).fetchone()
                if row and row[0]:
                    break
                time.sleep(POLL_S)


class Feeder(Background):
    """New images queued into ``c`` a round at a time: the next round once fewer than half a round
    wait (``finished``: a count in the database of the units done so far), so the workers never run
    dry and the queue never grows without bound."""

    def __init__(
        self,
        store: VectorStore,
        conn: psycopg.Connection[Any],
        c: Collection,
        images: list[bytes],
        *,
        round_size: int,
        finished: sql.Composed,
    ) -> None:
        super().__init__("feeder")
        self.store, self.conn, self.c = store, conn, c
        self.images, self.round_size = images, round_size
        self._finished = finished
        self._at_start = self._count()
        self._done = 0

    def done(self) -> int:
        return self._done

    def _count(self) -> int:
        row = self.conn.execute(self._finished).fetchone()
        return int(row[0]) if row else 0

    def _run(self) -> None:
        queued = 0
        while not self._stop.is_set():
            self._done = self._count() - self._at_start
            if queued - self._done < self.round_size / 2:
                start = self.started * self.round_size
                batch = [self.images[(start + i) % len(self.images)] for i in range(self.round_size)]
                queue_images(self.store, self.c, batch, prefix=f"r{self.started:04d}-")
                self.started += 1
                queued += self.round_size
            self._stop.wait(POLL_S)


def finished_units(kind: str, c: Collection) -> sql.Composed:
    """The count ``Feeder`` watches: images embedded (``ingest``) or read (``ocr``)."""
    if kind == "ocr":
        return sql.SQL("SELECT count(*) FROM {} WHERE ocr_status IN ('done', 'failed')").format(c.table)
    return sql.SQL("SELECT count(*) FROM {} WHERE embedding IS NOT NULL").format(c.table)
