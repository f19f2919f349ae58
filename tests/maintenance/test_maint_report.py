"""``memstore-maint report --plot``: what the chart draws (no database)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from matplotlib.figure import Figure

from maintenance import report

T0 = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)
TABLE = "c1_docs"


def _probe(minute: int, dead: int, index_mib: int) -> dict[str, Any]:
    return {
        "taken_at": T0 + timedelta(minutes=minute),
        "partition_table": TABLE,
        "live_rows": 1000,
        "dead_rows": dead,
        "index_bytes": index_mib << 20,
        "fresh_index_bytes": 4 << 20,
        "recall": 0.9,
    }


def _action(action: str, outcome: str, after: dict[str, Any]) -> dict[str, Any]:
    return {
        "action": action,
        "outcome": outcome,
        "collection": "docs",
        "partition_table": TABLE,
        "started_at": T0 + timedelta(minutes=2),
        "finished_at": T0 + timedelta(minutes=3),
        "before": {},
        "after": after,
    }


REBUILT = {"live_rows": 1000, "dead_entries": 0, "index_bytes": 4 << 20, "fresh_bytes": 4 << 20, "recall": 0.99}


def test_each_action_s_after_figures_are_a_point_at_its_finish() -> None:
    points = report.after_points(
        [
            _action("rebuild", "ok", REBUILT),
            _action("rebuild", "failed", {}),
            _action("tune", "ok", {"ef_search": 40}),  # no index figures: nothing to plot
            _action("cleanup", "ok", {"dropped": ["c1_docs_hnsw_ccnew"]}),
        ]
    )
    assert points == [
        {
            "taken_at": T0 + timedelta(minutes=3),
            "partition_table": TABLE,
            "live_rows": 1000,
            "dead_rows": 0,
            "index_bytes": 4 << 20,
            "fresh_index_bytes": 4 << 20,
            "recall": 0.99,
        }
    ]


def test_the_plot_ends_at_what_a_rebuild_left(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Without the action's own figures the lines end at the last probe before it: the bloat it removed."""
    drawn: list[Figure] = []
    save = Figure.savefig

    def keep(fig: Figure, *args: Any, **kwargs: Any) -> None:
        drawn.append(fig)
        save(fig, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", keep)
    path = report.plot_history(
        [_probe(0, 100, 6), _probe(1, 400, 9)], [_action("rebuild", "ok", REBUILT)], tmp_path / "h.png"
    )
    assert path.read_bytes()[:4] == b"\x89PNG"
    [fig] = drawn
    _, dead_axis, size_axis = fig.axes[:3]
    dead_line, size_line = dead_axis.get_lines()[0], size_axis.get_lines()[0]
    assert list(dead_line.get_xdata())[-1] == T0 + timedelta(minutes=3)
    assert list(dead_line.get_ydata()) == [0.1, 0.4, 0.0]
    assert list(size_line.get_ydata()) == [6.0, 9.0, 4.0]
