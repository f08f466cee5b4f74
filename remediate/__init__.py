"""gpunode-remediate: the rule pack's alerts turned into scheduler actions (drain, reboot or GPU reset
once idle, return to service), dry run by default, behind a circuit breaker. Runs beside
Alertmanager, never on the GPU nodes; it imports nothing of the node agent (exporter/)."""
