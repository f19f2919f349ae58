"""Keys and scopes: 401 without a valid key, 403 outside its scopes, everything within them allowed."""

from __future__ import annotations

import time
import uuid

import httpx
import pytest

from memstore.access import keys
from memstore.db.core import Database
from tests.api.api_helpers import start_server


@pytest.fixture
def make_key(engine):
    def make(*scopes: str) -> str:
        return keys.create_key(Database(engine), name=f"k-{uuid.uuid4().hex[:8]}", scopes=list(scopes))[1]

    return make


def as_key(server, key: str | None) -> httpx.Client:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.Client(base_url=server.url, headers=headers, timeout=30)


def test_missing_or_unknown_keys_are_401(server, collection) -> None:
    for key in (None, "msk_not-a-real-key", "garbage"):
        with as_key(server, key) as c:
            r = c.get(f"/v1/collections/{collection}")
            assert r.status_code == 401 and r.headers["content-type"] == "application/problem+json"
            assert r.headers["www-authenticate"].startswith("Bearer")
    with httpx.Client(base_url=server.url, headers={"Authorization": "Basic dXNlcjpwdw=="}) as c:
        assert c.get("/v1/collections").status_code == 401
    with as_key(server, None) as c:  # operations routes need no key
        assert c.get("/health").status_code == 200
        assert c.get("/metrics").status_code == 200


def test_scope_matrix(server, collection, make_key, collection_name) -> None:
    other = collection_name + "_b"
    item = {"items": [{"external_id": "a", "vector": [0.5] * 64}]}
    search = {"vector": [0.5] * 64, "k": 1}
    # (scopes, {request: expected status})
    cases = [
        (("read:" + collection,), {"get": 200, "search": 200, "add": 403, "drop": 403, "other": 403, "create": 403}),
        (("write:" + collection,), {"get": 200, "search": 200, "add": 201, "drop": 403, "other": 403, "create": 403}),
        (("admin:" + other,), {"get": 403, "search": 403, "add": 403, "other": 404, "create": 201}),
        (("read",), {"get": 200, "search": 200, "add": 403, "drop": 403, "other": 200, "create": 403}),
    ]
    for scopes, expected in cases:
        with as_key(server, make_key(*scopes)) as c:
            calls = {
                "get": lambda c=c: c.get(f"/v1/collections/{collection}"),
                "search": lambda c=c: c.post(f"/v1/collections/{collection}/search", json=search),
                "add": lambda c=c: c.post(f"/v1/collections/{collection}/items", json=item),
                "drop": lambda c=c: c.delete(f"/v1/collections/{collection}"),
                "other": lambda c=c: c.get(f"/v1/collections/{other}"),
                "create": lambda c=c: c.post("/v1/collections", json={"name": other}),
            }
            for what, status in expected.items():
                r = calls[what]()
                assert r.status_code == status, (scopes, what, r.text)
                if status == 403:
                    assert "needs" in r.json()["detail"]
    with as_key(server, make_key("admin:" + other)) as c:
        assert c.delete(f"/v1/collections/{other}").status_code == 204


def test_listing_shows_only_readable_collections(server, collection, make_key) -> None:
    with as_key(server, make_key("read:" + collection)) as c:
        names = [x["name"] for x in c.get("/v1/collections").json()["collections"]]
    assert names == [collection]


def test_revoked_keys_stop_working(server, engine, collection) -> None:
    name = f"k-{uuid.uuid4().hex[:8]}"
    _, secret = keys.create_key(Database(engine), name=name, scopes=["read"])
    with as_key(server, secret) as c:
        assert c.get(f"/v1/collections/{collection}").status_code == 200
        keys.revoke_key(Database(engine), name_or_id=name)
        time.sleep(0.6)  # the test server trusts a verified key for 0.5 s
        assert c.get(f"/v1/collections/{collection}").status_code == 401


def test_keys_are_stored_hashed(engine, make_key) -> None:
    secret = make_key("read")
    with engine.connect() as conn:
        rows = conn.exec_driver_sql("SELECT prefix, key_hash FROM memstore_api_keys").fetchall()
    assert all(secret.encode() not in bytes(h) for _, h in rows)
    assert any(bytes(h) == keys.hash_key(secret) for _, h in rows)


def test_bad_scopes_are_refused(engine) -> None:
    from memstore.errors import InvalidInputError

    for scope in ("superuser", "read:Bad-Name", ""):
        with pytest.raises(InvalidInputError):
            keys.create_key(Database(engine), name="bad", scopes=[scope])


def test_auth_off_needs_no_key(settings, collection_name) -> None:
    with start_server(settings, backend=None, workers=0, auth="off") as live, httpx.Client(base_url=live.url) as c:
        r = c.post("/v1/collections", json={"name": collection_name, "dimensions": 4})
        assert r.status_code == 201
        assert c.get("/health").json()["auth"] == "off"
