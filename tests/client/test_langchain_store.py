"""MemstoreVectorStore beyond the standard suite: memstore's filters, hybrid and keyword search,
maximal marginal relevance, scores, the retriever's search types, exact metadata, sync and async."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest
from langchain_core.documents import Document
from langchain_core.embeddings import DeterministicFakeEmbedding, Embeddings
from memstore_client import Client, InvalidInputError
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
    assert store.get_by_ids(["empty", "missing", "hnsw"]) == [DOCS[4], DOCS[1]]  # metadata exactly as given
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
