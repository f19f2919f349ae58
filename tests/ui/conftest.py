"""Fixtures for the web pages' tests: keys, signed-in clients and headless Chromium (the live server
and the admin key are the root conftest's, shared with the API tests)."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from memstore.access import keys
from memstore.db.core import Database
from tests.api.api_helpers import LiveServer
from tests.ui.ui_helpers import sign_in


@pytest.fixture(scope="session")
def new_key(engine: sa.Engine) -> Callable[..., str]:
    """A key with these scopes (a fresh name each time); returns its secret."""

    def make(*scopes: str) -> str:
        return keys.create_key(Database(engine), name=f"ui-{uuid.uuid4().hex[:8]}", scopes=list(scopes))[1]

    return make


@pytest.fixture
def api(server: LiveServer, admin_key: str) -> Iterator[httpx.Client]:
    """The REST API with an admin key (to set up what the pages show)."""
    headers = {"Authorization": f"Bearer {admin_key}"}
    with httpx.Client(base_url=server.url, headers=headers, timeout=60) as client:
        yield client


@pytest.fixture
def admin_page(server: LiveServer, admin_key: str) -> Iterator[httpx.Client]:
    """A browser-like client signed in with the admin key (the session cookie, no API key)."""
    with httpx.Client(base_url=server.url, timeout=60) as client:
        sign_in(client, admin_key)
        yield client


@pytest.fixture
def ui_collection(api: httpx.Client, collection_name: str) -> str:
    r = api.post("/v1/collections", json={"name": collection_name})
    assert r.status_code == 201, r.text
    return collection_name


def _chromium() -> tuple[str, str] | None:
    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    driver = shutil.which("chromedriver")
    return (browser, driver) if browser and driver else None


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    """Headless Chromium through selenium. Missing Chromium fails the tests in CI (CI is set there, and
    .ci/run installs it) and skips them elsewhere, saying how to install it: a developer without it
    still runs the rest of the suite, CI can never pass without the browser tests."""
    found = _chromium()
    if found is None:
        message = "Chromium and chromedriver are needed: apt-get install -y chromium chromium-driver"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    options.binary_location = found[0]
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,1000"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path=found[1]), options=options)
    driver.implicitly_wait(0)
    try:
        yield driver
    finally:
        driver.quit()
