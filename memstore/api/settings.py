"""The API's own settings (``MEMSTORE_API_*``): authentication and request limits."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from memstore.search.request import MAX_K


class ApiSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="MEMSTORE_API_", env_file=".env", extra="ignore")

    auth: Literal["keys", "off"] = Field(
        default="keys",
        description="keys: every /v1 request needs 'Authorization: Bearer KEY'. off: no checks, for local use only.",
    )
    max_body_bytes: int = Field(
        default=64 * 1024 * 1024, ge=1024, description="Largest upload body (POST .../items: files, texts, vectors)."
    )
    max_search_body_bytes: int = Field(
        default=16 * 1024 * 1024, ge=1024, description="Largest search body (a query image, base64 or multipart)."
    )
    max_json_body_bytes: int = Field(
        default=1024 * 1024,
        ge=1024,
        description="Largest body of every other route (lookups, deletes, edits, collections): small JSON only.",
    )
    max_load_body_bytes: int = Field(
        default=4 * 1024**3,
        ge=1024,
        description="Largest bulk load body (POST .../load: NDJSON vectors), spooled to a temporary file.",
    )
    max_files_per_request: int = Field(default=64, ge=1, le=10_000, description="Image files per upload.")
    max_items_per_request: int = Field(default=1000, ge=1, le=100_000, description="JSON items (texts or vectors).")
    max_text_chars: int = Field(default=8192, ge=1, description="Longest text item or text query.")
    max_k: int = Field(default=MAX_K, ge=1, le=MAX_K, description="Most results one search returns.")
    access_log: Literal["all", "sampled", "off"] = Field(
        default="sampled",
        description="all: one log line per request (uvicorn's access log; it costs a vector search about a tenth of "
        "the API's throughput). sampled: a line for every answer of 400 or more and for one in "
        "MEMSTORE_API_ACCESS_LOG_EVERY of the others; every request is counted in /metrics either way. off: no "
        "lines, where a proxy in front logs the requests already. true and false read as all and off.",
    )
    access_log_every: int = Field(
        default=100,
        ge=0,
        description="With MEMSTORE_API_ACCESS_LOG=sampled: one line for every this many answers under 400 (0: none; "
        "answers of 400 or more always have theirs).",
    )
    query_sample_rate: float = Field(
        default=0.01, ge=0.0, le=1.0, description="Share of query vectors kept for maintenance's recall probes."
    )
    max_query_image_pixels: int = Field(
        default=16_000_000,
        ge=1,
        description="Most pixels of a search's query image (decoding costs by pixels, not bytes: a tiny 1-bit "
        "PNG can hold 64 million); lower than the ingest limit, MEMSTORE_ENCODER_MAX_IMAGE_PIXELS.",
    )
    health_detail: Literal["key", "public"] = Field(
        default="key",
        description="key: /health shows versions, model, queue and workers to a valid key only (everyone gets "
        "status and reasons). public: to everyone.",
    )
    key_cache_s: float = Field(default=5.0, ge=0.0, description="How long a verified key is trusted.")
    max_head_bytes: int = Field(
        default=64 * 1024,
        ge=4096,
        description="Largest request head (request line and headers together): a longer one is answered 431 and "
        "its connection closed while it arrives (memstore serve).",
    )
    max_header_lines: int = Field(
        default=100, ge=8, description="Most header lines in one request: more are answered 431 (memstore serve)."
    )
    head_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="Seconds a client has to send a whole request head, from its first byte (from the connection's "
        "opening for a new one): a slower one is answered 408 and its connection closed (memstore serve).",
    )
    keep_alive_s: int = Field(
        default=5, ge=1, description="Seconds an idle keep-alive connection is kept open (memstore serve)."
    )
    searches_per_key: int | None = Field(
        default=None,
        ge=0,
        description="Most searches one key runs at once (search, batch, recommend, duplicates); more are answered "
        "429 with Retry-After. Unset: half the search connections (MEMSTORE_POOL_SIZE / 2, at least 1); "
        "0: no limit. With auth off there is one identity and no limit.",
    )
    metrics_cache_s: float = Field(
        default=5.0,
        ge=0.0,
        description="How long /metrics (no key needed) reuses its reading of the ingest queue's depth before it "
        "reads the database again.",
    )
    signing_key: SecretStr | None = Field(
        default=None,
        description="The key that signs the web pages' sign-in form (its pre-session cookie and CSRF token). Unset: "
        "a random key per process; set one shared by every API process behind a load balancer.",
    )

    @field_validator("access_log", mode="before")
    @classmethod
    def _access_log_words(cls, value: object) -> object:
        """The setting was a boolean before it had a sampled mode: true is every line, false none."""
        if isinstance(value, bool):
            return "all" if value else "off"
        if isinstance(value, str):
            word = value.strip().lower()
            return {"true": "all", "1": "all", "yes": "all", "false": "off", "0": "off", "no": "off"}.get(word, word)
        return value
