"""RemoteEncoder: the EmbeddingEngine interface over HTTP, for API processes and ingest workers that
point at a separate encoder service (MEMSTORE_ENCODER_URL). Imports no torch."""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any

import httpx
import numpy as np

from .errors import (
    DecodeUnavailableError,
    DecompressionBombError,
    EncoderError,
    EncoderNoAnswerError,
    EncoderUnreachableError,
    ImageRejectedError,
    QueueFullError,
    RequestCancelledError,
    RequestTooLargeError,
    UnknownModelError,
)
from .tenancy import TENANT
from .types import EncoderInfo, ImageEmbedding, Priority

_PROBLEM = "urn:memstore:encoder:problem:"
_ERRORS: dict[str, type[EncoderError]] = {
    "decompression-bomb": DecompressionBombError,
    "request-too-large": RequestTooLargeError,
    "image-rejected": ImageRejectedError,
    "cancelled": RequestCancelledError,
    "model-not-found": UnknownModelError,
}
_RETRIED = {"decode-unavailable": DecodeUnavailableError}  # raised with the service's Retry-After


def _vector(value: list[float] | str) -> np.ndarray:
    if isinstance(value, str):
        return np.frombuffer(base64.b64decode(value), dtype="<f4").astype(np.float32)
    return np.asarray(value, dtype=np.float32)


class RemoteEncoder:
    """Same calls as EmbeddingEngine (`info`, `embed_texts`, `embed_images`), served remotely.

    429 answers raise QueueFullError with the service's Retry-After; other problem answers raise
    the matching encoder error, so callers handle local and remote encoders alike.
    """

    def __init__(
        self, base_url: str, timeout: float = 60.0, *, client: httpx.Client | None = None, api_key: str | None = None
    ) -> None:
        self.base_url = base_url.rstrip("/")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = client or httpx.Client(base_url=self.base_url, timeout=timeout, headers=headers)
        self._owns_client = client is None
        self.timeout = timeout
        self._info: EncoderInfo | None = None
        self._infos: dict[str, EncoderInfo] | None = None

    def close(self) -> None:
        if self._owns_client:
            self._client.close()

    def __enter__(self) -> RemoteEncoder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _url(self, path: str) -> str:
        return self.base_url + path

    def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """One request. A service that cannot be reached raises EncoderUnreachableError (no input is at
        fault); one that took the request and gave no answer, EncoderNoAnswerError (the input may be)."""
        try:
            return self._client.request(method, self._url(path), **kwargs)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            raise EncoderUnreachableError(f"the encoder service at {self.base_url} cannot be reached: {exc}") from exc
        except httpx.TransportError as exc:
            raise EncoderNoAnswerError(
                f"the encoder service at {self.base_url} gave no answer: {type(exc).__name__}: {exc}"
            ) from exc

    def health(self) -> dict[str, Any]:
        resp = self._send("GET", "/health")
        if resp.status_code not in (200, 503):
            self._raise(resp)
        data: dict[str, Any] = resp.json()
        return data

    @property
    def info(self) -> EncoderInfo:
        if self._info is None:
            self._info = EncoderInfo.from_dict(self.health())
        return self._info

    def _raise(self, resp: httpx.Response) -> None:
        try:
            body = resp.json()
        except ValueError:
            body = {}
        detail = str(body.get("detail") or resp.text or resp.reason_phrase)
        kind = str(body.get("type", "")).removeprefix(_PROBLEM)
        header = resp.headers.get("Retry-After", "")
        retry = float(body.get("retry_after") or (header if header.replace(".", "", 1).isdigit() else 1.0))
        if resp.status_code == 429:
            raise QueueFullError(detail, retry_after=retry)
        message = f"encoder service answered {resp.status_code}: {detail}"
        if kind in _RETRIED:
            raise _RETRIED[kind](message, retry_after=retry)
        raise _ERRORS.get(kind, EncoderError)(message)

    def _post(self, payload: dict[str, Any]) -> list[dict[str, Any]]:
        resp = self._send("POST", "/v1/embeddings", json=payload)
        if resp.status_code != 200:
            self._raise(resp)
        data: list[dict[str, Any]] = sorted(resp.json()["data"], key=lambda d: d["index"])
        return data

    @property
    def infos(self) -> dict[str, EncoderInfo]:
        """Every model the service runs, its default first."""
        if self._infos is None:
            listed = self.health().get("models") or [self.info.as_dict()]
            self._infos = {str(m["model"]): EncoderInfo.from_dict(m) for m in listed}
        return self._infos

    def _dimensions(self, model: str | None) -> int:
        if model is None:
            return self.info.dimensions
        if model not in self.infos:
            raise UnknownModelError(
                f"the encoder service does not run model {model!r}; it runs {', '.join(self.infos)}"
            )
        return self.infos[model].dimensions

    def _payload(
        self, items: list[str], modality: str, priority: Priority, deadline_s: float | None, model: str | None
    ) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "input": items,
            "modality": modality,
            "encoding_format": "base64",
            "priority": Priority.parse(priority).label,
        }
        if deadline_s is not None:
            payload["deadline_ms"] = deadline_s * 1000.0
        if model is not None:
            payload["model"] = model
        tenant = TENANT.get()
        if tenant:  # the service decodes its images for the same tenant (encoder.tenancy)
            payload["user"] = tenant
        return payload

    def embed_texts(
        self,
        texts: Sequence[str],
        *,
        priority: Priority = Priority.QUERY,
        deadline_s: float | None = None,
        model: str | None = None,
    ) -> np.ndarray:
        if not texts:
            return np.zeros((0, self._dimensions(model)), dtype=np.float32)
        data = self._post(self._payload(list(texts), "text", priority, deadline_s, model))
        return np.stack([_vector(d["embedding"]) for d in data])

    def embed_images(
        self,
        images: Sequence[bytes],
        *,
        priority: Priority = Priority.QUERY,
        deadline_s: float | None = None,
        return_tiles: bool = False,
        model: str | None = None,
    ) -> np.ndarray | list[ImageEmbedding]:
        if not images:
            return [] if return_tiles else np.zeros((0, self._dimensions(model)), dtype=np.float32)
        items = [base64.b64encode(bytes(b)).decode("ascii") for b in images]
        payload = self._payload(items, "image", priority, deadline_s, model)
        payload["return_tiles"] = return_tiles
        data = self._post(payload)
        if not return_tiles:
            return np.stack([_vector(d["embedding"]) for d in data])
        out = []
        for d in data:
            t = d["tiles"]
            vector = _vector(d["embedding"])
            tiles = [_vector(v) for v in t["embeddings"]]
            out.append(
                ImageEmbedding(
                    vector=vector,
                    global_vector=_vector(t["global_embedding"]),
                    tiles=np.stack(tiles) if tiles else np.zeros((0, len(vector)), dtype=np.float32),
                    boxes=[(int(b[0]), int(b[1]), int(b[2]), int(b[3])) for b in t["boxes"]],
                    weights=[float(w) for w in t["weights"]],
                    grid=(int(t["grid"][0]), int(t["grid"][1])),
                )
            )
        return out
