"""The settings of a memstore process, read once from ``MEMSTORE_*`` environment variables (and a
``.env`` file): the core's (``Settings``), the API's (``ApiSettings``, ``MEMSTORE_API_*``), the ingest
workers' (``IngestSettings``, ``MEMSTORE_INGEST_*``) and the web pages' (``UiSettings``,
``MEMSTORE_UI_*``), each behind a getter that reads it once per process. Code takes a settings object
as an argument where a caller may give one, else the getter's; nothing builds one of its own. The
encoder's settings are the encoder's (``encoder.settings``: it knows nothing of memstore), the
maintenance worker's are ``maintenance.config``.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from memstore.inputs import MAX_K

# A size in a PostgreSQL setting, with its unit (also checked before it is written to the server's
# configuration, memstore.db.embedded).
SERVER_SIZE = r"[1-9][0-9]*(kB|MB|GB|TB)"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="MEMSTORE_", env_file=".env", extra="ignore")

    database_url: str | None = Field(
        default=None,
        description="PostgreSQL >= 16 with pgvector >= 0.8. Unset: the embedded PostgreSQL 18 server.",
    )
    read_database_urls: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Hot standbys of the database for reads (searches, item reads, listings), comma-separated; "
        "writes, the queue, keys and maintenance stay on the primary. Unset: every read goes to the primary.",
    )
    max_replica_lag_s: float = Field(
        default=5.0, gt=0, description="A standby further behind than this serves no reads until it catches up."
    )
    replica_wait_s: float = Field(
        default=0.5,
        ge=0,
        description="How long a read given a min_lsn (read-your-writes) waits for a standby to replay it "
        "before it is served by the primary.",
    )
    data_dir: Path = Field(
        default=Path.home() / ".memstore",
        description="Where the embedded server keeps its data (and other local state).",
    )
    # Server tuning applied to the embedded server (and printed as advice for external ones).
    maintenance_work_mem: str = Field(
        default="1GB", description="Memory for HNSW builds: a graph that fits builds several times faster."
    )
    max_parallel_maintenance_workers: int = Field(
        default=2, ge=0, le=64, description="Extra processes for one index build."
    )
    background_build_workers: int | None = Field(
        default=None,
        ge=0,
        le=64,
        description="Extra processes for a build nobody waits for (a seal, a merge, a rebuild, a new space's "
        "index), at most max_parallel_maintenance_workers. Unset: on a server on this machine (the embedded one, "
        "a Unix socket, a loopback address) the machine's cores less two, one core left to searches; on "
        "another server max_parallel_maintenance_workers.",
    )
    embedded_shared_buffers: str = Field(
        default="auto",
        pattern=rf"^(auto|{SERVER_SIZE})$",
        description="The embedded server's buffer cache, e.g. 2GB; 'auto': an eighth of the machine's memory, "
        "between 128MB and 4GB. Read when the server starts.",
    )
    pool_size: int = Field(default=8, ge=1, le=256, description="Connections kept per process.")
    pool_max_overflow: int = Field(default=8, ge=0, le=256)

    # Defaults for new collections.
    default_hnsw_m: int = Field(default=16, ge=2, le=100)
    default_hnsw_ef_construction: int = Field(default=64, ge=4, le=1000)
    default_ef_search: int = Field(default=80, ge=1, le=1000)
    # The most a filtered search or a search through dead tuples may visit before giving up.
    max_scan_tuples: int = Field(default=20_000, ge=1)
    search_timeout_ms: int = Field(
        default=5_000,
        ge=0,
        le=3_600_000,
        description="The longest one search statement may run on the server (PostgreSQL's statement_timeout on "
        "the search connections); past it the search is cancelled and answers 504. 0: no limit.",
    )

    # Bulk loads (memstore.items.bulk_load): a load this large against its collection goes in without the
    # HNSW index and builds it afterwards; smaller ones go into the live index.
    # Collections written as segments (memstore.catalog.segments, memstore.items.sealing).
    seal_rows: int = Field(
        default=5_000,
        ge=100,
        description=(
            "A segmented collection's tail gets a graph of its own once it holds this many rows (until "
            "then its rows are searched exactly: the bound on what a search reads without a graph)."
        ),
    )
    segments_max: int = Field(
        default=12,
        ge=2,
        description="A segmented collection's graphs are merged into one when they reach this many, writes or not.",
    )
    segments_quiet_s: float = Field(
        default=30.0,
        ge=0,
        description="A segmented collection's graphs are merged into one after this many seconds without a seal.",
    )
    seal_interval_s: float = Field(
        default=1.0, gt=0, description="How often the sealer looks at the segmented collections written to."
    )
    bulk_min_rows: int = Field(
        default=10_000, ge=1, description="The fewest rows a load needs before it may build the index afresh."
    )
    bulk_fraction: float = Field(
        default=1.0,
        ge=0,
        description="A load builds the index afresh when it brings at least this fraction of the rows already there.",
    )
    bulk_connections: int = Field(
        default=4, ge=1, le=64, description="Connections inserting side by side when a load goes into a live index."
    )

    # Foreground first (memstore.services.foreground): background work yields to searches.
    search_p99_slo_ms: float | None = Field(
        default=None,
        gt=0,
        description="The p99 latency searches should keep (over MEMSTORE_FOREGROUND_WINDOW_S); while it is "
        "exceeded, background work (ingest, re-embedding, OCR, photo facts) is given less of the process. "
        "Unset: MEMSTORE_FOREGROUND_BASELINE_FACTOR x the p99 of recent windows without background work.",
    )
    foreground: bool = Field(
        default=True, description="Whether background work yields to searches at all (false: always full speed)."
    )
    foreground_shared: bool = Field(
        default=True,
        description="A process that answers searches publishes its share in the database, and background work "
        "in other processes (memstore worker, the maintenance daemon) follows the lowest fresh one.",
    )
    foreground_window_s: float = Field(
        default=1.0, gt=0, le=60, description="The window search p99 is measured over; the share is set 4x a window."
    )
    foreground_baseline_factor: float = Field(
        default=2.0,
        ge=1,
        description="Without MEMSTORE_SEARCH_P99_SLO_MS, the target is this many times the p99 of searches "
        "measured while no background work ran.",
    )
    background_connections: int = Field(
        default=2,
        ge=1,
        le=64,
        description="Units of background work (each holds one database connection at a time) running at once at "
        "a full share; fewer as the share falls, none at zero.",
    )

    gc_freeze: bool = Field(
        default=True,
        description="Once the API process has started (and again once its model has loaded), the objects made so far "
        "are kept out of the garbage collector's passes (gc.freeze): a full collection over them held every search "
        "for about 0.2 s with a model loaded. false: the collector as CPython has it.",
    )
    encoder_load_yield: bool = Field(
        default=True,
        description="While a local model loads (/health says starting), the interpreter switches threads every "
        "0.5 ms instead of 5 ms, so the loader, which holds the interpreter lock for long stretches, does not make "
        "each search wait for it (searches that need no model ran at 0.4 of their speed before). false: as before.",
    )

    # HTTP
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=1, le=65535)

    @field_validator("read_database_urls", mode="before")
    @classmethod
    def _comma_separated(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()


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


# A background process's CPU priority (memstore.services.cpu_priority applies it).
CpuPriority = Literal["normal", "low", "idle"]


class IngestSettings(BaseSettings):
    """``MEMSTORE_INGEST_*``: how workers claim, retry and give up."""

    model_config = SettingsConfigDict(env_prefix="MEMSTORE_INGEST_", env_file=".env", extra="ignore")

    batch_size: int = Field(default=32, ge=1, le=1024, description="Queue rows one worker claims at a time.")
    max_attempts: int = Field(default=5, ge=1, le=100, description="Attempts before an item is marked failed.")
    backoff_base_s: float = Field(default=2.0, ge=0.0, description="Delay before the 1st retry; doubles after.")
    backoff_max_s: float = Field(default=300.0, ge=0.0)
    poll_interval_s: float = Field(default=5.0, gt=0.0, description="Queue poll when no NOTIFY arrives.")
    wait_timeout_s: float = Field(default=30.0, gt=0.0, description="How long ?wait=true waits for vectors.")
    cpu_priority: CpuPriority = Field(
        default="idle",
        description="CPU priority of a `memstore worker` process (it answers no search): idle runs it on cores "
        "nothing else wants (Linux SCHED_IDLE), low at nice 10, normal as started.",
    )


class UiSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="MEMSTORE_UI_", env_file=".env", extra="ignore")

    session_hours: float = Field(
        default=12.0, gt=0, le=24 * 30, description="How long a sign-in lasts (sessions end sooner with their key)."
    )
    results: int = Field(default=24, ge=1, le=200, description="Hits per search on the collection page.")
    neighbours: int = Field(default=8, ge=1, le=100, description="Nearest neighbours shown on an item's page.")


@lru_cache(maxsize=1)
def get_api_settings() -> ApiSettings:
    return ApiSettings()


@lru_cache(maxsize=1)
def get_ingest_settings() -> IngestSettings:
    return IngestSettings()


@lru_cache(maxsize=1)
def get_ui_settings() -> UiSettings:
    return UiSettings()


def reread() -> None:
    """Forget what every getter read (tests that change the environment; a process reads once)."""
    for getter in (get_settings, get_api_settings, get_ingest_settings, get_ui_settings):
        getter.cache_clear()
