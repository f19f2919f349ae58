"""The maintenance worker's knobs, read from ``MEMSTORE_MAINT_*`` environment variables.

The defaults come from measurements on this project's machine (docs/maintenance.md has the numbers
and the commands that produced them).
"""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from maintenance.tuning import DEFAULT_DESIGN_EFFECT, DEFAULT_TOLERANCE, DEFAULT_Z, MAX_EF, Margin


class MaintenanceConfig(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="MEMSTORE_MAINT_", env_file=".env", extra="ignore")

    # --- policy (see maintenance.policy) ---
    compact_dead_fraction: float = Field(
        default=0.10,
        gt=0,
        le=1,
        description="Dead index entries per live row from which the index is rebuilt: above about 5% "
        "pgvector's VACUUM repairs most of the graph and a concurrent rebuild is cheaper.",
    )
    max_size_ratio: float = Field(
        default=1.09, gt=1, description="Compact when the index is this much larger than a fresh build would be."
    )
    recall_floor: float = Field(default=0.95, ge=0, le=1, description="Compact when sampled recall falls below.")
    recall_drop: float = Field(
        default=0.02, ge=0, le=1, description="Compact when sampled recall is this far below the index's fresh recall."
    )
    small_index_bytes: int = Field(
        default=1 << 20,
        ge=0,
        description="Below this index size a plain VACUUM (tens of ms) beats a concurrent rebuild's fixed cost.",
    )
    max_dead_age_s: float = Field(
        default=24 * 3600.0,
        ge=0,
        description="Dead entries older than this are cleaned (by VACUUM while they are few) even below the "
        "rebuild threshold, so a slowly churning index still gets its space back.",
    )
    own_index_cleanup: bool = Field(
        default=True,
        description="Set vacuum_index_cleanup = off on collection tables: autovacuum then only prunes the heap "
        "and the worker decides when the index is cleaned (by a rebuild, which is cheaper).",
    )

    # --- recall probe ---
    recall_k: int = Field(default=10, ge=1, le=100)
    recall_sample: int = Field(default=20, ge=1, le=1000, description="Query vectors per recall probe.")
    recall_on_replica: bool = Field(
        default=False,
        description="Measure sampled recall on a hot standby (the first healthy one of MEMSTORE_READ_DATABASE_URLS): "
        "its index is the primary's, replayed page for page, and the probe's exact scans then cost the primary "
        "nothing. The primary's index is probed when no standby answers.",
    )
    recall_churn_fraction: float = Field(
        default=0.10,
        ge=0,
        description="Measure recall again once this fraction of the rows changed since the last measurement.",
    )
    recall_interval_s: float = Field(default=3600.0, ge=0, description="... or once this much time has passed.")
    recall_cost_fraction: float = Field(
        default=0.05,
        gt=0,
        description="A recall probe may cost at most this fraction of the index's last rebuild time (at least "
        "5 queries): the check must stay cheap next to the remedy.",
    )
    rebuild_rows_per_s: float = Field(
        default=4000.0,
        gt=0,
        description="Assumed build speed before the worker has timed a rebuild of an index (measured here: "
        "100k x 128-d in 25 s, 720 x 1024-d in 0.17 s).",
    )
    recall_budget_s: float = Field(
        default=10.0, gt=0, description="Stop adding queries to a probe past this many seconds (min 5 queries)."
    )
    probe_timeout_s: float = Field(
        default=600.0,
        ge=0,
        description="statement_timeout of the reads of a recall probe or a tuning (their exact scans; 0: none): "
        "a scan that outgrew every budget is cancelled and the pass goes on, where it would run unbounded.",
    )

    # --- recall target (see maintenance.tuning) ---
    tune_sample: int = Field(
        default=100,
        ge=5,
        le=1000,
        description="Queries of a recall-target tuning (its ladder of ef_search values shares one exact scan).",
    )
    tune_sample_max: int = Field(
        # The API keeps the latest 1,000 query samples of a collection. At 1M clustered rows a draw of
        # 100 to 200 of them read recall 0.965 at an ef where 1,000 held-out queries read 0.933
        # (bench.recall_target, docs/maintenance.md): the undecided rungs need the queries there are.
        default=1000,
        ge=5,
        le=5000,
        description="Queries a tuning may grow to, in one more round of fresh queries where the ef would move: a "
        "lower ef must pass again on them, a higher one is checked against the undecided rungs below it.",
    )
    tune_z: float = Field(
        default=DEFAULT_Z,
        gt=0,
        description="Normal quantile of the tuning's margin: the chosen ef_search's recall must reach the target "
        "at this one-sided confidence (1.645: 95%).",
    )
    tune_design_effect: float = Field(
        default=DEFAULT_DESIGN_EFFECT,
        ge=1,
        description="The least design effect assumed: the per-neighbour trials (k x queries) are divided by "
        "the one measured on the sample's queries (the misses of one query come together), at least this.",
    )
    tune_tolerance: float = Field(
        default=DEFAULT_TOLERANCE,
        ge=0,
        le=0.1,
        description="How far below the target the chosen ef_search's lower confidence bound may read; the "
        "sample's recall itself must reach the target. 0: the bound must reach the target (several times the "
        "ef on clustered data, whose queries are hit or miss as a whole).",
    )
    search_horizon_s: float = Field(
        default=24 * 3600.0,
        gt=0,
        description="With a recall target, the policy weighs an action's seconds against the search seconds it "
        "would save over this long (the measured searches per second at the ef each choice leaves).",
    )
    tune_max_ef: int = Field(default=MAX_EF, ge=1, le=MAX_EF, description="The largest ef_search a tuning may set.")

    # --- safety ---
    lock_timeout_ms: int = Field(default=2000, ge=1, description="lock_timeout of every maintenance statement.")
    ddl_retries: int = Field(default=5, ge=0, description="Retries of a statement that hit the lock timeout.")
    retry_backoff_s: float = Field(default=1.0, ge=0)
    slo_p99_ms: float = Field(default=250.0, gt=0, description="Foreground search latency above which work waits.")
    slo_max_wait_s: float = Field(default=300.0, ge=0, description="How long to wait for latency to recover.")
    vacuum_cost_delay_ms: float = Field(
        default=0.0, ge=0, le=100, description="vacuum_cost_delay of the worker's VACUUMs (0: full speed)."
    )

    # --- loop ---
    interval_s: float = Field(default=300.0, gt=0, description="Seconds between passes of the daemon.")

    def margin(self) -> Margin:
        """The tuning's margin, as the keyword arguments of ``maintenance.tuning``'s decisions."""
        return Margin(z=self.tune_z, design_effect=self.tune_design_effect, tolerance=self.tune_tolerance)
