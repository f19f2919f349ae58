"""The engine's bookkeeping types: one queued request, a tick's report, future helpers."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from concurrent.futures import CancelledError, Future, InvalidStateError
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from .errors import RequestCancelledError
from .images import ImageSpec
from .scheduling import RequestState
from .tiling import TilePlan
from .types import EncoderInfo, Modality, Priority


class BatchEncoder(Protocol):
    """What the engine needs from a model (encoder.models.Encoder, or a fake in tests)."""

    info: EncoderInfo
    spec: ImageSpec
    batch_size: int

    def tokenize(self, texts: Sequence[str]) -> Any: ...
    # tokens: an (n, context) integer array; views: an (n, S, S, 3) uint8 array or a list of n views.
    def encode_text_batch(self, tokens: Any, *, urgent: bool = True) -> np.ndarray: ...
    def encode_image_batch(self, views: Any, *, urgent: bool = True) -> np.ndarray: ...


@dataclass(frozen=True)
class TickReport:
    modality: Modality
    units: int  # real units in the batch (the rest was padding)
    requests: tuple[int, ...]  # ids of the requests that had units in it
    completed: tuple[int, ...]  # ids of the requests that finished with it
    seconds: float
    model: str = ""


class QueuedRequest:
    def __init__(
        self,
        rid: int,
        priority: Priority,
        modality: Modality,
        n_units: int,
        deadline: float,
        seq: int,
        submitted: float,
        dims: int,
        model: str = "",
    ) -> None:
        self.id, self.priority, self.modality, self.seq, self.model = rid, priority, modality, seq, model
        self.deadline, self.submitted, self.n_units = deadline, submitted, n_units
        self.future: Future[Any] = Future()
        self.inputs: list[Any] = [None] * n_units
        self.ready: dict[int, None] = {}  # insertion-ordered set of unit indices
        self.pending = n_units
        self.queued = n_units  # units counted against the class's queue limit
        self.encoded_bytes = 0  # image bytes not yet decoded, counted against the class's byte limit
        self.done = 0
        self.served = 0  # units handed to the model so far
        self.vectors = np.zeros((n_units, dims), dtype=np.float32)
        self.plans: list[TilePlan] = []
        self.return_tiles = False

    def state(self) -> RequestState:
        return RequestState(
            self.id,
            self.priority,
            self.modality,
            self.deadline,
            self.seq,
            tuple(self.ready),
            self.pending,
            self.served,
            self.model,
        )


def done_future(value: Any) -> Future[Any]:
    fut: Future[Any] = Future()
    fut.set_result(value)
    return fut


def fail_future(fut: Future[Any], error: BaseException) -> None:
    with contextlib.suppress(InvalidStateError):
        fut.set_exception(error)


def wait_future(fut: Future[Any], timeout: float | None) -> Any:
    try:
        return fut.result(timeout)
    except FutureTimeout:
        fut.cancel()
        raise RequestCancelledError(f"no result within {timeout} s; the request was cancelled") from None
    except CancelledError:
        raise RequestCancelledError("the request was cancelled") from None
