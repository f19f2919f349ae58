"""POST /v1/collections/{name}/load: NDJSON vectors loaded at index-build speed, answered once searchable;
bad input refused whole with its line number; keys and limits checked before the body is read."""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Iterator

import httpx
import numpy as np
import sqlalchemy as sa

from memstore.access import keys
from memstore.db.core import Database
from tests.api.test_errors import problem

NDJSON = {"content-type": "application/x-ndjson"}


def _lines(vectors: np.ndarray, start: int = 0) -> bytes:
    return b"".join(
        json.dumps({"external_id": f"v{start + i}", "vector": v.tolist(), "metadata": {"i": start + i}}).encode()
        + b"\n"
        for i, v in enumerate(vectors)
    )


def _count(client: httpx.Client, name: str) -> int:
    r = client.get(f"/v1/collections/{name}")
    assert r.status_code == 200, r.text
    return int(r.json()["items"])


def test_a_large_load_is_answered_once_every_vector_is_searchable(client: httpx.Client, collection_name: str) -> None:
    r = client.post("/v1/collections", json={"name": collection_name, "dimensions": 8})
    assert r.status_code == 201, r.text
    vectors = np.random.default_rng(20).normal(size=(10_000, 8)).astype(np.float32)

    def body() -> Iterator[bytes]:  # streamed, as a client sends a file, without Content-Length
        for start in range(0, len(vectors), 2_500):
            yield _lines(vectors[start : start + 2_500], start)

    r = client.post(f"/v1/collections/{collection_name}/load", content=body(), headers=NDJSON, timeout=300)
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["rows"] == answer["created"] == 10_000 and answer["deferred_index"] is True
    for i in (0, 4_321, 9_999):
        hits = client.post(
            f"/v1/collections/{collection_name}/search", json={"vector": vectors[i].tolist(), "k": 1}
        ).json()["results"]
        assert hits[0]["external_id"] == f"v{i}" and hits[0]["metadata"] == {"i": i}
    # The same file again changes nothing and says so.
    again = client.post(f"/v1/collections/{collection_name}/load", content=_lines(vectors[:50]), headers=NDJSON)
    assert again.status_code == 200 and again.json()["unchanged"] == 50 and not again.json()["deferred_index"]


def test_a_bad_line_refuses_the_whole_load_with_its_number(client: httpx.Client, collection_name: str) -> None:
    client.post("/v1/collections", json={"name": collection_name, "dimensions": 4})
    good = _lines(np.ones((3, 4), dtype=np.float32))
    cases = {
        b'{"external_id": "x", "vector": [1, 2, 3]}\n': "line 4",  # wrong dimension count
        b'{"external_id": "x", "vector": [1, 2, 3, "a"]}\n': "line 4",
        b'{"external_id": "x", "vector": [1, 2, 3, NaN]}\n': "line 4",
        b'{"vector": [1, 2, 3, 4]}\n': "external_id and vector",
        b'{"external_id": "x", "text": "only a text"}\n': "external_id and vector",
        b'{"external_id": "x", "vector": [1, 2, 3, 4], "extra": 1}\n': "unknown fields",
        b"not json\n": "line 4",
        b"[1, 2]\n": "line 4",
        b'{"external_id": "", "vector": [1, 2, 3, 4]}\n': "line 4",
        b'{"external_id": "x", "vector_b64": "AACAPw=="}\n': "line 4",  # one float32 of four
        b'{"external_id": "x", "vector_b64": "not base64!"}\n': "line 4: vector_b64 is not valid base64",
        b'{"external_id": "x", "vector_b64": [1, 2, 3, 4]}\n': "line 4: vector_b64 must be a string",
        b'{"external_id": "x", "vector": [1, 2, 3, 4], "vector_b64": "AACAPw=="}\n': "not both",
    }
    for bad, expected in cases.items():
        r = client.post(f"/v1/collections/{collection_name}/load", content=good + bad + good, headers=NDJSON)
        body = problem(r, 422, "invalid-input") if r.status_code == 422 else problem(r, 400, "invalid-input")
        assert expected in body["detail"], (bad, body)
    assert _count(client, collection_name) == 0  # nothing half loaded
    empty = client.post(f"/v1/collections/{collection_name}/load", content=b"\n\n", headers=NDJSON)
    assert empty.status_code == 400, empty.text


def test_a_line_may_give_its_vector_as_base64_float32s(client: httpx.Client, collection_name: str) -> None:
    """As the API's bodies take it (``vector_b64``, little-endian): the same rows as the numbers give."""
    client.post("/v1/collections", json={"name": collection_name, "dimensions": 4})
    vectors = np.random.default_rng(21).normal(size=(3, 4)).astype(np.float32)
    lines = b"".join(
        json.dumps(
            {"external_id": f"b{i}", "vector_b64": base64.b64encode(v.astype("<f4").tobytes()).decode()}
        ).encode()
        + b"\n"
        for i, v in enumerate(vectors)
    )
    r = client.post(f"/v1/collections/{collection_name}/load", content=lines, headers=NDJSON)
    assert r.status_code == 200 and r.json()["created"] == 3, r.text
    hits = client.post(f"/v1/collections/{collection_name}/search", json={"vector": vectors[1].tolist(), "k": 1})
    assert hits.json()["results"][0]["external_id"] == "b1"
    # The same rows as numbers change nothing: the values are exactly the float32s sent.
    again = client.post(f"/v1/collections/{collection_name}/load", content=_lines_named(vectors, "b"), headers=NDJSON)
    assert again.status_code == 200 and again.json()["unchanged"] == 3, again.text


def _lines_named(vectors: np.ndarray, prefix: str) -> bytes:
    return b"".join(
        json.dumps({"external_id": f"{prefix}{i}", "vector": v.tolist()}).encode() + b"\n"
        for i, v in enumerate(vectors)
    )


def test_keys_media_types_and_missing_collections(
    client: httpx.Client, server: object, engine: sa.Engine, collection_name: str
) -> None:
    client.post("/v1/collections", json={"name": collection_name, "dimensions": 4})
    url = f"/v1/collections/{collection_name}/load"
    line = b'{"external_id": "a", "vector": [1, 0, 0, 0]}\n'
    base = str(client.base_url)
    assert httpx.post(base + url, content=line, headers=NDJSON).status_code == 401
    _, reader = keys.create_key(Database(engine), name=f"r-{uuid.uuid4().hex[:8]}", scopes=["read"])
    refused = httpx.post(base + url, content=line, headers={**NDJSON, "Authorization": f"Bearer {reader}"})
    problem(refused, 403, "forbidden")
    _, other = keys.create_key(Database(engine), name=f"o-{uuid.uuid4().hex[:8]}", scopes=[f"write:{collection_name}x"])
    refused = httpx.post(base + url, content=line, headers={**NDJSON, "Authorization": f"Bearer {other}"})
    problem(refused, 403, "forbidden")
    problem(client.post(url, content=line, headers={"content-type": "application/json"}), 415, "unsupported-media-type")
    r = client.post(f"/v1/collections/{collection_name}_nope/load", content=line, headers=NDJSON)
    assert r.status_code == 404, r.text
    assert _count(client, collection_name) == 0


def test_a_load_over_its_body_limit_is_refused(fake_client: httpx.Client, fake_collection: str) -> None:
    url = f"/v1/collections/{fake_collection}/load"
    big = b'{"external_id": "a", "vector": [1, 0, 0, 0]}\n' * 8_000  # about 360 kB, over the fake's 256 kB
    body = problem(fake_client.post(url, content=big, headers=NDJSON), 413, "payload-too-large")
    assert "MEMSTORE_API_MAX_LOAD_BODY_BYTES" in body["detail"]

    def chunks() -> Iterator[bytes]:  # no Content-Length: cut off while reading
        for _ in range(40):
            yield b" " * 10_000

    problem(fake_client.post(url, content=chunks(), headers=NDJSON), 413, "payload-too-large")
