"""Helpers for the web pages' tests (imported as ``ui_helpers``)."""

from __future__ import annotations

import re
import time
from typing import Any

import httpx

_HIDDEN = re.compile(r'<input type="hidden" name="(?P<name>[a-z_]+)" value="(?P<value>[^"]*)"')


def hidden_fields(html: str) -> dict[str, str]:
    return {m["name"]: m["value"] for m in _HIDDEN.finditer(html)}


def csrf_of(html: str) -> str:
    match = re.search(r'<meta name="csrf-token" content="([^"]*)"', html)
    assert match, "the page has no CSRF token"
    return match[1]


def sign_in(client: httpx.Client, secret: str, next_page: str = "") -> httpx.Response:
    """The sign-in form, as a browser fills it: the form (and its cookie), then the post."""
    form = client.get("/ui/signin")
    assert form.status_code == 200, form.text
    fields = hidden_fields(form.text)
    fields.update(key=secret, next=next_page)
    answer = client.post("/ui/signin", data=fields)
    assert answer.status_code == 303, answer.text
    return answer


def wait_until(check: Any, timeout: float = 60, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)
