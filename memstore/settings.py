"""One settings object for the whole process, read from ``MEMSTORE_*`` environment variables."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

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
