"""The q/s-against-recall plot of a ``bench.peers`` run (one line per system, the ef ladder along it).

``python -m bench.peers_plot RESULT.json OUT.png`` draws it again from a saved result."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display: write the file only
import matplotlib.pyplot as plt


def plot(result: dict[str, Any], path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(8, 5.5))
    for row in result["systems"].values():
        curve = sorted((int(ef), point) for ef, point in row["curve"].items())
        recalls = [point["recall"] for _, point in curve]
        qps = [point["qps"] for _, point in curve]
        (line,) = ax.plot(recalls, qps, marker="o", label=row["label"])
        for (ef, _), r, q in zip(curve, recalls, qps, strict=True):
            ax.annotate(str(ef), (r, q), textcoords="offset points", xytext=(3, 3), fontsize=7, color=line.get_color())
        # The table's figure: q/s timed over warm passes at the chosen ef (the curve is one pass a step).
        ax.plot([row["recall"]], [row["search_qps"]], marker="*", markersize=14, color=line.get_color(), alpha=0.8)
    ax.axvline(result["recall_target"], color="grey", linestyle=":", linewidth=1)
    ax.set_yscale("log")
    ax.set_xlabel("recall@10 (against exact neighbours)")
    ax.set_ylabel("searches per second, one client (log)")
    kind = "halfvec index" if result["representation"] == "halfvec" else "vector index"
    ax.set_title(
        f"{result['rows']:,} x {result['dims']} clustered vectors, HNSW m 16, ef_construction 64 ({kind})\n"
        "labels: ef_search (one pass a step); stars: the timed figures at the chosen ef",
        fontsize=9,
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


if __name__ == "__main__":
    import json
    import sys

    plot(json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2]))
