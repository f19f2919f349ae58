"""Fixtures for the API tests: the tiny model, a live uvicorn server on the test database, keys."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
import sqlalchemy as sa

from memstore.access import keys
from memstore.db.core import Database, create_engine
from memstore.settings import Settings
from tests.api.api_helpers import FakeBackend, LiveServer, start_server
from tests.databases import scratch_database


@pytest.fixture
def client(server: LiveServer, admin_key: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {admin_key}"}, timeout=60) as c:
        yield c


@pytest.fixture
def collection(client: httpx.Client, collection_name: str) -> str:
    r = client.post("/v1/collections", json={"name": collection_name})
    assert r.status_code == 201, r.text
    return collection_name


@pytest.fixture(scope="session")
def fake_backend() -> FakeBackend:
    return FakeBackend()


@pytest.fixture(scope="session")
def fake_admin_key(fake_url: str) -> str:
    engine = create_engine(fake_url)
    try:
        return keys.create_key(Database(engine), name="fake-admin", scopes=["admin"])[1]
    finally:
        engine.dispose()


@pytest.fixture(scope="session")
def fake_server(settings: Settings, fake_url: str, fake_backend: FakeBackend) -> Iterator[LiveServer]:
    """A server whose encoder is a controllable fake, with small limits to hit."""
    limits = {
        "max_body_bytes": 256 * 1024,
        "max_search_body_bytes": 256 * 1024,
        "max_json_body_bytes": 64 * 1024,
        "max_load_body_bytes": 256 * 1024,
        "max_files_per_request": 3,
        "max_items_per_request": 4,
        "max_text_chars": 100,
        "max_k": 20,
    }
    fake_settings = settings.model_copy(update={"database_url": fake_url})
    with start_server(fake_settings, backend=fake_backend, **limits) as live:
        yield live


@pytest.fixture
def fake_client(fake_server: LiveServer, fake_admin_key: str, fake_backend: FakeBackend) -> Iterator[httpx.Client]:
    fake_backend.failures.clear()
    fake_backend.gate = None
    headers = {"Authorization": f"Bearer {fake_admin_key}"}
    with httpx.Client(base_url=fake_server.url, headers=headers, timeout=60) as c:
        yield c


@pytest.fixture
def fake_collection(fake_client: httpx.Client, collection_name: str) -> str:
    r = fake_client.post("/v1/collections", json={"name": collection_name})
    assert r.status_code == 201, r.text
    return collection_name


@pytest.fixture
def empty_database_url(server_url: str) -> Iterator[str]:
    """A migrated database of its own, for tests that need a queue nobody else touches."""
    with scratch_database(server_url, "memstore_empty") as url:
        yield url


@pytest.fixture(scope="session")
def worker_url(server_url: str) -> Iterator[str]:
    """A database of its own for the worker tests: the API servers' workers would claim their rows."""
    with scratch_database(server_url, "memstore_worker") as url:
        yield url


@pytest.fixture(scope="session")
def fake_url(server_url: str) -> Iterator[str]:
    """The fake-encoder server's own database: workers of one server must not embed another's items."""
    with scratch_database(server_url, "memstore_fake") as url:
        yield url


@pytest.fixture(scope="session")
def worker_engine(worker_url: str) -> Iterator[sa.Engine]:
    engine = create_engine(worker_url)
    yield engine
    engine.dispose()
