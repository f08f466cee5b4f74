"""The processes that use GPUs: their read()/write() totals (the checkpoint's path through the
page cache) and the workload each GPU serves (whose nodes are the node's peers)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator

from pynvml import NVMLError

from gpunode_exporter import workload
from gpunode_exporter.collector.base import Collector, Context, Family, MetricSpec, register
from gpunode_exporter.gpu_processes import ProcessTracker, Snapshot

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
PARSE_ERRORS = MetricSpec("gpunode_gpu_process_parse_errors_total", "counter",
                          "/proc/PID/stat or io files not in the kernel's format (a number no kernel prints), "
                          "counted on every read that saw one; that process alone is skipped.")
UNREADABLE = MetricSpec("gpunode_gpu_process_unreadable", "gauge",
                        "Processes the exporter may not inspect: fd = cannot tell whether it uses a GPU, "
                        "io = a GPU process whose I/O is not counted. Run as root or grant CAP_SYS_PTRACE "
                        "and CAP_DAC_READ_SEARCH. cgroup, environ = GPU processes whose workload could not be read.",
                        ("file",))
GPU_WORKLOAD = MetricSpec("gpunode_gpu_workload_info", "gauge",
                          "The workload (job) of the processes using this GPU, and where it was read (source: "
                          "pattern, job_mapping, slurm, kubernetes (a pod UID), environment, container, systemd; "
                          "unidentified with workload=\"\" when no source names it). Absent while no process "
                          "uses the GPU.", ("gpu", "uuid", "source", "workload"))
NODE_WORKLOAD = MetricSpec("gpunode_node_workload_info", "gauge",
                           "The workload holding most of this node's GPUs: the rule pack compares the node "
                           "with the nodes of the same workload. Absent while no process uses a GPU.",
                           ("source", "workload"))


@register
class GPUProcessesCollector(Collector):
    name = "gpu_processes"
    description = "read()/write() bytes and calls of processes using GPUs, monotonic across exits."
    metrics = (PROCESSES, READ_BYTES, WRITE_BYTES, READ_CALLS, WRITE_CALLS, PENDING, PARSE_ERRORS, UNREADABLE,
               GPU_WORKLOAD, NODE_WORKLOAD)

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        cfg, wl = ctx.config.gpu_processes, ctx.config.workload
        reader = workload.Reader(str(ctx.procfs), wl.sources, wl.environment, wl.cgroup_patterns) \
            if wl.sources else None
        self._order = wl.sources
        self._job_mapping_dir = wl.job_mapping_dir if "job_mapping" in wl.sources else ""
        self._tracker = ProcessTracker(ctx.procfs, cfg.rescan_young_seconds, cfg.check_budget_seconds, reader)

    def collect(self) -> Iterator[Family]:
        snap = self._tracker.scan()
        for spec, value in ((PROCESSES, snap.processes), (READ_BYTES, snap.totals.rchar),
                            (WRITE_BYTES, snap.totals.wchar), (READ_CALLS, snap.totals.syscr),
                            (WRITE_CALLS, snap.totals.syscw), (PENDING, snap.pending),
                            (PARSE_ERRORS, snap.parse_errors)):
            family = spec.family()
            family.add((), value)
            yield family
        unreadable = UNREADABLE.family()
        unreadable.add(("fd",), snap.fds_denied)
        unreadable.add(("io",), snap.io_denied)
        if self._order:
            for name, count in snap.identity_denied.items():
                unreadable.add((name,), count)
        yield unreadable
        if self._order:
            yield from self._workloads(snap)

    def _workloads(self, snap: Snapshot) -> Iterator[Family]:
        by_minor: dict[int, list[workload.Identity]] = defaultdict(list)
        for minors, identity in snap.holders:
            for minor in minors:
                by_minor[minor].append(identity)
        devices = self._devices_by_minor() if by_minor else {}
        mapped = workload.read_job_mapping(self._job_mapping_dir) if self._job_mapping_dir and by_minor else {}
        assigned: dict[int, workload.Assignment] = {}
        gpu_family = GPU_WORKLOAD.family()
        for minor, holders in sorted(by_minor.items()):
            device = devices.get(minor)
            index = device[0] if device else None
            assigned[minor] = a = workload.resolve(holders, mapped.get(index) if index is not None else None,
                                                   self._order)
            if device:  # a GPU NVML does not know (or NVML down) still counts for the node below
                gpu_family.add((str(device[0]), device[1], a.source, a.workload), 1)
        yield gpu_family
        node_family = NODE_WORKLOAD.family()
        if (node := workload.node_workload(assigned)) is not None:
            node_family.add((node.source, node.workload), 1)
        yield node_family

    def _devices_by_minor(self) -> dict[int, tuple[int, str]]:
        """minor -> (NVML index, UUID), as the driver numbers its device files; {} without NVML."""
        try:
            devices = self.ctx.nvml.devices()
        except NVMLError:
            return {}
        return {d.minor: (d.index, d.uuid) for d in devices if d.minor is not None}
