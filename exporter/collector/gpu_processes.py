"""read()/write() totals of the processes that use GPUs: the checkpoint's path through the page cache."""

from __future__ import annotations

from collections.abc import Iterator

from exporter.collector.base import Collector, Context, Family, MetricSpec, register
from exporter.gpu_processes import ProcessTracker

PROCESSES = MetricSpec("gpunode_gpu_processes", "gauge",
                       "Processes holding a GPU device file (/dev/nvidiaN) open.")
READ_BYTES = MetricSpec("gpunode_gpu_process_read_bytes_total", "counter",
                        "Bytes GPU processes passed to read() and similar calls (rchar), kept across exits.")
WRITE_BYTES = MetricSpec("gpunode_gpu_process_write_bytes_total", "counter",
                         "Bytes GPU processes passed to write() and similar calls (wchar), kept across exits.")
READ_CALLS = MetricSpec("gpunode_gpu_process_read_syscalls_total", "counter",
                        "read()-family calls made by GPU processes (syscr), kept across exits.")
WRITE_CALLS = MetricSpec("gpunode_gpu_process_write_syscalls_total", "counter",
                         "write()-family calls made by GPU processes (syscw), kept across exits.")
PENDING = MetricSpec("gpunode_gpu_process_checks_pending", "gauge",
                     "Processes not yet checked for GPU use: a scrape spends at most "
                     "gpu_processes.check_budget_seconds on checks, the rest wait for the next one.")
UNREADABLE = MetricSpec("gpunode_gpu_process_unreadable", "gauge",
                        "Processes the exporter may not inspect: fd = cannot tell whether it uses a GPU, "
                        "io = a GPU process whose I/O is not counted. Run as root or grant CAP_SYS_PTRACE "
                        "and CAP_DAC_READ_SEARCH.", ("file",))


@register
class GPUProcessesCollector(Collector):
    name = "gpu_processes"
    description = "read()/write() bytes and calls of processes using GPUs, monotonic across exits."
    metrics = (PROCESSES, READ_BYTES, WRITE_BYTES, READ_CALLS, WRITE_CALLS, PENDING, UNREADABLE)

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        cfg = ctx.config.gpu_processes
        self._tracker = ProcessTracker(ctx.procfs, cfg.rescan_young_seconds, cfg.check_budget_seconds)

    def collect(self) -> Iterator[Family]:
        snap = self._tracker.scan()
        for spec, value in ((PROCESSES, snap.processes), (READ_BYTES, snap.totals.rchar),
                            (WRITE_BYTES, snap.totals.wchar), (READ_CALLS, snap.totals.syscr),
                            (WRITE_CALLS, snap.totals.syscw), (PENDING, snap.pending)):
            family = spec.family()
            family.add((), value)
            yield family
        unreadable = UNREADABLE.family()
        unreadable.add(("fd",), snap.fds_denied)
        unreadable.add(("io",), snap.io_denied)
        yield unreadable
