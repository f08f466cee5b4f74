"""Small shared test helpers."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from exporter.collector.base import Collector, Context
from exporter.config import Config


def nfs_context(procfs: Path, route_lookup: Callable[[str], str | None] = lambda _a: None) -> Context:
    return Context(procfs=procfs, sysfs=procfs.parent / "sys", config=Config(), route_lookup=route_lookup)


def collect_samples(collector: Collector) -> dict[str, dict[tuple, float]]:
    """{sample name: {sorted label items: value}} for one collect() call."""
    series: dict[str, dict[tuple, float]] = {}
    for family in collector.collect():
        for s in family.samples:
            series.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return series
