"""/docs under its Content-Security-Policy, in headless Chromium: Swagger UI's scripts run (the page
is rendered by them) and the browser reports no blocked script, style or image."""

from __future__ import annotations

import time
from typing import Any

from tests.api.api_helpers import LiveServer


def test_the_swagger_page_runs_under_its_policy(server: LiveServer, browser: Any) -> None:
    browser.get_log("browser")  # drop what earlier tests left
    browser.get(f"{server.url}/docs")
    deadline = time.monotonic() + 30
    # Only the bundle and the hash-pinned start script can fill the element.
    while not browser.find_element("id", "swagger-ui").get_attribute("innerText").strip():
        assert time.monotonic() < deadline, "Swagger UI's scripts did not run"
        time.sleep(0.2)
    time.sleep(0.5)
    problems = [e["message"] for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert not [p for p in problems if "Content Security Policy" in p or "Refused" in p], problems
