"""Ingest workers as threads of this process (``memstore serve``'s default), and other background
services a command asks the process to run (the maintenance worker)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from encoder.types import EmbeddingBackend
from memstore.db.core import Database
from memstore.settings import IngestSettings, Settings
from memstore.workers.ingest import IngestWorker
from memstore.workers.pacing import FULL_SPEED, Pace


@dataclass(frozen=True)
class ServiceContext:
    """What a background service may use: the database, the settings, the foreground latency (to
    back off while searches are slow), the process's stop signal and its foreground controller."""

    db: Database
    settings: Settings
    latency_p99_ms: Callable[[], float | None]
    stop_event: threading.Event
    pace: Pace = FULL_SPEED  # the process's foreground controller: the share background work may use


class BackgroundService(Protocol):
    """Started once with the process; answers a short line for /health (``running``, ``unavailable: ...``)."""

    name: str

    def start(self, context: ServiceContext) -> tuple[threading.Thread | None, str]: ...


@dataclass
class InProcessWorkers:
    """Ingest worker threads sharing the process's encoder: ``configured`` are asked for, and they
    start once the encoder is ready (``threads``)."""

    db: Database
    settings: IngestSettings
    stop_event: threading.Event
    configured: int = 0
    threads: list[threading.Thread] = field(default_factory=list)
    pace: Pace = FULL_SPEED  # the process's foreground controller (memstore.services.foreground)

    def start(self, backend: EmbeddingBackend | None) -> None:
        count = self.configured
        if count <= 0:
            return
        if backend is None:
            raise ValueError("in-process ingest workers need an encoder; drop --no-encoder or use --no-worker")
        for i in range(count):
            worker = IngestWorker(
                self.db,
                backend,
                settings=self.settings,
                stop_event=self.stop_event,
                name=f"ingest-{i}",
                pace=self.pace,
            )
            t = threading.Thread(target=worker.run, name=f"ingest-{i}", daemon=True)
            t.start()
            self.threads.append(t)
