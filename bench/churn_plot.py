"""The PNG of ``bench.churn``: recall and index size per round for each strategy."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def plot(result: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_recall, ax_size) = plt.subplots(1, 2, figsize=(12, 4.5))
    for name, s in result["strategies"].items():
        rounds = list(range(len(s["recall"])))
        ax_recall.plot(rounds, s["recall"], marker="o", label=f"{name} ({s['maint_seconds']:.1f}s maint)")
        # Against a fresh build of as many rows as the table had then (the concurrent inserts grow it).
        per_row = (s["fresh_index_bytes"] or 1) / max(s["live_rows"][-1], 1)
        ratios = [b / (per_row * n) for b, n in zip(s["index_bytes"], s["live_rows"], strict=True)]
        ax_size.plot(rounds, ratios, marker="o", label=name)
    ax_recall.axhline(result["fresh_recall"], color="black", ls=":", lw=1, label="fresh build")
    ax_recall.set_xlabel("round (0 = fresh build)")
    ax_recall.set_ylabel(f"recall@{result['k']} at ef_search {result['ef_search']}")
    ax_size.axhline(1.1, color="red", ls=":", lw=1, label="goal: 1.1x")
    ax_size.set_xlabel("round (0 = fresh build)")
    ax_size.set_ylabel("index bytes / fresh build bytes")
    for ax in (ax_recall, ax_size):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(
        f"bench.churn: {result['dataset']}, {result['rows']} rows, {result['rounds']} rounds of "
        f"{result['churn_fraction']:.0%} churn; policy cost {result['cost_ratio_policy_vs_vacuum']:.2f}x vacuum"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def plot_target(result: dict[str, Any], path: Path) -> Path:
    """``--recall-target``: the policy's recall at its tuned ef per round against the target, its
    ef per round against the fixed ef that held the target throughout, and its rebuilds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = result["recall_target"]
    policy = result["strategies"]["policy"]["target"]
    rounds = list(range(len(policy["recall"])))
    fixed = str(t["fixed_ef"])
    fig, (ax_recall, ax_ef) = plt.subplots(1, 2, figsize=(12, 4.5))
    ax_recall.plot(rounds, policy["recall"], marker="o", label="policy, at its tuned ef")
    ax_recall.plot(
        rounds, [ladder[fixed] for ladder in policy["ladder"]], marker="s", ls="--", label=f"fixed ef {fixed}"
    )
    if "vacuum" in result["strategies"]:
        ax_recall.plot(
            rounds, result["strategies"]["vacuum"]["recall"], marker=".", label=f"vacuum, ef {result['ef_search']}"
        )
    ax_recall.axhline(t["target"], color="black", ls=":", lw=1, label=f"target {t['target']:g}")
    ax_recall.axhline(t["floor"], color="red", ls=":", lw=1, label=f"goal: >= {t['floor']:g}")
    ax_recall.set_ylabel(f"recall@{result['k']} (held-out queries)")
    ax_ef.step(rounds, policy["ef_search"], where="post", marker="o", label="policy's tuned ef_search")
    ax_ef.axhline(t["fixed_ef"], color="gray", ls="--", lw=1, label=f"fixed ef {fixed}")
    for r in t["rebuild_rounds"]:
        ax_ef.axvline(r, color="red", alpha=0.4, lw=4, label="rebuild" if r == t["rebuild_rounds"][0] else None)
    ax_ef.set_ylabel("ef_search")
    for ax in (ax_recall, ax_ef):
        ax.set_xlabel("round (0 = fresh build, before the first pass)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    ratio = t["cost_ratio_policy_vs_vacuum"]
    fig.suptitle(
        f"bench.churn --recall-target {t['target']:g}: {result['dataset']}, {result['rows']} rows, "
        f"{result['rounds']} rounds of {result['churn_fraction']:.0%}; q/s tuned / fixed "
        f"{t['qps_ratio_tuned_vs_fixed']:.2f}" + ("" if ratio is None else f"; policy cost {ratio:.2f}x vacuum")
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)
