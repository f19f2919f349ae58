"""``memstore-maint report --plot FILE.png``: recall, dead fraction and index size over time, actions marked."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

ACTION_COLOURS = {"compact": "tab:red", "vacuum": "tab:blue", "cleanup": "tab:orange", "own_index_cleanup": "tab:gray"}


def plot_history(probes: list[dict[str, Any]], actions: list[dict[str, Any]], path: Path, *, title: str = "") -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for p in sorted(probes, key=lambda r: r["taken_at"]):
        series[p["partition_table"]].append(p)
    fig, axes = plt.subplots(3, 1, figsize=(10, 9), sharex=True)
    for table, rows in series.items():
        times = [r["taken_at"] for r in rows]
        recall = [(r["taken_at"], r["recall"]) for r in rows if r["recall"] is not None]
        if recall:
            axes[0].plot(*zip(*recall, strict=True), marker="o", ms=3, label=table)
        axes[1].plot(
            times, [(r["dead_rows"] or 0) / max(r["live_rows"] or 1, 1) for r in rows], marker=".", label=table
        )
        axes[2].plot(times, [(r["index_bytes"] or 0) / 2**20 for r in rows], marker=".", label=f"{table} index")
        axes[2].plot(times, [(r["fresh_index_bytes"] or 0) / 2**20 for r in rows], ls=":", label=f"{table} fresh")
    seen: set[str] = set()
    for a in actions:
        colour = ACTION_COLOURS.get(a["action"], "black")
        label = a["action"] if a["action"] not in seen else None
        seen.add(a["action"])
        for ax in axes:
            ax.axvline(
                a["started_at"],
                color=colour,
                alpha=0.5 if a["outcome"] == "ok" else 0.2,
                lw=1,
                ls="-" if a["outcome"] == "ok" else "--",
                label=label if ax is axes[0] else None,
            )
    axes[0].set_ylabel("sampled recall@k")
    axes[1].set_ylabel("dead entries / live rows")
    axes[2].set_ylabel("index MiB")
    axes[2].set_xlabel("time")
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7, loc="lower left")
    axes[2].legend(fontsize=7, loc="upper left")
    fig.suptitle(title or "memstore maintenance history")
    fig.autofmt_xdate()
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
