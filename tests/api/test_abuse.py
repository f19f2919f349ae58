"""Hostile input over HTTP: injection-shaped names, deep filters, thousands of parts, big bodies.

Every one is refused with a clear 4xx problem, and the service keeps answering a well-behaved client
while the abuse goes on.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx

HOSTILE_NAMES = [
    'x"; DROP TABLE memstore_collections; --',
    "robert'); DELETE FROM memstore_api_keys;--",
    "ÄÖÜ_ünïcödé",
    "名前",
    "a" * 49,
    "a" * 5000,
    "..%2F..%2Fetc",
    "UPPER",
    "with space",
]


CUT_OFF = -1

# Valid names that are SQL keywords: accepted, and they work (identifiers are always quoted).
KEYWORD_NAMES = ["select", "table", "drop", "user", "order"]


def _nested(depth: int) -> dict[str, Any]:
    node: dict[str, Any] = {"leaf": 1}
    for _ in range(depth):
        node = {"x": node}
    return node


def test_hostile_collection_names_are_refused_without_side_effects(fake_client: httpx.Client) -> None:
    before = fake_client.get("/v1/collections").json()
    for name in HOSTILE_NAMES:
        r = fake_client.post("/v1/collections", json={"name": name, "dimensions": 4})
        assert 400 <= r.status_code < 500, (name, r.status_code, r.text)
        assert r.headers["content-type"] == "application/problem+json"
        r = fake_client.post(f"/v1/collections/{httpx.URL(name).path}/search", json={"vector": [1, 0, 0, 0]})
        assert 400 <= r.status_code < 500, (name, r.status_code)
    assert fake_client.get("/v1/collections").json() == before


def test_sql_keyword_names_work(fake_client: httpx.Client) -> None:
    for name in KEYWORD_NAMES:
        r = fake_client.post("/v1/collections", json={"name": name, "dimensions": 4})
        assert r.status_code in (201, 409), r.text
        r = fake_client.post(
            f"/v1/collections/{name}/items", json={"items": [{"external_id": "a", "vector": [1, 0, 0, 0]}]}
        )
        assert r.status_code in (200, 201, 202), r.text
        r = fake_client.post(f"/v1/collections/{name}/search", json={"vector": [1, 0, 0, 0], "k": 1})
        assert r.status_code == 200 and r.json()["results"][0]["external_id"] == "a", r.text
        assert fake_client.delete(f"/v1/collections/{name}").status_code == 204


def test_deeply_nested_filters_are_refused(fake_client: httpx.Client, fake_collection: str) -> None:
    dims = fake_client.get(f"/v1/collections/{fake_collection}").json()["dimensions"]
    for depth in (20, 500):
        r = fake_client.post(
            f"/v1/collections/{fake_collection}/search", json={"vector": [1.0] * dims, "filter": _nested(depth)}
        )
        assert 400 <= r.status_code < 500, (depth, r.status_code, r.text[:200])


def test_thousands_of_multipart_parts_are_refused(fake_client: httpx.Client, fake_collection: str) -> None:
    files = [("files", (f"f{i}.png", b"x", "image/png")) for i in range(3000)]
    r = fake_client.post(f"/v1/collections/{fake_collection}/items", files=files)
    assert 400 <= r.status_code < 500, (r.status_code, r.text[:200])


def test_the_service_keeps_answering_while_under_abuse(fake_client: httpx.Client, fake_collection: str) -> None:
    dims = fake_client.get(f"/v1/collections/{fake_collection}").json()["dimensions"]
    headers = dict(fake_client.headers)
    base = str(fake_client.base_url)
    stop = threading.Event()
    abusive: list[int] = []

    def abuse() -> None:
        with httpx.Client(base_url=base, headers=headers, timeout=60) as c:
            while not stop.is_set():
                big = {"items": [{"vector": [1.0] * dims}] * 5_000}
                for path, body in (
                    ("items", big),
                    ("search", {"vector": [1.0] * dims, "filter": _nested(300)}),
                ):
                    try:
                        abusive.append(c.post(f"/v1/collections/{fake_collection}/{path}", json=body).status_code)
                    except httpx.HTTPError:
                        # The server may cut an oversized upload off mid-body: a refusal too.
                        abusive.append(CUT_OFF)

    threads = [threading.Thread(target=abuse) for _ in range(2)]
    for t in threads:
        t.start()
    good: list[httpx.Response] = []
    try:
        deadline = time.monotonic() + 120
        while (len(good) < 20 or len(abusive) < 4) and time.monotonic() < deadline:
            good.append(
                fake_client.post(f"/v1/collections/{fake_collection}/search", json={"vector": [1.0] * dims, "k": 3})
            )
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=120)
    assert len(abusive) >= 4, abusive
    assert all(400 <= s < 500 or s == CUT_OFF for s in abusive), sorted(set(abusive))
    assert all(r.status_code == 200 for r in good), [r.status_code for r in good]
