"""Collectors, one per file, registered by name (see base.register)."""

from exporter.collector import gpu, gpu_processes, nfs, staging, storage_network, xid  # noqa: F401 (self-registering)
from exporter.collector.base import COLLECTORS, Collector, Context, MetricSpec

__all__ = ["COLLECTORS", "Collector", "Context", "MetricSpec"]
