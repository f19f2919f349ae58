"""The PNG of ``bench.foreground``: search p99 a second and the background's rate over time, the phases
with the controller on shaded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

RATE_STEP_S = 2.0  # the rate is drawn over steps this long (the trace ticks every 0.25 s)


def phase_spans(trace: list[dict[str, Any]]) -> list[tuple[float, float, str]]:
    """(start, end, mode) of each run of trace points in one mode."""
    spans: list[tuple[float, float, str]] = []
    for point in trace:
        if spans and spans[-1][2] == point["mode"]:
            spans[-1] = (spans[-1][0], point["t"], point["mode"])
        else:
            spans.append((point["t"], point["t"], point["mode"]))
    return spans


def rates(trace: list[dict[str, Any]], step_s: float = RATE_STEP_S) -> list[tuple[float, float]]:
    """(time, units a second) over steps of ``step_s`` from the trace's cumulative counts."""
    out: list[tuple[float, float]] = []
    if not trace:
        return out
    last = trace[0]
    for point in trace[1:]:
        if point["t"] - last["t"] >= step_s:
            out.append((point["t"], (point["done"] - last["done"]) / (point["t"] - last["t"])))
            last = point
    return out


def plot(result: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    trace = result["share_trace"]
    fig, (ax_p99, ax_rate) = plt.subplots(2, 1, figsize=(11, 6.5), sharex=True)
    for start, end, mode in phase_spans(trace):
        for ax in (ax_p99, ax_rate):
            if mode == "on":
                ax.axvspan(start, end, color="tab:green", alpha=0.12, lw=0)
    windows = result["search_windows"]
    ax_p99.plot(
        [w["t"] for w in windows],
        [w["p99_ms"] for w in windows],
        color="tab:blue",
        lw=1,
        label="search p99 (each second)",
    )
    idle = result["idle_before"]["p99_ms"]
    if idle:
        ax_p99.axhline(idle, color="black", ls=":", lw=1, label=f"idle p99 ({idle:.1f} ms)")
        ax_p99.axhline(2 * idle, color="tab:red", ls="--", lw=1, label="goal: 2 x idle")
    ax_p99.set_ylabel("ms")
    ax_p99.set_yscale("log")
    ax_p99.legend(loc="upper right", fontsize=8)
    ax_p99.set_title(
        f"{result['background']}: p99 {result['p99_ratio_on']}x idle with the controller (green), "
        f"{result['p99_ratio_off']}x without; rate on/off {result['background_rate_ratio_on_vs_off']}",
        fontsize=10,
    )
    points = rates(trace)
    ax_rate.plot([t for t, _ in points], [r for _, r in points], color="tab:orange", lw=1.2)
    ax_rate.set_ylabel(f"{result['unit']} / s")
    share = ax_rate.twinx()
    share.plot([p["t"] for p in trace], [p["share"] for p in trace], color="tab:gray", lw=0.8, alpha=0.7)
    share.set_ylabel("background share", color="tab:gray")
    share.set_ylim(0, 1.05)
    ax_rate.set_xlabel("seconds since the stream started")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
