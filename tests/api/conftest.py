"""Fixtures for the API tests: the tiny model, a live uvicorn server on the test database, keys."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import httpx
import psycopg
import pytest
import sqlalchemy as sa
from psycopg import sql

from memstore import keys, migrate
from memstore.db import create_engine, libpq_url
from memstore.settings import Settings
from tests.api.api_helpers import FakeBackend, LiveServer, start_server


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
        return keys.create_key(engine, name="fake-admin", scopes=["admin"])[1]
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


def _new_database(server_url: str, prefix: str) -> str:
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(libpq_url(server_url), autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = sa.make_url(server_url).set(database=name).render_as_string(hide_password=False)
    migrate.upgrade(url)
    return url


def _drop_database(server_url: str, url: str) -> None:
    with psycopg.connect(libpq_url(server_url), autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(sa.make_url(url).database))
        )


@pytest.fixture
def empty_database_url(server_url: str) -> Iterator[str]:
    """A migrated database of its own, for tests that need a queue nobody else touches."""
    url = _new_database(server_url, "memstore_empty")
    yield url
    _drop_database(server_url, url)


@pytest.fixture(scope="session")
def worker_url(server_url: str) -> Iterator[str]:
    """A database of its own for the worker tests: the API servers' workers would claim their rows."""
    url = _new_database(server_url, "memstore_worker")
    yield url
    _drop_database(server_url, url)


@pytest.fixture(scope="session")
def fake_url(server_url: str) -> Iterator[str]:
    """The fake-encoder server's own database: workers of one server must not embed another's items."""
    url = _new_database(server_url, "memstore_fake")
    yield url
    _drop_database(server_url, url)


@pytest.fixture(scope="session")
def worker_engine(worker_url: str) -> Iterator[sa.Engine]:
    engine = create_engine(worker_url)
    yield engine
    engine.dispose()
