"""``memstore-maint report --plot FILE.png``: recall (with each collection's ef_search beside it), dead fraction and
index size over time, actions marked."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime
from pathlib import Path
from typing import Any

ACTION_COLOURS = {
    "rebuild": "tab:red",
    "compact": "tab:red",
    "vacuum": "tab:blue",
    "cleanup": "tab:orange",
    "own_index_cleanup": "tab:gray",
    "tune": "tab:green",
}


def ef_history(actions: list[dict[str, Any]]) -> dict[str, list[tuple[datetime, int]]]:
    """Each collection's default ef_search over time, from its recall target's tunings: the ef before a
    tuning at its start, the ef it set at its end (an unchanged ef is a point on the same level)."""
    steps: dict[str, list[tuple[datetime, int]]] = defaultdict(list)
    for a in sorted(actions, key=lambda r: r["started_at"]):
        if a["action"] != "tune" or a["outcome"] != "ok" or a["finished_at"] is None:
            continue
        before, after = a.get("before") or {}, a.get("after") or {}
        if isinstance(before.get("ef_search"), int):
            steps[a["collection"]].append((a["started_at"], before["ef_search"]))
        if isinstance(after.get("ef_search"), int):
            steps[a["collection"]].append((a["finished_at"], after["ef_search"]))
    return dict(steps)


def after_points(actions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each successful vacuum's or rebuild's ``after`` figures as a probe row at its finish time: the
    probes before an action show the index it found, these what it left (the next probe may be a pass
    away)."""
    points: list[dict[str, Any]] = []
    for a in actions:
        after = a.get("after") or {}
        if a["outcome"] != "ok" or a.get("finished_at") is None or after.get("index_bytes") is None:
            continue
        points.append(
            {
                "taken_at": a["finished_at"],
                "partition_table": a["partition_table"],
                "live_rows": after.get("live_rows"),
                "dead_rows": after.get("dead_entries"),
                "index_bytes": after["index_bytes"],
                "fresh_index_bytes": after.get("fresh_bytes"),
                "recall": after.get("recall"),
            }
        )
    return points


def plot_history(probes: list[dict[str, Any]], actions: list[dict[str, Any]], path: Path, *, title: str = "") -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for p in sorted([*probes, *after_points(actions)], key=lambda r: r["taken_at"]):
        series[p["partition_table"]].append(p)
    # One colour per table in every panel (matplotlib's cycle would differ between panels).
    palette = plt.get_cmap("tab10")
    colours = {table: palette(i % 10) for i, table in enumerate(sorted(series))}
    fig, axes = plt.subplots(3, 1, figsize=(10, 9), sharex=True)
    for table, rows in series.items():
        colour = colours[table]
        times = [r["taken_at"] for r in rows]
        recall = [(r["taken_at"], r["recall"]) for r in rows if r["recall"] is not None]
        if recall:
            axes[0].plot(*zip(*recall, strict=True), marker="o", ms=3, color=colour, label=table)
        dead = [(r["dead_rows"] or 0) / max(r["live_rows"] or 1, 1) for r in rows]
        axes[1].plot(times, dead, marker=".", color=colour, label=table)
        axes[2].plot(times, [(r["index_bytes"] or 0) / 2**20 for r in rows], marker=".", color=colour, label=table)
        axes[2].plot(times, [(r["fresh_index_bytes"] or 0) / 2**20 for r in rows], ls=":", color=colour)
    if series:  # the dotted lines share one legend entry: what a fresh build of that table would take
        axes[2].plot([], [], ls=":", color="gray", label="fresh build (estimate)")
    seen: set[str] = set()
    for a in actions:
        marker_colour = ACTION_COLOURS.get(a["action"], "black")
        label = a["action"] if a["action"] not in seen else None
        seen.add(a["action"])
        for ax in axes:
            ax.axvline(
                a["started_at"],
                color=marker_colour,
                alpha=0.5 if a["outcome"] == "ok" else 0.2,
                lw=1,
                ls="-" if a["outcome"] == "ok" else "--",
                label=label if ax is axes[1] else None,
            )
    efs = ef_history(actions)
    if efs:  # a recall target's tunings: the ef searches get, beside the recall it buys
        ef_axis = axes[0].twinx()
        end = max([r["taken_at"] for rows in series.values() for r in rows] + [t for s in efs.values() for t, _ in s])
        for collection, steps in sorted(efs.items()):
            at, ef = zip(*[*steps, (end, steps[-1][1])], strict=True)
            ef_axis.step(at, ef, where="post", ls="--", lw=1.2, label=f"{collection} ef_search")
        ef_axis.set_ylabel("default ef_search (tuned)")
        ef_axis.set_ylim(bottom=0)
        ef_axis.legend(fontsize=7, loc="lower right")
    axes[0].set_ylabel("sampled recall@k")
    top = max([1.0] + [r["recall"] for rows in series.values() for r in rows if r["recall"] is not None])
    low = min([0.9] + [r["recall"] for rows in series.values() for r in rows if r["recall"] is not None])
    axes[0].set_ylim(max(0.0, low - 0.02), min(1.0, top) + 0.005)  # recall never exceeds 1
    axes[1].set_ylabel("dead entries / live rows")
    axes[2].set_ylabel("index MiB")
    axes[2].set_xlabel("time")
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7, loc="lower left", title="table", title_fontsize=7)
    axes[1].legend(fontsize=7, loc="upper left", title="table, actions", title_fontsize=7)
    axes[2].legend(fontsize=7, loc="upper left", title="index size", title_fontsize=7)
    fig.suptitle(title or "memstore maintenance history")
    fig.autofmt_xdate()
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
