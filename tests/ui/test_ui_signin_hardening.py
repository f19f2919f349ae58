"""Sign-in against a hostile client: the form's pre-session is server-issued (a cookie the client
chooses is refused), cookies take ``__Host-`` names over HTTPS, and ``next`` never leaves ``/ui/``
through dot segments, encoded or not, backslashes or a second slash."""

from __future__ import annotations

import time

import httpx
import pytest

from memstore.access import ui_sessions
from memstore.ui.signin import is_ui_page, issue_presession, presession_csrf
from tests.api.api_helpers import LiveServer
from tests.ui.ui_helpers import hidden_fields, sign_in

HTTPS = {"X-Forwarded-Proto": "https"}  # the test server trusts it from 127.0.0.1, as behind a local proxy


def test_a_signin_cookie_the_client_chose_is_refused(server: LiveServer, admin_key: str) -> None:
    """The old weakness: any cookie value was a valid pre-session, and its token was derivable."""
    chosen = "attacker-chosen-value"
    with httpx.Client(base_url=server.url, cookies={"memstore_signin": chosen}) as client:
        r = client.post("/ui/signin", data={"key": admin_key, "csrf": ui_sessions.csrf_token(chosen)})
        assert r.status_code == 403
        assert "memstore_session" not in r.headers.get("set-cookie", "")


def test_the_pre_session_is_signed_bound_and_expires() -> None:
    key = b"k" * 32
    now = time.time()
    cookie, csrf = issue_presession(key, now)
    assert presession_csrf(key, cookie, now) == csrf
    nonce, expires, signature = cookie.split(".")
    assert presession_csrf(b"other" * 8, cookie, now) is None  # another server's key
    assert presession_csrf(key, f"{nonce}.{int(expires) + 10_000}.{signature}", now) is None  # extended
    assert presession_csrf(key, f"x{nonce}.{expires}.{signature}", now) is None  # another nonce
    assert presession_csrf(key, cookie, now + 3601) is None  # expired
    assert presession_csrf(key, "a.b", now) is None and presession_csrf(key, "a.b.c", now) is None
    assert issue_presession(key, now)[1] != csrf  # a fresh nonce, a fresh token


def test_over_https_the_cookies_are_host_prefixed(server: LiveServer, admin_key: str) -> None:
    with httpx.Client(base_url=server.url, headers=HTTPS) as client:
        form = client.get("/ui/signin")
        set_cookie = form.headers["set-cookie"]
        assert set_cookie.startswith("__Host-memstore_signin=")
        for attribute in ("Secure", "Path=/;", "HttpOnly", "SameSite=strict"):
            assert attribute.lower() in (set_cookie + ";").lower(), set_cookie
        assert "domain=" not in set_cookie.lower()
        pre_session = set_cookie.split(";")[0].split("=", 1)[1]
        fields = {**hidden_fields(form.text), "key": admin_key}
        # A plain-named cookie (another host of the site could have planted it) does not count.
        planted = client.post("/ui/signin", data=fields, headers={"Cookie": f"memstore_signin={pre_session}"})
        assert planted.status_code == 403
        signed_in = client.post("/ui/signin", data=fields, headers={"Cookie": f"__Host-memstore_signin={pre_session}"})
        assert signed_in.status_code == 303, signed_in.text
        cookies = signed_in.headers.get_list("set-cookie")
        session = next(c for c in cookies if c.startswith("__Host-memstore_session="))
        assert "secure" in session.lower() and "path=/;" in (session + ";").lower()
        token = session.split(";")[0].split("=", 1)[1]
        home = client.get("/ui/", headers={"Cookie": f"__Host-memstore_session={token}"})
        assert home.status_code == 200
        plain = client.get("/ui/", headers={"Cookie": f"memstore_session={token}"})
        assert plain.status_code == 303 and "/ui/signin" in plain.headers["location"]
    # Plain HTTP (a local server) keeps the plain names, scoped to /ui.
    with httpx.Client(base_url=server.url) as client:
        assert client.get("/ui/signin").headers["set-cookie"].startswith("memstore_signin=")


ESCAPES = [
    "/ui/../docs",
    "/ui/%2e%2e/docs",
    "/ui/%2E%2e/docs",
    "/ui/.%2E/docs",
    "/ui/./../docs",
    "/ui/c/x/../../docs",
    "/ui/..",
    "/ui/%2e%2e",
    "/ui//evil.example/",
    "/ui/%2f%2fevil.example/",
    "/ui/\\evil.example",
    "/ui/%5c%5cevil.example",
    "/ui/\t/evil.example",
    "/ui/\n/x",
    "/ui /x",
    "//evil.example/ui/",
    "https://evil.example/ui/",
    "/v1/collections",
    "/uix/",
]


@pytest.mark.parametrize("target", ESCAPES)
def test_next_never_leaves_the_pages(target: str) -> None:
    assert not is_ui_page(target)


@pytest.mark.parametrize("target", ["/ui/", "/ui/c/photos", "/ui/c/photos/search?q=a%2F..b&k=5", "/ui/c/x#top"])
def test_next_keeps_a_page(target: str) -> None:
    assert is_ui_page(target)


@pytest.mark.parametrize("target", ["/ui/../docs", "/ui/%2e%2e/docs", "/ui//evil.example/"])
def test_sign_in_goes_home_for_an_escaping_next(server: LiveServer, admin_key: str, target: str) -> None:
    with httpx.Client(base_url=server.url) as client:
        assert sign_in(client, admin_key, next_page=target).headers["location"] == "/ui/"
        assert client.get("/ui/signin", params={"next": "/ui/c/a"}).status_code == 200
    with httpx.Client(base_url=server.url) as client:
        assert sign_in(client, admin_key, next_page="/ui/c/a").headers["location"] == "/ui/c/a"
