"""gpunode-exporter: GPU training-node health metrics for Prometheus."""

__version__ = "0.1.0"
