"""Foreground load for ``bench.churn``: searches and inserts running while churn and maintenance run."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import psycopg

from bench.churn_db import connect
from memstore.search.statements import SearchSettings, apply, search_statement


class Load:
    """A searcher and an inserter thread on their own connections; latencies and errors are kept.

    ``take_vector`` hands the inserter a new vector (and its pool index) or None; ``on_insert``
    tells the benchmark's mirror of the table which id holds which vector.
    """

    def __init__(
        self,
        table: str,
        queries: np.ndarray,
        *,
        ef_search: int,
        take_vector: Callable[[], tuple[int, np.ndarray] | None],
        on_insert: Callable[[int, int], None],
        insert_pause_s: float = 0.1,
    ) -> None:
        self.table, self.queries, self.ef_search = table, queries, ef_search
        self.take_vector, self.on_insert, self.insert_pause_s = take_vector, on_insert, insert_pause_s
        self.latencies_ms: list[float] = []
        self.errors: list[str] = []
        self.inserts = 0
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._seq = 0

    def start(self) -> None:
        self._stop.clear()
        self._threads = [
            threading.Thread(target=self._guard, args=(f,), daemon=True) for f in (self._search, self._insert)
        ]
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(60)

    def _guard(self, loop: Callable[[psycopg.Connection[Any]], None]) -> None:
        try:
            with connect() as conn:
                loop(conn)
        except Exception as exc:  # a broken connection is an error of the run, not a crash of the bench
            self.errors.append(f"{type(exc).__name__}: {exc}")

    def _search(self, conn: psycopg.Connection[Any]) -> None:
        settings = SearchSettings(ef_search=self.ef_search, exact=False, max_scan_tuples=20_000)
        statement = search_statement(self.table, "<=>", exact=False, ids_only=True)
        i = 0
        while not self._stop.is_set():
            q = self.queries[i % len(self.queries)]
            i += 1
            t0 = time.perf_counter()
            try:
                with conn.transaction(), conn.cursor() as cur:
                    apply(cur, settings)
                    rows = cur.execute(statement, {"q": q, "k": 10}).fetchall()
                if len(rows) < 10:
                    self.errors.append(f"short result: {len(rows)} rows")
            except psycopg.Error as exc:
                self.errors.append(f"search: {type(exc).__name__}: {exc}")
                continue
            self.latencies_ms.append((time.perf_counter() - t0) * 1000)
            self._stop.wait(0.02)

    def _insert(self, conn: psycopg.Connection[Any]) -> None:
        while not self._stop.wait(self.insert_pause_s):
            picked = self.take_vector()
            if picked is None:
                continue
            slot, vector = picked
            self._seq += 1
            try:
                row = conn.execute(
                    f'INSERT INTO "{self.table}" (external_id, embedding) VALUES (%s, %s) RETURNING id',
                    (f"live-{time.time_ns()}-{self._seq}", vector),
                ).fetchone()
            except psycopg.Error as exc:
                self.errors.append(f"insert: {type(exc).__name__}: {exc}")
                continue
            assert row is not None
            self.on_insert(int(row[0]), slot)
            self.inserts += 1

    def p99_ms(self) -> float | None:
        if not self.latencies_ms:
            return None
        return float(np.percentile(np.asarray(self.latencies_ms), 99))
