"""The exporter's own process: the process_* metrics every Prometheus client library serves.

psutil reads them, through one psutil.Process kept for the exporter's life, from /proc whatever
--path.procfs says (it is this process, wherever it runs). prometheus_client has the same
collector, but in the running exporter importing it adds ~1.5 MiB of RSS (~12 MiB in a bare
interpreter, most of it standard modules the exporter loads anyway); psutil adds ~0.7 MiB and
also reads the GPU processes (exporter/gpu_processes.py).
"""

from __future__ import annotations

import ctypes
import itertools
import os
from collections.abc import Callable, Iterator

import psutil

from gpunode_exporter.collector.base import Family, MetricSpec

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
# Not after every scrape: the next one faulted the pages back in (on the reference node 50 page
# faults and ~0.4 ms of CPU a scrape); every 10th leaves the peak ~0.4 MiB higher.
TRIM_EVERY = 10
_scrapes = itertools.count(1)


def _own() -> psutil.Process | None:
    """This process, read from /proc: a psutil.Process reads the procfs psutil.PROCFS_PATH named
    when it was made, and a host's /proc (--path.procfs in a container) counts PIDs in another
    namespace."""
    saved, psutil.PROCFS_PATH = psutil.PROCFS_PATH, "/proc"
    try:
        own = psutil.Process()
        own.create_time()  # kept by psutil: /proc/stat (boot time; costly on big nodes) is read once, here
        return own
    except (psutil.Error, OSError):
        return None
    finally:
        psutil.PROCFS_PATH = saved


_OWN = _own()  # at import, before any collector thread reads procfs through psutil


def _cpu(own: psutil.Process) -> float:
    """In whole clock ticks, as the kernel counts: psutil's user + system adds two quotients and
    serves 0.13999999999999999 for 14 ticks."""
    times = own.cpu_times()
    return round((times.user + times.system) * _TICKS) / _TICKS


def _readings(own: psutil.Process) -> tuple[tuple[MetricSpec, Callable[[], float]], ...]:
    return ((CPU, lambda: _cpu(own)), (RESIDENT, lambda: own.memory_info().rss),
            (VIRTUAL, lambda: own.memory_info().vms), (START, own.create_time), (OPEN_FDS, own.num_fds),
            (MAX_FDS, lambda: own.rlimit(psutil.RLIMIT_NOFILE)[0]))


_READINGS = _readings(_OWN) if _OWN is not None else ()


def _read(read: Callable[[], float]) -> float | None:
    try:
        return read()
    except (psutil.Error, OSError, ValueError):
        return None  # about us, not worth a failed scrape (no /proc, say): the metric is left out


def collect() -> Iterator[Family]:
    if _OWN is None:
        return
    with _OWN.oneshot():  # /proc/self/stat and statm read once for all six, not once each
        values = [(spec, _read(read)) for spec, read in _READINGS]
    for spec, value in values:
        if value is not None:
            family = spec.family()
            family.add((), value)
            yield family


def release_memory() -> bool:
    """After a scrape: every TRIM_EVERY-th, return the free pages of the C heap to the system
    (glibc; elsewhere nothing). True when it did."""
    if _MALLOC_TRIM is None or next(_scrapes) % TRIM_EVERY:
        return False
    _MALLOC_TRIM(0)
    return True
