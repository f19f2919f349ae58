"""Line charts as inline SVG, drawn on the server: no chart library, no script, nothing from a CDN.

``line_chart`` turns time series into coordinates in a fixed viewBox; the template draws them
(``_chart.html``). Colours come from the stylesheet through class names (the page's CSP allows no
inline style).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

WIDTH, HEIGHT = 480, 190
LEFT, RIGHT, TOP, BOTTOM = 64, 10, 12, 30  # room for the axis labels
TICKS = 4


@dataclass(frozen=True)
class Series:
    label: str
    points: Sequence[tuple[datetime, float]]
    dashed: bool = False
    colour: int | None = None  # the N-th colour (a table keeps its colour across lines); None: by position


@dataclass(frozen=True)
class Line:
    label: str
    css: str  # "series-N", the colour of the N-th table
    points: str  # "x,y x,y ..." for <polyline>
    dots: tuple[tuple[float, float], ...]  # single points would not show as a line
    dashed: bool


@dataclass(frozen=True)
class Marker:
    x: float
    label: str
    css: str


@dataclass(frozen=True)
class Chart:
    title: str
    width: int
    height: int
    lines: tuple[Line, ...]
    y_ticks: tuple[tuple[float, str], ...]  # (y, label)
    x_labels: tuple[tuple[float, str, str], ...]  # (x, label, anchor)
    markers: tuple[Marker, ...]
    plot: tuple[float, float, float, float]  # left, top, right, bottom
    empty: bool


def line_chart(
    title: str,
    series: Sequence[Series],
    *,
    fmt: Callable[[float], str],
    low: float | None = None,
    high: float | None = None,
    events: Sequence[tuple[datetime, str, str]] = (),
) -> Chart:
    """A chart of ``series`` over time; ``low``/``high`` pin the value axis (else it fits the data);
    ``events`` (time, label, css class) become vertical markers, such as maintenance actions."""
    plot = (float(LEFT), float(TOP), float(WIDTH - RIGHT), float(HEIGHT - BOTTOM))
    values = [v for s in series for _, v in s.points]
    times = [t for s in series for t, _ in s.points]
    if not values:
        return Chart(title, WIDTH, HEIGHT, (), (), (), (), plot, True)
    y_low = min(values) if low is None else min(low, min(values))
    y_high = max(values) if high is None else max(high, max(values))
    if y_high - y_low < 1e-12:  # one value: a little room above it (and below, unless the bottom is pinned)
        pad = abs(y_high) * 0.1 or 1.0
        y_low, y_high = (y_low if low is not None else y_low - pad), y_high + pad
    t_low, t_high = min(times).timestamp(), max(times).timestamp()
    span = max(t_high - t_low, 1.0)

    def x_of(t: datetime) -> float:
        return round(plot[0] + (t.timestamp() - t_low) / span * (plot[2] - plot[0]), 1)

    def y_of(v: float) -> float:
        return round(plot[3] - (v - y_low) / (y_high - y_low) * (plot[3] - plot[1]), 1)

    lines = []
    for i, s in enumerate(series):
        ordered = sorted(s.points)
        coords = [(x_of(t), y_of(v)) for t, v in ordered]
        lines.append(
            Line(
                label=s.label,
                css=f"series-{(i if s.colour is None else s.colour) % 6}",
                points=" ".join(f"{x},{y}" for x, y in coords),
                dots=tuple(coords),
                dashed=s.dashed,
            )
        )
    ticks = tuple(
        (y_of(y_low + (y_high - y_low) * j / TICKS), fmt(y_low + (y_high - y_low) * j / TICKS))
        for j in range(TICKS + 1)
    )
    first, last = min(times), max(times)
    x_labels = (
        ((plot[0], _when(first), "start"), (plot[2], _when(last), "end"))
        if first != last
        else ((plot[0], _when(first), "start"),)
    )
    markers = tuple(Marker(x_of(t), label, css) for t, label, css in events if t_low <= t.timestamp() <= t_low + span)
    return Chart(title, WIDTH, HEIGHT, tuple(lines), ticks, x_labels, markers, plot, False)


def _when(t: datetime) -> str:
    return t.strftime("%d %b %H:%M")


def compact_bytes(n: float) -> str:
    """An axis label: short enough for the margin ("1.5 MiB", "781 KiB")."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if 0 < n < 10 and unit != "B" else f"{n:.0f} {unit}"
        n /= 1024
    return f"{n:.0f} TiB"
