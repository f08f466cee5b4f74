"""The exporter's own process: the process_* metrics every Prometheus client library serves.

Read from /proc/self whatever --path.procfs says (it is this process, wherever it runs).
prometheus_client has the same collector, but importing it costs ~12 MiB of RSS: more than
a third of what the exporter needs in all.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
from collections.abc import Iterator
from functools import cache

from exporter.collector.base import Family, MetricSpec
from exporter.procfs.pid import PidFileError, parse_usage

CPU = MetricSpec("process_cpu_seconds_total", "counter", "Total user and system CPU time spent in seconds.")
RESIDENT = MetricSpec("process_resident_memory_bytes", "gauge", "Resident memory size in bytes.")
VIRTUAL = MetricSpec("process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes.")
START = MetricSpec("process_start_time_seconds", "gauge", "Start time of the process since unix epoch in seconds.")
OPEN_FDS = MetricSpec("process_open_fds", "gauge", "Number of open file descriptors.")
MAX_FDS = MetricSpec("process_max_fds", "gauge", "Maximum number of open file descriptors.")
PROCESS_METRICS = (CPU, RESIDENT, VIRTUAL, START, OPEN_FDS, MAX_FDS)

_TICKS = os.sysconf("SC_CLK_TCK")
# glibc keeps the memory a scrape freed for later use; malloc_trim gives its free pages back.
_MALLOC_TRIM = getattr(ctypes.CDLL(None), "malloc_trim", None)
_PAGE = os.sysconf("SC_PAGE_SIZE")


@cache
def _boot_time() -> int:
    with open("/proc/stat", "rb") as f:
        for line in f:
            if line.startswith(b"btime "):
                return int(line.split()[1])
    raise PidFileError("/proc/stat: no btime line")


def collect() -> Iterator[Family]:
    # Any of these may be missing (no /proc): they are about us, not worth a failed scrape.
    values: list[tuple[MetricSpec, float]] = []
    try:
        with open("/proc/self/stat", "rb") as f:
            usage = parse_usage(f.read())
        values += [(CPU, usage.cpu_ticks / _TICKS), (RESIDENT, usage.resident_pages * _PAGE),
                   (VIRTUAL, usage.virtual_bytes), (START, _boot_time() + usage.start_ticks / _TICKS)]
    except (OSError, PidFileError):
        pass
    with contextlib.suppress(OSError):
        values.append((OPEN_FDS, len(os.listdir("/proc/self/fd"))))
    values.append((MAX_FDS, resource.getrlimit(resource.RLIMIT_NOFILE)[0]))
    for spec, value in values:
        family = spec.family()
        family.add((), value)
        yield family


def release_memory() -> None:
    """After a scrape: return the free pages of the C heap to the system (glibc; elsewhere nothing)."""
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)
