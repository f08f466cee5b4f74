"""Collectors, one per file, registered by name (see base.register)."""

from gpunode_exporter.collector import (  # noqa: F401 (self-registering)
    checkpoint,
    gpu,
    gpu_processes,
    nfs,
    staging,
    storage_network,
    xid,
)
from gpunode_exporter.collector.base import COLLECTORS, Collector, Context, MetricSpec

__all__ = ["COLLECTORS", "Collector", "Context", "MetricSpec"]
