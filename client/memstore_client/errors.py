"""The client's exceptions: every problem+json answer of the API as an ``APIError`` of its type.

The server answers each error as an RFC 9457 problem document (``type``, ``title``, ``status``,
``detail``, ``instance``, and sometimes ``errors``, ``limit``, ``retry_after``, ``items``). It is
raised as the subclass registered for its type (``NotFoundError`` for ``/problems/not-found``...),
``APIError`` itself for a type this client does not know, so ``except APIError`` catches them all and
``error.type``, ``error.status`` and ``error.detail`` are always there.
"""

from __future__ import annotations

import email.utils
import json
import time
from typing import Any, ClassVar

import httpx

__all__ = [
    "APIError",
    "AuthenticationError",
    "ConflictError",
    "ConnectionFailedError",
    "ImageRejectedError",
    "IngestFailedError",
    "InternalServerError",
    "InvalidInputError",
    "MalformedRequestError",
    "MemstoreError",
    "MethodNotAllowedError",
    "NotFoundError",
    "PayloadTooLargeError",
    "PermissionDeniedError",
    "RateLimitedError",
    "ServerTimeoutError",
    "ServiceUnavailableError",
    "UnsupportedMediaTypeError",
    "error_from_response",
    "retry_after_of",
]


class MemstoreError(Exception):
    """Anything this client raises about the server: an error answer, or no answer at all."""


class ConnectionFailedError(MemstoreError):
    """The server could not be reached, or the connection broke before an answer (after the retries)."""

    def __init__(self, url: str, cause: BaseException) -> None:
        super().__init__(f"cannot reach {url}: {cause}")
        self.url = url
        self.cause = cause
        # Whether the request may have reached the server (a read timeout, a reset), and whether it
        # is safe to send again: the retry strategy repeats only what is.
        self.sent = not isinstance(cause, httpx.ConnectError | httpx.ConnectTimeout)
        self.idempotent = False


class APIError(MemstoreError):
    """An error answer. ``type`` is the problem's slug (``not-found``), ``type_uri`` its full ``type``
    (``/problems/not-found``); ``problem`` holds the whole document, with any extra members."""

    slug: ClassVar[str | None] = None

    def __init__(
        self,
        *,
        status: int,
        type: str,
        title: str,
        detail: str,
        instance: str | None = None,
        problem: dict[str, Any] | None = None,
        response: httpx.Response | None = None,
    ) -> None:
        super().__init__(f"{status} {title}: {detail}" if title else f"{status}: {detail}")
        self.status = status
        self.type_uri = type
        self.type = type.rsplit("/", 1)[-1] if type else ""
        self.title = title
        self.detail = detail
        self.instance = instance
        self.problem: dict[str, Any] = problem or {}
        self.response = response

    @property
    def errors(self) -> list[dict[str, Any]]:
        """Each invalid field (``field``, ``message``) of an ``invalid-input`` answer, when given."""
        value = self.problem.get("errors")
        return value if isinstance(value, list) else []

    @property
    def retry_after(self) -> float | None:
        """Seconds the server asked to wait (its ``Retry-After`` header, else the ``retry_after`` member)."""
        return None if self.response is None else retry_after_of(self.response)

    @property
    def headers(self) -> httpx.Headers:
        return self.response.headers if self.response is not None else httpx.Headers()


class MalformedRequestError(APIError):
    slug = "malformed-request"


class AuthenticationError(APIError):
    slug = "unauthorized"


class PermissionDeniedError(APIError):
    slug = "forbidden"


class NotFoundError(APIError):
    slug = "not-found"


class MethodNotAllowedError(APIError):
    slug = "method-not-allowed"


class ConflictError(APIError):
    slug = "conflict"


class PayloadTooLargeError(APIError):
    slug = "payload-too-large"

    @property
    def limit(self) -> Any:
        return self.problem.get("limit")


class UnsupportedMediaTypeError(APIError):
    slug = "unsupported-media-type"


class InvalidInputError(APIError):
    slug = "invalid-input"


class ImageRejectedError(InvalidInputError):
    slug = "image-rejected"


class IngestFailedError(APIError):
    """With ``wait=True``: the items were stored but could not be embedded; ``items`` says which and why."""

    slug = "ingest-failed"

    @property
    def items(self) -> list[dict[str, Any]]:
        value = self.problem.get("items")
        return value if isinstance(value, list) else []


class RateLimitedError(APIError):
    slug = "too-many-requests"


class InternalServerError(APIError):
    slug = "internal-error"


class ServiceUnavailableError(APIError):
    slug = "service-unavailable"


class ServerTimeoutError(APIError):
    slug = "timeout"


_BY_SLUG: dict[str, type[APIError]] = {
    cls.slug: cls
    for cls in (
        MalformedRequestError,
        AuthenticationError,
        PermissionDeniedError,
        NotFoundError,
        MethodNotAllowedError,
        ConflictError,
        PayloadTooLargeError,
        UnsupportedMediaTypeError,
        InvalidInputError,
        ImageRejectedError,
        IngestFailedError,
        RateLimitedError,
        InternalServerError,
        ServiceUnavailableError,
        ServerTimeoutError,
    )
    if cls.slug is not None
}
# An answer that is not a problem document (a proxy's page): its class by status.
_BY_STATUS: dict[int, type[APIError]] = {
    400: MalformedRequestError,
    401: AuthenticationError,
    403: PermissionDeniedError,
    404: NotFoundError,
    405: MethodNotAllowedError,
    409: ConflictError,
    413: PayloadTooLargeError,
    415: UnsupportedMediaTypeError,
    422: InvalidInputError,
    429: RateLimitedError,
    500: InternalServerError,
    503: ServiceUnavailableError,
    504: ServerTimeoutError,
}


def error_from_response(response: httpx.Response) -> APIError:
    """The exception for an error answer: by its problem type when it is a problem document, else by
    its status."""
    body: Any = None
    try:
        body = json.loads(response.content) if response.content else None
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("type"), str):
        slug = body["type"].rsplit("/", 1)[-1]
        cls = _BY_SLUG.get(slug) or _BY_STATUS.get(response.status_code, APIError)
        return cls(
            status=int(body.get("status") or response.status_code),
            type=body["type"],
            title=str(body.get("title") or ""),
            detail=str(body.get("detail") or ""),
            instance=body.get("instance") if isinstance(body.get("instance"), str) else None,
            problem=body,
            response=response,
        )
    cls = _BY_STATUS.get(response.status_code, APIError)
    text = response.text[:500] if response.content else ""
    return cls(
        status=response.status_code,
        type=f"/problems/{cls.slug}" if cls.slug else "",
        title=response.reason_phrase,
        detail=text or response.reason_phrase,
        problem=body if isinstance(body, dict) else None,
        response=response,
    )


def retry_after_of(response: httpx.Response) -> float | None:
    """The wait a response asks for: ``Retry-After`` in seconds or as an HTTP date, else a problem
    document's ``retry_after`` member; None when it asks for none."""
    header = response.headers.get("Retry-After")
    if header:
        try:
            return max(0.0, float(header))
        except ValueError:
            try:
                when = email.utils.parsedate_to_datetime(header)
            except (TypeError, ValueError):
                when = None
            if when is not None:
                return max(0.0, when.timestamp() - time.time())
    try:
        body = json.loads(response.content) if response.content else None
    except ValueError:
        return None
    if isinstance(body, dict) and isinstance(body.get("retry_after"), int | float):
        return max(0.0, float(body["retry_after"]))
    return None
