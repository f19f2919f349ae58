"""What the sync and the async client share: requests described as data (``Call``), the bodies,
the retry strategy, the read-your-writes position and the progress of batched uploads."""

from __future__ import annotations

import base64
import json
import math
import threading
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeAlias, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel
from tenacity import RetryCallState

from memstore_client.errors import APIError, ConnectionFailedError
from memstore_client.models import (
    Collection,
    Content,
    DeleteResult,
    ItemIn,
    ItemsAck,
    MetadataIndex,
    SearchHit,
    Space,
)

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)

LSN_HEADER = "X-Memstore-LSN"
MIN_LSN_HEADER = "X-Memstore-Min-LSN"
USER_AGENT = "memstore-client/0.1.0"

ItemLike: TypeAlias = ItemIn | Mapping[str, Any]
# A file to upload: a path, its bytes, or (file name, bytes).
FileLike: TypeAlias = str | Path | bytes | tuple[str, bytes]
# An image for a search or an example: its bytes or a path.
ImageLike: TypeAlias = bytes | str | Path
# A recommendation example: a stored item's id, or {"text": ...}, {"vector": [...]}, {"image": bytes|path}.
Example: TypeAlias = int | Mapping[str, Any]
Progress: TypeAlias = bool | Callable[[int], None]


@dataclass(frozen=True)
class RetryPolicy:
    """How answers that say "come back later" (429, 503) and failed connections are retried.

    ``attempts`` is the number of tries in all (1: no retry). The pause before each retry is the
    server's ``Retry-After`` when it gave one (at most ``max_retry_after_s``), else ``backoff_s``
    doubling up to ``max_backoff_s``. A connection that failed before the request was sent is always
    retried; one that broke after it (a read timeout, a reset) only for requests that are safe to
    repeat (reads, and writes keyed by external ids)."""

    attempts: int = 5
    backoff_s: float = 0.5
    max_backoff_s: float = 30.0
    max_retry_after_s: float = 120.0
    statuses: frozenset[int] = frozenset({429, 503})
    connection_errors: bool = True


NO_RETRY = RetryPolicy(attempts=1)


@dataclass(frozen=True)
class RetryEvent:
    """Passed to ``on_retry`` before each pause: the try about to come (``attempt`` of ``attempts``),
    the pause and the error that caused it."""

    attempt: int
    attempts: int
    sleep_s: float
    error: Exception


@dataclass
class Call(Generic[T]):
    """One API request, and how its answer is read."""

    method: str
    path: str
    parse: Callable[[httpx.Response], T]
    params: dict[str, Any] | None = None
    json: Any = None
    files: list[tuple[str, tuple[str, bytes]]] | None = None
    data: dict[str, Any] | None = None
    content: bytes | Callable[[], Iterator[bytes]] | None = None  # a callable: a fresh body each try
    headers: dict[str, str] | None = None
    read: bool = False  # carries the read-your-writes position
    idempotent: bool = False  # safe to send again after a broken connection
    accept: tuple[int, ...] = ()  # error statuses answered rather than raised
    retry: bool = True

    def __post_init__(self) -> None:
        if self.method in ("GET", "PUT", "DELETE", "HEAD") or self.read:
            self.idempotent = True


def path(*parts: str | int) -> str:
    return "/v1/collections/" + "/".join(quote(str(p), safe="") for p in parts)


def as_model(cls: type[M]) -> Callable[[httpx.Response], M]:
    def parse(response: httpx.Response) -> M:
        return cls.model_validate_json(response.content)

    return parse


def as_acks(response: httpx.Response) -> ItemsAck:
    ack = ItemsAck.model_validate_json(response.content)
    if ack.lsn is None and response.headers.get(LSN_HEADER):
        ack.lsn = response.headers[LSN_HEADER]
    return ack


def as_none(response: httpx.Response) -> None:
    return None


def as_response(response: httpx.Response) -> httpx.Response:
    return response


def as_json(response: httpx.Response) -> Any:
    return response.json()


def drop_none(**fields: Any) -> dict[str, Any]:
    return {k: v for k, v in fields.items() if v is not None}


def item_body(item: ItemLike, where: str = "item") -> dict[str, Any]:
    """An item as its JSON body; what JSON cannot carry is refused naming its place (``where``), before
    pydantic or the JSON encoder would refuse it without one."""
    if isinstance(item, ItemIn):
        model = item
        check_json(model.metadata, f"{where}.metadata")
    else:
        fields = dict(item)
        external_id = fields.get("external_id")
        if external_id is not None and not isinstance(external_id, str):
            raise TypeError(f"{where}.external_id is of type {type_name(external_id)}: an external id is a string")
        metadata = fields.get("metadata")
        if metadata is not None:
            if not isinstance(metadata, Mapping):
                raise TypeError(f"{where}.metadata is of type {type_name(metadata)}: metadata is a dict")
            fields["metadata"] = dict(metadata)
            check_json(fields["metadata"], f"{where}.metadata")
        model = ItemIn.model_validate(fields)
    check_json(model.external_id, f"{where}.external_id")
    check_json(model.text, f"{where}.text")
    body = model.body()
    if "vector" in body:
        body["vector"] = vector_values(body["vector"])
    return body


def type_name(value: object) -> str:
    kind = type(value)
    return kind.__name__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"


def check_json(value: Any, where: str) -> None:
    """Refuse what a JSON body cannot carry as it is, naming its place: a TypeError for a value that is no
    JSON value (a datetime, a numpy integer, a set) or a key that is no string, a ValueError for a NaN or
    an infinity, or a string with a lone surrogate (no UTF-8 for it). Nothing is converted: the caller
    says what a datetime should become."""
    if value is None or isinstance(value, bool | int):
        return
    if isinstance(value, str):
        if not value.isascii():
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise ValueError(
                    f"{where} holds a lone surrogate ({value[exc.start]!r} at {exc.start}): it has no UTF-8 encoding"
                ) from None
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{where} is {value}: JSON has no number for it")
        return
    if isinstance(value, dict):
        for key, inner in value.items():
            if not isinstance(key, str):
                raise TypeError(f"{where} has the key {key!r} of type {type_name(key)}: keys must be strings")
            place = f"{where}[{json.dumps(key)}]"
            check_json(key, place)
            check_json(inner, place)
        return
    if isinstance(value, list | tuple):
        for i, inner in enumerate(value):
            check_json(inner, f"{where}[{i}]")
        return
    raise TypeError(
        f"{where} is of type {type_name(value)}: give JSON values (str, int, float, bool, None, lists and dicts "
        "of them); convert it first (a datetime with .isoformat(), a numpy number with .item())"
    )


def items_call(collection: str, items: Sequence[ItemLike], wait: bool) -> Call[ItemsAck]:
    bodies = [item_body(item, f"items[{i}]") for i, item in enumerate(items)]
    return Call(
        "POST",
        path(collection, "items"),
        as_acks,
        params={"wait": "true"} if wait else None,
        json={"items": bodies},
        idempotent=all("external_id" in b for b in bodies),
    )


def delete_call(
    collection: str,
    ids: Sequence[int] | None,
    external_ids: Sequence[str] | None,
    filter: Mapping[str, Any] | None,
) -> Call[DeleteResult]:
    body = drop_none(
        ids=list(ids) if ids is not None else None,
        external_ids=list(external_ids) if external_ids is not None else None,
        filter=dict(filter) if filter is not None else None,
    )
    return Call(
        "POST",
        path(collection, "items", "delete"),
        as_model(DeleteResult),
        json=body,
        idempotent=filter is None,  # ids name what goes: deleting them twice deletes nothing more
    )


def file_part(file: FileLike, index: int) -> tuple[str, bytes]:
    if isinstance(file, tuple):
        return file[0], file[1]
    if isinstance(file, bytes):
        return f"file-{index}", file
    p = Path(file)
    return p.name, p.read_bytes()


def upload_call(
    collection: str,
    files: Sequence[FileLike],
    *,
    external_ids: Sequence[str] | None,
    metadata: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None,
    wait: bool,
) -> Call[ItemsAck]:
    """Images as multipart: one ``metadata`` object for all, or one per file (sent as one JSON array)."""
    parts = [("files", file_part(f, i)) for i, f in enumerate(files)]
    data: dict[str, Any] = {}
    if external_ids is not None:
        if len(external_ids) != len(files):
            raise ValueError(f"{len(external_ids)} external ids for {len(files)} files: give one per file")
        data["external_id"] = list(external_ids)
    if metadata is not None:
        if isinstance(metadata, Mapping):
            data["metadata"] = json.dumps(dict(metadata))
        else:
            if len(metadata) != len(files):
                raise ValueError(f"{len(metadata)} metadata objects for {len(files)} files: give one per file")
            data["metadata"] = json.dumps([dict(m) for m in metadata])
    return Call(
        "POST",
        path(collection, "items"),
        as_acks,
        params={"wait": "true"} if wait else None,
        files=parts,
        data=data or None,
        idempotent=external_ids is not None,
    )


def vector_values(vector: Iterable[Any], where: str = "vector") -> list[float]:
    """A vector as the JSON numbers a body carries (numpy arrays and any iterable of numbers); a NaN or
    an infinity is refused here, naming its place, since JSON has no number for it."""
    values = [float(x) for x in vector]
    for i, x in enumerate(values):
        if not math.isfinite(x):
            raise ValueError(f"{where}[{i}] is {x}: a vector's values must be finite numbers")
    return values


def image_b64(image: ImageLike) -> str:
    data = image if isinstance(image, bytes) else Path(image).read_bytes()
    return base64.b64encode(data).decode("ascii")


def search_body(
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
) -> dict[str, Any]:
    body = drop_none(
        text=text,
        vector=vector_values(vector) if vector is not None else None,
        image=image_b64(image) if image is not None else None,
        item_id=item_id,
        mode=mode,
        filter=dict(filter) if filter is not None else None,
        candidates=candidates,
        weights=dict(weights) if weights is not None else None,
        score_threshold=score_threshold,
        ef_search=ef_search,
        using=using,
        group_by=group_by,
        group_size=group_size,
    )
    body["k"] = k
    if offset:
        body["offset"] = offset
    if exact:
        body["exact"] = True
    if with_vector:
        body["with_vector"] = True
    return body


def example_body(example: Example) -> int | dict[str, Any]:
    if isinstance(example, int):
        return example
    out = dict(example)
    if "image" in out and not isinstance(out["image"], str):
        out["image"] = image_b64(out["image"])
    if "vector" in out:
        out["vector"] = vector_values(out["vector"])
    return out


def content_of(response: httpx.Response) -> Content:
    disposition = response.headers.get("Content-Disposition", "")
    filename = None
    for part in disposition.split(";"):
        key, _, value = part.strip().partition("=")
        if key == "filename*" and value.lower().startswith("utf-8''"):
            from urllib.parse import unquote

            filename = unquote(value[7:])
        elif key == "filename" and filename is None:
            filename = value.strip('"')
    return Content(
        content=response.content,
        content_type=response.headers.get("Content-Type", "application/octet-stream").split(";")[0],
        filename=filename,
    )


def ndjson_lines(items: Iterable[ItemLike]) -> Iterator[bytes]:
    for i, item in enumerate(items):
        yield json.dumps(item_body(item, f"items[{i}]"), separators=(",", ":")).encode() + b"\n"


def file_chunks(p: Path, size: int = 1 << 20) -> Callable[[], Iterator[bytes]]:
    def chunks() -> Iterator[bytes]:
        with p.open("rb") as fh:
            while block := fh.read(size):
                yield block

    return chunks


async def aiterate(chunks: Iterator[bytes]) -> AsyncIterator[bytes]:
    """A body of blocks read in turn (a file's, small reads) for httpx's async client."""
    for block in chunks:
        yield block


# The server refuses a POST .../items body over MEMSTORE_API_MAX_BODY_BYTES, 64 MiB by default
# (memstore/settings.py, docs/api.md "Limits"), however few items it holds: half of it leaves room
# for a server set somewhat lower.
MAX_BATCH_BYTES = 32 * 1024 * 1024


def item_batches(
    items: Iterable[ItemLike], size: int, max_bytes: int = MAX_BATCH_BYTES
) -> Iterator[list[dict[str, Any]]]:
    """Items as their bodies, at most ``size`` a batch, a batch cut before its JSON (encoded as httpx
    encodes it) would pass ``max_bytes``. An item larger than that alone goes alone: the server says
    what it makes of it."""
    empty = len(b'{"items":[]}')
    batch: list[dict[str, Any]] = []
    used = empty
    for i, item in enumerate(items):
        body = item_body(item, f"items[{i}]")
        encoded = json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        cost = len(encoded.encode("utf-8")) + 1  # the comma before it
        if batch and (len(batch) >= size or used + cost > max_bytes):
            yield batch
            batch, used = [], empty
        batch.append(body)
        used += cost
    if batch:
        yield batch


def chunked(items: Iterable[T], size: int) -> Iterator[list[T]]:
    batch: list[T] = []
    for item in items:
        batch.append(item)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


class ProgressBar:
    """``progress=True``: a tqdm bar on stderr; a callable: called with each batch's item count."""

    def __init__(self, progress: Progress, total: int | None, desc: str) -> None:
        self.callback: Callable[[int], None] | None = None
        self.bar: Any = None
        if callable(progress):
            self.callback = progress
        elif progress:
            from tqdm import tqdm

            self.bar = tqdm(total=total, unit="item", desc=desc)

    def update(self, n: int) -> None:
        if self.callback is not None:
            self.callback(n)
        if self.bar is not None:
            self.bar.update(n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def total_of(items: Iterable[Any], total: int | None) -> int | None:
    if total is not None:
        return total
    try:
        return len(items)  # type: ignore[arg-type]
    except TypeError:
        return None


def lsn_value(lsn: str) -> int:
    high, _, low = lsn.partition("/")
    return (int(high, 16) << 32) + int(low, 16)


class Positions:
    """The highest write position (``X-Memstore-LSN``) this client has seen."""

    def __init__(self) -> None:
        self.last: str | None = None
        self._lock = threading.Lock()

    def note(self, lsn: str | None) -> None:
        if not lsn:
            return
        with self._lock:
            try:
                if self.last is None or lsn_value(lsn) > lsn_value(self.last):
                    self.last = lsn
            except ValueError:
                return


class Base:
    """Settings and request plumbing common to ``Client`` and ``AsyncClient``."""

    def __init__(
        self,
        url: str,
        api_key: str | None,
        *,
        retry: RetryPolicy | int | None,
        on_retry: Callable[[RetryEvent], None] | None,
        read_your_writes: bool,
        headers: Mapping[str, str] | None,
    ) -> None:
        self.url = url.rstrip("/")
        self.api_key = api_key
        if retry is None:
            retry = NO_RETRY
        elif isinstance(retry, int):
            retry = RetryPolicy(attempts=max(1, retry))
        self.retry_policy: RetryPolicy = retry
        self.on_retry = on_retry
        self.read_your_writes = read_your_writes
        self.positions = Positions()
        self.base_headers = {"User-Agent": USER_AGENT, **(headers or {})}
        if api_key:
            self.base_headers["Authorization"] = f"Bearer {api_key}"

    @property
    def last_lsn(self) -> str | None:
        """The highest write position (``X-Memstore-LSN``) an answer to this client has carried."""
        return self.positions.last

    def note_lsn(self, lsn: str) -> None:
        """Count a position written elsewhere (another client's) as one this client's reads must see."""
        self.positions.note(lsn)

    def request_kwargs(self, call: Call[Any], min_lsn: str | None = None) -> dict[str, Any]:
        headers = dict(call.headers or {})
        floor = min_lsn or (self.positions.last if (call.read and self.read_your_writes) else None)
        if floor:
            headers[MIN_LSN_HEADER] = floor
        kwargs: dict[str, Any] = {"headers": headers}
        if call.params:
            kwargs["params"] = call.params
        if call.json is not None:
            kwargs["json"] = call.json
        if call.files is not None:
            kwargs["files"] = call.files
        if call.data is not None:
            kwargs["data"] = call.data
        return kwargs

    def check(self, call: Call[Any], response: httpx.Response) -> httpx.Response:
        if response.status_code >= 400 and response.status_code not in call.accept:
            raise error_from(response)
        if not call.read and response.status_code < 300:
            self.positions.note(response.headers.get(LSN_HEADER))
        return response

    def connection_error(self, call: Call[Any], exc: httpx.TransportError) -> ConnectionFailedError:
        error = ConnectionFailedError(self.url, exc)
        error.idempotent = call.idempotent
        return error

    # tenacity's pieces, the same for Retrying and AsyncRetrying.

    def should_retry(self, exc: BaseException) -> bool:
        policy = self.retry_policy
        if isinstance(exc, APIError):
            return exc.status in policy.statuses
        if isinstance(exc, ConnectionFailedError):
            return policy.connection_errors and (not exc.sent or exc.idempotent)
        return False

    def pause(self, state: RetryCallState) -> float:
        policy = self.retry_policy
        error = state.outcome.exception() if state.outcome is not None else None
        if isinstance(error, APIError):
            asked = error.retry_after
            if asked is not None:
                return min(asked, policy.max_retry_after_s)
        return float(min(policy.max_backoff_s, policy.backoff_s * 2.0 ** (state.attempt_number - 1)))

    def before_sleep(self, state: RetryCallState) -> None:
        if self.on_retry is None or state.outcome is None or state.next_action is None:
            return
        error = state.outcome.exception()
        if isinstance(error, Exception):
            self.on_retry(
                RetryEvent(
                    attempt=state.attempt_number + 1,
                    attempts=self.retry_policy.attempts,
                    sleep_s=state.next_action.sleep,
                    error=error,
                )
            )


def error_from(response: httpx.Response) -> APIError:
    from memstore_client.errors import error_from_response

    return error_from_response(response)


def columns_to_items(
    *,
    texts: Sequence[str | None] | None = None,
    vectors: Sequence[Sequence[float]] | None = None,
    ids: Sequence[str] | None = None,
    metadatas: Sequence[Mapping[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    n = len(texts) if texts is not None else len(vectors or [])
    for name, values in (("vectors", vectors), ("ids", ids), ("metadatas", metadatas), ("texts", texts)):
        if values is not None and len(values) != n:
            raise ValueError(f"{len(values)} {name} for {n} items")
    out = []
    for i in range(n):
        item: dict[str, Any] = {}
        if ids is not None:
            item["external_id"] = ids[i]
        if texts is not None and texts[i] is not None:
            item["text"] = texts[i]
        if vectors is not None:
            item["vector"] = vector_values(vectors[i], f"vectors[{i}]")
        if metadatas is not None:
            item["metadata"] = dict(metadatas[i])
        out.append(item)
    return out


def as_collections(response: httpx.Response) -> list[Collection]:
    return [Collection.model_validate(c) for c in response.json()["collections"]]


def as_indexes(response: httpx.Response) -> list[MetadataIndex]:
    return [MetadataIndex.model_validate(i) for i in response.json()["indexes"]]


def as_spaces(response: httpx.Response) -> list[Space]:
    return [Space.model_validate(s) for s in response.json()["spaces"]]


def as_found(response: httpx.Response) -> dict[str, int]:
    return {str(k): int(v) for k, v in response.json()["found"].items()}


def as_written(response: httpx.Response) -> int:
    return int(response.json()["written"])


def as_batch(response: httpx.Response) -> list[list[SearchHit]]:
    return [[SearchHit.model_validate(h) for h in hits] for hits in response.json()["results"]]
