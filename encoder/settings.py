"""Encoder settings from the environment (pydantic-settings).

`MEMSTORE_MODEL` and `MEMSTORE_PRETRAINED` are project-wide (API, workers and the encoder service
all read them); the encoder's own knobs are `MEMSTORE_ENCODER_*` so they cannot collide with the
core's settings.
"""

from __future__ import annotations

import functools
import os
import sys
from dataclasses import replace
from typing import Annotated, Literal

from pydantic import AliasChoices, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from .images import ImageOptions
from .types import Priority

# The weights a model gets when MEMSTORE_PRETRAINED is not set. A model missing here gets its first
# known tag ("default", resolved when it loads), or untrained weights, with a warning, if it has none.
DEFAULT_WEIGHTS: dict[str, str | None] = {
    "ViT-B-32": "laion2b_s34b_b79k",
    "memstore-tiny": None,
    "memstore-tiny-wide": None,
}
DEFAULT_PRETRAINED = "default"
OFFLINE_HINT = "MEMSTORE_MODEL=memstore-tiny MEMSTORE_PRETRAINED=none make run"


class EncoderSettings(BaseSettings):
    # .env as the core's Settings read it, so MEMSTORE_MODEL there reaches `memstore serve`.
    model_config = SettingsConfigDict(env_prefix="MEMSTORE_ENCODER_", env_file=".env", extra="ignore")

    model: str = Field(default="ViT-B-32", validation_alias=AliasChoices("MEMSTORE_MODEL", "model"))
    # A tag known to open_clip, a local checkpoint path, "default" (the model's usual weights), or
    # None ("none"/"" in the environment). Unset: DEFAULT_WEIGHTS for the model.
    pretrained: str | None = Field(
        default=DEFAULT_PRETRAINED, validation_alias=AliasChoices("MEMSTORE_PRETRAINED", "pretrained")
    )
    # More models served beside MEMSTORE_MODEL (the default): "name" (its usual weights) or
    # "name=pretrained", comma-separated. A request picks one by name; one scheduler serves them all.
    models: Annotated[list[tuple[str, str | None]], NoDecode] = Field(
        default_factory=list, validation_alias=AliasChoices("MEMSTORE_MODELS", "models")
    )
    device: str | None = None  # None: cuda when available, else cpu
    precision: str | None = None  # None: fp16 on cuda, fp32 on cpu
    cache_dir: str | None = None  # Hugging Face cache override (default: HF_HOME / ~/.cache)
    # torch intra-op threads for the encoder service; None: cores - 1 on CPU (a core stays free for
    # decoding and scheduling instead of fighting over it), torch's default on CUDA.
    torch_threads: int | None = Field(default=None, ge=1)
    # Keep the start-up's objects (torch, the model) out of the collector's passes (encoder.gc_freeze);
    # the same variable as the core's.
    gc_freeze: bool = Field(default=True, validation_alias=AliasChoices("MEMSTORE_GC_FREEZE", "gc_freeze"))
    # "trace": run micro-batches through a graph traced at their fixed shape (the whole forward pass
    # without the interpreter lock); "eager": the plain module, for models the tracer cannot follow.
    graph: Literal["trace", "eager"] = "trace"

    # Scheduler: fixed micro-batch shape, queue bounds, class shares, SLO.
    batch_size: int = Field(default=32, ge=1, le=1024)
    queue_units_query: int = Field(default=512, ge=1)
    queue_units_sync_ingest: int = Field(default=2048, ge=1)
    queue_units_background: int = Field(default=4096, ge=1)
    # Encoded image bytes admitted and not yet decoded, per class: each admitted image keeps its file
    # until a decoding thread reaches it, and the unit limits alone let the queues hold thousands of
    # files of up to max_image_bytes each.
    queue_bytes_query: int = Field(default=256 * 1024 * 1024, ge=1)
    queue_bytes_sync_ingest: int = Field(default=256 * 1024 * 1024, ge=1)
    queue_bytes_background: int = Field(default=256 * 1024 * 1024, ge=1)
    slo_query_p99_ms: float = Field(default=250.0, gt=0)
    min_query_share: float = Field(default=0.5, ge=0.0, le=1.0)
    sync_ingest_share: float = Field(default=0.75, ge=0.0, le=1.0)  # of what queries leave over
    deadline_sync_ingest_s: float = Field(default=2.0, gt=0)
    deadline_background_s: float = Field(default=30.0, gt=0)
    # Decoding threads; 0: preprocess inline in the submitting thread. More do not help on a GPU host:
    # eight prepared no more images a second than two beside an H200 (docs/encoder.md, "On a GPU").
    preprocess_workers: int = Field(default=2, ge=0)

    # Images.
    max_tiles: int = Field(default=36, ge=0, le=256)
    tile_threshold: float = Field(default=2.0, ge=1.0)
    global_weight: float = Field(default=0.5, ge=0.0, le=1.0)
    max_image_pixels: int = Field(default=64_000_000, ge=1)
    max_image_bytes: int = Field(default=32 * 1024 * 1024, ge=1)
    # The decode budget (encoder.decode_budget): work a file may ask for, and time a decode may take.
    max_jpeg_scans: int = Field(default=64, ge=1)
    max_image_frames: int = Field(default=1000, ge=1)
    decode_timeout_s: float = Field(default=5.0, gt=0)
    decode_workers: int = Field(default=2, ge=0)  # 0: every decode in-process, with no time limit
    inline_max_pixels: int = Field(default=4_000_000, ge=0)

    # Service and remote use.
    host: str = "127.0.0.1"
    port: int = Field(default=8001, ge=0, le=65535)
    url: str | None = None  # set: API and workers use the remote encoder service at this URL
    # The service's bearer key (and the one the API's remote client sends). Unset: no key is asked,
    # which the service allows on a loopback address only unless told otherwise (--allow-open).
    api_key: str | None = Field(default=None, repr=False)
    max_body_bytes: int = Field(default=64 * 1024 * 1024, ge=1024)  # largest /v1/embeddings request
    max_text_chars: int = Field(default=8192, ge=1)  # longest text (the tokenizer keeps 77 tokens anyway)

    @field_validator("pretrained", "device", "precision", "cache_dir", "url", "torch_threads", "api_key", mode="before")
    @classmethod
    def _none_words(cls, value: object) -> object:
        if isinstance(value, str) and value.strip().lower() in ("", "none", "null"):
            return None
        return value

    @field_validator("models", mode="before")
    @classmethod
    def _model_list(cls, value: object) -> object:
        """ "a,b=tag" -> [("a", usual weights), ("b", "tag")]; "b=none": untrained weights."""
        if not isinstance(value, str):
            return value
        out: list[tuple[str, str | None]] = []
        for part in (p.strip() for p in value.split(",")):
            if not part:
                continue
            name, _, tag = part.partition("=")
            weights = DEFAULT_WEIGHTS.get(name.strip(), DEFAULT_PRETRAINED) if not tag else tag.strip()
            out.append((name.strip(), None if str(weights).lower() in ("", "none", "null") else weights))
        return out

    @model_validator(mode="after")
    def _model_default_weights(self) -> EncoderSettings:
        if "pretrained" not in self.model_fields_set:
            self.pretrained = DEFAULT_WEIGHTS.get(self.model, DEFAULT_PRETRAINED)
        names = [self.model, *(name for name, _ in self.models)]
        if len(set(names)) != len(names):
            raise ValueError(f"MEMSTORE_MODELS names a model twice (or the default, {self.model}): {names}")
        return self

    def all_models(self) -> list[tuple[str, str | None]]:
        """(name, pretrained) of every model to serve, the default (MEMSTORE_MODEL) first."""
        return [(self.model, self.pretrained), *self.models]

    def service_torch_threads(self, device: str) -> int | None:
        if self.torch_threads is not None or device.startswith("cuda"):
            return self.torch_threads
        return max(1, (os.cpu_count() or 2) - 1)

    def image_options(self) -> ImageOptions:
        return ImageOptions(
            max_tiles=self.max_tiles,
            tile_threshold=self.tile_threshold,
            global_weight=self.global_weight,
            max_pixels=self.max_image_pixels,
            max_bytes=self.max_image_bytes,
            max_jpeg_scans=self.max_jpeg_scans,
            max_frames=self.max_image_frames,
            decode_timeout_s=self.decode_timeout_s,
            decode_workers=self.decode_workers,
            inline_max_pixels=self.inline_max_pixels,
        )

    def queue_limits(self) -> dict[Priority, int]:
        return {
            Priority.QUERY: self.queue_units_query,
            Priority.SYNC_INGEST: self.queue_units_sync_ingest,
            Priority.BACKGROUND: self.queue_units_background,
        }

    def queue_byte_limits(self) -> dict[Priority, int]:
        return {
            Priority.QUERY: self.queue_bytes_query,
            Priority.SYNC_INGEST: self.queue_bytes_sync_ingest,
            Priority.BACKGROUND: self.queue_bytes_background,
        }

    def default_deadline_s(self, priority: Priority) -> float:
        """Relative deadline of a one-batch request of this class (EDF key when none is given)."""
        if priority is Priority.QUERY:
            return self.slo_query_p99_ms / 1000.0
        if priority is Priority.SYNC_INGEST:
            return self.deadline_sync_ingest_s
        return self.deadline_background_s


@functools.cache
def encoder_settings() -> EncoderSettings:
    """The encoder's settings, read once per process (``MEMSTORE_ENCODER_*``)."""
    return EncoderSettings()


@functools.cache
def environment_options() -> ImageOptions:
    """The image limits the environment sets (MEMSTORE_ENCODER_*), read once; the defaults where
    they cannot be read. For decodes outside the encoder (thumbnails, OCR)."""
    try:
        return encoder_settings().image_options()
    except Exception:
        return ImageOptions()


def stored_options(max_pixels: int) -> ImageOptions:
    """The environment's decode budget for content already stored (thumbnails, OCR): ``max_pixels``
    and no byte bound."""
    return replace(environment_options(), max_pixels=max_pixels, max_bytes=sys.maxsize)
