"""A Python client for the memstore REST API.

```python
from memstore_client import Client

with Client("http://127.0.0.1:8000", api_key="msk_...") as ms:
    ms.create_collection("notes", dimensions=3)
    ms.add_items("notes", [{"external_id": "n1", "vector": [0.1, 0.2, 0.3], "text": "a red bicycle"}])
    for hit in ms.search("notes", vector=[0.1, 0.2, 0.3], k=5).results:
        print(hit.external_id, hit.score)
```

``AsyncClient`` has the same methods, to be awaited. ``memstore_client.langchain`` (the
``langchain`` extra) is a LangChain vector store on top of them.
"""

from memstore_client._async import AsyncClient
from memstore_client._core import NO_RETRY, RetryEvent, RetryPolicy
from memstore_client._sync import Client
from memstore_client.errors import (
    APIError,
    AuthenticationError,
    ConflictError,
    ConnectionFailedError,
    ImageRejectedError,
    IngestFailedError,
    InternalServerError,
    InvalidInputError,
    MalformedRequestError,
    MemstoreError,
    MethodNotAllowedError,
    NotFoundError,
    PayloadTooLargeError,
    PermissionDeniedError,
    RateLimitedError,
    ServerTimeoutError,
    ServiceUnavailableError,
    UnsupportedMediaTypeError,
)
from memstore_client.models import (
    Collection,
    Content,
    DuplicatePair,
    DuplicatesPage,
    Health,
    HitRanks,
    Item,
    ItemAck,
    ItemIn,
    ItemPage,
    ItemsAck,
    LoadResult,
    MetadataIndex,
    Ocr,
    SearchGroup,
    SearchHit,
    SearchResult,
    Space,
)

__version__ = "0.1.0"

__all__ = [
    "NO_RETRY",
    "APIError",
    "AsyncClient",
    "AuthenticationError",
    "Client",
    "Collection",
    "ConflictError",
    "ConnectionFailedError",
    "Content",
    "DuplicatePair",
    "DuplicatesPage",
    "Health",
    "HitRanks",
    "ImageRejectedError",
    "IngestFailedError",
    "InternalServerError",
    "InvalidInputError",
    "Item",
    "ItemAck",
    "ItemIn",
    "ItemPage",
    "ItemsAck",
    "LoadResult",
    "MalformedRequestError",
    "MemstoreError",
    "MetadataIndex",
    "MethodNotAllowedError",
    "NotFoundError",
    "Ocr",
    "PayloadTooLargeError",
    "PermissionDeniedError",
    "RateLimitedError",
    "RetryEvent",
    "RetryPolicy",
    "SearchGroup",
    "SearchHit",
    "SearchResult",
    "ServerTimeoutError",
    "ServiceUnavailableError",
    "Space",
    "UnsupportedMediaTypeError",
]
