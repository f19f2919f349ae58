"""The PNG of ``bench.stream``: rows/s (against COPY + CREATE INDEX) and recall@10 per write path."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _bars(result: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Each option, and for the tail designs also their state once the last seal indexed every row."""
    out: list[tuple[str, dict[str, Any]]] = []
    for name, o in result["options"].items():
        if "rows_per_s" not in o:  # a peer that was skipped
            continue
        out.append((name + (" (acked)" if "indexed" in o else ""), o))
        if "indexed" in o:
            out.append((name + " (indexed)", o["indexed"]))
    return out


def plot(result: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bars = _bars(result)
    names = [n for n, _ in bars]
    y = list(range(len(bars)))
    fig, (ax_rate, ax_recall) = plt.subplots(1, 2, figsize=(13, 0.42 * len(bars) + 1.8), sharey=True)
    ax_rate.barh(y, [o["ratio_vs_copy_build"] for _, o in bars], color="tab:blue")
    ax_rate.axvline(1.0, color="black", ls=":", lw=1)
    ax_rate.set_xlabel("rows/s over COPY + CREATE INDEX (parallel build)")
    for ef, dy, colour in (("40", -0.2, "tab:orange"), ("80", 0.2, "tab:green")):
        ax_recall.barh(
            [v + dy for v in y], [o["recall_at_10"].get(ef, float("nan")) for _, o in bars], height=0.4, color=colour
        )
        fresh = result["options"]["copy_build_parallel"]["recall_at_10"][ef]
        ax_recall.axvline(fresh, color=colour, ls=":", lw=1, label=f"ef {ef} (fresh parallel build: {fresh:.3f})")
    lows = [o["recall_at_10"][ef] for _, o in bars for ef in ("40", "80") if ef in o["recall_at_10"]]
    ax_recall.set_xlim(max(0.0, min(lows) - 0.01), 1.0)
    ax_recall.set_xlabel(f"recall@{result['k']}")
    ax_recall.legend(fontsize=8, loc="lower left")
    ax_rate.set_yticks(y, names, fontsize=8)
    ax_rate.invert_yaxis()
    for ax in (ax_rate, ax_recall):
        ax.grid(axis="x", alpha=0.3)
    fig.suptitle(
        f"bench.stream: {result['dataset']}, {result['rows']:,} rows (batches as named, else {result['batch']:,}), "
        f"m {result['hnsw']['m']}, ef_construction {result['hnsw']['ef_construction']}"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)
