"""A hostile client on the network: what it tried, and what must hold.

- No key and a huge body: refused on the headers alone, before a byte of the body is read, so the
  event loop stays free for everyone else.
- A key and an oversize body on a route that takes small JSON: 413 on the headers alone.
- Zero vectors in a cosine collection: refused (store and query); a legacy one never breaks a search.
- Deep JSON in multipart fields, two Authorization headers, coerced numbers: 4xx, never 500.
- Downloads: nosniff, a sandbox CSP, an RFC 6266 Content-Disposition.
- The Host header never reaches a link; /health tells strangers liveness only.
- Twenty concurrent posts of one external id: every answer 2xx or a retryable 409, never "unreachable".
"""

from __future__ import annotations

import base64
import contextlib
import io
import socket
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import psycopg
from PIL import Image
from psycopg import sql

from memstore.db.core import libpq_url
from tests.api.api_helpers import LiveServer, make_image


def _raw_request(server: LiveServer, head: str, first_body: bytes = b"") -> tuple[str, float, bool]:
    """Send a request's headers (and the first part of its body), then read the answer. Returns the
    status line, the seconds until it came, and whether the server closed the connection after it."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as s:
        started = time.monotonic()
        s.sendall(head.encode("latin-1") + b"\r\n" + first_body)
        answer = b""
        while b"\r\n\r\n" not in answer:
            chunk = s.recv(65536)
            if not chunk:
                break
            answer += chunk
        took = time.monotonic() - started
        closed = b"connection: close" in answer.lower()
    return answer.split(b"\r\n", 1)[0].decode(), took, closed


def _head(method: str, path: str, length: int, *extra: str) -> str:
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json"]
    lines += [f"Content-Length: {length}", *extra]
    return "\r\n".join(lines) + "\r\n"


def test_no_key_and_a_huge_body_is_refused_before_the_body_is_read(server: LiveServer, collection: str) -> None:
    """The body is declared as 59 MB but never sent: the 401 must come anyway (the server did not
    wait for the body) and the connection is closed (it will not read it later either)."""
    for method, path in (
        ("POST", f"/v1/collections/{collection}/items/lookup"),
        ("POST", f"/v1/collections/{collection}/items/delete"),
        ("PATCH", f"/v1/collections/{collection}/items/1"),
        ("POST", "/v1/collections"),
        ("POST", f"/v1/collections/{collection}/search"),
        ("POST", f"/v1/collections/{collection}/items"),
    ):
        status, took, closed = _raw_request(server, _head(method, path, 59_000_000), b'{"external_ids": [1, 1, ')
        print(f"{method} {path.split('/')[-1]}: no key, 59 MB declared: {status[9:]} in {took * 1000:.1f} ms")
        assert status.endswith("401 Unauthorized"), (method, path, status)
        assert closed, (method, path)


def test_an_unauthenticated_flood_does_not_stall_other_clients(server: LiveServer, client: httpx.Client) -> None:
    """Unrelated requests keep their latency while no-key clients push 15 MB bodies. The bound is
    loose (a loaded machine is slow for everyone); before the fix each such body held the event
    loop for about a second while it was parsed."""

    def baseline() -> float:
        times = []
        for _ in range(10):
            t0 = time.monotonic()
            assert client.get("/v1/collections").status_code == 200
            times.append(time.monotonic() - t0)
        return statistics.median(times)

    normal = baseline()
    stop = threading.Event()
    body = b'{"external_ids": [' + b"1, " * 5_000_000 + b"1]}"

    def flood() -> None:
        while not stop.is_set():
            # The server may close the connection before the client has sent it all.
            with contextlib.suppress(httpx.HTTPError):
                httpx.post(
                    f"{server.url}/v1/collections/x/items/lookup",
                    content=body,
                    headers={"content-type": "application/json"},
                    timeout=10,
                )

    threads = [threading.Thread(target=flood, daemon=True) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        time.sleep(0.3)
        worst = 0.0
        for _ in range(20):
            t0 = time.monotonic()
            assert client.get("/v1/collections").status_code == 200
            worst = max(worst, time.monotonic() - t0)
    finally:
        stop.set()
        for t in threads:
            t.join(15)
    print(f"unrelated request during a no-key 15 MB flood: worst {worst * 1000:.1f} ms, usually {normal * 1000:.1f}")
    assert worst < 1.0 + 10 * normal, f"an unrelated request took {worst:.3f} s (normally {normal:.3f} s)"


def test_a_small_json_route_refuses_an_oversize_body_on_its_headers(
    server: LiveServer, admin_key: str, collection: str
) -> None:
    limit = server.runtime.api.max_json_body_bytes
    head = _head("POST", f"/v1/collections/{collection}/items/lookup", limit + 1, f"Authorization: Bearer {admin_key}")
    status, took, closed = _raw_request(server, head)
    print(f"key, {limit + 1} bytes declared to a small JSON route: {status[9:]} in {took * 1000:.1f} ms")
    assert " 413 " in status and closed


def test_a_chunked_body_over_a_json_route_limit_is_413_not_400(client: httpx.Client, collection: str) -> None:
    limit = client.get("/health").json()  # any call: the limit is the server's
    assert limit["status"] in ("ok", "degraded")

    def chunks() -> Any:
        yield b'{"external_ids": ['
        for _ in range(200):
            yield b'"abcdefghij", ' * 1000
        yield b'"z"]}'

    r = client.post(
        f"/v1/collections/{collection}/items/lookup", content=chunks(), headers={"content-type": "application/json"}
    )
    assert r.status_code == 413, r.text
    assert (
        r.json()["type"] == "/problems/payload-too-large" and "MEMSTORE_API_MAX_JSON_BODY_BYTES" in r.json()["detail"]
    )


def test_zero_vectors_are_refused_in_a_cosine_collection(client: httpx.Client, collection_name: str) -> None:
    assert client.post("/v1/collections", json={"name": collection_name, "dimensions": 4}).status_code == 201
    base = f"/v1/collections/{collection_name}"
    for vector in ([0.0, 0.0, 0.0, 0.0], [1e-30, 0.0, 0.0, 0.0], [3e38, 3e38, 0.0, 0.0]):
        r = client.post(f"{base}/items", json={"items": [{"vector": vector}]})
        assert r.status_code == 422, (vector, r.text)
        # Too short for a cosine direction, or (3e38) too long for any distance: refused either way.
        assert ("cosine" if vector[0] < 1 else "squared length") in r.json()["detail"]
        r = client.post(f"{base}/search", json={"vector": vector})
        assert r.status_code == 422, (vector, r.text)
    assert client.get(base).json()["items"] == 0
    # l2 has no such limit: a zero vector is a point like any other.
    l2 = collection_name[:40] + "_l2"
    assert client.post("/v1/collections", json={"name": l2, "dimensions": 4, "metric": "l2"}).status_code == 201
    assert client.post(f"/v1/collections/{l2}/items", json={"items": [{"vector": [0, 0, 0, 0]}]}).status_code == 201
    assert client.post(f"/v1/collections/{l2}/search", json={"vector": [0, 0, 0, 0]}).status_code == 200


def test_a_zero_vector_stored_before_the_check_never_breaks_a_search(
    client: httpx.Client, collection_name: str, database_url: str
) -> None:
    """Rows written before zero vectors were refused (or by hand) get a NaN cosine distance: they are
    left out of the answer instead of turning every search that reaches them into a 500."""
    assert client.post("/v1/collections", json={"name": collection_name, "dimensions": 4}).status_code == 201
    base = f"/v1/collections/{collection_name}"
    ok = client.post(f"{base}/items", json={"items": [{"vector": [1, 0, 0, 0], "external_id": "good"}]})
    assert ok.status_code == 201
    with psycopg.connect(libpq_url(database_url), autocommit=True) as conn:
        (table,) = conn.execute(
            "SELECT table_name FROM memstore_collections WHERE name = %s", (collection_name,)
        ).fetchone()  # type: ignore[misc]
        conn.execute(
            sql.SQL(
                "INSERT INTO {} (external_id, embedding, metadata, status) "
                "VALUES ('zero', '[0,0,0,0]', '{{}}', 'ready')"
            ).format(sql.Identifier(table))
        )
    for query in ({"vector": [1, 0, 0, 0], "exact": True}, {"vector": [0.5, 0.5, 0, 0]}):
        r = client.post(f"{base}/search", json=query)
        assert r.status_code == 200, r.text
        assert [hit["external_id"] for hit in r.json()["results"]] == ["good"]


def test_deep_json_in_multipart_fields_is_422(client: httpx.Client, collection: str) -> None:
    deep = "[" * 100_000 + "]" * 100_000
    files = {"files": ("a.jpg", make_image(1), "image/jpeg")}
    r = client.post(f"/v1/collections/{collection}/items", files=files, data={"metadata": deep})
    assert r.status_code == 422, r.text
    for field in ("filter", "vector"):
        r = client.post(
            f"/v1/collections/{collection}/search",
            files={"image": ("q.jpg", make_image(2), "image/jpeg")},
            data={field: deep},
        )
        assert r.status_code == 422, (field, r.text)
        assert "nested" in r.json()["detail"]


def test_two_authorization_headers_are_refused(server: LiveServer, admin_key: str, collection: str) -> None:
    headers = [("authorization", f"Bearer {admin_key}"), ("authorization", "Bearer msk_other")]
    for method, path, body in (
        ("POST", f"/v1/collections/{collection}/search", {"vector": [0.1] * 64}),
        ("GET", f"/v1/collections/{collection}", None),
    ):
        r = httpx.request(method, server.url + path, json=body, headers=headers)
        assert r.status_code == 400, (path, r.text)
        assert "Authorization" in r.json()["detail"]


def test_numbers_are_not_coerced_from_strings_or_booleans(client: httpx.Client, collection: str) -> None:
    for bad in ({"k": "5"}, {"k": True}, {"exact": "yes"}, {"ef_search": 1.5}):
        r = client.post(f"/v1/collections/{collection}/search", json={"vector": [0.1] * 64, **bad})
        assert r.status_code == 422, (bad, r.text)


def test_downloads_carry_safety_headers(client: httpx.Client, collection: str) -> None:
    html = b"<html><script>alert(1)</script></html>"
    png = make_image(3, fmt="PNG") + html
    up = client.post(
        f"/v1/collections/{collection}/items",
        files={"files": ("été 2024.png", png, "image/png")},
        data={"external_id": "albums/summer"},
    )
    assert up.status_code in (201, 202), up.text
    text = client.post(f"/v1/collections/{collection}/items", json={"items": [{"text": html.decode()}]})
    assert text.status_code in (201, 202), text.text
    for item, disposition in ((up.json()["items"][0], "inline"), (text.json()["items"][0], "attachment")):
        r = client.get(f"/v1/collections/{collection}/items/{item['id']}/content")
        assert r.status_code == 200
        assert r.headers["x-content-type-options"] == "nosniff"
        assert r.headers["content-security-policy"].startswith("sandbox")
        assert r.headers["content-disposition"].startswith(disposition + ";")
    r = client.get(f"/v1/collections/{collection}/items/{up.json()['items'][0]['id']}/content")
    # The uploaded file's name (kept in the metadata), RFC 6266 encoded, with an ASCII fallback.
    assert "filename*=UTF-8''%C3%A9t%C3%A9%202024.png" in r.headers["content-disposition"]
    assert 'filename="_t_ 2024.png"' in r.headers["content-disposition"]
    # No file name: the external id (a content hash here), with the extension of its type.
    r = client.get(f"/v1/collections/{collection}/items/{text.json()['items'][0]['id']}/content")
    fallback = r.headers["content-disposition"].split('filename="')[1].split('"')[0]
    assert fallback.startswith("sha256_") and fallback.endswith(".txt") and ":" not in fallback


def test_paging_links_ignore_the_host_header_and_end_on_a_full_last_page(
    client: httpx.Client, collection_name: str
) -> None:
    assert client.post("/v1/collections", json={"name": collection_name, "dimensions": 3}).status_code == 201
    base = f"/v1/collections/{collection_name}/items"
    items = [{"vector": [1, i + 1, 0], "external_id": f"v{i}"} for i in range(4)]
    assert client.post(base, json={"items": items}).status_code == 201
    first = client.get(base, params={"limit": 2}, headers={"Host": "evil.example"}).json()
    assert first["next"].startswith(f"{base}?") and "evil" not in first["next"]
    second = client.get(first["next"]).json()
    assert len(second["items"]) == 2
    assert second["next"] is None, "a last page that is exactly full must not link to an empty one"


def test_health_tells_strangers_liveness_only(server: LiveServer, client: httpx.Client) -> None:
    public = httpx.get(f"{server.url}/health").json()
    assert set(public) == {"status", "reasons"}
    detailed = client.get("/health").json()
    assert {"database", "encoder", "workers", "queue"} <= set(detailed)


def test_a_query_image_is_charged_by_pixels(client: httpx.Client, collection: str, server: LiveServer) -> None:
    """A tiny 1-bit PNG with more pixels than a search may decode is refused on its header."""
    budget = server.runtime.api.max_query_image_pixels
    side = int(budget**0.5) + 16
    buf = io.BytesIO()
    Image.new("1", (side, side)).save(buf, format="PNG", optimize=True)
    assert len(buf.getvalue()) < 200_000  # cheap to send
    r = client.post(f"/v1/collections/{collection}/search", json={"image": base64.b64encode(buf.getvalue()).decode()})
    assert r.status_code == 413, r.text
    assert "pixels" in r.json()["detail"]


def test_concurrent_posts_of_one_external_id_never_deadlock_into_unreachable(
    client: httpx.Client, collection: str, server: LiveServer, admin_key: str
) -> None:
    def post(i: int) -> httpx.Response:
        with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {admin_key}"}, timeout=60) as c:
            return c.post(
                f"/v1/collections/{collection}/items",
                json={"items": [{"external_id": "same", "text": f"version {i % 3}"}]},
            )

    with ThreadPoolExecutor(20) as pool:
        answers = list(pool.map(post, range(40)))
    for r in answers:
        assert r.status_code in (201, 202, 409), r.text
        if r.status_code == 409:
            assert "retry" in r.json()["detail"]
    assert all("unreachable" not in r.text for r in answers)
    assert sum(r.status_code in (201, 202) for r in answers) >= 1


def test_docs_load_no_third_party_script(server: LiveServer) -> None:
    page = httpx.get(f"{server.url}/docs")
    assert page.status_code == 200 and "swagger-ui-bundle.js" in page.text
    assert "https://" not in page.text and "http://" not in page.text, "the docs page must not load from a CDN"
    for asset in ("swagger-ui-bundle.js", "swagger-ui.css"):
        r = httpx.get(f"{server.url}/docs/assets/{asset}")
        assert r.status_code == 200 and len(r.content) > 10_000
    assert httpx.get(f"{server.url}/redoc").status_code == 404


def test_invalid_utf8_in_a_multipart_text_field_is_refused_not_read_as_latin1(
    client: httpx.Client, collection: str
) -> None:
    url = f"/v1/collections/{collection}/items"
    image = ("files", ("a.jpg", make_image(4), "image/jpeg"))
    r = client.post(url, files=[image, ("external_id", (None, b"caf\xe9-latin1"))])
    assert r.status_code == 422, r.text
    assert "external_id" in r.json()["detail"] and "utf-8" in r.json()["detail"]
    r = client.post(url, files=[image, ("metadata", (None, b'{"place": "caf\xe9"}'))])
    assert r.status_code == 422, r.text
    ok = client.post(url, files=[image, ("external_id", (None, "café-utf8".encode()))])
    assert ok.status_code == 202, ok.text
    assert ok.json()["items"][0]["external_id"] == "café-utf8"


def test_an_unknown_charset_is_refused_not_read_as_latin1(client: httpx.Client, collection: str) -> None:
    body = (
        b'--b\r\nContent-Disposition: form-data; name="external_id"\r\n\r\n\xff\xfebad\r\n'
        b'--b\r\nContent-Disposition: form-data; name="files"; filename="a.jpg"\r\n'
        b"Content-Type: image/jpeg\r\n\r\n" + make_image(5) + b"\r\n--b--\r\n"
    )
    r = client.post(
        f"/v1/collections/{collection}/items",
        content=body,
        headers={"content-type": "multipart/form-data; boundary=b; charset=bogus"},
    )
    assert r.status_code == 422, r.text
    assert "unknown charset" in r.json()["detail"]


def test_replacing_an_items_image_is_an_upload_not_a_small_json_body(fake_server: LiveServer, fake_client) -> None:
    """PUT .../items/{id}/content takes an image: the upload limit applies, not the small-JSON one."""
    json_limit = fake_server.runtime.api.max_json_body_bytes
    upload_limit = fake_server.runtime.api.max_body_bytes
    big = json_limit + 10_000
    assert big < upload_limit
    url = "/v1/collections/absent_collection/items/1/content"
    r = fake_client.put(url, files={"file": ("a.png", b"\x89PNG\r\n\x1a\n" + b"0" * big, "image/png")})
    assert r.status_code != 413, r.text  # past the size check (then: no such collection)
    r = fake_client.post("/v1/collections/absent_collection/items/lookup", content=b" " * big)
    assert r.status_code == 413


def test_the_key_is_checked_before_the_body_under_a_proxys_root_path(settings, admin_key) -> None:
    """Behind a proxy that mounts the API under a prefix (uvicorn --root-path), the gate still sees
    /v1 routes: no key and a broken body answer 401, not a parse error."""
    from fastapi.testclient import TestClient

    from memstore.api.runtime import RuntimeOptions
    from memstore.settings import ApiSettings
    from memstore.web import create_app

    app = create_app(settings, api_settings=ApiSettings(auth="keys"), options=RuntimeOptions(encoder="none"))
    with TestClient(app, root_path="/api") as c:
        r = c.post(
            "/api/v1/collections/x/items/lookup", content=b"{not json", headers={"content-type": "application/json"}
        )
        assert r.status_code == 401, r.text
        ok = c.get("/api/v1/collections", headers={"Authorization": f"Bearer {admin_key}"})
        assert ok.status_code == 200, ok.text


def test_a_key_sent_the_wrong_way_is_named_as_such(server: LiveServer, admin_key: str) -> None:
    for headers, words in (
        ({"Authorization": admin_key}, "no 'Bearer' scheme"),
        ({"X-API-Key": admin_key}, "X-API-Key is not read"),
        ({}, "no API key"),
    ):
        r = httpx.get(f"{server.url}/v1/collections", headers=headers)
        assert r.status_code == 401 and words in r.json()["detail"], r.text
