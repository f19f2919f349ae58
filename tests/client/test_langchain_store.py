"""MemstoreVectorStore beyond the standard suite: memstore's filters, hybrid and keyword search,
maximal marginal relevance, scores, the retriever's search types, exact metadata, sync and async."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any, ClassVar

import httpx
import pytest
from langchain_core.documents import Document
from langchain_core.embeddings import DeterministicFakeEmbedding, Embeddings
from memstore_client import AsyncClient, Client, InvalidInputError, NotFoundError
from memstore_client.langchain import MemstoreRetriever, MemstoreVectorStore

from tests.client.conftest import Served

DOCS = [
    Document(
        id="pg", page_content="PostgreSQL stores the vectors with pgvector", metadata={"year": 2024, "tags": ["db"]}
    ),
    Document(
        id="hnsw",
        page_content="an HNSW graph finds near neighbours",
        metadata={"year": 2016, "nested": {"a": [1, 2.5, None]}},
    ),
    Document(
        id="rrf", page_content="reciprocal rank fusion merges two ranked lists", metadata={"year": 2009, "ok": True}
    ),
    Document(id="kettle", page_content="a stainless kettle boils water", metadata={"year": 2024, "tags": ["home"]}),
    Document(id="empty", page_content="", metadata={}),
]


@pytest.fixture
def store(served: Served) -> Iterator[MemstoreVectorStore]:
    s = MemstoreVectorStore(
        embedding=DeterministicFakeEmbedding(size=16),
        collection=f"lc_{uuid.uuid4().hex[:12]}",
        url=served.url,
        api_key=served.key,
    )
    try:
        yield s
    finally:
        s.delete_collection()
        s.close()


def test_documents_round_trip_and_memstore_searches(store: MemstoreVectorStore, served: Served) -> None:
    assert store.add_documents(DOCS) == [d.id for d in DOCS]
    with Client(served.url, api_key=served.key) as ms:
        made = ms.get_collection(store.collection)
        assert (made.dimensions, made.metric, made.items) == (16, "cosine", 5)
        item = ms.get_item_by_external_id(store.collection, "rrf")
        assert item is not None and item.text == DOCS[2].page_content and item.vector is None
    assert store.get_by_ids(["empty", "missing", "hnsw"]) == [DOCS[4], DOCS[1]]  # metadata as it was given
    found = store.similarity_search_with_score(DOCS[1].page_content, k=2)
    assert found[0][0] == DOCS[1] and found[0][1] == pytest.approx(1.0, abs=1e-5) and found[1][1] < 1.0
    recent = store.similarity_search(DOCS[1].page_content, k=5, filter={"year": {"$gte": 2020}})
    assert sorted(d.id or "" for d in recent) == ["kettle", "pg"]
    tagged = store.similarity_search("x", k=5, filter={"$or": [{"tags": "db"}, {"ok": True}]})
    assert sorted(d.id or "" for d in tagged) == ["pg", "rrf"]
    assert [d.id for d in store.search("kettle", search_type="keyword")] == ["kettle"]
    hybrid = store.search("reciprocal fusion", search_type="hybrid", k=3)
    assert hybrid[0].id == "rrf" and len(hybrid) == 3
    scored = store.hybrid_search_with_score("water kettle", k=2, weights={"vector": 0.1, "keyword": 1})
    assert scored[0][0].id == "kettle" and scored[0][1] > scored[1][1]
    relevant = store.similarity_search_with_relevance_scores(DOCS[0].page_content, k=3)
    assert relevant[0][0].id == "pg" and relevant[0][1] == pytest.approx(1.0, abs=1e-5)
    assert all(0.0 <= r <= 1.0 for _, r in relevant)
    mmr = store.max_marginal_relevance_search(DOCS[3].page_content, k=3, fetch_k=5, lambda_mult=0.3)
    assert mmr[0].id == "kettle" and len({d.id for d in mmr}) == 3
    with pytest.raises(InvalidInputError, match="filter"):
        store.similarity_search("x", filter={"year": {"$between": 1}})
    store.delete(filter={"year": 2024})
    assert store.get_by_ids(["pg", "kettle", "rrf"]) == [DOCS[2]]


def test_the_retriever_takes_memstore_search_types(store: MemstoreVectorStore) -> None:
    store.add_documents(DOCS)
    retriever = store.as_retriever(search_type="hybrid", search_kwargs={"k": 2})
    assert isinstance(retriever, MemstoreRetriever)
    assert retriever.invoke("reciprocal rank fusion")[0].id == "rrf"
    keyword = store.as_retriever(search_type="keyword", search_kwargs={"k": 5, "filter": {"year": 2024}})
    assert [d.id for d in keyword.invoke("kettle")] == ["kettle"]
    mmr = store.as_retriever(search_type="mmr", search_kwargs={"k": 2, "fetch_k": 5})
    assert len(mmr.invoke("vectors")) == 2
    threshold = store.as_retriever(search_type="similarity_score_threshold", search_kwargs={"score_threshold": 0.99})
    assert [d.id for d in threshold.invoke(DOCS[0].page_content)] == ["pg"]
    with pytest.raises(ValueError, match="not allowed"):
        store.as_retriever(search_type="nearest")
    assert [d.id for d in asyncio.run(retriever.ainvoke("reciprocal rank fusion"))][:1] == ["rrf"]


def test_the_async_side(store: MemstoreVectorStore) -> None:
    async def scenario() -> None:
        assert await store.asimilarity_search("anything") == []  # no collection yet
        assert await store.aadd_documents(DOCS) == [d.id for d in DOCS]
        hits = await store.asimilarity_search_with_score(DOCS[2].page_content, k=1, filter={"ok": True})
        assert hits[0][0] == DOCS[2]
        assert [d.id for d in await store.asearch("stainless", search_type="keyword")] == ["kettle"]
        assert (await store.asearch("rank fusion", search_type="hybrid", k=1))[0].id == "rrf"
        mmr = await store.amax_marginal_relevance_search(DOCS[0].page_content, k=2, fetch_k=4)
        assert mmr[0].id == "pg" and len(mmr) == 2
        relevant = await store.asimilarity_search_with_relevance_scores(DOCS[1].page_content, k=1)
        assert relevant[0][0].id == "hnsw"
        assert await store.aget_by_ids(["kettle"]) == [DOCS[3]]
        await store.adelete(["kettle", "nope"])
        assert await store.aget_by_ids(["kettle"]) == []
        await store.aclose()

    asyncio.run(scenario())
    # A second event loop gets a client of its own.
    assert asyncio.run(store.aget_by_ids(["pg"])) == [DOCS[0]]


def test_from_texts_and_a_collection_of_other_dimensions(served: Served) -> None:
    name = f"lc_{uuid.uuid4().hex[:12]}"
    options: dict[str, Any] = {"url": served.url, "api_key": served.key, "collection": name}
    store = MemstoreVectorStore.from_texts(
        ["one", "two"], DeterministicFakeEmbedding(size=8), ids=["1", "2"], **options
    )
    try:
        assert [d.page_content for d in store.get_by_ids(["2", "1"])] == ["two", "one"]
        other = MemstoreVectorStore(embedding=DeterministicFakeEmbedding(size=4), **options)
        with pytest.raises(ValueError, match="8-dimensional"):
            other.add_texts(["three"])
        other.close()
        again = asyncio.run(
            MemstoreVectorStore.afrom_texts(["three"], DeterministicFakeEmbedding(size=8), ids=["3"], **options)
        )
        assert [d.id for d in again.get_by_ids(["1", "2", "3"])] == ["1", "2", "3"]
        again.close()
    finally:
        store.delete_collection()
        store.close()


class _Compass(Embeddings):
    """Texts naming a direction, as unit vectors: "east" and "west" opposite, "north" between."""

    AT: ClassVar[dict[str, list[float]]] = {
        "east": [1.0, 0.0], "west": [-1.0, 0.0], "north": [0.0, 1.0], "north-east": [0.7071, 0.7071],
    }  # fmt: skip

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return [self.AT[t] for t in texts]

    def embed_query(self, text: str) -> list[float]:
        return self.AT[text]


@pytest.mark.parametrize("metric", ["cosine", "l2", "inner_product"])
def test_relevance_scores_stay_in_0_to_1_for_opposite_vectors(served: Served, metric: str) -> None:
    """LangChain asks for relevance in 0..1 (and warns otherwise); a cosine distance runs to 2."""
    store = MemstoreVectorStore(
        embedding=_Compass(), collection=f"lc_{uuid.uuid4().hex[:12]}", url=served.url, api_key=served.key,
        metric=metric,
    )  # fmt: skip
    try:
        store.add_texts(["east", "west", "north", "north-east"], ids=["e", "w", "n", "ne"])
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("error")  # LangChain's "Relevance scores must be between 0 and 1"
            scored = dict((d.id, r) for d, r in store.similarity_search_with_relevance_scores("east", k=4))
        assert set(scored) == {"e", "w", "n", "ne"}
        assert all(0.0 <= r <= 1.0 for r in scored.values()), scored
        assert scored["e"] == pytest.approx(1.0, abs=1e-4)
        assert scored["e"] > scored["ne"] > scored["w"]
        assert scored["w"] == 0.0  # the opposite direction: not relevant, not -1
        if metric == "cosine":  # LangChain's 1 - distance where it is in range
            assert scored["ne"] == pytest.approx(0.7071, abs=1e-3) and scored["n"] == pytest.approx(0.0, abs=1e-4)
    finally:
        store.delete_collection()
        store.close()


def _store(served: Served, embedding: Embeddings | None = None, **options: Any) -> MemstoreVectorStore:
    options.setdefault("collection", f"lc_{uuid.uuid4().hex[:12]}")
    return MemstoreVectorStore(
        embedding=embedding or DeterministicFakeEmbedding(size=16), url=served.url, api_key=served.key, **options
    )


# LangChain's mapping for l2 (1 - distance / sqrt 2): "north-east" is 0.765 from "east"; cosine's
# mapping (1 - distance) would read 0.235 for that distance.
NE_L2_RELEVANCE = 1.0 - 0.76537 / 2**0.5


def test_relevance_scores_follow_the_collections_own_metric(served: Served) -> None:
    name = f"lc_{uuid.uuid4().hex[:12]}"
    with Client(served.url, api_key=served.key) as ms:
        ms.create_collection(name, dimensions=2, metric="l2")
    writer = _store(served, _Compass(), collection=name)
    try:
        assert writer.metric == "cosine"  # not read yet: what a new collection would get
        writer.add_texts(["east", "north-east", "west"], ids=["e", "ne", "w"])
        assert writer.metric == "l2"
        scored = {d.id: r for d, r in writer.similarity_search_with_relevance_scores("east", k=3)}
        assert scored["ne"] == pytest.approx(NE_L2_RELEVANCE, abs=1e-3)
        reader = _store(served, _Compass(), collection=name)  # only searches: reads the metric once
        scored = {d.id: r for d, r in reader.similarity_search_with_relevance_scores("east", k=3)}
        assert scored["ne"] == pytest.approx(NE_L2_RELEVANCE, abs=1e-3) and reader.metric == "l2"
        areader = _store(served, _Compass(), collection=name)
        found = asyncio.run(areader.asimilarity_search_with_relevance_scores("east", k=3))
        assert {d.id: r for d, r in found}["ne"] == pytest.approx(NE_L2_RELEVANCE, abs=1e-3)
        for other in (_store(served, _Compass(), collection=name, metric="cosine"),):
            with pytest.raises(ValueError, match=r"measures by the l2 metric; this store was given metric='cosine'"):
                other.similarity_search_with_relevance_scores("east", k=3)
            with pytest.raises(ValueError, match="l2 metric"):
                other.add_texts(["north"])
        with pytest.raises(ValueError, match="disagree"):
            _store(served, metric="l2", collection_options={"metric": "cosine"})
        optioned = _store(served, _Compass(), collection_options={"metric": "inner_product"})
        try:
            optioned.add_texts(["east"])
            assert optioned.metric == "inner_product"
        finally:
            optioned.delete_collection()
    finally:
        writer.delete_collection()


def test_a_store_given_one_client_makes_the_other_for_the_same_server(served: Served) -> None:
    """Not the default url without a key: the same url, key, headers, timeout and retries."""
    given = Client("http://proxy.test/api", api_key="k", headers={"X-Tenant": "t"}, timeout=7.0, retry=2)
    store = MemstoreVectorStore(embedding=DeterministicFakeEmbedding(size=4), collection="c", client=given)

    async def twin() -> AsyncClient:
        return store.async_client

    made = asyncio.run(twin())
    assert made.url == "http://proxy.test/api" and made.http.base_url == "http://proxy.test/api/"
    assert made.base_headers["Authorization"] == "Bearer k" and made.base_headers["X-Tenant"] == "t"
    assert made.http.timeout == httpx.Timeout(7.0) and made.retry_policy.attempts == 2
    assert made.positions is given.positions
    given_async = AsyncClient("http://proxy.test/api", api_key="k", headers={"X-Tenant": "t"}, timeout=7.0)
    store = MemstoreVectorStore(embedding=DeterministicFakeEmbedding(size=4), collection="c", async_client=given_async)
    assert store.client.url == "http://proxy.test/api" and store.client.base_headers["X-Tenant"] == "t"
    assert store.client.base_headers["Authorization"] == "Bearer k" and store.client.http.timeout == httpx.Timeout(7.0)
    assert store.client.positions is given_async.positions
    # Against the real server, each side with the other's client.
    sync_only = _store(served, client=Client(served.url, api_key=served.key))
    try:
        asyncio.run(sync_only.aadd_texts(["one", "two"], ids=["1", "2"]))
        assert [d.id for d in sync_only.get_by_ids(["2", "1"])] == ["2", "1"]
        async_only = _store(
            served, collection=sync_only.collection, async_client=AsyncClient(served.url, api_key=served.key)
        )
        assert [d.page_content for d in async_only.get_by_ids(["1"])] == ["one"]
    finally:
        sync_only.delete_collection()


def test_delete_without_ids_deletes_nothing_and_says_how_to_delete_everything() -> None:
    store = MemstoreVectorStore(embedding=DeterministicFakeEmbedding(size=4), collection="c", url="http://nowhere.test")
    message = r"deletes nothing .* to delete every document, drop the collection with delete_collection\(\)"
    with pytest.raises(ValueError, match=message):
        store.delete()
    with pytest.raises(ValueError, match=message):
        asyncio.run(store.adelete(None))


def test_hybrid_and_keyword_searches_take_queries_of_any_length(store: MemstoreVectorStore) -> None:
    """The server takes 4,096 characters of a keyword or hybrid search's text, and a non-blank one."""
    store.add_documents(DOCS)
    long_query = "kettle " * 1000  # 7,000 characters
    assert [d.id for d in store.hybrid_search(long_query, k=1)] == ["kettle"]
    for blank in ("", "   "):
        assert len(store.hybrid_search(blank, k=2, weights={"vector": 1, "keyword": 2})) == 2  # by vector
        assert store.keyword_search(blank) == []
        assert len(store.as_retriever(search_type="hybrid", search_kwargs={"k": 2}).invoke(blank)) == 2
        assert store.as_retriever(search_type="keyword").invoke(blank) == []
    with pytest.raises(ValueError, match=r"7000 characters; a keyword search takes at most 4096"):
        store.keyword_search(long_query)

    async def scenario() -> None:
        assert [d.id for d in await store.ahybrid_search(long_query, k=1)] == ["kettle"]
        assert len(await store.ahybrid_search("", k=2)) == 2
        assert await store.akeyword_search(" ") == []
        with pytest.raises(ValueError, match="4096"):
            await store.akeyword_search(long_query)

    asyncio.run(scenario())


def test_the_hybrid_keyword_part_is_cut_at_a_words_end() -> None:
    from memstore_client.langchain import KEYWORD_TEXT_LIMIT, _hybrid

    query = "a" * (KEYWORD_TEXT_LIMIT - 3) + " kettle boils"
    search = _hybrid(query, [1.0])
    assert search["mode"] == "hybrid" and search["text"] == "a" * (KEYWORD_TEXT_LIMIT - 3) + " "
    assert _hybrid("x" * 5000, [1.0])["text"] == "x" * KEYWORD_TEXT_LIMIT  # one word: cut where the limit is
    assert _hybrid(" " * 5000 + "kettle", [1.0]) == {"vector": [1.0], "mode": "vector"}


def test_ids_and_metadata_no_request_can_carry_are_refused_before_anything_is_sent(served: Served) -> None:
    import math
    from datetime import datetime

    import numpy as np

    store = _store(served)
    refused: list[tuple[dict[str, Any], type[Exception], str]] = [
        ({"ids": ["a", 1.5]}, TypeError, r"^ids\[1\] is of type float: an id is a string"),
        ({"ids": ["a", b"b"]}, TypeError, r"^ids\[1\] is of type bytes"),
        ({"metadatas": [{}, {"when": datetime(2024, 1, 1)}]}, TypeError,
         r'^metadatas\[1\]\["when"\] is of type datetime\.datetime: .*\.isoformat\(\)'),
        ({"metadatas": [{1: "a"}, {}]}, TypeError, r"^metadatas\[0\] has the key 1 of type int"),
        ({"metadatas": [{"n": np.int64(3)}, {}]}, TypeError, r'^metadatas\[0\]\["n"\] is of type numpy\.int64'),
        ({"metadatas": [{"x": [math.nan]}, {}]}, ValueError, r'^metadatas\[0\]\["x"\]\[0\] is nan'),
        ({"metadatas": [{"s": "\ud800"}, {}]}, ValueError, r'^metadatas\[0\]\["s"\] holds a lone surrogate'),
        ({"metadatas": ["x", {}]}, TypeError, r"^metadatas\[0\] is of type str: a document's metadata is a dict"),
    ]  # fmt: skip
    try:
        for options, error, message in refused:
            with pytest.raises(error, match=message):
                store.add_texts(["one", "two"], **options)
            with pytest.raises(error, match=message):
                asyncio.run(store.aadd_texts(["one", "two"], **options))
        with pytest.raises(ValueError, match=r"^texts\[1\] holds a lone surrogate"):
            store.add_texts(["one", "tw\udc80"])
        with Client(served.url, api_key=served.key) as ms, pytest.raises(NotFoundError):
            ms.get_collection(store.collection)  # nothing was sent: not even the collection made
        # A UUID or an int is taken as its str(), as LangChain's other stores do.
        key = uuid.uuid4()
        ids: list[Any] = [key, 7, "x"]
        assert store.add_texts(["one", "two", "three"], ids=ids) == [str(key), "7", "x"]
        assert [d.page_content for d in store.get_by_ids([key, 7])] == ["one", "two"]  # type: ignore[list-item]
        store.delete([key])  # type: ignore[list-item]
        assert [d.id for d in store.get_by_ids([str(key), "7"])] == ["7"]
        # np.float64 is a float: JSON carries it.
        store.add_texts(["four"], metadatas=[{"f": np.float64(0.5)}], ids=["4"])
        assert store.get_by_ids(["4"])[0].metadata == {"f": 0.5}
    finally:
        store.delete_collection()


def test_k_zero_finds_nothing_and_mmr_fetches_at_most_the_servers_limit(store: MemstoreVectorStore) -> None:
    store.add_documents(DOCS)
    assert store.similarity_search("kettle", k=0) == []
    assert store.similarity_search_with_relevance_scores("kettle", k=0) == []
    assert store.hybrid_search("kettle", k=0) == [] and store.keyword_search("kettle", k=0) == []
    assert store.max_marginal_relevance_search("kettle", k=0) == []
    assert len(store.max_marginal_relevance_search(DOCS[3].page_content, k=3, fetch_k=5000)) == 3
    assert asyncio.run(store.asimilarity_search("kettle", k=0)) == []
    assert len(asyncio.run(store.amax_marginal_relevance_search("kettle", k=2, fetch_k=5000))) == 2
    with pytest.raises(InvalidInputError):
        store.similarity_search("kettle", k=5000)  # k itself over the server's limit


def test_from_texts_takes_collection_name_and_names_a_keyword_it_does_not_take(served: Served) -> None:
    name = f"lc_{uuid.uuid4().hex[:12]}"
    emb = DeterministicFakeEmbedding(size=8)
    options: dict[str, Any] = {"url": served.url, "api_key": served.key, "collection_name": name}
    store = MemstoreVectorStore.from_texts(["one"], emb, ids=["1"], **options)
    try:
        assert store.collection == name
        again = MemstoreVectorStore.from_documents([Document(page_content="two", id="2")], emb, **options)
        made = asyncio.run(MemstoreVectorStore.afrom_texts(["three"], emb, ids=["3"], **options))
        assert again.collection == made.collection == name
        assert [d.page_content for d in store.get_by_ids(["1", "2", "3"])] == ["one", "two", "three"]
        with pytest.raises(TypeError, match="name two collections"):
            MemstoreVectorStore.from_texts(["x"], emb, collection="a", collection_name="b")
        unknown = r"^MemstoreVectorStore does not take the keyword argument 'persist_directory' \(its clients take"
        with pytest.raises(TypeError, match=unknown):
            MemstoreVectorStore.from_texts(["x"], emb, persist_directory="/tmp", url=served.url, api_key=served.key)
        with pytest.raises(TypeError, match="'index_name'"):
            MemstoreVectorStore(emb, "c", index_name="x")
    finally:
        store.delete_collection()


def test_metadata_comes_back_as_jsonb_keeps_it_as_the_docs_say(store: MemstoreVectorStore) -> None:
    """The docs' examples of what jsonb normalises (``1e20`` an int, ``-0.0`` as ``0.0``) hold."""
    from pathlib import Path

    import memstore_client.langchain as module

    readme = (Path(__file__).resolve().parents[2] / "client" / "README.md").read_text()
    for text in (readme, module.__doc__ or ""):
        assert "exactly as given" not in text and "1e20` comes back as an int" in text.replace("``", "`")
    store.add_texts(["x"], metadatas=[{"big": 1e20, "zero": -0.0, "s": "é", "n": [1, 2.5, None]}], ids=["x"])
    back = store.get_by_ids(["x"])[0].metadata
    assert back == {"big": 10**20, "zero": 0.0, "s": "é", "n": [1, 2.5, None]}
    assert type(back["big"]) is int and str(back["zero"]) == "0.0"
