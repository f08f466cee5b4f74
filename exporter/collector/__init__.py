"""Collectors, one per file, registered by name (see base.register)."""

from exporter.collector import gpu, nfs  # noqa: F401  (they register themselves)
from exporter.collector.base import COLLECTORS, Collector, Context, MetricSpec

__all__ = ["COLLECTORS", "Collector", "Context", "MetricSpec"]
