"""``MemstoreVectorStore``: a LangChain vector store on a memstore collection (the ``langchain`` extra).

```python
store = MemstoreVectorStore(embedding=embeddings, collection="docs", url="http://127.0.0.1:8000", api_key="msk_...")
store.add_documents(docs)
store.similarity_search("question", k=4, filter={"source": "manual"})
store.as_retriever(search_type="hybrid").invoke("question")
```

How LangChain's notions map onto memstore's:

- a document's id is the item's ``external_id`` (a UUID is made for a document without one; a
  ``uuid.UUID`` or an int id is taken as its ``str()``);
- ``page_content`` is the item's ``text``, stored for keyword search as it is (the item comes with the
  vector the embedding computed, so the server embeds nothing: ``memstore serve --no-encoder``
  serves it), and ``metadata`` is the item's metadata: JSON values, returned as PostgreSQL's jsonb
  keeps them (the same values, numbers normalised: ``1e20`` comes back as an int, ``-0.0`` as ``0.0``);
- the collection is created on first use with the embedding's dimension (``metric`` and
  ``collection_options`` choose the rest; scores follow an existing collection's metric);
  ``delete_collection()`` drops it, and ``delete()`` needs ids or ``filter=``;
- ``filter=`` is memstore's filter language (``{"year": {"$gte": 2020}}``, ``$or``, ``$in``...);
- search types: ``similarity``, ``similarity_score_threshold``, ``mmr``, and memstore's ``hybrid``
  (the vector list and the keyword list fused) and ``keyword``.

Search hits carry no text, so each hit's item is read (one request per hit, side by side on the
async side) to give its ``page_content``.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import re
import uuid
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar

from langchain_core.callbacks import AsyncCallbackManagerForRetrieverRun, CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from langchain_core.vectorstores import VectorStore, VectorStoreRetriever

from memstore_client._async import AsyncClient
from memstore_client._core import check_json, type_name, vector_values
from memstore_client._sync import Client
from memstore_client.errors import NotFoundError
from memstore_client.models import Collection, Item, SearchHit

__all__ = ["MemstoreRetriever", "MemstoreVectorStore"]

SEARCH_TYPES = ("similarity", "similarity_score_threshold", "mmr", "hybrid", "keyword")
# The server's defaults (docs/api.md "Limits"): the most hits a search answers (MEMSTORE_API_MAX_K,
# which a server may set lower, never higher), and the longest text a keyword or hybrid search takes
# (memstore/search/request.py MAX_QUERY_TEXT, not a setting).
SERVER_MAX_K = 1000
KEYWORD_TEXT_LIMIT = 4096
NO_IDS = (
    "delete() without ids or filter= deletes nothing (never everything by mistake); to delete every "
    "document, drop the collection with delete_collection() (the next add creates it again)"
)
# The keyword arguments the clients take besides those the store sets itself.
CLIENT_OPTIONS = frozenset(inspect.signature(Client).parameters) - {"url", "api_key", "read_your_writes"}


class MemstoreVectorStore(VectorStore):
    """A LangChain ``VectorStore`` on the memstore collection ``collection`` at ``url``.

    ``client`` and ``async_client`` may be given instead of ``url`` and ``api_key`` (other keyword
    arguments go to their constructors: ``retry``, ``timeout``...); given one of them, the other side
    is made with its url, key, headers, timeout and retries. Reads see this store's own writes
    (``read_your_writes``), also across read replicas. ``batch_size`` items go per request.

    ``metric`` (or ``collection_options["metric"]``) is the one a new collection gets (cosine when
    neither says); relevance scores follow the collection's own metric, and one that differs from a
    ``metric`` given here is a ``ValueError``."""

    def __init__(
        self,
        embedding: Embeddings,
        collection: str,
        url: str = "http://127.0.0.1:8000",
        api_key: str | None = None,
        *,
        client: Client | None = None,
        async_client: AsyncClient | None = None,
        metric: str | None = None,
        collection_options: Mapping[str, Any] | None = None,
        batch_size: int = 500,
        read_your_writes: bool = True,
        **client_options: Any,
    ) -> None:
        unknown = sorted(set(client_options) - CLIENT_OPTIONS)
        if unknown:
            raise TypeError(
                f"MemstoreVectorStore does not take the keyword argument {unknown[0]!r} "
                f"(its clients take {', '.join(sorted(CLIENT_OPTIONS))})"
            )
        self.embedding = embedding
        self.collection = collection
        self.collection_options = dict(collection_options or {})
        optioned = self.collection_options.get("metric")
        if metric is not None and optioned is not None and optioned != metric:
            raise ValueError(f"metric={metric!r} and collection_options={{'metric': {optioned!r}}} disagree")
        self._asked_metric: str | None = metric or optioned
        self._metric: str | None = None  # the collection's, once read
        self.batch_size = batch_size
        self._options = {"api_key": api_key, "read_your_writes": read_your_writes, **client_options}
        self._url = url
        if client is not None and async_client is None:
            self._url, self._options = client.url, _options_of(client)
        if client is None and async_client is not None:
            client = Client(async_client.url, **_options_of(async_client))
            client.positions = async_client.positions
        self.client = client or Client(url, **self._options)
        self._given_async = async_client
        # One AsyncClient per event loop: httpx's connections belong to the loop that opened them.
        self._async: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncClient] = weakref.WeakKeyDictionary()
        self._dimensions: int | None = None

    # Clients and the collection.

    @property
    def embeddings(self) -> Embeddings:
        return self.embedding

    @property
    def metric(self) -> str:
        """The collection's metric once it has been read, else the one a new collection gets."""
        return self._metric or self._asked_metric or "cosine"

    @property
    def async_client(self) -> AsyncClient:
        """The AsyncClient of the running event loop (it shares the sync client's write positions)."""
        if self._given_async is not None:
            return self._given_async
        loop = asyncio.get_running_loop()
        found = self._async.get(loop)
        if found is None:
            found = AsyncClient(self._url, **self._options)
            found.positions = self.client.positions
            self._async[loop] = found
        return found

    def close(self) -> None:
        self.client.close()

    async def aclose(self) -> None:
        for client in list(self._async.values()):
            await client.aclose()
        self._async.clear()

    def _create_options(self, dimensions: int) -> dict[str, Any]:
        return {"dimensions": dimensions, "metric": self.metric, **self.collection_options}

    def _check_dimensions(self, found: int, wanted: int) -> None:
        if found != wanted:
            raise ValueError(
                f"collection {self.collection!r} holds {found}-dimensional vectors; the embedding makes {wanted}"
            )
        self._dimensions = found

    def _check_metric(self, found: Collection) -> None:
        if self._asked_metric is not None and found.metric != self._asked_metric:
            raise ValueError(
                f"collection {self.collection!r} measures by the {found.metric} metric; "
                f"this store was given metric={self._asked_metric!r}"
            )
        self._metric = found.metric

    def _ensure(self, dimensions: int) -> None:
        if self._dimensions is None:
            made = self.client.get_or_create_collection(self.collection, **self._create_options(dimensions))
            self._check_metric(made)
            self._check_dimensions(made.dimensions, dimensions)
        elif self._dimensions != dimensions:
            self._check_dimensions(self._dimensions, dimensions)

    async def _aensure(self, dimensions: int) -> None:
        if self._dimensions is None:
            client = self.async_client
            made = await client.get_or_create_collection(self.collection, **self._create_options(dimensions))
            self._check_metric(made)
            self._check_dimensions(made.dimensions, dimensions)
        elif self._dimensions != dimensions:
            self._check_dimensions(self._dimensions, dimensions)

    def _scoring_metric(self) -> str:
        """The collection's metric, read once (a store that only searches has not read it yet)."""
        if self._metric is None:
            with contextlib.suppress(NotFoundError):  # dropped meanwhile: its hits are gone too
                self._check_metric(self.client.get_collection(self.collection))
        return self.metric

    async def _ascoring_metric(self) -> str:
        if self._metric is None:
            with contextlib.suppress(NotFoundError):
                self._check_metric(await self.async_client.get_collection(self.collection))
        return self.metric

    def delete_collection(self) -> None:
        """Drop the collection and every item in it (nothing happens if it does not exist)."""
        with contextlib.suppress(NotFoundError):
            self.client.delete_collection(self.collection)
        self._dimensions = self._metric = None

    async def adelete_collection(self) -> None:
        with contextlib.suppress(NotFoundError):
            await self.async_client.delete_collection(self.collection)
        self._dimensions = self._metric = None

    # Writing.

    @staticmethod
    def _checked(
        texts: Sequence[str],
        metadatas: Sequence[Mapping[str, Any] | None] | None,
        ids: Sequence[Any] | None,
    ) -> tuple[list[str], list[dict[str, Any]]]:
        """The ids (made where missing) and metadatas, refused naming their place before anything is
        embedded or sent when no request could carry them."""
        if metadatas is not None and len(metadatas) != len(texts):
            raise ValueError(f"{len(metadatas)} metadatas for {len(texts)} texts")
        if ids is not None and len(ids) != len(texts):
            raise ValueError(f"{len(ids)} ids for {len(texts)} texts")
        given = list(ids) if ids is not None else [None] * len(texts)
        made = [str(uuid.uuid4()) if i is None or i == "" else _id(i, f"ids[{n}]") for n, i in enumerate(given)]
        found: list[dict[str, Any]] = []
        for n, text in enumerate(texts):
            check_json(text, f"texts[{n}]")
            metadata = metadatas[n] if metadatas is not None else None
            if metadata is not None and not isinstance(metadata, Mapping):
                raise TypeError(f"metadatas[{n}] is of type {type_name(metadata)}: a document's metadata is a dict")
            found.append(dict(metadata or {}))
            check_json(found[-1], f"metadatas[{n}]")
        return made, found

    @staticmethod
    def _items(
        texts: Sequence[str],
        vectors: Sequence[Sequence[float]],
        ids: Sequence[str],
        metadatas: Sequence[dict[str, Any]],
    ) -> list[dict[str, Any]]:
        items = []
        for n, (text, vector, external_id, metadata) in enumerate(zip(texts, vectors, ids, metadatas, strict=True)):
            item: dict[str, Any] = {
                "external_id": external_id,
                "vector": vector_values(vector, f"embeddings[{n}]"),
                "metadata": metadata,
            }
            if text:  # an empty page_content is an item without a text
                item["text"] = text
            items.append(item)
        return items

    def add_texts(
        self,
        texts: Iterable[str],
        metadatas: list[dict[str, Any]] | None = None,
        *,
        ids: list[str] | None = None,
        **kwargs: Any,
    ) -> list[str]:
        """Embed the texts and store them with their metadata under ``ids`` (made when missing);
        an existing id is updated. Returns the ids. An id is a string; a ``uuid.UUID`` or an int is
        taken as its ``str()``. Metadata holds JSON values only (a datetime is refused, not converted)."""
        texts = list(texts)
        if not texts:
            return []
        made, found = self._checked(texts, metadatas, ids)
        vectors = self.embedding.embed_documents(texts)
        self._ensure(len(vectors[0]))
        items = self._items(texts, vectors, made, found)
        self.client.add_many(self.collection, items, batch_size=kwargs.get("batch_size", self.batch_size))
        return made

    async def aadd_texts(
        self,
        texts: Iterable[str],
        metadatas: list[dict[str, Any]] | None = None,
        *,
        ids: list[str] | None = None,
        **kwargs: Any,
    ) -> list[str]:
        texts = list(texts)
        if not texts:
            return []
        made, found = self._checked(texts, metadatas, ids)
        vectors = await self.embedding.aembed_documents(texts)
        await self._aensure(len(vectors[0]))
        items = self._items(texts, vectors, made, found)
        await self.async_client.add_many(self.collection, items, batch_size=kwargs.get("batch_size", self.batch_size))
        return made

    def delete(self, ids: list[str] | None = None, **kwargs: Any) -> bool | None:
        """Delete by ids (missing ones are no error), or everything a ``filter=`` matches. With neither
        it deletes nothing and raises ``ValueError``: ``delete_collection()`` deletes every document."""
        try:
            if ids is not None:
                self.client.delete_items(self.collection, external_ids=_ids(ids))
            elif kwargs.get("filter") is not None:
                self.client.delete_items(self.collection, filter=kwargs["filter"])
            else:
                raise ValueError(NO_IDS)
        except NotFoundError:
            pass  # no collection yet: nothing to delete
        return True

    async def adelete(self, ids: list[str] | None = None, **kwargs: Any) -> bool | None:
        try:
            if ids is not None:
                await self.async_client.delete_items(self.collection, external_ids=_ids(ids))
            elif kwargs.get("filter") is not None:
                await self.async_client.delete_items(self.collection, filter=kwargs["filter"])
            else:
                raise ValueError(NO_IDS)
        except NotFoundError:
            pass
        return True

    # Reading.

    def get_by_ids(self, ids: Sequence[str], /) -> list[Document]:
        """The documents with these ids, in that order; missing ids are left out."""
        ids = _ids(ids)
        try:
            found = self.client.lookup(self.collection, ids)
        except NotFoundError:
            return []
        wanted = [found[i] for i in ids if i in found]
        return [_document(item) for item in self._items_by_id(wanted)]

    async def aget_by_ids(self, ids: Sequence[str], /) -> list[Document]:
        ids = _ids(ids)
        try:
            found = await self.async_client.lookup(self.collection, ids)
        except NotFoundError:
            return []
        wanted = [found[i] for i in ids if i in found]
        return [_document(item) for item in await self._aitems_by_id(wanted)]

    def _items_by_id(self, item_ids: Sequence[int]) -> list[Item]:
        """The items (with their texts), in order; those deleted meanwhile are left out."""

        def one(item_id: int) -> Item | None:
            try:
                return self.client.get_item(self.collection, item_id)
            except NotFoundError:
                return None

        if len(item_ids) <= 1:
            found = [one(i) for i in item_ids]
        else:
            with ThreadPoolExecutor(min(8, len(item_ids))) as pool:
                found = list(pool.map(one, item_ids))
        return [i for i in found if i is not None]

    async def _aitems_by_id(self, item_ids: Sequence[int]) -> list[Item]:
        client = self.async_client

        async def one(item_id: int) -> Item | None:
            try:
                return await client.get_item(self.collection, item_id)
            except NotFoundError:
                return None

        found = await asyncio.gather(*(one(i) for i in item_ids))
        return [i for i in found if i is not None]

    def _documents(self, hits: Sequence[SearchHit]) -> list[tuple[Document, SearchHit]]:
        items = {i.id: i for i in self._items_by_id([h.id for h in hits])}
        return [(_document(items[h.id]), h) for h in hits if h.id in items]

    async def _adocuments(self, hits: Sequence[SearchHit]) -> list[tuple[Document, SearchHit]]:
        items = {i.id: i for i in await self._aitems_by_id([h.id for h in hits])}
        return [(_document(items[h.id]), h) for h in hits if h.id in items]

    def _search(self, **search: Any) -> list[SearchHit]:
        if search["k"] == 0:  # the server asks for k >= 1; no hits is the answer
            return []
        try:
            return self.client.search(self.collection, **search).results
        except NotFoundError:
            return []  # no collection yet: nothing found

    async def _asearch(self, **search: Any) -> list[SearchHit]:
        if search["k"] == 0:
            return []
        try:
            return (await self.async_client.search(self.collection, **search)).results
        except NotFoundError:
            return []

    @staticmethod
    def _search_options(kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """memstore's own search options passed through LangChain's keyword arguments."""
        names = ("ef_search", "exact", "candidates", "weights", "score_threshold", "using", "offset")
        return {n: kwargs[n] for n in names if kwargs.get(n) is not None}

    def similarity_search_by_vector_with_score(
        self, embedding: list[float], k: int = 4, filter: dict[str, Any] | None = None, **kwargs: Any
    ) -> list[tuple[Document, float]]:
        hits = self._search(vector=embedding, k=k, filter=filter, mode="vector", **self._search_options(kwargs))
        return [(doc, hit.score) for doc, hit in self._documents(hits)]

    async def asimilarity_search_by_vector_with_score(
        self, embedding: list[float], k: int = 4, filter: dict[str, Any] | None = None, **kwargs: Any
    ) -> list[tuple[Document, float]]:
        hits = await self._asearch(vector=embedding, k=k, filter=filter, mode="vector", **self._search_options(kwargs))
        return [(doc, hit.score) for doc, hit in await self._adocuments(hits)]

    def similarity_search(
        self, query: str, k: int = 4, filter: dict[str, Any] | None = None, **kwargs: Any
    ) -> list[Document]:
        return [doc for doc, _ in self.similarity_search_with_score(query, k, filter=filter, **kwargs)]

    async def asimilarity_search(
        self, query: str, k: int = 4, filter: dict[str, Any] | None = None, **kwargs: Any
    ) -> list[Document]:
        return [doc for doc, _ in await self.asimilarity_search_with_score(query, k, filter=filter, **kwargs)]

    def similarity_search_with_score(
        self, query: str, k: int = 4, filter: dict[str, Any] | None = None, **kwargs: Any
    ) -> list[tuple[Document, float]]:
        """The ``k`` nearest documents with memstore's score (higher is better: the cosine similarity
        in a cosine collection)."""
        return self.similarity_search_by_vector_with_score(
            self.embedding.embed_query(query), k, filter=filter, **kwargs
        )

    async def asimilarity_search_with_score(
        self, query: str, k: int = 4, filter: dict[str, Any] | None = None, **kwargs: Any
    ) -> list[tuple[Document, float]]:
        vector = await self.embedding.aembed_query(query)
        return await self.asimilarity_search_by_vector_with_score(vector, k, filter=filter, **kwargs)

    def similarity_search_by_vector(
        self, embedding: list[float], k: int = 4, filter: dict[str, Any] | None = None, **kwargs: Any
    ) -> list[Document]:
        return [doc for doc, _ in self.similarity_search_by_vector_with_score(embedding, k, filter=filter, **kwargs)]

    async def asimilarity_search_by_vector(
        self, embedding: list[float], k: int = 4, filter: dict[str, Any] | None = None, **kwargs: Any
    ) -> list[Document]:
        found = await self.asimilarity_search_by_vector_with_score(embedding, k, filter=filter, **kwargs)
        return [doc for doc, _ in found]

    def _select_relevance_score_fn(self) -> Callable[[float], float]:
        """From memstore's distance (pgvector's) to a relevance in 0..1, by the collection's metric:
        LangChain's own mapping for the metric (``1 - distance`` for cosine, as its other stores),
        held to 0..1. A cosine distance runs from 0 to 2, so the mapping alone gives an opposite
        vector -1; held, anything at or past orthogonal reads 0 (not relevant), and thresholds keep
        the meaning they have with LangChain's other stores."""
        return self._relevance_fn(self._scoring_metric())

    def _relevance_fn(self, metric: str) -> Callable[[float], float]:
        if metric == "l2":
            mapping = self._euclidean_relevance_score_fn
        elif metric == "inner_product":
            mapping = self._max_inner_product_relevance_score_fn
        else:
            mapping = self._cosine_relevance_score_fn

        def relevance(distance: float) -> float:
            return min(1.0, max(0.0, mapping(distance)))

        return relevance

    def _similarity_search_with_relevance_scores(
        self, query: str, k: int = 4, **kwargs: Any
    ) -> list[tuple[Document, float]]:
        filter = kwargs.pop("filter", None)
        hits = self._search(
            vector=self.embedding.embed_query(query), k=k, filter=filter, mode="vector", **self._search_options(kwargs)
        )
        if not hits:
            return []
        relevance = self._select_relevance_score_fn()
        return [(doc, relevance(hit.distance or 0.0)) for doc, hit in self._documents(hits)]

    async def _asimilarity_search_with_relevance_scores(
        self, query: str, k: int = 4, **kwargs: Any
    ) -> list[tuple[Document, float]]:
        filter = kwargs.pop("filter", None)
        vector = await self.embedding.aembed_query(query)
        hits = await self._asearch(vector=vector, k=k, filter=filter, mode="vector", **self._search_options(kwargs))
        if not hits:
            return []
        relevance = self._relevance_fn(await self._ascoring_metric())
        return [(doc, relevance(hit.distance or 0.0)) for doc, hit in await self._adocuments(hits)]

    # Hybrid and keyword search: memstore's own.

    def hybrid_search_with_score(
        self, query: str, k: int = 4, filter: dict[str, Any] | None = None, **kwargs: Any
    ) -> list[tuple[Document, float]]:
        """The query's vector list and its keyword list (the page contents' words), fused by
        Reciprocal Rank Fusion; the score is the fused one. ``weights={"vector": 1, "keyword": 2}``
        and ``candidates`` tune it (docs/search.md). The vector is the whole query's; the keyword
        list takes its first 4,096 characters (the server's limit, cut at a word's end); a query
        without words is a vector search (its scores are then similarities)."""
        search = _hybrid(query, self.embedding.embed_query(query))
        hits = self._search(**search, k=k, filter=filter, **self._search_options(kwargs))
        return [(doc, hit.score) for doc, hit in self._documents(hits)]

    async def ahybrid_search_with_score(
        self, query: str, k: int = 4, filter: dict[str, Any] | None = None, **kwargs: Any
    ) -> list[tuple[Document, float]]:
        search = _hybrid(query, await self.embedding.aembed_query(query))
        hits = await self._asearch(**search, k=k, filter=filter, **self._search_options(kwargs))
        return [(doc, hit.score) for doc, hit in await self._adocuments(hits)]

    def hybrid_search(
        self, query: str, k: int = 4, filter: dict[str, Any] | None = None, **kwargs: Any
    ) -> list[Document]:
        return [doc for doc, _ in self.hybrid_search_with_score(query, k, filter=filter, **kwargs)]

    async def ahybrid_search(
        self, query: str, k: int = 4, filter: dict[str, Any] | None = None, **kwargs: Any
    ) -> list[Document]:
        return [doc for doc, _ in await self.ahybrid_search_with_score(query, k, filter=filter, **kwargs)]

    def keyword_search_with_score(
        self, query: str, k: int = 4, filter: dict[str, Any] | None = None, **kwargs: Any
    ) -> list[tuple[Document, float]]:
        """The documents whose words match the query (no embedding), ranked by ``ts_rank_cd``. A query
        without words finds nothing; one over the server's 4,096 characters is a ``ValueError``
        (``hybrid_search`` cuts it instead: its vector keeps the whole query)."""
        if not _keyword_query(query):
            return []
        hits = self._search(text=query, mode="keyword", k=k, filter=filter, **self._search_options(kwargs))
        return [(doc, hit.score) for doc, hit in self._documents(hits)]

    async def akeyword_search_with_score(
        self, query: str, k: int = 4, filter: dict[str, Any] | None = None, **kwargs: Any
    ) -> list[tuple[Document, float]]:
        if not _keyword_query(query):
            return []
        hits = await self._asearch(text=query, mode="keyword", k=k, filter=filter, **self._search_options(kwargs))
        return [(doc, hit.score) for doc, hit in await self._adocuments(hits)]

    def keyword_search(
        self, query: str, k: int = 4, filter: dict[str, Any] | None = None, **kwargs: Any
    ) -> list[Document]:
        return [doc for doc, _ in self.keyword_search_with_score(query, k, filter=filter, **kwargs)]

    async def akeyword_search(
        self, query: str, k: int = 4, filter: dict[str, Any] | None = None, **kwargs: Any
    ) -> list[Document]:
        return [doc for doc, _ in await self.akeyword_search_with_score(query, k, filter=filter, **kwargs)]

    def search(self, query: str, search_type: str, **kwargs: Any) -> list[Document]:
        """LangChain's search types, and memstore's ``hybrid`` and ``keyword``."""
        if search_type == "hybrid":
            return self.hybrid_search(query, **kwargs)
        if search_type == "keyword":
            return self.keyword_search(query, **kwargs)
        return super().search(query, search_type, **kwargs)

    async def asearch(self, query: str, search_type: str, **kwargs: Any) -> list[Document]:
        if search_type == "hybrid":
            return await self.ahybrid_search(query, **kwargs)
        if search_type == "keyword":
            return await self.akeyword_search(query, **kwargs)
        return await super().asearch(query, search_type, **kwargs)

    # Maximal marginal relevance: fetch_k hits with their vectors, chosen among here.

    def max_marginal_relevance_search_by_vector(
        self,
        embedding: list[float],
        k: int = 4,
        fetch_k: int = 20,
        lambda_mult: float = 0.5,
        filter: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> list[Document]:
        hits = self._search(
            vector=embedding, k=max(k, min(fetch_k, SERVER_MAX_K)), filter=filter, mode="vector", with_vector=True,
            **self._search_options(kwargs),
        )  # fmt: skip
        chosen = _mmr(embedding, hits, k, lambda_mult)
        return [doc for doc, _ in self._documents(chosen)]

    async def amax_marginal_relevance_search_by_vector(
        self,
        embedding: list[float],
        k: int = 4,
        fetch_k: int = 20,
        lambda_mult: float = 0.5,
        filter: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> list[Document]:
        hits = await self._asearch(
            vector=embedding, k=max(k, min(fetch_k, SERVER_MAX_K)), filter=filter, mode="vector", with_vector=True,
            **self._search_options(kwargs),
        )  # fmt: skip
        chosen = _mmr(embedding, hits, k, lambda_mult)
        return [doc for doc, _ in await self._adocuments(chosen)]

    def max_marginal_relevance_search(
        self,
        query: str,
        k: int = 4,
        fetch_k: int = 20,
        lambda_mult: float = 0.5,
        filter: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> list[Document]:
        return self.max_marginal_relevance_search_by_vector(
            self.embedding.embed_query(query), k, fetch_k, lambda_mult, filter=filter, **kwargs
        )

    async def amax_marginal_relevance_search(
        self,
        query: str,
        k: int = 4,
        fetch_k: int = 20,
        lambda_mult: float = 0.5,
        filter: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> list[Document]:
        vector = await self.embedding.aembed_query(query)
        return await self.amax_marginal_relevance_search_by_vector(
            vector, k, fetch_k, lambda_mult, filter=filter, **kwargs
        )

    # Construction from texts, and the retriever.

    @classmethod
    def from_texts(
        cls,
        texts: list[str],
        embedding: Embeddings,
        metadatas: list[dict[str, Any]] | None = None,
        *,
        ids: list[str] | None = None,
        collection: str | None = None,
        **kwargs: Any,
    ) -> MemstoreVectorStore:
        """A store on ``collection`` (``collection_name`` is taken too; "langchain" when neither is
        given) holding these texts; the other keyword arguments are the constructor's."""
        store = cls(embedding=embedding, collection=_collection_name(collection, kwargs), **kwargs)
        store.add_texts(texts, metadatas, ids=ids)
        return store

    @classmethod
    async def afrom_texts(
        cls,
        texts: list[str],
        embedding: Embeddings,
        metadatas: list[dict[str, Any]] | None = None,
        *,
        ids: list[str] | None = None,
        collection: str | None = None,
        **kwargs: Any,
    ) -> MemstoreVectorStore:
        """A store on ``collection`` (``collection_name`` is taken too; "langchain" when neither is
        given) holding these texts; the other keyword arguments are the constructor's."""
        store = cls(embedding=embedding, collection=_collection_name(collection, kwargs), **kwargs)
        await store.aadd_texts(texts, metadatas, ids=ids)
        return store

    def as_retriever(self, **kwargs: Any) -> MemstoreRetriever:
        """A retriever whose ``search_type`` may also be ``hybrid`` or ``keyword``."""
        tags = kwargs.pop("tags", None) or [*self._get_retriever_tags()]
        return MemstoreRetriever(vectorstore=self, tags=tags, **kwargs)


class MemstoreRetriever(VectorStoreRetriever):
    """LangChain's vector store retriever, with memstore's ``hybrid`` and ``keyword`` search types."""

    allowed_search_types: ClassVar[tuple[str, ...]] = SEARCH_TYPES

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun, **kwargs: Any
    ) -> list[Document]:
        if self.search_type in ("hybrid", "keyword"):
            return self.vectorstore.search(query, self.search_type, **(self.search_kwargs | kwargs))
        return super()._get_relevant_documents(query, run_manager=run_manager, **kwargs)

    async def _aget_relevant_documents(
        self, query: str, *, run_manager: AsyncCallbackManagerForRetrieverRun, **kwargs: Any
    ) -> list[Document]:
        if self.search_type in ("hybrid", "keyword"):
            return await self.vectorstore.asearch(query, self.search_type, **(self.search_kwargs | kwargs))
        return await super()._aget_relevant_documents(query, run_manager=run_manager, **kwargs)


def _collection_name(collection: str | None, kwargs: dict[str, Any]) -> str:
    """``collection``, or LangChain's more usual ``collection_name`` (taken out of ``kwargs``)."""
    alias = kwargs.pop("collection_name", None)
    if collection is not None and alias is not None and alias != collection:
        raise TypeError(f"collection={collection!r} and collection_name={alias!r} name two collections")
    return collection or alias or "langchain"


def _options_of(client: Client | AsyncClient) -> dict[str, Any]:
    """What a twin on the other side (sync or async) needs to reach the same server the same way."""
    return {
        "api_key": client.api_key,
        "headers": dict(client.base_headers),
        "timeout": client.http.timeout,
        "retry": client.retry_policy,
        "on_retry": client.on_retry,
        "read_your_writes": client.read_your_writes,
    }


def _id(value: Any, where: str) -> str:
    """A document id: a string, or a ``uuid.UUID`` or an int as its ``str()`` (as LangChain's other
    stores take them); anything else is refused rather than guessed at."""
    if isinstance(value, str):
        check_json(value, where)
        return value
    if isinstance(value, uuid.UUID) or (isinstance(value, int) and not isinstance(value, bool)):
        return str(value)
    raise TypeError(
        f"{where} is of type {type_name(value)}: an id is a string (a uuid.UUID or an int is taken as its str())"
    )


def _ids(ids: Iterable[Any]) -> list[str]:
    return [_id(i, f"ids[{n}]") for n, i in enumerate(ids)]


def _keyword_query(query: str) -> bool:
    """Whether a keyword search has words to look for (a ``ValueError`` for more than the server takes)."""
    if len(query) > KEYWORD_TEXT_LIMIT:
        raise ValueError(
            f"the query has {len(query)} characters; a keyword search takes at most {KEYWORD_TEXT_LIMIT} "
            "(the server's limit; hybrid_search cuts the keyword part instead)"
        )
    return bool(query.strip())


def _hybrid(query: str, vector: list[float]) -> dict[str, Any]:
    """A hybrid search's query: the vector is given, so the server embeds nothing and the text is its
    keyword part alone, which may then be cut to the server's limit without changing the vector."""
    words = query
    if len(words) > KEYWORD_TEXT_LIMIT:
        words = words[:KEYWORD_TEXT_LIMIT]
        if not query[KEYWORD_TEXT_LIMIT].isspace():
            words = re.sub(r"\S+$", "", words) or words  # not half a word, unless it is one word
    if not words.strip():
        return {"vector": vector, "mode": "vector"}
    return {"text": words, "vector": vector, "mode": "hybrid"}


def _document(item: Item) -> Document:
    return Document(id=item.external_id, page_content=item.text or "", metadata=item.metadata)


def _mmr(query: Sequence[float], hits: Sequence[SearchHit], k: int, lambda_mult: float) -> list[SearchHit]:
    """LangChain's maximal marginal relevance over the hits' stored vectors."""
    import numpy as np
    from langchain_core.vectorstores.utils import maximal_marginal_relevance

    usable = [h for h in hits if h.vector is not None]
    if not usable:
        return []
    vectors = [list(h.vector or []) for h in usable]
    chosen = maximal_marginal_relevance(np.array(query, dtype=np.float32), vectors, lambda_mult=lambda_mult, k=k)
    return [usable[i] for i in chosen]
