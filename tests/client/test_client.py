"""memstore_client.Client and AsyncClient against a real server: every route family, typed answers,
problem documents as exceptions, retries and read-your-writes positions."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from memstore_client import (
    APIError,
    AsyncClient,
    AuthenticationError,
    Client,
    ConflictError,
    ConnectionFailedError,
    InvalidInputError,
    ItemIn,
    NotFoundError,
    RateLimitedError,
    RetryEvent,
    RetryPolicy,
    SearchResult,
    ServiceUnavailableError,
    _core,
)

from tests.api.api_helpers import make_image
from tests.client.conftest import Served


@pytest.fixture
def ms(served: Served) -> Any:
    with Client(served.url, api_key=served.key) as c:
        yield c


def _vec(i: int) -> list[float]:
    return [1.0, float(i), float(i % 3) + 0.5]


def _fill(ms: Client, name: str, n: int = 12) -> None:
    ms.create_collection(name, dimensions=3, text_fields=["title"])
    items = [
        ItemIn(
            external_id=f"e{i}",
            vector=_vec(i),
            text=f"note number {i} about {'cats' if i % 2 else 'dogs'}",
            metadata={"i": i, "kind": "odd" if i % 2 else "even", "title": f"T-{i}"},
        )
        for i in range(n)
    ]
    ack = ms.add_items(name, items)
    assert [a.external_id for a in ack.items] == [f"e{i}" for i in range(n)]
    assert {a.status for a in ack.items} == {"ready"} and {a.change for a in ack.items} == {"created"}


def test_collections_round_trip(ms: Client, name: str) -> None:
    made = ms.create_collection(name, dimensions=3, metric="cosine", language="english", text_fields=["sku"])
    assert (made.name, made.dimensions, made.metric, made.language, made.text_fields) == (
        name, 3, "cosine", "english", ["sku"],
    )  # fmt: skip
    assert name in [c.name for c in ms.list_collections()]
    with pytest.raises(ConflictError) as conflict:
        ms.create_collection(name, dimensions=3)
    assert conflict.value.status == 409 and conflict.value.type == "conflict" and name in conflict.value.detail
    assert ms.get_or_create_collection(name, dimensions=3).name == name
    changed = ms.update_collection(name, language="simple", text_fields=["sku", "title"], ocr=True)
    assert (changed.language, changed.text_fields, changed.ocr) == ("simple", ["sku", "title"], True)
    got = ms.get_collection(name)
    assert got.items == 0 and got.pending == 0 and got.ocr
    index = ms.create_index(name, "price", "number")
    assert [i.name for i in ms.list_indexes(name)] == [index.name]
    ms.drop_index(name, index.name)
    assert ms.list_indexes(name) == []
    # a nested field by its dotted path or its keys; a key that holds a dot as a list of one key
    nested = ms.create_index(name, "image.taken_at", "timestamp")
    dotted_key = ms.create_index(name, ["price.usd"], "number")
    assert (nested.field, dotted_key.field) == (["image", "taken_at"], ["price.usd"])
    assert sorted(map(str, (i.field for i in ms.list_indexes(name)))) == ["['image', 'taken_at']", "['price.usd']"]
    for made in (nested, dotted_key):
        ms.drop_index(name, made.name)
    assert [s.name for s in ms.list_spaces(name)] == ["default"]
    assert ms.get_space(name, "default").active
    ms.delete_collection(name)
    with pytest.raises(NotFoundError) as missing:
        ms.get_collection(name)
    assert missing.value.type_uri == "/problems/not-found" and missing.value.status == 404


def test_a_segmented_collection_is_streamed_into_and_sealed(ms: Client, name: str) -> None:
    made = ms.create_collection(name, dimensions=3, write_path="segments")
    assert made.write_path == "segments"
    ms.add_vectors(name, [[1, 0, 0], [0, 1, 0]], ids=["a", "b"])
    assert ms.get_collection(name).segments == {"graphs": [], "tail_rows": 2}
    (done,) = ms.seal(name)
    assert done["action"] == "seal" and done["rows"] == 2
    ms.add_vectors(name, [[0, 0, 1]], ids=["c"])
    assert [d["action"] for d in ms.seal(name, merge=True)] == ["seal", "merge"]
    got = ms.get_collection(name)
    assert len(got.segments["graphs"]) == 1 and got.segments["tail_rows"] == 0
    assert ms.search(name, vector=[0, 0, 1], k=1).results[0].external_id == "c"
    assert ms.seal(name) == []


def test_items_search_modes_filters_and_paging(ms: Client, name: str) -> None:
    _fill(ms, name)
    hits = ms.search(name, vector=_vec(4), k=3)
    assert isinstance(hits, SearchResult) and hits.results[0].external_id == "e4"
    assert hits.results[0].metadata == {"i": 4, "kind": "even", "title": "T-4"}
    assert hits.results[0].score == pytest.approx(1.0) and hits.results[0].ranks.vector == 1
    page2 = ms.search(name, vector=_vec(4), k=3, offset=3, exact=True)
    first = ms.search(name, vector=_vec(4), k=6, exact=True)
    assert [h.id for h in page2.results] == [h.id for h in first.results[3:]]
    odd = ms.search(name, vector=_vec(4), k=20, filter={"kind": "odd", "i": {"$gte": 5}})
    assert sorted(h.metadata["i"] for h in odd.results) == [5, 7, 9, 11]
    words = ms.search(name, text="cats", mode="keyword", k=20)
    assert len(words.results) == 6 and all(h.distance is None for h in words.results)
    field = ms.search(name, text="T-7", mode="keyword", k=1)
    assert field.results[0].external_id == "e7"
    hybrid = ms.search(name, text="dogs", vector=_vec(3), mode="hybrid", k=4)
    assert hybrid.results[0].ranks.vector is not None and len(hybrid.results) == 4
    grouped = ms.search(name, vector=_vec(1), k=2, group_by="kind", group_size=2)
    assert grouped.groups is not None and {g.value for g in grouped.groups} == {"odd", "even"}
    assert all(len(g.hits) == 2 for g in grouped.groups)
    with_vectors = ms.search(name, vector=_vec(2), k=1, with_vector=True)
    assert with_vectors.results[0].vector is not None and len(with_vectors.results[0].vector) == 3
    by_item = ms.search(name, item_id=hits.results[0].id, k=1)
    assert by_item.results[0].external_id == "e4"
    batch = ms.search_batch(name, [{"vector": _vec(1), "k": 1}, {"text": "T-2", "mode": "keyword", "k": 1}])
    assert [b[0].external_id for b in batch] == ["e1", "e2"]
    liked = ms.recommend(name, [hits.results[0].id, {"vector": _vec(5)}], [{"vector": _vec(0)}], k=3)
    assert "e4" not in [h.external_id for h in liked.results] and len(liked.results) == 3


def test_items_crud_lookup_paging_and_download(ms: Client, name: str) -> None:
    _fill(ms, name, n=7)
    found = ms.lookup(name, ["e1", "e3", "nope"])
    assert set(found) == {"e1", "e3"}
    walked = list(ms.iter_items(name, page_size=3))
    assert [i.external_id for i in walked] == [f"e{i}" for i in range(7)]
    page = ms.list_items(name, limit=2)
    assert len(page.items) == 2 and page.next
    item = ms.get_item(name, found["e3"], with_vector=True)
    assert item.text == "note number 3 about cats" and item.vector is not None and item.status == "ready"
    assert ms.get_item_by_external_id(name, "e3") is not None and ms.get_item_by_external_id(name, "zz") is None
    merged = ms.update_item(name, item.id, metadata={"extra": True}, merge=True)
    assert merged.metadata == {"i": 3, "kind": "odd", "title": "T-3", "extra": True}
    replaced = ms.update_item(name, item.id, metadata={"only": 1})
    assert replaced.metadata == {"only": 1}
    ms.update_item(name, item.id, vector=[0.0, 0.0, 9.0])
    assert ms.search(name, vector=[0.0, 0.0, 9.0], k=1).results[0].id == item.id
    text = ms.download(name, item.id)
    assert text.text == "note number 3 about cats" and text.content_type.startswith("text/plain")
    bare = ms.add_vectors(name, [[0.3, 0.2, 0.1]], ids=["bare"])
    with pytest.raises(NotFoundError, match="vector only"):
        ms.download(name, bare.items[0].id)
    ms.delete_item(name, found["e1"])
    assert ms.delete_items(name, external_ids=["e2", "missing"]) == 1
    assert ms.delete_items(name, filter={"kind": "even"}) == 3  # e0, e4, e6
    assert sorted(ms.lookup(name, [f"e{i}" for i in range(7)])) == ["e3", "e5"]
    unchanged = ms.add_vectors(name, [_vec(5)], ids=["e5"], metadatas=[{"i": 5, "kind": "odd", "title": "T-5"}],
                               texts=["note number 5 about cats"])  # fmt: skip
    assert unchanged.items[0].change == "unchanged"


def test_bulk_helpers_report_progress_and_load(ms: Client, name: str, tmp_path: Path) -> None:
    ms.create_collection(name, dimensions=3)
    seen: list[int] = []
    acks = ms.add_many(name, ({"external_id": f"b{i}", "vector": _vec(i)} for i in range(25)), batch_size=10,
                       progress=seen.append)  # fmt: skip
    assert len(acks) == 25 and seen == [10, 10, 5]
    acks = ms.add_many(name, [{"external_id": f"b{i}", "vector": _vec(i)} for i in range(3)], progress=True)
    assert {a.change for a in acks} == {"unchanged"}
    ndjson = tmp_path / "v.ndjson"
    ndjson.write_text("".join(json.dumps({"external_id": f"l{i}", "vector": _vec(i)}) + "\n" for i in range(30)))
    loaded = ms.load(name, ndjson)
    assert (loaded.rows, loaded.created) == (30, 30)
    again = ms.load(name, [{"external_id": f"l{i}", "vector": _vec(i)} for i in range(30)])
    assert again.unchanged == 30
    assert ms.get_collection(name).items == 55
    pairs = list(ms.iter_duplicates(name, 0.0001, scan=7))
    assert {(p.a.external_id[1:], p.b.external_id[1:]) for p in pairs} >= {("0", "0"), ("5", "5")}
    page = ms.duplicates(name, 0.0001, scan=1000)
    assert page.next is None


def test_problems_are_raised_with_their_type_status_and_detail(ms: Client, served: Served, name: str) -> None:
    ms.create_collection(name, dimensions=3)
    with pytest.raises(InvalidInputError) as bad:
        ms.add_vectors(name, [[1.0, 2.0]])
    assert bad.value.status == 422 and bad.value.type == "invalid-input"
    assert "expected 3 dimensions" in bad.value.detail and bad.value.problem["title"] == "Invalid input"
    with pytest.raises(InvalidInputError, match=r"filter\.\$or"):
        ms.search(name, vector=[1, 2, 3], filter={"$or": "nope"})
    with Client(served.url) as anonymous, pytest.raises(AuthenticationError) as refused:
        anonymous.list_collections()
    assert refused.value.status == 401 and "Authorization: Bearer" in refused.value.detail
    with pytest.raises(APIError) as other:
        ms.search("no_such_collection_here", vector=[1, 2, 3])
    assert isinstance(other.value, NotFoundError)
    health = ms.health()
    assert health.status == "ok" and "database" in (health.model_extra or {})


def test_read_your_writes_positions_are_kept_and_sent(served: Served, name: str) -> None:
    sent: list[httpx.Request] = []

    def spy(request: httpx.Request) -> None:
        sent.append(request)

    with Client(served.url, api_key=served.key, read_your_writes=True) as ms:
        ms.http.event_hooks["request"] = [spy]
        ms.create_collection(name, dimensions=3)
        first = ms.last_lsn
        ack = ms.add_vectors(name, [_vec(1)], ids=["x"])
        assert first and ack.lsn and ms.last_lsn == ack.lsn
        ms.search(name, vector=_vec(1), k=1)
        assert sent[-1].headers["X-Memstore-Min-LSN"] == ack.lsn
        ms.get_collection(name)
        assert sent[-1].headers["X-Memstore-Min-LSN"] == ack.lsn
        ms.add_vectors(name, [_vec(2)], ids=["y"])
        assert "X-Memstore-Min-LSN" not in sent[-1].headers  # writes carry none
    with Client(served.url, api_key=served.key) as plain:
        plain.http.event_hooks["request"] = [spy]
        plain.search(name, vector=_vec(1), k=1)
        assert "X-Memstore-Min-LSN" not in sent[-1].headers
        plain.search(name, vector=_vec(1), k=1, min_lsn=ack.lsn)
        assert sent[-1].headers["X-Memstore-Min-LSN"] == ack.lsn
        with pytest.raises(InvalidInputError):
            plain.search(name, vector=_vec(1), k=1, min_lsn="FFFF/0")  # ahead of the server's WAL


def _mocked(answers: list[httpx.Response | Exception], **options: Any) -> tuple[Client, list[httpx.Request]]:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        answer = answers.pop(0) if len(answers) > 1 else answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer

    return Client("http://memstore.test", api_key="k", transport=httpx.MockTransport(handler), **options), seen


def _problem(status: int, slug: str, retry_after: str | None = None) -> httpx.Response:
    headers = {"Content-Type": "application/problem+json"} | ({"Retry-After": retry_after} if retry_after else {})
    body = {"type": f"/problems/{slug}", "title": slug, "status": status, "detail": f"{slug} now"}
    return httpx.Response(status, headers=headers, json=body)


def test_busy_answers_are_retried_after_retry_after(monkeypatch: pytest.MonkeyPatch) -> None:
    pauses: list[float] = []
    monkeypatch.setattr("tenacity.nap.time.sleep", pauses.append)
    events: list[RetryEvent] = []
    ok = httpx.Response(200, json={"collections": []})
    client, seen = _mocked([_problem(429, "too-many-requests", "2"), _problem(503, "service-unavailable", "1"), ok],
                           on_retry=events.append)  # fmt: skip
    assert client.list_collections() == [] and len(seen) == 3
    assert pauses == [2.0, 1.0] and [(e.attempt, e.attempts) for e in events] == [(2, 5), (3, 5)]
    assert isinstance(events[0].error, RateLimitedError) and seen[0].headers["Authorization"] == "Bearer k"
    pauses.clear()
    client, seen = _mocked([_problem(503, "service-unavailable")], retry=RetryPolicy(attempts=4, backoff_s=0.25))
    with pytest.raises(ServiceUnavailableError) as gave_up:
        client.list_collections()
    assert len(seen) == 4 and pauses == [0.25, 0.5, 1.0] and gave_up.value.detail == "service-unavailable now"
    client, seen = _mocked([_problem(404, "not-found")])
    with pytest.raises(NotFoundError):
        client.get_collection("x")
    assert len(seen) == 1  # not retried
    client, seen = _mocked([_problem(429, "too-many-requests", "0")], retry=None)
    with pytest.raises(RateLimitedError):
        client.list_collections()
    assert len(seen) == 1
    client, seen = _mocked([_problem(503, "service-unavailable", "0")], retry=3)
    answer = client.request("GET", "/v1/collections", raise_for_status=False)
    assert answer.status_code == 503 and len(seen) == 3


def test_connection_failures_are_retried_only_when_safe(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("tenacity.nap.time.sleep", lambda _s: None)
    client, seen = _mocked([httpx.ConnectError("refused")])
    with pytest.raises(ConnectionFailedError, match=r"cannot reach http://memstore\.test"):
        client.list_collections()
    assert len(seen) == 5
    # A read timeout after an add without external ids: the server may have stored them; not sent again.
    client, seen = _mocked([httpx.ReadTimeout("slow")])
    with pytest.raises(ConnectionFailedError):
        client.add_vectors("c", [[1.0, 2.0]])
    assert len(seen) == 1
    client, seen = _mocked([httpx.ReadTimeout("slow")])
    with pytest.raises(ConnectionFailedError):
        client.add_vectors("c", [[1.0, 2.0]], ids=["a"])  # keyed: sending it again is harmless
    assert len(seen) == 5


def test_a_problem_that_is_not_json_still_raises_by_status() -> None:
    client, _ = _mocked([httpx.Response(502, text="<html>bad gateway</html>")])
    with pytest.raises(APIError) as error:
        client.list_collections()
    assert error.value.status == 502 and "bad gateway" in error.value.detail


def test_texts_images_ocr_and_downloads_through_the_model(server: Any, admin_key: str, name: str) -> None:
    """The server's encoder (the tiny model): texts and images embedded, waited for, searched."""
    with Client(server.url, api_key=admin_key) as ms:
        made = ms.create_collection(name, ocr=True)
        assert made.dimensions == 64 and made.ocr
        texts = ms.add_texts(name, ["a red bicycle", "a blue kettle"], ids=["t1", "t2"],
                             metadatas=[{"k": 1}, {"k": 2}], wait=True)  # fmt: skip
        assert [a.status for a in texts.items] == ["ready", "ready"]
        images = ms.upload(name, [make_image(1), ("two.png", make_image(2, fmt="PNG"))], external_ids=["i1", "i2"],
                           metadata=[{"k": 3}, {"k": 4}], wait=True)  # fmt: skip
        assert [a.status for a in images.items] == ["ready", "ready"]
        acks = ms.upload_many(name, [make_image(3), make_image(4), make_image(5)], batch_size=2,
                              metadata=[{"n": i} for i in range(3)])  # fmt: skip
        assert len(acks) == 3
        ms.wait_until_embedded(name, timeout=60)
        by_text = ms.search(name, text="a red bicycle", k=1, mode="vector")
        assert by_text.results[0].external_id == "t1"
        by_image = ms.search(name, image=make_image(2, fmt="PNG"), k=1)
        assert by_image.results[0].external_id == "i2"
        assert {"k": 4, "filename": "two.png"}.items() <= by_image.results[0].metadata.items()
        hybrid = ms.search(name, text="kettle", k=2)
        assert hybrid.results[0].external_id == "t2" and hybrid.results[0].ranks.keyword == 1
        liked = ms.recommend(name, [{"text": "a red bicycle"}], k=1)
        assert liked.results[0].external_id == "t1"
        original = ms.download(name, images.items[1].id)
        assert original.content == make_image(2, fmt="PNG") and original.content_type == "image/png"
        assert original.filename == "two.png"
        item = ms.get_item(name, images.items[0].id)
        assert item.ocr is not None and item.ocr.status in ("pending", "done", "failed")
        again = ms.replace_content(name, texts.items[0].id, text="a green bicycle", wait=True)
        assert again.items[0].change == "updated"
        assert ms.get_item(name, texts.items[0].id).text == "a green bicycle"
        ms.replace_content(name, images.items[0].id, file=make_image(9), wait=True)
        assert ms.download(name, images.items[0].id).content == make_image(9)


def test_the_async_client_mirrors_the_sync_one(served: Served, name: str) -> None:
    async def scenario() -> None:
        async with AsyncClient(served.url, api_key=served.key, read_your_writes=True) as ms:
            await ms.create_collection(name, dimensions=3)
            ack = await ms.add_items(name, [{"external_id": f"a{i}", "vector": _vec(i), "text": f"t{i}"}
                                            for i in range(5)])  # fmt: skip
            assert ack.lsn and ms.last_lsn == ack.lsn
            hits = await ms.search(name, vector=_vec(3), k=2, filter={"$not": {"x": 1}})
            assert hits.results[0].external_id == "a3"
            found = await asyncio.gather(*(ms.get_item(name, h.id) for h in hits.results))
            assert [f.external_id for f in found] == [h.external_id for h in hits.results]
            words = await ms.search(name, text="t2", mode="keyword")
            assert [h.external_id for h in words.results] == ["a2"]
            walked = [i.external_id async for i in ms.iter_items(name, page_size=2)]
            assert walked == [f"a{i}" for i in range(5)]
            seen: list[int] = []
            more = await ms.add_many(name, [{"external_id": f"m{i}", "vector": _vec(i)} for i in range(7)],
                                     batch_size=3, progress=seen.append)  # fmt: skip
            assert len(more) == 7 and seen == [3, 3, 1]
            pairs = [p async for p in ms.iter_duplicates(name, 0.0001, scan=4)]
            assert len(pairs) == 5  # a_i and m_i share a vector
            loaded = await ms.load(name, [{"external_id": f"l{i}", "vector": _vec(i)} for i in range(4)])
            assert loaded.created == 4
            assert await ms.delete_items(name, external_ids=["a0", "nope"]) == 1
            with pytest.raises(NotFoundError):
                await ms.get_collection("c_missing")
            assert (await ms.health()).status == "ok"
            await ms.delete_collection(name)

    asyncio.run(scenario())


def test_a_vector_json_cannot_carry_is_refused_before_sending_with_its_place(ms: Client, name: str) -> None:
    """NaN and infinities have no JSON number: the client says which value, instead of the JSON
    encoder's "Out of range float values", and sends nothing."""
    ms.create_collection(name, dimensions=4)
    nan, inf = float("nan"), float("inf")
    with pytest.raises(ValueError, match=r"^vector\[1\] is nan: a vector's values must be finite numbers"):
        ms.search(name, vector=[1.0, nan, 0.0, 0.0])
    with pytest.raises(ValueError, match=r"^vectors\[1\]\[2\] is inf"):
        ms.add_vectors(name, vectors=[[1.0, 0.0, 0.0, 0.0], [0.0, 1.0, inf, 0.0]], ids=["a", "b"])
    with pytest.raises(ValueError, match=r"^vector\[0\] is -inf"):
        ms.add_items(name, [{"external_id": "c", "vector": [-inf, 0.0, 0.0, 1.0]}])
    assert ms.get_collection(name).items == 0


def test_deletes_by_ids_are_retried_after_a_broken_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    """Deleting named items twice deletes nothing more; deleting by a filter may (items written meanwhile)."""
    monkeypatch.setattr("tenacity.nap.time.sleep", lambda _s: None)
    for by in ({"external_ids": ["a", "b"]}, {"ids": [1, 2]}):
        client, seen = _mocked([httpx.ReadTimeout("slow")])
        with pytest.raises(ConnectionFailedError):
            client.delete_items("c", **by)
        assert len(seen) == 5, by
    client, seen = _mocked([httpx.ReadTimeout("slow")])
    with pytest.raises(ConnectionFailedError):
        client.delete_items("c", filter={"tag": "old"})
    assert len(seen) == 1


def _listing(request: httpx.Request) -> httpx.Response:
    """Two pages of items as a server behind a proxy at /api answers them: its ``next`` holds /api."""
    after = int(request.url.params.get("after", "0"))
    last = min(after + 2, 4)
    items = [{"id": i, "external_id": f"e{i}", "status": "ready"} for i in range(after + 1, last + 1)]
    page: dict[str, Any] = {"items": items, "next": None, "next_after": None}
    if last < 4:
        page |= {"next": f"/api/v1/collections/c/items?limit=2&after={last}", "next_after": last}
    return httpx.Response(200, json=page)


def test_iter_items_pages_on_the_clients_own_path_behind_a_proxy() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return _listing(request)

    with Client("http://proxy/api", transport=httpx.MockTransport(handler)) as client:
        assert [i.external_id for i in client.iter_items("c", page_size=2, status="ready")] == ["e1", "e2", "e3", "e4"]
    assert [r.url.path for r in seen] == ["/api/v1/collections/c/items"] * 2
    assert seen[1].url.params["after"] == "2" and seen[1].url.params["status"] == "ready"

    async def walk() -> list[str]:
        async with AsyncClient("http://proxy/api", transport=httpx.MockTransport(handler)) as client:
            return [i.external_id async for i in client.iter_items("c", page_size=2)]

    seen.clear()
    assert asyncio.run(walk()) == ["e1", "e2", "e3", "e4"]
    assert [r.url.path for r in seen] == ["/api/v1/collections/c/items"] * 2


def _acks(request: httpx.Request) -> httpx.Response:
    items = json.loads(request.content)["items"]
    acks = [{"id": i, "external_id": it["external_id"], "status": "ready", "change": "created"}
            for i, it in enumerate(items)]  # fmt: skip
    return httpx.Response(200, json={"items": acks})


def test_add_many_ends_a_batch_before_its_body_passes_the_byte_budget() -> None:
    """350 texts of 224k characters are 78 MB: under the 500-item batch size but over the server's
    64 MiB body limit (a 413 and nothing stored); the batches stay under 32 MiB each."""
    sizes: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sizes.append(len(request.content))
        return _acks(request)

    text = "word " * 44_800
    items = [{"external_id": f"t{i}", "text": text, "vector": [1.0, 0.0]} for i in range(350)]
    with Client("http://memstore.test", transport=httpx.MockTransport(handler)) as client:
        acks = client.add_many("c", items)
    assert [a.external_id for a in acks] == [f"t{i}" for i in range(350)]
    assert len(sizes) == 3 and max(sizes) <= _core.MAX_BATCH_BYTES, sizes

    async def send() -> int:
        async with AsyncClient("http://memstore.test", transport=httpx.MockTransport(handler)) as client:
            return len(await client.add_many("c", items))

    sizes.clear()
    assert asyncio.run(send()) == 350 and len(sizes) == 3 and max(sizes) <= _core.MAX_BATCH_BYTES
    # An item over the budget alone still goes, alone: the server answers for it.
    small = [{"external_id": "a", "text": "a"}, {"external_id": "big", "text": "b" * 2000}, {"external_id": "c"}]
    batches = list(_core.item_batches(small, 500, max_bytes=1000))
    assert [[b["external_id"] for b in batch] for batch in batches] == [["a"], ["big"], ["c"]]


def test_upload_many_takes_one_metadata_object_for_every_file() -> None:
    forms: list[bytes] = []

    def handler(request: httpx.Request) -> httpx.Response:
        forms.append(request.read())
        count = request.content.count(b'name="files"')
        return httpx.Response(200, json={"items": [{"id": i, "external_id": f"f{i}", "status": "pending",
                                                    "change": "created"} for i in range(count)]})  # fmt: skip

    files = [("a.png", b"1"), ("b.png", b"2"), ("c.png", b"3")]
    with Client("http://memstore.test", transport=httpx.MockTransport(handler)) as client:
        assert len(client.upload_many("c", files, metadata={"album": "x"}, batch_size=2)) == 3
        assert len(client.upload_many("c", files, metadata=[{"n": 1}, {"n": 2}, {"n": 3}], batch_size=2)) == 3
    assert len(forms) == 4
    assert all(b'{"album": "x"}' in form for form in forms[:2])
    assert b'[{"n": 1}, {"n": 2}]' in forms[2] and b'[{"n": 3}]' in forms[3]

    async def upload() -> int:
        async def ahandler(request: httpx.Request) -> httpx.Response:
            await request.aread()
            return handler(request)

        async with AsyncClient("http://memstore.test", transport=httpx.MockTransport(ahandler)) as client:
            return len(await client.upload_many("c", files, metadata={"album": "y"}, batch_size=2))

    forms.clear()
    assert asyncio.run(upload()) == 3 and all(b'{"album": "y"}' in form for form in forms)


def test_an_item_json_cannot_carry_is_refused_before_sending_with_its_place() -> None:
    import math
    import uuid
    from datetime import datetime

    import numpy as np

    client, seen = _mocked([httpx.Response(500)])
    refused: list[tuple[dict[str, Any], type[Exception], str]] = [
        ({"external_id": 7}, TypeError, r"^items\[1\]\.external_id is of type int: an external id is a string"),
        ({"external_id": uuid.uuid4()}, TypeError, r"^items\[1\]\.external_id is of type uuid\.UUID"),
        ({"metadata": {1: "a"}}, TypeError, r"^items\[1\]\.metadata has the key 1 of type int: keys must be strings"),
        ({"metadata": {"when": datetime(2024, 1, 1)}}, TypeError,
         r'^items\[1\]\.metadata\["when"\] is of type datetime\.datetime: .*\.isoformat\(\)'),
        ({"metadata": {"n": [1, np.int64(2)]}}, TypeError,
         r'^items\[1\]\.metadata\["n"\]\[1\] is of type numpy\.int64'),
        ({"metadata": {"x": math.nan}}, ValueError, r'^items\[1\]\.metadata\["x"\] is nan: JSON has no number'),
        ({"metadata": {"s": "a\udc80"}}, ValueError, r'^items\[1\]\.metadata\["s"\] holds a lone surrogate'),
        ({"text": "caf\ud800"}, ValueError, r"^items\[1\]\.text holds a lone surrogate \('\\ud800' at 3\)"),
        ({"metadata": ["a"]}, TypeError, r"^items\[1\]\.metadata is of type list: metadata is a dict"),
    ]  # fmt: skip
    for fields, error, message in refused:
        bad = {"external_id": "b", "vector": [1.0, 2.0], **fields}
        with pytest.raises(error, match=message):
            client.add_items("c", [{"external_id": "a", "vector": [1.0, 2.0]}, bad])
    with pytest.raises(TypeError, match=r'^items\[0\]\.metadata\["when"\] is of type datetime'):
        client.add_items("c", [ItemIn(external_id="a", vector=[1.0], metadata={"when": datetime(2024, 1, 1)})])
    assert seen == []
