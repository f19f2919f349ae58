"""The pages' abuse cases: every one refused, and nothing changed by the refused request."""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator
from urllib.parse import quote, urlsplit

import httpx
import pytest

from memstore.access import keys
from memstore.db.core import Database
from tests.api.api_helpers import LiveServer, make_image, start_server, wait_ready
from tests.ui.ui_helpers import csrf_of, hidden_fields, sign_in


def _text_item(api: httpx.Client, name: str, text: str, metadata: dict | None = None) -> int:
    r = api.post(
        f"/v1/collections/{name}/items?wait=true",
        json={"items": [{"text": text, "metadata": metadata or {}}]},
    )
    assert r.status_code == 201, r.text
    return int(r.json()["items"][0]["id"])


@pytest.mark.parametrize("path", ["/ui/", "/ui/c/anything?q=x", "/ui/maintenance", "/ui/c/a/items/1/thumbnail"])
def test_without_a_session_every_page_redirects_to_sign_in(server, path) -> None:
    r = httpx.get(server.url + path)
    assert r.status_code == 303
    assert r.headers["location"].startswith("/ui/signin?next=%2Fui%2F")


@pytest.mark.parametrize("accept", [b"*/*", b"text/html,application/xhtml+xml"])
def test_without_a_session_a_change_is_refused_before_its_body_is_read(server, accept) -> None:
    """A 1 GB upload announced, no byte of it sent: the answer comes at once, on the headers (a page
    for a browser's form, plain text for a script)."""
    host, port = urlsplit(server.url).hostname, urlsplit(server.url).port
    with socket.create_connection((host, port), timeout=5) as sock:
        sock.sendall(
            b"POST /ui/c/x/upload HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; boundary=b\r\n"
            b"Accept: " + accept + b"\r\nContent-Length: 1000000000\r\n\r\n"
        )
        answer = sock.recv(4096)
    assert answer.startswith(b"HTTP/1.1 401"), answer


def test_the_session_cookie_is_httponly_strict_and_scoped_to_the_pages(server, admin_key) -> None:
    with httpx.Client(base_url=server.url) as client:
        answer = sign_in(client, admin_key)
    cookie = answer.headers["set-cookie"]
    assert cookie.startswith("memstore_session=")
    for attribute in ("HttpOnly", "SameSite=strict", "Path=/ui"):
        assert attribute.lower() in cookie.lower(), cookie
    assert admin_key not in cookie  # the key never leaves the server


def test_a_wrong_key_is_refused_and_the_form_says_so(server) -> None:
    with httpx.Client(base_url=server.url) as client:
        fields = hidden_fields(client.get("/ui/signin").text)
        r = client.post("/ui/signin", data={**fields, "key": "msk_not-a-key"})
    assert r.status_code == 401
    assert "That key is unknown or revoked." in r.text
    assert "memstore_session" not in r.headers.get("set-cookie", "")


def test_sign_in_refuses_a_form_from_elsewhere(server, admin_key) -> None:
    """Login CSRF: without the form's own cookie, or with another token, no session is made."""
    with httpx.Client(base_url=server.url) as client:
        no_cookie = client.post("/ui/signin", data={"key": admin_key, "csrf": "x"})
        assert no_cookie.status_code == 403
        fields = hidden_fields(client.get("/ui/signin").text)
        wrong = client.post("/ui/signin", data={**fields, "csrf": "forged", "key": admin_key})
        assert wrong.status_code == 403
        assert "memstore_session" not in client.cookies


@pytest.mark.parametrize("target", ["//evil.example/", "https://evil.example/", "/v1/collections", "/ui/\\evil"])
def test_sign_in_never_redirects_off_the_pages(server, admin_key, target) -> None:
    with httpx.Client(base_url=server.url) as client:
        answer = sign_in(client, admin_key, next_page=target)
    assert answer.headers["location"] == "/ui/"


def test_sign_in_returns_to_the_page_asked_for(server, admin_key, ui_collection) -> None:
    with httpx.Client(base_url=server.url) as client:
        answer = sign_in(client, admin_key, next_page=f"/ui/c/{ui_collection}?q=cat")
    assert answer.headers["location"] == f"/ui/c/{ui_collection}?q=cat"


def test_a_wrong_or_missing_csrf_token_is_refused(admin_page, api, ui_collection) -> None:
    item = _text_item(api, ui_collection, "keep me")
    url = f"/ui/c/{ui_collection}/items/{item}"
    assert admin_page.post(f"{url}/delete", data={"csrf": "forged"}).status_code == 403
    assert admin_page.post(f"{url}/delete", data={}).status_code == 403
    assert admin_page.post(f"{url}/delete", headers={"X-CSRF-Token": "forged"}).status_code == 403
    assert admin_page.post(f"{url}/metadata", data={"csrf": "", "metadata": "{}"}).status_code == 403
    upload = admin_page.post(
        f"/ui/c/{ui_collection}/upload",
        files={"file": ("a.jpg", make_image(1), "image/jpeg")},
        headers={"X-CSRF-Token": "forged"},
    )
    assert upload.status_code == 403
    assert api.get(f"/v1/collections/{ui_collection}/items/{item}").status_code == 200
    assert api.get(f"/v1/collections/{ui_collection}").json()["items"] == 1


def test_a_change_sent_from_another_site_is_refused_even_with_the_token(admin_page, api, ui_collection) -> None:
    item = _text_item(api, ui_collection, "keep me")
    url = f"/ui/c/{ui_collection}/items/{item}"
    csrf = csrf_of(admin_page.get(url).text)
    r = admin_page.post(f"{url}/delete", data={"csrf": csrf}, headers={"Sec-Fetch-Site": "cross-site"})
    assert r.status_code == 403
    assert api.get(f"/v1/collections/{ui_collection}/items/{item}").status_code == 200


def test_a_read_key_searches_and_reads_but_cannot_edit_delete_or_upload(server, api, new_key, ui_collection) -> None:
    item = _text_item(api, ui_collection, "look but do not touch", {"k": "v"})
    with httpx.Client(base_url=server.url) as reader:
        sign_in(reader, new_key(f"read:{ui_collection}"))
        search = reader.get(f"/ui/c/{ui_collection}", params={"q": "look"})
        assert search.status_code == 200 and f'data-item="{item}"' in search.text
        assert 'id="dropzone"' not in search.text  # no upload panel
        page = reader.get(f"/ui/c/{ui_collection}/items/{item}")
        assert page.status_code == 200
        assert 'id="confirm-delete"' not in page.text and 'id="save-metadata"' not in page.text
        csrf = csrf_of(page.text)
        deleted = reader.post(f"/ui/c/{ui_collection}/items/{item}/delete", data={"csrf": csrf})
        assert deleted.status_code == 403 and "needs write" in deleted.text
        edited = reader.post(f"/ui/c/{ui_collection}/items/{item}/metadata", data={"csrf": csrf, "metadata": "{}"})
        assert edited.status_code == 403
        upload = reader.post(
            f"/ui/c/{ui_collection}/upload",
            files={"file": ("a.jpg", make_image(2), "image/jpeg")},
            headers={"X-CSRF-Token": csrf},
        )
        assert upload.status_code == 403
    assert api.get(f"/v1/collections/{ui_collection}/items/{item}").json()["metadata"] == {"k": "v"}
    assert api.get(f"/v1/collections/{ui_collection}").json()["items"] == 1


def test_revoking_the_key_ends_its_sessions_at_once(server, engine, new_key, ui_collection) -> None:
    secret = new_key("admin")
    with httpx.Client(base_url=server.url) as client:
        sign_in(client, secret)
        assert client.get("/ui/").status_code == 200
        [key] = [
            k for k in keys.list_keys(Database(engine)) if secret.startswith(k.prefix) and k.name.startswith("ui-")
        ][-1:]
        keys.revoke_key(Database(engine), name_or_id=str(key.id))
        after = client.get("/ui/")
        assert after.status_code == 303 and after.headers["location"].startswith("/ui/signin")


PAGE_ACCEPT = {"Accept": "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"}


def test_after_the_session_ends_pages_forms_and_scripts_are_told_so(
    server, api, engine, new_key, ui_collection
) -> None:
    """A revoked key's session: a page leads to the sign-in form, which says the session ended; a form
    posted is a page (not a bare 401) leading back, through sign-in, to the page it came from (its
    Referer, only when that is a page of this site); a script's status poll gets JSON, not a redirect."""
    item = _text_item(api, ui_collection, "keep me", {"k": "v"})
    secret = new_key("admin")
    page_url = f"/ui/c/{ui_collection}/items/{item}"
    with httpx.Client(base_url=server.url) as client:
        sign_in(client, secret)
        csrf = csrf_of(client.get(page_url).text)
        [key] = [
            k for k in keys.list_keys(Database(engine)) if secret.startswith(k.prefix) and k.name.startswith("ui-")
        ]
        keys.revoke_key(Database(engine), name_or_id=str(key.id))

        def post(referer: str, **headers: str) -> httpx.Response:
            return client.post(
                f"{page_url}/metadata",
                data={"csrf": csrf, "metadata": '{"k": "changed"}'},
                headers={"Referer": referer, **headers},
            )

        ended = post(server.url + page_url, **PAGE_ACCEPT)
        assert ended.status_code == 401 and ended.headers["content-type"].startswith("text/html")
        assert "Session ended" in ended.text and "this change was not made" in ended.text
        back = f'href="/ui/signin?next={quote(page_url, safe="")}&amp;notice=session-ended"'
        assert back in ended.text, ended.text
        assert ended.headers["content-security-policy"].startswith("default-src 'none'")
        home = 'href="/ui/signin?next=%2Fui%2F&amp;notice=session-ended"'
        for referer in (
            f"https://evil.example{page_url}",
            server.url.replace("127.0.0.1", "localhost") + page_url,
            server.url + "/v1/collections",
            server.url + "/ui/../docs",
            server.url + "/ui/%2e%2e/docs",
            "javascript:alert(1)",
            "http://[broken",
            "",
        ):
            refused = post(referer, **PAGE_ACCEPT)
            assert refused.status_code == 401 and home in refused.text, referer
        hostile = post(server.url + '/ui/c/"><script>alert(1)</script>', **PAGE_ACCEPT)
        assert hostile.status_code == 401 and "<script>alert" not in hostile.text
        script = post(server.url + page_url, **{"X-CSRF-Token": csrf})
        assert script.status_code == 401 and script.headers["content-type"].startswith("text/plain")
        redirected = client.get(page_url)
        assert redirected.status_code == 303
        assert redirected.headers["location"] == f"/ui/signin?next={quote(page_url, safe='')}&notice=session-ended"
        signin = client.get(redirected.headers["location"])
        assert "Your session ended: sign in again." in signin.text
        assert hidden_fields(signin.text)["next"] == page_url
        poll = client.get(f"/ui/c/{ui_collection}/status", params={"ids": item}, headers={"Accept": "application/json"})
        assert poll.status_code == 401 and poll.headers["content-type"] == "application/problem+json"
        assert "sign in again" in poll.json()["detail"]
    with httpx.Client(base_url=server.url) as stranger:  # never signed in: no notice
        first = stranger.get(page_url)
        assert first.status_code == 303 and "notice" not in first.headers["location"]
    assert api.get(f"/v1/collections/{ui_collection}/items/{item}").json()["metadata"] == {"k": "v"}


def test_signing_out_ends_the_session_on_the_server(server, admin_key) -> None:
    with httpx.Client(base_url=server.url) as client:
        sign_in(client, admin_key)
        token = client.cookies["memstore_session"]
        out = client.post("/ui/signout", data={"csrf": csrf_of(client.get("/ui/").text)})
        assert out.status_code == 303
    with httpx.Client(base_url=server.url, cookies={"memstore_session": token}) as replay:
        assert replay.get("/ui/").status_code == 303  # the old cookie is worth nothing


def test_a_key_for_one_collection_cannot_see_another(server, api, new_key, collection_name) -> None:
    mine, theirs = f"{collection_name}_a", f"{collection_name}_b"
    for name in (mine, theirs):
        assert api.post("/v1/collections", json={"name": name}).status_code == 201
    secret_item = _text_item(api, theirs, "the other collection's secret")
    with httpx.Client(base_url=server.url) as client:
        sign_in(client, new_key(f"write:{mine}"))
        listing = client.get("/ui/").text
        assert f'data-collection="{mine}"' in listing and theirs not in listing
        for path in (
            f"/ui/c/{theirs}?q=secret",
            f"/ui/c/{theirs}/items/{secret_item}",
            f"/ui/c/{theirs}/items/{secret_item}/thumbnail",
            f"/ui/c/{theirs}/items/{secret_item}/original",
            f"/ui/c/{theirs}/status?ids={secret_item}",
        ):
            r = client.get(path)
            assert r.status_code == 403, path
            assert "secret" not in r.text.replace(theirs, "")
        maintenance = client.get("/ui/maintenance").text
        assert mine in maintenance and theirs not in maintenance


def test_hostile_metadata_and_file_names_are_shown_as_text(admin_page, api, ui_collection) -> None:
    hostile = '<script>alert("x")</script>'
    item = _text_item(api, ui_collection, f"text {hostile}", {hostile: hostile, "filename": f"{hostile}.txt"})
    csrf = csrf_of(admin_page.get(f"/ui/c/{ui_collection}").text)
    uploaded = admin_page.post(
        f"/ui/c/{ui_collection}/upload",
        files={"file": (f'<img src=x onerror="alert(1)">{hostile}.jpg', make_image(5), "image/jpeg")},
        headers={"X-CSRF-Token": csrf},
    )
    assert uploaded.status_code == 200, uploaded.text
    # The upload's page shows the hostile item among its neighbours once the upload is embedded; on a
    # loaded machine the worker may not have reached it yet.
    wait_ready(api, ui_collection)
    pages = [
        admin_page.get(f"/ui/c/{ui_collection}").text,
        admin_page.get(f"/ui/c/{ui_collection}", params={"q": "text"}).text,
        admin_page.get(f"/ui/c/{ui_collection}/items/{item}").text,
        admin_page.get(f"/ui/c/{ui_collection}/items/{uploaded.json()['id']}").text,
    ]
    for html in pages:
        assert "<script>alert" not in html and "<img src=x" not in html
        assert "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;" in html
        assert all(' src="' in tag for tag in re.findall(r"<script[^>]*>", html))  # no inline script at all


def test_every_answer_carries_a_strict_content_security_policy(admin_page, ui_collection) -> None:
    for path in ("/ui/", f"/ui/c/{ui_collection}", "/ui/maintenance", "/ui/signin", "/ui/nowhere"):
        r = admin_page.get(path)
        csp = r.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "unsafe-inline" not in csp and "frame-ancestors 'none'" in csp
        assert r.headers["x-content-type-options"] == "nosniff"
        assert r.headers["cache-control"] == "no-store"
    assert admin_page.get("/ui/nowhere").status_code == 404


@pytest.fixture(scope="module")
def open_server(settings, tiny_engine) -> Iterator[LiveServer]:
    """memstore serve --no-auth (MEMSTORE_API_AUTH=off)."""
    with start_server(settings, backend=tiny_engine, auth="off", workers=0) as live:
        yield live


def test_with_auth_off_the_pages_open_directly_and_changes_still_need_the_token(
    open_server, api, ui_collection
) -> None:
    item = _text_item(api, ui_collection, "local")
    with httpx.Client(base_url=open_server.url) as client:
        assert client.get("/ui/signin").headers["location"] == "/ui/"
        home = client.get("/ui/")
        assert home.status_code == 200 and ui_collection in home.text
        assert client.post(f"/ui/c/{ui_collection}/items/{item}/delete", data={"csrf": "x"}).status_code == 403
        csrf = csrf_of(home.text)
        assert client.post(f"/ui/c/{ui_collection}/items/{item}/delete", data={"csrf": csrf}).status_code == 303
    assert api.get(f"/v1/collections/{ui_collection}/items/{item}").status_code == 404
