"""``AsyncClient``: the memstore REST API from asyncio code, method for method as ``Client`` (``_sync.py``)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import httpx
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt

from memstore_client import _core
from memstore_client._core import (
    Call,
    Example,
    FileLike,
    ImageLike,
    ItemLike,
    Progress,
    RetryEvent,
    RetryPolicy,
    as_acks,
    as_json,
    as_model,
    as_none,
    as_response,
    drop_none,
    path,
)
from memstore_client.errors import APIError, NotFoundError
from memstore_client.models import (
    Collection,
    Content,
    DuplicatePair,
    DuplicatesPage,
    Health,
    Item,
    ItemAck,
    ItemPage,
    ItemsAck,
    LoadResult,
    MetadataIndex,
    SearchHit,
    SearchResult,
    Space,
)

T = TypeVar("T")


class AsyncClient(_core.Base):
    """The memstore REST API: ``Client("http://127.0.0.1:8000", api_key="msk_...")``.

    Every error answer is raised as an ``APIError`` of its problem type (``NotFoundError``,
    ``InvalidInputError``...); 429 and 503 answers and failed connections are retried as ``retry``
    says (a ``RetryPolicy``, a number of tries, or None for none), waiting what ``Retry-After`` asks.
    With ``read_your_writes=True`` every read carries the position of the latest write this client
    made (``X-Memstore-Min-LSN``), so a server reading from replicas answers with that write in.
    ``transport`` and ``timeout`` go to the underlying ``httpx.Client`` (``client.http``).
    Use it as a context manager, or call ``close()``.
    """

    def __init__(
        self,
        url: str = "http://127.0.0.1:8000",
        api_key: str | None = None,
        *,
        timeout: float | httpx.Timeout = 60.0,
        retry: RetryPolicy | int | None = RetryPolicy(),  # noqa: B008  # frozen: shared safely
        on_retry: Callable[[RetryEvent], None] | None = None,
        read_your_writes: bool = False,
        headers: Mapping[str, str] | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        super().__init__(
            url, api_key, retry=retry, on_retry=on_retry, read_your_writes=read_your_writes, headers=headers
        )
        self.http = httpx.AsyncClient(
            base_url=self.url, headers=self.base_headers, timeout=timeout, transport=transport
        )

    async def aclose(self) -> None:
        await self.http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # The plumbing.

    async def _once(self, call: Call[Any], min_lsn: str | None) -> httpx.Response:
        kwargs = self.request_kwargs(call, min_lsn)
        if callable(call.content):
            kwargs["content"] = _core.aiterate(call.content())
        elif call.content is not None:
            kwargs["content"] = call.content
        try:
            response = await self.http.request(call.method, call.path, **kwargs)
        except httpx.TransportError as exc:
            raise self.connection_error(call, exc) from exc
        return self.check(call, response)

    async def _send(self, call: Call[T], min_lsn: str | None = None) -> T:
        if not call.retry or self.retry_policy.attempts <= 1:
            return call.parse(await self._once(call, min_lsn))
        strategy = AsyncRetrying(
            retry=retry_if_exception(self.should_retry),
            stop=stop_after_attempt(self.retry_policy.attempts),
            wait=self.pause,
            before_sleep=self.before_sleep,
            reraise=True,
        )
        response: httpx.Response = await strategy(self._once, call, min_lsn)
        return call.parse(response)

    async def request(
        self,
        method: str,
        url: str,
        *,
        read: bool | None = None,
        raise_for_status: bool = True,
        **kwargs: Any,
    ) -> httpx.Response:
        """Any route, with this client's key, retries and positions (``kwargs``: ``params``, ``json``,
        ``files``, ``data``, ``content``, ``headers``). ``read`` says whether it only reads (default: a
        GET). With ``raise_for_status=False`` an error answer is returned (the last one, after the
        retries) instead of raised."""
        call: Call[httpx.Response] = Call(method.upper(), url, as_response, read=method.upper() == "GET")
        if read is not None:
            call.read = read
        for name in ("params", "json", "files", "data", "content", "headers"):
            if name in kwargs:
                setattr(call, name, kwargs.pop(name))
        if kwargs:
            raise TypeError(f"unexpected arguments: {', '.join(kwargs)}")
        try:
            return await self._send(call)
        except APIError as error:
            if raise_for_status or error.response is None:
                raise
            return error.response

    # Health.

    async def health(self) -> Health:
        """``/health``: ``status`` (ok, starting, degraded, unavailable) and ``reasons``; with a key,
        the database, encoder, workers and queue as extra fields. Not retried: it says how things are."""
        return await self._send(Call("GET", "/health", as_model(Health), accept=(503,), retry=False))

    async def models(self) -> list[dict[str, Any]]:
        """``GET /v1/models``: the models this server's encoder runs (the default first), each a dict
        with its ``id`` and ``dimensions``: what a collection or a space may be created with."""
        answer = await self._send(Call("GET", "/v1/models", as_json, read=True))
        return list(answer["data"])

    # Collections.

    async def list_collections(self) -> list[Collection]:
        return await self._send(Call("GET", "/v1/collections", _core.as_collections, read=True))

    async def get_collection(self, name: str) -> Collection:
        return await self._send(Call("GET", path(name), as_model(Collection), read=True))

    async def create_collection(
        self,
        name: str,
        *,
        dimensions: int | None = None,
        model: str | None = None,
        metric: str | None = None,
        hnsw_m: int | None = None,
        hnsw_ef_construction: int | None = None,
        ef_search: int | None = None,
        partitions: int | None = None,
        language: str | None = None,
        text_fields: Sequence[str] | None = None,
        ocr: bool | None = None,
        write_path: str | None = None,
    ) -> Collection:
        """Without ``dimensions`` the collection takes the server model's (texts and images are then
        embedded by it); give them for vectors you make yourself. ``write_path="segments"``: for
        collections fed by streams of upserts (new rows go to a tail searched exactly and get graphs
        at index-build speed in the background; ``seal`` at a stream's end)."""
        body = drop_none(
            name=name,
            dimensions=dimensions,
            model=model,
            metric=metric,
            hnsw_m=hnsw_m,
            hnsw_ef_construction=hnsw_ef_construction,
            ef_search=ef_search,
            partitions=partitions,
            language=language,
            text_fields=list(text_fields) if text_fields is not None else None,
            ocr=ocr,
            write_path=write_path,
        )
        return await self._send(Call("POST", "/v1/collections", as_model(Collection), json=body))

    async def get_or_create_collection(self, name: str, **create: Any) -> Collection:
        """The collection, created (with ``create``: ``create_collection``'s options) when missing."""
        try:
            return await self.get_collection(name)
        except NotFoundError:
            pass
        try:
            return await self.create_collection(name, **create)
        except APIError as error:
            if error.status != 409:  # made meanwhile by someone else: theirs is as good
                raise
            return await self.get_collection(name)

    async def update_collection(
        self,
        name: str,
        *,
        language: str | None = None,
        text_fields: Sequence[str] | None = None,
        ocr: bool | None = None,
    ) -> Collection:
        """Keyword settings (``language``, ``text_fields``: the keyword index is rebuilt online) and
        OCR (reading the text in images, found by keyword search)."""
        body = drop_none(language=language, text_fields=list(text_fields) if text_fields is not None else None, ocr=ocr)
        return await self._send(Call("PATCH", path(name), as_model(Collection), json=body))

    async def seal(self, name: str, *, merge: bool = False) -> list[dict[str, Any]]:
        """Put a segmented collection's tail into a graph now (a stream's writer calls it at the end);
        ``merge``: then merge every graph into one. The seals and merges run, as the server lists them."""
        params = {"merge": "true"} if merge else None
        answer = await self._send(Call("POST", path(name, "seal"), as_json, params=params))
        return list(answer["done"])

    async def delete_collection(self, name: str) -> None:
        await self._send(Call("DELETE", path(name), as_none))

    async def create_index(self, collection: str, field: str | Sequence[str], type: str) -> MetadataIndex:
        """A typed index on a metadata field for filters: ``field`` a key or a dotted path
        (``"image.taken_at"``), or the list of keys down to a nested field; ``type`` is number,
        timestamp or keyword."""
        body = {"field": field if isinstance(field, str) else list(field), "type": type}
        return await self._send(Call("POST", path(collection, "indexes"), as_model(MetadataIndex), json=body))

    async def list_indexes(self, collection: str) -> list[MetadataIndex]:
        return await self._send(Call("GET", path(collection, "indexes"), _core.as_indexes, read=True))

    async def drop_index(self, collection: str, index: str) -> None:
        await self._send(Call("DELETE", path(collection, "indexes", index), as_none))

    # Items.

    async def add_items(self, collection: str, items: Sequence[ItemLike], *, wait: bool = False) -> ItemsAck:
        """Texts and vectors (``ItemIn`` or dicts with ``external_id``, ``text``, ``vector``,
        ``metadata``), at most the server's per-request limit (1,000 by default; ``add_many`` splits).
        ``wait=True`` answers once texts are embedded."""
        return await self._send(_core.items_call(collection, items, wait))

    async def add_texts(
        self,
        collection: str,
        texts: Sequence[str],
        *,
        ids: Sequence[str] | None = None,
        metadatas: Sequence[Mapping[str, Any]] | None = None,
        vectors: Sequence[Sequence[float]] | None = None,
        wait: bool = False,
    ) -> ItemsAck:
        """Texts, embedded by the server's model, or stored with ``vectors`` you computed."""
        return await self.add_items(
            collection, _core.columns_to_items(texts=texts, ids=ids, metadatas=metadatas, vectors=vectors), wait=wait
        )

    async def add_vectors(
        self,
        collection: str,
        vectors: Sequence[Sequence[float]],
        *,
        ids: Sequence[str] | None = None,
        metadatas: Sequence[Mapping[str, Any]] | None = None,
        texts: Sequence[str | None] | None = None,
    ) -> ItemsAck:
        """Your own vectors (written at once), each with an optional text found by keyword search."""
        return await self.add_items(
            collection, _core.columns_to_items(vectors=vectors, ids=ids, metadatas=metadatas, texts=texts)
        )

    async def upload(
        self,
        collection: str,
        files: Sequence[FileLike],
        *,
        external_ids: Sequence[str] | None = None,
        metadata: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
        wait: bool = False,
    ) -> ItemsAck:
        """Image files (paths, bytes, or (name, bytes)) in one multipart request; ``metadata`` is one
        object for all or one per file. The file name is added to the metadata as ``filename``."""
        call = _core.upload_call(collection, files, external_ids=external_ids, metadata=metadata, wait=wait)
        return await self._send(call)

    async def add_many(
        self,
        collection: str,
        items: Iterable[ItemLike],
        *,
        batch_size: int = 500,
        wait: bool = False,
        progress: Progress = False,
        total: int | None = None,
    ) -> list[ItemAck]:
        """Any number of items, ``batch_size`` a request (fewer where their JSON would pass 32 MiB, half
        the server's default body limit), with a progress bar (``progress=True``, tqdm) or a callback
        given each batch's count. Returns every acknowledgement, in order."""
        bar = _core.ProgressBar(progress, _core.total_of(items, total), "upload")
        acks: list[ItemAck] = []
        try:
            for batch in _core.item_batches(items, max(1, batch_size)):
                acks.extend((await self.add_items(collection, batch, wait=wait)).items)
                bar.update(len(batch))
        finally:
            bar.close()
        return acks

    async def upload_many(
        self,
        collection: str,
        files: Sequence[FileLike],
        *,
        external_ids: Sequence[str] | None = None,
        metadata: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
        batch_size: int = 16,
        wait: bool = False,
        progress: Progress = False,
    ) -> list[ItemAck]:
        """Many image files, ``batch_size`` a request (each file read when its batch is sent); ``metadata``
        is one object for all, or one per file, as ``upload`` takes it."""
        bar = _core.ProgressBar(progress, len(files), "upload")
        acks: list[ItemAck] = []
        try:
            for start in range(0, len(files), max(1, batch_size)):
                end = start + max(1, batch_size)
                ack = await self.upload(
                    collection,
                    files[start:end],
                    external_ids=external_ids[start:end] if external_ids is not None else None,
                    metadata=metadata if metadata is None or isinstance(metadata, Mapping) else metadata[start:end],
                    wait=wait,
                )
                acks.extend(ack.items)
                bar.update(len(files[start:end]))
        finally:
            bar.close()
        return acks

    async def load(self, collection: str, source: str | Path | bytes | Iterable[ItemLike]) -> LoadResult:
        """The bulk load (``POST .../load``, NDJSON, at index-build speed when large): a file's path, its
        bytes, or items each with ``external_id`` and ``vector``. A file is read again if the request is
        retried; items are streamed once (not retried after a broken connection)."""
        content: bytes | Callable[[], Iterator[bytes]]
        if isinstance(source, bytes):
            content = source
        elif isinstance(source, str | Path):
            content = _core.file_chunks(Path(source))
        else:
            lines = _core.ndjson_lines(source)
            content = lambda: lines  # noqa: E731
        call = Call(
            "POST",
            path(collection, "load"),
            as_model(LoadResult),
            content=content,
            headers={"Content-Type": "application/x-ndjson"},
            idempotent=not callable(content) or isinstance(source, str | Path),
            retry=not callable(content) or isinstance(source, str | Path),  # items stream once: never resent
        )
        return await self._send(call)

    async def get_item(self, collection: str, item_id: int, *, with_vector: bool = False) -> Item:
        params = {"with_vector": "true"} if with_vector else None
        return await self._send(
            Call("GET", path(collection, "items", item_id), as_model(Item), params=params, read=True)
        )

    async def get_item_by_external_id(self, collection: str, external_id: str) -> Item | None:
        page = await self.list_items(collection, external_id=external_id, limit=1)
        return page.items[0] if page.items else None

    async def list_items(
        self,
        collection: str,
        *,
        limit: int = 100,
        after: int = 0,
        external_id: str | None = None,
        status: str | None = None,
        filter: Mapping[str, Any] | None = None,
    ) -> ItemPage:
        """One page of items by id (``after``: the last id of the previous page; ``next`` is the next
        page's path), optionally those whose metadata matches ``filter`` (the search filter language).
        ``iter_items`` walks them all; ``query_items`` sends a long filter in the body."""
        params = drop_none(
            limit=limit,
            after=after or None,
            external_id=external_id,
            status=status,
            filter=json.dumps(dict(filter)) if filter is not None else None,
        )
        return await self._send(Call("GET", path(collection, "items"), as_model(ItemPage), params=params, read=True))

    async def iter_items(
        self,
        collection: str,
        *,
        status: str | None = None,
        page_size: int = 100,
        filter: Mapping[str, Any] | None = None,
    ) -> AsyncIterator[Item]:
        """Every item (by id), or every one whose metadata matches ``filter`` (paged through POST .../items/list)."""
        if filter is not None:
            after = 0
            while True:
                found = await self.query_items(collection, filter=filter, status=status, after=after, limit=page_size)
                for item in found.items:
                    yield item
                if found.next_after is None:
                    return
                after = found.next_after
        page = await self.list_items(collection, limit=page_size, status=status)
        while True:
            for item in page.items:
                yield item
            # Not page.next: it is the server's path, which holds a reverse proxy's root path too.
            if page.next_after is None:
                return
            page = await self.list_items(collection, limit=page_size, status=status, after=page.next_after)

    async def query_items(
        self,
        collection: str,
        *,
        filter: Mapping[str, Any] | None = None,
        status: str | None = None,
        after: int = 0,
        limit: int = 100,
    ) -> ItemPage:
        """One page of the items whose metadata matches ``filter`` (POST .../items/list: a filter of any
        length); the next page is ``after=page.next_after`` (None on the last)."""
        body = drop_none(filter=dict(filter) if filter is not None else None, status=status, after=after, limit=limit)
        return await self._send(
            Call("POST", path(collection, "items", "list"), as_model(ItemPage), json=body, read=True)
        )

    async def count_items(
        self, collection: str, *, filter: Mapping[str, Any] | None = None, status: str | None = None
    ) -> int:
        """How many items (with this ``status``: pending, ready, failed) match ``filter`` (exact)."""
        body = drop_none(filter=dict(filter) if filter is not None else None, status=status)
        answer = await self._send(Call("POST", path(collection, "items", "count"), as_json, json=body, read=True))
        return int(answer["count"])

    async def update_item(
        self,
        collection: str,
        item_id: int,
        *,
        metadata: Mapping[str, Any] | None = None,
        merge: bool = False,
        vector: Sequence[float] | None = None,
    ) -> Item:
        """Replace (or ``merge`` into) the metadata, or replace the vector."""
        body: dict[str, Any] = drop_none(
            metadata=dict(metadata) if metadata is not None else None,
            vector=_core.vector_values(vector) if vector is not None else None,
        )
        if merge:
            body["merge"] = True
        return await self._send(Call("PATCH", path(collection, "items", item_id), as_model(Item), json=body))

    async def replace_content(
        self,
        collection: str,
        item_id: int,
        *,
        text: str | None = None,
        file: FileLike | None = None,
        wait: bool = False,
    ) -> ItemsAck:
        """A new text or image for the item: it is embedded again."""
        if (text is None) == (file is None):
            raise ValueError("give a text or a file")
        params = {"wait": "true"} if wait else None
        if text is not None:
            call = Call(
                "PUT", path(collection, "items", item_id, "content"), as_acks, params=params, json={"text": text}
            )
        else:
            assert file is not None
            part = _core.file_part(file, 0)
            call = Call(
                "PUT", path(collection, "items", item_id, "content"), as_acks, params=params, files=[("file", part)]
            )
        return await self._send(call)

    async def delete_item(self, collection: str, item_id: int) -> None:
        await self._send(Call("DELETE", path(collection, "items", item_id), as_none))

    async def delete_items(
        self,
        collection: str,
        *,
        ids: Sequence[int] | None = None,
        external_ids: Sequence[str] | None = None,
        filter: Mapping[str, Any] | None = None,
    ) -> int:
        """Delete by ids, external ids (missing ones are no error) or a metadata filter; the count deleted.
        More than 1,000 external ids go in several requests."""
        if external_ids is not None and len(external_ids) > 1000 and ids is None and filter is None:
            deleted = 0
            for chunk in _core.chunked(external_ids, 1000):
                deleted += await self.delete_items(collection, external_ids=chunk)
            return deleted
        result = await self._send(_core.delete_call(collection, ids, external_ids, filter))
        return result.deleted

    async def lookup(self, collection: str, external_ids: Sequence[str]) -> dict[str, int]:
        """Which of these external ids exist: external id -> item id (any number, 1,000 a request)."""
        found: dict[str, int] = {}
        for chunk in _core.chunked(external_ids, 1000):
            call = Call(
                "POST", path(collection, "items", "lookup"), _core.as_found, json={"external_ids": chunk}, read=True
            )
            answer: dict[str, int] = await self._send(call)
            found.update(answer)
        return found

    async def download(self, collection: str, item_id: int) -> Content:
        """The stored original: the image bytes or the text (``NotFoundError`` for a bare vector)."""
        return await self._send(Call("GET", path(collection, "items", item_id, "content"), _core.content_of, read=True))

    async def wait_until_embedded(
        self, collection: str, *, timeout: float | None = None, poll_s: float = 0.5
    ) -> Collection:
        """Poll the collection until nothing is pending (``TimeoutError`` after ``timeout`` seconds)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            c = await self.get_collection(collection)
            if not c.pending:
                return c
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"{c.pending} items of {collection!r} still pending after {timeout} s")
            await asyncio.sleep(poll_s)

    # Search.

    async def search(
        self,
        collection: str,
        *,
        text: str | None = None,
        vector: Sequence[float] | None = None,
        image: ImageLike | None = None,
        item_id: int | None = None,
        mode: str | None = None,
        k: int = 10,
        offset: int = 0,
        filter: Mapping[str, Any] | None = None,
        candidates: int | None = None,
        weights: Mapping[str, float] | None = None,
        score_threshold: float | None = None,
        ef_search: int | None = None,
        exact: bool = False,
        using: str | None = None,
        with_vector: bool = False,
        group_by: str | None = None,
        group_size: int | None = None,
        min_lsn: str | None = None,
    ) -> SearchResult:
        """By ``text``, ``vector``, ``image`` (bytes or a path) or ``item_id``; ``mode`` vector, keyword or
        hybrid (the default with a text when a vector can be had); ``filter`` in memstore's filter
        language; ``offset`` pages; ``group_by`` answers ``groups``. ``min_lsn``: see this write."""
        body = _core.search_body(
            text=text,
            vector=vector,
            image=image,
            item_id=item_id,
            mode=mode,
            k=k,
            offset=offset,
            filter=filter,
            candidates=candidates,
            weights=weights,
            score_threshold=score_threshold,
            ef_search=ef_search,
            exact=exact,
            using=using,
            with_vector=with_vector,
            group_by=group_by,
            group_size=group_size,
        )
        call = Call("POST", path(collection, "search"), as_model(SearchResult), json=body, read=True)
        return await self._send(call, min_lsn)

    async def search_batch(self, collection: str, searches: Sequence[Mapping[str, Any]]) -> list[list[SearchHit]]:
        """Up to 100 searches in one request, each given as ``search``'s keyword arguments."""
        bodies = [_core.search_body(**dict(s)) for s in searches]
        call = Call("POST", path(collection, "search", "batch"), _core.as_batch, json={"searches": bodies}, read=True)
        return await self._send(call)

    async def recommend(
        self,
        collection: str,
        positive: Sequence[Example],
        negative: Sequence[Example] = (),
        *,
        k: int = 10,
        filter: Mapping[str, Any] | None = None,
        ef_search: int | None = None,
        exact: bool = False,
    ) -> SearchResult:
        """Items like the ``positive`` examples and unlike the ``negative`` ones: each an item id or
        ``{"text": ...}``, ``{"vector": [...]}``, ``{"image": bytes}``."""
        body: dict[str, Any] = {
            "positive": [_core.example_body(e) for e in positive],
            "negative": [_core.example_body(e) for e in negative],
            "k": k,
        }
        body.update(drop_none(filter=dict(filter) if filter is not None else None, ef_search=ef_search))
        if exact:
            body["exact"] = True
        return await self._send(
            Call("POST", path(collection, "recommend"), as_model(SearchResult), json=body, read=True)
        )

    async def duplicates(
        self, collection: str, threshold: float, *, after: int = 0, scan: int = 500, per_item: int = 5
    ) -> DuplicatesPage:
        """One page of near-duplicate pairs; pass its ``next`` as ``after`` (``iter_duplicates`` does)."""
        body = {"threshold": threshold, "after": after, "scan": scan, "per_item": per_item}
        return await self._send(
            Call("POST", path(collection, "duplicates"), as_model(DuplicatesPage), json=body, read=True)
        )

    async def iter_duplicates(
        self, collection: str, threshold: float, *, scan: int = 500, per_item: int = 5
    ) -> AsyncIterator[DuplicatePair]:
        after: int | None = 0
        while after is not None:
            page = await self.duplicates(collection, threshold, after=after, scan=scan, per_item=per_item)
            for pair in page.pairs:
                yield pair
            after = page.next

    # Spaces.

    async def create_space(
        self,
        collection: str,
        name: str,
        model: str,
        *,
        metric: str | None = None,
        hnsw_m: int | None = None,
        hnsw_ef_construction: int | None = None,
        ef_search: int | None = None,
    ) -> Space:
        """A space of another model's vectors, filled in the background (``get_space`` says how far)."""
        body = drop_none(
            name=name, model=model, metric=metric, hnsw_m=hnsw_m, hnsw_ef_construction=hnsw_ef_construction,
            ef_search=ef_search,
        )  # fmt: skip
        return await self._send(Call("POST", path(collection, "spaces"), as_model(Space), json=body))

    async def list_spaces(self, collection: str) -> list[Space]:
        return await self._send(Call("GET", path(collection, "spaces"), _core.as_spaces, read=True))

    async def get_space(self, collection: str, name: str) -> Space:
        return await self._send(Call("GET", path(collection, "spaces", name), as_model(Space), read=True))

    async def activate_space(self, collection: str, name: str, *, force: bool = False) -> Space:
        body = {"force": True} if force else {}
        return await self._send(Call("POST", path(collection, "spaces", name, "activate"), as_model(Space), json=body))

    async def put_space_vectors(self, collection: str, name: str, vectors: Mapping[str, Sequence[float]]) -> int:
        """Vectors by external id for items stored as bare vectors (1,000 a request); the count written."""
        written = 0
        for chunk in _core.chunked(list(vectors.items()), 1000):
            body = {"vectors": {k: _core.vector_values(v, f"vectors[{k!r}]") for k, v in chunk}}
            written += await self._send(
                Call("PUT", path(collection, "spaces", name, "vectors"), _core.as_written, json=body)
            )
        return written

    async def delete_space(self, collection: str, name: str) -> None:
        await self._send(Call("DELETE", path(collection, "spaces", name), as_none))
