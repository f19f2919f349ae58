"""The maintenance charts: lines named by the space (and model) whose index they measure, not by
its table, and a recall axis that fits the measurements."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

from memstore.catalog.collections import Collection, Space
from memstore.db.core import raw_connection
from memstore.store import VectorStore
from memstore.ui.maintenance_page import charts_of, recall_floor, table_names

T0 = datetime(2024, 5, 1, tzinfo=UTC)


def _probe(table: str, minutes: int, recall: float | None) -> dict[str, Any]:
    return {
        "partition_table": table,
        "taken_at": T0 + timedelta(minutes=minutes),
        "recall": recall,
        "dead_rows": 5,
        "live_rows": 100,
        "index_bytes": 2_000_000,
        "fresh_index_bytes": 1_500_000,
    }


def _collection(partitions: int = 1) -> Collection:
    side = Space(
        id=1,
        name="clip_large",
        model="clip-vit-l-14",
        dimensions=768,
        metric="cosine",
        hnsw_m=16,
        hnsw_ef_construction=64,
        default_ef_search=40,
        table_name="c7_s1",
    )
    return Collection(
        id=7,
        name="photos",
        table_name="c7",
        dimensions=512,
        metric="cosine",
        hnsw_m=16,
        hnsw_ef_construction=64,
        default_ef_search=40,
        partitions=partitions,
        model="clip-vit-b-32",
        spaces=(side,),
    )


def test_tables_are_named_by_their_space_and_model() -> None:
    assert table_names(_collection()) == {"c7": "default · clip-vit-b-32", "c7_s1": "clip_large · clip-vit-l-14"}
    parts = table_names(_collection(partitions=2))
    assert parts["c7_p0"] == "default · clip-vit-b-32 · partition 0" and parts["c7_p1"].endswith("partition 1")
    probes = [_probe("c7", 0, 0.97), _probe("c7_s1", 5, 0.91), _probe("c7_gone", 9, 0.99)]
    recall, _, size = charts_of(probes, [], table_names(_collection()))
    labels = [line.label for line in recall.lines]
    assert sorted(labels) == ["c7_gone", "clip_large · clip-vit-l-14", "default · clip-vit-b-32"]  # gone: its name
    assert "clip_large · clip-vit-l-14 (fresh build)" in [line.label for line in size.lines]


def test_the_recall_axis_fits_the_data() -> None:
    assert recall_floor([1.0]) == 0.95
    assert recall_floor([0.9, 0.97]) == 0.85
    assert recall_floor([0.31]) == 0.2
    assert recall_floor([0.02]) == 0.0
    only_perfect = charts_of([_probe("c7", 0, 1.0), _probe("c7", 5, 1.0)], [])[0]
    ticks = [label for _, label in only_perfect.y_ticks]
    assert ticks[0] == "0.950" and ticks[-1] == "1.000"  # not 0.5 to 1.5
    mixed = charts_of([_probe("c7", 0, 0.88), _probe("c7", 5, 0.99)], [])[0]
    values = [float(label) for _, label in mixed.y_ticks]
    assert values[0] == 0.85 and values[-1] == 1.0
    ys = [float(p.split(",")[1]) for p in mixed.lines[0].points.split()]
    top, bottom = mixed.plot[1], mixed.plot[3]
    assert all(top <= y <= bottom for y in ys) and max(ys) - min(ys) > 0.5 * (bottom - top)  # uses the chart
    flat = charts_of([_probe("c7", 0, 0.9)] * 2, [])[1]  # one dead fraction: 5%, on an axis from 0
    assert flat.y_ticks[0][1] == "0%"


def test_the_maintenance_page_names_the_space(admin_page, api, ui_collection, store: VectorStore, engine) -> None:
    c = store.get_collection(name=ui_collection)
    with raw_connection(engine) as conn:
        for minutes, recall in ((30, 1.0), (5, 1.0)):
            conn.execute(
                "INSERT INTO memstore_maintenance_probes (collection, partition_table, taken_at, live_rows, "
                "dead_rows, index_bytes, fresh_index_bytes, recall) VALUES "
                "(%s, %s, now() - make_interval(mins => %s), 100, 5, 2000000, 1500000, %s)",
                (ui_collection, c.table_name, minutes, recall),
            )
    page = admin_page.get("/ui/maintenance", params={"c": ui_collection})
    assert page.status_code == 200
    legend = re.findall(r'<span class="swatch[^"]*"></span>([^<]*)</li>', page.text)
    assert f"default · {c.model}" in legend
    assert c.table_name not in legend
    assert ">1.500<" not in page.text and ">0.950<" in page.text
