"""The demo: the whole stack on one machine without GPUs, a simulated node developing faults.

`make demo` (or `python -m demo`) runs, per simulated node, the real exporter and Debian's
node_exporter in a network namespace of their own, fed by files in the kernel's formats
that demo/node.py rewrites every second (mountstats, /proc/PID/io, sysfs counters, the
kernel log) and by the simulated NVML; and on the host Debian's Prometheus with the rule
pack rendered from demo/spec.yaml, Debian's Alertmanager with the example configuration,
and a webhook receiver that prints each notification. See docs/demo.md.
"""
