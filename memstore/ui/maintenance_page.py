"""``/ui/maintenance``: per collection, the maintenance worker's probes as charts (sampled recall,
dead fraction, index size against a fresh build), its action log (what, why, how long), and "probe
now" for an admin: a request the maintenance worker takes between passes (``memstore.action_log``), so
that this package never imports ``maintenance`` and a worker in another process answers it too."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from starlette.responses import RedirectResponse, Response

from memstore import action_log
from memstore.api.runtime import Runtime
from memstore.catalog.collections import Collection
from memstore.ui.access import collection_for, runtime
from memstore.ui.charts import Chart, Series, compact_bytes, line_chart
from memstore.ui.identity import CSRF_FIELD, Identity, check_csrf_field, current
from memstore.ui.render import PageRoute, base_path, page

router = APIRouter(prefix="/ui", route_class=PageRoute, include_in_schema=False)
PROBES_SHOWN = 500
ACTIONS_SHOWN = 25
KNOWN_ACTIONS = ("rebuild", "compact", "vacuum", "cleanup")


@dataclass(frozen=True)
class CollectionHistory:
    name: str
    charts: tuple[Chart, ...]
    actions: list[dict[str, Any]]
    probes: int
    requested_at: datetime | None  # a "probe now" no worker has taken yet
    can_probe: bool
    table_names: dict[str, str]  # table: what it holds (space, model, partition)


def table_names(c: Collection) -> dict[str, str]:
    """What each table the probes name holds, in the words of the collection: its space and that
    space's model (``default · clip-vit-b-32``), and the partition where there are several."""
    names: dict[str, str] = {}
    for space in c.all_spaces():
        label = space.name + (f" · {space.model}" if space.model else "")
        if space.side or c.partitions == 1:
            names[space.table_name] = label
        else:
            for i, table in enumerate(c.partition_tables()):
                names[table] = f"{label} · partition {i}"
    return names


def _series(
    probes: list[dict[str, Any]],
    value: Any,
    colours: dict[str, int],
    names: dict[str, str],
    *,
    dashed: bool = False,
    suffix: str = "",
) -> list[Series]:
    by_table: dict[str, list[tuple[Any, float]]] = {}
    for p in probes:
        v = value(p)
        if v is not None:
            by_table.setdefault(p["partition_table"], []).append((p["taken_at"], float(v)))
    return [
        Series(names.get(table, table) + suffix, points, dashed, colours[table])
        for table, points in sorted(by_table.items())
    ]


def recall_floor(values: list[float]) -> float:
    """The bottom of the recall axis: a little below the lowest recall, on a round step (0.05, or 0.1
    once recall has fallen under 0.5), so that the lines use the chart rather than a fixed 0-1 axis."""
    if not values:
        return 0.0
    lowest = min(values)
    step = 0.05 if lowest >= 0.5 else 0.1
    return max(0.0, round(math.floor((min(lowest, 1.0) - step / 2) / step) * step, 4))


def charts_of(
    probes: list[dict[str, Any]], actions: list[dict[str, Any]], names: dict[str, str] | None = None
) -> tuple[Chart, ...]:
    """The collection's three charts, a line per table, named by ``names`` (table: its space and
    model; a table no longer there keeps its own name)."""
    names = names or {}
    colours = {table: i for i, table in enumerate(sorted({p["partition_table"] for p in probes}))}
    events = [
        (a["started_at"], a["action"], f"action-{a['action'] if a['action'] in KNOWN_ACTIONS else 'other'}")
        for a in actions
    ]
    recalls = [float(p["recall"]) for p in probes if p["recall"] is not None]
    recall = line_chart(
        "Sampled recall",
        _series(probes, lambda p: p["recall"], colours, names),
        fmt=lambda v: f"{v:.3f}",
        low=recall_floor(recalls),
        high=1.0,
        events=events,
    )
    dead = line_chart(
        "Dead entries per live row",
        _series(probes, lambda p: (p["dead_rows"] or 0) / max(p["live_rows"] or 1, 1), colours, names),
        fmt=lambda v: f"{v:.0%}",
        low=0.0,
        events=events,
    )
    size = line_chart(
        "Index size (dashed: a fresh build)",
        [
            *_series(probes, lambda p: p["index_bytes"], colours, names),
            *_series(probes, lambda p: p["fresh_index_bytes"], colours, names, dashed=True, suffix=" (fresh build)"),
        ],
        fmt=compact_bytes,
        low=0.0,
        events=events,
    )
    return recall, dead, size


def _histories(rt: Runtime, identity: Identity, only: str | None) -> list[CollectionHistory]:
    out = []
    requested = action_log.pending_requests(rt.db)
    for c in rt.store.list_collections():
        if not identity.key.allows("read", c.name) or (only and c.name != only):
            continue
        probes = action_log.recent_probes(rt.db, collection=c.name, limit=PROBES_SHOWN)
        actions = action_log.recent_actions(rt.db, collection=c.name, limit=ACTIONS_SHOWN)
        names = table_names(c)
        out.append(
            CollectionHistory(
                c.name,
                charts_of(probes, actions, names),
                actions,
                len(probes),
                requested.get(c.name),
                identity.key.allows("admin", c.name),
                names,
            )
        )
    return out


@router.get("/maintenance")
async def maintenance_page(request: Request, c: str | None = None) -> Response:
    identity = current(request)
    rt = runtime(request)
    collections = await run_in_threadpool(_histories, rt, identity, c)
    return page(
        request,
        "maintenance.html",
        identity=identity,
        collections=collections,
        only=c,
        worker_here=rt.notes.get("maintenance") == "running",
    )


@router.post("/maintenance/{name}/probe")
async def probe_now(request: Request, name: str) -> Response:
    rt, identity, c = await collection_for(request, name, "admin")  # before the body is read
    form = await request.form(max_files=0, max_fields=4)
    check_csrf_field(request, identity, form.get(CSRF_FIELD))
    await run_in_threadpool(lambda: action_log.request_pass(rt.db, collection=c.name, requested_by=identity.key.name))
    target = f"{base_path(request)}/maintenance?{urlencode({'c': c.name, 'notice': 'probe'})}"
    return RedirectResponse(target, status_code=303)
