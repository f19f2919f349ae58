"""Fixtures for the client's tests: a real ``memstore serve --no-encoder`` with an admin key (vectors
only: the LangChain store computes its own), and clients of it. Tests that need the server to embed
texts and images use the session's in-process server with the tiny model (``server``, ``admin_key``)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from memstore.access import keys
from memstore.db.core import Database, create_engine
from tests.databases import scratch_database


@dataclass(frozen=True)
class Served:
    url: str
    key: str
    database_url: str
    log: Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def served(server_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """``memstore serve --no-encoder`` in its own process, on a database of its own, keys on."""
    with scratch_database(server_url, "memstore_client") as url:
        engine = create_engine(url)
        try:
            _, key = keys.create_key(Database(engine), name=f"client-{uuid.uuid4().hex[:6]}", scopes=["admin"])
        finally:
            engine.dispose()
        data_dir = tmp_path_factory.mktemp("served")
        port = _free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSTORE_")}
        env |= {
            "MEMSTORE_DATABASE_URL": url,
            "MEMSTORE_DATA_DIR": str(data_dir),
            "MEMSTORE_API_ACCESS_LOG": "false",
        }
        command = [sys.executable, "-m", "memstore.cli", "serve", "--no-encoder", "--no-migrate"]
        command += ["--host", "127.0.0.1", "--port", str(port)]
        log_path = data_dir / "serve.log"
        with log_path.open("wb") as log:
            proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 120
            while True:
                if proc.poll() is not None:
                    pytest.fail(f"memstore serve exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}")
                try:
                    if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    pytest.fail(f"memstore serve did not answer in 120 s:\n{log_path.read_text()[-3000:]}")
                time.sleep(0.2)
            yield Served(base, key, url, log_path)
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


@pytest.fixture
def name() -> str:
    return f"c_{uuid.uuid4().hex[:12]}"
