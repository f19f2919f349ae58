"""Prometheus metrics for one engine, in a registry of its own (several engines can coexist)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_FILL_BUCKETS = (0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875, 1.0)


class _QueueCollector(Collector):
    """Reads queue depths from engine.stats() at scrape time instead of tracking them twice."""

    def __init__(self, stats: Callable[[], dict[str, Any]]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[GaugeMetricFamily]:
        s = self._stats()
        units = GaugeMetricFamily(
            "encoder_queue_units", "Units (texts, views, tiles) waiting, per class", labels=["class"]
        )
        requests = GaugeMetricFamily("encoder_queue_requests", "Requests waiting, per class", labels=["class"])
        for name, q in s["queues"].items():
            units.add_metric([name], q["units"])
            requests.add_metric([name], q["requests"])
        yield units
        yield requests
        yield GaugeMetricFamily(
            "encoder_units_per_second", "Units (tiles) encoded per second, recent average", value=s["units_per_s"]
        )
        yield GaugeMetricFamily(
            "encoder_query_share", "Share of each micro-batch reserved for queries", value=s["shares"]["query"]
        )
        pool = s.get("preprocessing_pool")
        if pool is not None:
            jobs = GaugeMetricFamily(
                "encoder_preprocess_jobs",
                "Images being prepared (decoded and cut into views) or waiting for a thread, per lane",
                labels=["lane", "state"],
            )
            for lane in ("light", "heavy"):
                for state in ("waiting", "running"):
                    jobs.add_metric([lane, state], pool[f"{lane}_{state}"])
            yield jobs


class EngineMetrics:
    def __init__(self, stats: Callable[[], dict[str, Any]]) -> None:
        self.registry = CollectorRegistry()
        self.latency = Histogram(
            "encoder_request_latency_seconds",
            "Submit-to-result latency per class",
            ["class"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.batch_fill = Histogram(
            "encoder_batch_fill_ratio",
            "Real units / batch size per micro-batch",
            ["modality"],
            buckets=_FILL_BUCKETS,
            registry=self.registry,
        )
        self.batch_seconds = Histogram(
            "encoder_batch_seconds",
            "Model time per micro-batch",
            ["modality"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.units = Counter("encoder_units", "Units encoded", ["modality"], registry=self.registry)
        self.rejected = Counter(
            "encoder_rejected_requests",
            "Requests refused at submission",
            ["class", "reason"],
            registry=self.registry,
        )
        self.cancelled = Counter(
            "encoder_cancelled_requests", "Requests cancelled before completion", registry=self.registry
        )
        self.registry.register(_QueueCollector(stats))
