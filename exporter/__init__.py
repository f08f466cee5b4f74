"""gpunode-exporter's node agent: GPU training-node health metrics for Prometheus."""
