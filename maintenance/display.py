"""How ``memstore-maint`` shows results to people: tables with units, and progress bars."""

from __future__ import annotations

import sys
from datetime import datetime
from typing import Any

from maintenance.progress import Progress


class Bars:
    """tqdm progress bars fed from the progress views, one per target and phase kind."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.bars: dict[tuple[str, str], Any] = {}

    def __call__(self, p: Progress) -> None:
        if not self.enabled:
            return
        from tqdm import tqdm

        key = (p.label, p.kind)
        bar = self.bars.get(key)
        if p.finished:
            if bar is not None:
                bar.close()
                del self.bars[key]
            return
        if bar is None:
            verb = "rebuild" if p.kind == "create_index" else "vacuum"
            bar = self.bars[key] = tqdm(total=max(p.total, 1), desc=f"{verb} {p.label}", file=sys.stderr, leave=False)
        bar.total = max(p.total, 1)
        bar.n = min(p.done, bar.total)
        bar.set_postfix_str(p.phase, refresh=False)
        bar.refresh()


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "kB", "MB", "GB"):
        if abs(n) < 1024 or unit == "GB":
            return f"{n:.0f}{unit}" if unit == "B" else f"{n:.1f}{unit}"
        n /= 1024
    return f"{n:.1f}GB"


def format_duration(seconds: float) -> str:
    """A duration for people: 3.1 ms, 0.84 s, 12.3 s, 4 min 05 s, 2 h 03 min."""
    if seconds < 1:
        return f"{seconds * 1000:.1f} ms" if seconds < 0.1 else f"{seconds:.2f} s"
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{int(seconds // 60)} min {int(seconds % 60):02d} s"
    return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60):02d} min"


def format_cell(column: str, value: Any) -> str:
    """A table cell: durations (columns ending in _s) in units, other floats to 4 significant digits,
    times to the second."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return format_duration(value) if column.endswith("_s") else f"{value:.4g}"
    if isinstance(value, datetime):
        return value.isoformat(sep=" ", timespec="seconds")
    return str(value)


def table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    cells = [[format_cell(c, r.get(c)) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(lines)
