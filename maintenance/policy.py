"""The policy: from a probe's figures to nothing, VACUUM or a concurrent rebuild. A pure function.

Why these rules (measurements in docs/maintenance.md):
- pgvector's VACUUM repairs every live element that has a dead neighbour; at m=16 an element has 32
  layer-0 neighbours, so with a dead fraction d about 1-(1-d)^32 of the graph is searched again
  (5% dead: 80%). Past a few percent a concurrent rebuild is cheaper, and it also restores the size
  and the graph quality a fresh build has. So dead entries are left to accumulate while recall and
  size are healthy, and then cleaned all at once by a rebuild.
- VACUUM stays the right tool where a rebuild's fixed costs dominate (tiny tables) and where few dead
  entries have waited long (their repair touches little of the graph).
- A verdict that rests on recall alone is taken on two independent samples (the worker confirms a low
  first reading before it pays for a rebuild).
- A collection with a recall target has its ef_search tuned to it (``maintenance.tuning``): the
  floor is then the target less ``recall_drop`` where that is lower, so a target under the floor does
  not make every tuned index look worn; a deeper search, not a rebuild, is the first remedy.
- No action is chosen that cannot change the figure it answers: VACUUM never shrinks an HNSW index
  nor rebuilds its graph, so on a small index (never rebuilt) a size or recall verdict with no dead
  entries to remove is "nothing", not the same VACUUM on every pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from maintenance.config import MaintenanceConfig
from maintenance.probes import Probe

Action = Literal["nothing", "vacuum", "rebuild"]


@dataclass(frozen=True)
class Decision:
    action: Action
    reason: str
    cleanup: bool = False  # INVALID leftovers to drop first (always done before anything else)

    @property
    def label(self) -> str:
        return (
            f"{self.action}+cleanup"
            if self.cleanup and self.action != "nothing"
            else ("cleanup" if self.cleanup else self.action)
        )


def decide(p: Probe, config: MaintenanceConfig) -> Decision:
    cleanup = bool(p.leftovers)
    if p.index is None:
        return Decision("nothing", "no valid HNSW index", cleanup)
    if p.live_rows == 0 and p.dead_entries == 0:
        return Decision("nothing", "empty", cleanup)
    small = p.index_bytes < config.small_index_bytes

    def heavy(reason: str) -> Decision:
        """A rebuild, or VACUUM where a rebuild's fixed costs dominate; nothing where VACUUM has
        already done all it could (see the module's docstring)."""
        if not small:
            return Decision("rebuild", reason, cleanup)
        if p.dead_entries > 0:
            return Decision("vacuum", reason, cleanup)
        return Decision(
            "nothing",
            f"{reason}, but VACUUM cannot change that and indexes under {config.small_index_bytes // 1024} kB "
            "are not rebuilt",
            cleanup,
        )

    recall = p.recall_value
    floor = config.recall_floor
    if p.recall_target is not None:
        floor = min(floor, p.recall_target - config.recall_drop)
    if recall is not None:
        if p.fresh_recall is None:
            # Never rebuilt by the worker: the absolute floor; one rebuild then tells what fresh gives.
            if recall < floor:
                return heavy(f"recall {recall:.3f} below {floor:.3f}")
        elif recall < p.fresh_recall - config.recall_drop and (p.churn_since_rebuild or 0) > 0:
            # Relative to what a fresh build gave: a rebuild cannot beat that, so no rebuild loops.
            return heavy(f"recall {recall:.3f} drifted from {p.fresh_recall:.3f} after the last rebuild")
    if p.dead_fraction >= config.compact_dead_fraction:
        return heavy(f"dead fraction {p.dead_fraction:.3f} at or over {config.compact_dead_fraction:.3f}")
    if p.size_ratio >= config.max_size_ratio and p.index_bytes > 4 * 8192:
        return heavy(f"index {p.size_ratio:.2f}x a fresh build (limit {config.max_size_ratio:.2f})")
    if p.dead_entries > 0 and p.dead_age_s is not None and p.dead_age_s >= config.max_dead_age_s:
        return Decision("vacuum", f"{p.dead_entries} dead entries older than {config.max_dead_age_s:.0f}s", cleanup)
    return Decision("nothing", "healthy", cleanup)
