"""Growth exponents, goals, the PNG and the markdown table of ``bench.scale``.

An exponent is the slope of a least-squares line through (log rows, log figure): 1 means the figure
grows in proportion to the rows, 0 that it does not grow.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

# The figures whose growth is fitted: name in the exponents -> path in one size's row.
FIGURES: dict[str, str] = {
    "ingest_rows_per_s": "ingest_rows_per_s",
    "build_s": "build_s",
    "index_bytes_per_row": "index_bytes_per_row",
    "ef_search": "ef_search",
    "search_qps": "search_qps",
    "search_p50_ms": "search_p50_ms",
    "search_p99_ms": "search_p99_ms",
    "search_p99_ms_default_ef": "at_default_ef.search_p99_ms",
    "recall_default_ef": "at_default_ef.recall_at_10",
    "vacuum_s": "maintenance.vacuum_s",
    "policy_s": "maintenance.policy_s",
}

GOALS = {
    "index_bytes_per_row_spread<=1.10": "largest over smallest index bytes per row across sizes",
    "search_p99_growth<=2.5": "search p99 at recall 0.95, largest size over smallest",
    "policy_cost<=0.25": "the policy's seconds over plain VACUUM's, at every size",
}


def figure(row: dict[str, Any], path: str) -> float | None:
    value: Any = row
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return float(value) if isinstance(value, int | float) else None


def exponent(sizes: list[int], values: list[float | None]) -> float | None:
    points = [(n, v) for n, v in zip(sizes, values, strict=True) if v is not None and v > 0]
    if len(points) < 2:
        return None
    x = np.log([n for n, _ in points])
    y = np.log([v for _, v in points])
    return round(float(np.polyfit(x, y, 1)[0]), 3)


def fit_and_check(rows: list[dict[str, Any]]) -> dict[str, Any]:
    sizes = [int(r["rows"]) for r in rows]
    exponents = {name: exponent(sizes, [figure(r, path) for r in rows]) for name, path in FIGURES.items()}
    per_row = [figure(r, "index_bytes_per_row") or math.nan for r in rows]
    p99 = [figure(r, "search_p99_ms") for r in rows]
    costs = [figure(r, "maintenance.cost") for r in rows]
    spread = max(per_row) / min(per_row) if rows else math.nan
    growth = p99[-1] / p99[0] if rows and p99[0] and p99[-1] else None
    measures = {
        "index_bytes_per_row_spread": round(spread, 4),
        "search_p99_growth": None if growth is None else round(growth, 3),
        "search_p99_growth_span": [sizes[0], sizes[-1]] if rows else None,
        "policy_cost_max": max((c for c in costs if c is not None), default=None),
    }
    goals = {
        "index_bytes_per_row_spread<=1.10": bool(spread <= 1.10),
        "search_p99_growth<=2.5": growth is not None and growth <= 2.5,
        "policy_cost<=0.25": bool(costs) and all(c is not None and c <= 0.25 for c in costs),
    }
    return {"exponents": exponents, **measures, "goals": goals}


def plot(result: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["sizes"]
    n = [r["rows"] for r in rows]
    fig, axes = plt.subplots(2, 2, figsize=(12, 8.5))
    (ax_ingest, ax_build), (ax_search, ax_maint) = axes

    def series(ax: Any, key: str, label: str, **style: Any) -> None:
        values = [figure(r, key) for r in rows]
        xs = [x for x, v in zip(n, values, strict=True) if v is not None]
        ys = [v for v in values if v is not None]
        fitted = next((name for name, path in FIGURES.items() if path == key), None)
        slope = result["exponents"].get(fitted) if fitted else None
        suffix = f" (n^{slope:.2f})" if slope is not None else ""
        ax.plot(xs, ys, marker="o", label=label + suffix, **style)

    series(ax_ingest, "ingest_rows_per_s", "store bulk ingest")
    series(ax_ingest, "ingest_rows_per_s_raw_copy", "raw COPY (reference)", ls="--")
    ax_ingest.set_ylabel("rows/s")
    ax_ingest.set_ylim(bottom=0)
    ax_ingest.set_title("bulk ingest (no index)")

    series(ax_build, "build_s", "HNSW build, s")
    ax_bytes = ax_build.twinx()
    values = [figure(r, "index_bytes_per_row") for r in rows]
    ax_bytes.plot(n, values, marker="s", color="tab:green", label="index bytes/row")
    ax_bytes.set_ylabel("index bytes per row")
    ax_bytes.set_ylim(0, max(v or 0 for v in values) * 1.3 or 1)
    ax_bytes.legend(fontsize=8, loc="lower right")
    ax_build.set_yscale("log")
    ax_build.set_ylabel("seconds")
    ax_build.set_title("index build and size")

    series(ax_search, "search_p50_ms", "p50")
    series(ax_search, "search_p99_ms", "p99")
    default_ef = next((r["at_default_ef"]["ef_search"] for r in rows if "at_default_ef" in r), None)
    if default_ef is not None:
        series(ax_search, "at_default_ef.search_p99_ms", f"p99 at the default ef_search {default_ef}", ls="--")
    ax_search.set_ylabel("ms per search (one client)")
    ax_search.set_yscale("log")
    efs = ", ".join(f"{r['rows']:,}: {r.get('ef_search')}" for r in rows)
    ax_search.set_title(f"search at the lowest ef_search with recall@10 >= 0.95\n(ef_search {efs})", fontsize=10)

    costs = ", ".join(f"{figure(r, 'maintenance.cost'):.3f}" for r in rows if figure(r, "maintenance.cost") is not None)
    maintained = any(figure(r, "maintenance.vacuum_s") is not None for r in rows)
    if maintained:
        series(ax_maint, "maintenance.vacuum_s", "plain VACUUM")
        series(ax_maint, "maintenance.policy_s", "maintenance policy")
        ax_maint.set_yscale("log")
        ax_maint.set_ylabel("seconds after 2% churn")
        ax_maint.set_title(f"maintenance (policy / VACUUM: {costs})", fontsize=10)
    else:  # a --no-maintenance run: nothing to draw (and a log scale of nothing would not render)
        ax_maint.text(
            0.5, 0.5, "maintenance not measured in this run", ha="center", va="center", transform=ax_maint.transAxes
        )

    for ax in axes.flat:
        ax.set_xscale("log")
        ax.set_xlabel("rows")
        ax.grid(alpha=0.3, which="both")
        if ax.get_lines():
            ax.legend(fontsize=8, loc="upper left")
    if not maintained:
        ax_maint.set_axis_off()
    fig.suptitle(f"bench.scale: {result['dataset']}, k={result['k']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def _cell(value: Any, digits: int = 1) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def markdown(result: dict[str, Any]) -> str:
    """The table, exponents and goals of a ``bench.scale`` result, as docs/scale.md shows them."""
    rows = result["sizes"]
    columns = [
        ("rows", "rows", 0),
        ("ingest rows/s (store)", "ingest_rows_per_s", 0),
        ("ingest rows/s (raw COPY)", "ingest_rows_per_s_raw_copy", 0),
        ("build s", "build_s", 1),
        ("index bytes/row", "index_bytes_per_row", 1),
        ("ef_search", "ef_search", 0),
        ("recall@10", "recall_at_10", 3),
        ("search q/s", "search_qps", 0),
        ("p50 ms", "search_p50_ms", 2),
        ("p99 ms", "search_p99_ms", 2),
        ("recall@10 at default ef", "at_default_ef.recall_at_10", 3),
        ("p99 ms at default ef", "at_default_ef.search_p99_ms", 2),
        ("VACUUM s", "maintenance.vacuum_s", 2),
        ("policy s", "maintenance.policy_s", 2),
        ("policy / VACUUM", "maintenance.cost", 3),
    ]
    out = ["| " + " | ".join(title for title, _, _ in columns) + " |", "|" + "---|" * len(columns)]
    for r in rows:
        cells = []
        for _, path, digits in columns:
            value = figure(r, path)
            cells.append(_cell(int(value) if value is not None and digits == 0 else value, digits))
        out.append("| " + " | ".join(cells) + " |")
    out += ["", "| figure | exponent (log-log slope over the sizes) |", "|---|---|"]
    out += [f"| {name} | {_cell(value, 2)} |" for name, value in result["exponents"].items()]
    out += ["", "| goal | measured | met |", "|---|---|---|"]
    measured = {
        "index_bytes_per_row_spread<=1.10": result["index_bytes_per_row_spread"],
        "search_p99_growth<=2.5": result["search_p99_growth"],
        "policy_cost<=0.25": result["policy_cost_max"],
    }
    for goal, met in result["goals"].items():
        out.append(f"| {GOALS[goal]} (`{goal}`) | {_cell(measured[goal], 3)} | {'yes' if met else 'no'} |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.scale_report RESULT.json [--plot FILE.png]``: the markdown of a saved
    ``bench.scale`` run (its last line), and its curves drawn again."""
    parser = argparse.ArgumentParser(prog="python -m bench.scale_report", description=main.__doc__)
    parser.add_argument("result", type=Path)
    parser.add_argument("--plot", type=Path)
    args = parser.parse_args(argv)
    result = json.loads(args.result.read_text().strip().splitlines()[-1])
    if args.plot:
        plot(result, args.plot)
    print(markdown(result), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
