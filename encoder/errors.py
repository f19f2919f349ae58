"""The encoder's own errors. Only the HTTP layer (encoder.service) turns them into status codes."""

from __future__ import annotations


class EncoderError(Exception):
    """Base class for every error raised by the encoder package."""


class UnknownModelError(EncoderError, ValueError):
    """The model name is not a registered open_clip configuration."""


class WeightsNotFoundError(EncoderError, FileNotFoundError):
    """Pretrained weights are neither cached nor downloadable; the message says how to provide them."""


class ImageRejectedError(EncoderError, ValueError):
    """An input image cannot be used: unsupported format, corrupt or truncated data, too many bytes."""


class DecompressionBombError(ImageRejectedError):
    """The image declares more work than allowed (pixels, JPEG scans, frames), read from its header and
    structure before any pixel is decoded. ``limit`` is the limit it broke, where one applies."""

    def __init__(self, message: str, limit: float | None = None) -> None:
        super().__init__(message)
        self.limit = limit


class DecodeTimeoutError(DecompressionBombError):
    """Decoding the image ran past the decode time limit (``limit``, in seconds) and was stopped."""


class DecodeUnavailableError(EncoderError):
    """The image could not be decoded for a reason not known to be its own: a decode worker died or did
    not start, or memory ran out. Not a ValueError, so nothing treats it as a verdict on the image:
    retry after ``retry_after`` seconds (an image that keeps bringing workers down spends its retries)."""

    def __init__(self, message: str, retry_after: float = 5.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class RequestTooLargeError(EncoderError, ValueError):
    """The request alone needs more queue room than its class has; it can never be admitted."""


class QueueFullError(EncoderError):
    """The priority class's queue is full; retry after `retry_after` seconds."""

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class EncoderUnreachableError(EncoderError):
    """The encoder service could not be reached (connection refused, connect timeout): the request never
    arrived, so no input is at fault; callers retry once the service is back."""


class EncoderNoAnswerError(EncoderError):
    """The encoder service took the request but no answer came (the connection broke, or the answer did
    not come in time): the service stopped mid-request, or the input itself may have brought it down."""


class RequestCancelledError(EncoderError):
    """The request was cancelled (by its caller, a timeout, or the engine shutting down)."""
