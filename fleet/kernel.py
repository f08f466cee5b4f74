"""The kernel log past Xid on a simulated node, as gpunode-exporter counts it (docs/kernel-events.md):
the events each fault or distractor makes the kernel print, as the series the exporter serves.

- `gpunode_kernel_events_total{kind,device}` and `gpunode_kernel_event_last_timestamp_seconds`,
  `gpunode_sxid_errors_total{switch,pci_bus_id,sxid,severity}` and its last timestamp: a series
  from its first event on (the exporter serves none before), its count exact for the whole run
  (the state file keeps it across restarts);
- `gpunode_nfs_server_responding{server}`: 0 from the client's `not responding` to its `OK`, 1
  after; absent until the kernel first names the server.

What each kind prints, and how often (the kernel's and drivers' own habits):
- hung tasks: `INFO: task ... blocked for more than 120 seconds` once per check (every 120 s) while
  a task stays blocked, at most 10 per boot (kernel.hung_task_warnings' default; here per episode:
  a node with hung tasks of its own is rebooted, its default remediation);
- a soft lockup: the watchdog reports again every 20 s (2 x watchdog_thresh) while the CPU is stuck;
- an NFS server that stops answering: each client prints `not responding` at its first request's
  major timeout, 180 s after it was sent (net/sunrpc's xprt_calc_majortimeo: timeo + retrans x timeo
  over TCP, nfs(5)'s 60 s and 2), and `OK` at its first reply after; a task blocked on it from the
  stop is reported hung at the first check past 120 s (120-240 s in: the check's phase is the
  node's own), then at each check, so a client may report a hung task a minute before it names
  the server;
- a corrected-memory storm: an `EDAC MCn: 1 CE` line per error, here about one a minute.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from fleet.scenario import Event

HUNG_TASK_CHECK = 120.0  # kernel.hung_task_timeout_secs: a blocked task is reported at each check
HUNG_TASK_WARNINGS = 10  # kernel.hung_task_warnings: reports per boot, then silence
SOFT_LOCKUP_EVERY = 20.0  # 2 x kernel.watchdog_thresh
NFS_MAJOR_TIMEOUT = 180.0  # a request's major timeout over TCP with nfs(5)'s defaults (timeo=600, retrans=2)
NFS_SERVER = "nas"  # the host part of every simulated node's checkpoint mount (fleet/simulate.py)
NFS_EXPORT = f"{NFS_SERVER}:/ckpt"



@dataclass
class KernelLog:
    """One node's kernel-log counts per sample: (kind, device) -> events so far, and so on."""

    events: dict[tuple[str, str], list[float]] = field(default_factory=dict)  # event times, seconds from the start
    sxids: dict[tuple[str, str, str, str], list[float]] = field(default_factory=dict)
    nfs_responding: dict[str, np.ndarray] = field(default_factory=dict)  # NaN before the server is named
    xids: dict[tuple[int, int], np.ndarray] = field(default_factory=dict)  # (gpu, code) -> count (Xid 119)


def _count(t: np.ndarray, times: Iterable[float]) -> np.ndarray:
    """Events so far at each sample: the events at or before it."""
    return np.searchsorted(np.sort(np.asarray(list(times), float)), t, side="right").astype(float)


def _every(start: float, end: float, every: float) -> list[float]:
    return list(np.arange(start, end, every))


def _poisson(rng: np.random.Generator, start: float, span: float, per_second: float) -> list[float]:
    """Event times of a Poisson process of this rate from start for span seconds."""
    gaps = rng.exponential(1 / per_second, int(span * per_second * 2) + 16)
    return [float(x) for x in start + np.cumsum(gaps) if x < start + span]


def outage(f: Event, node: int, seed: int) -> tuple[float, float]:
    """When a client of the NFS server (fault f) prints `not responding`, and `OK`: seconds from the start."""
    rng = np.random.default_rng((seed, node, 0x4E46))
    return f.at + NFS_MAJOR_TIMEOUT + rng.uniform(0, 15), f.at + f.duration("lasts", 1800) + rng.uniform(0, 30)


def build(t: np.ndarray, node: int, seed: int, faults: list[Event], distractors: list[Event],
          storage: list[Event]) -> KernelLog:
    """faults, distractors: the node's own; storage: the NFS servers that stop (all nodes mount the one)."""
    rng = np.random.default_rng((seed, node, 0x6B6C))
    log = KernelLog()
    times: dict[tuple[str, str], list[float]] = {}
    sxids: dict[tuple[str, str, str, str], list[float]] = {}
    hung: list[float] = []

    def add(kind: str, device: str, at: Iterable[float]) -> None:
        times.setdefault((kind, device), []).extend(at)

    for f in faults:
        lasts = f.duration("lasts", 1800)
        if f.kind == "nvswitch_fatal":  # an always-fatal SXid on one switch; its peers report the fabric fault too
            code = str(f.param("sxid", 22003))
            for switch in range(int(f.param("switches", 2))):
                sxids.setdefault((str(switch), f"0000:{0x05 + switch:02x}:00.0", code, "fatal"), []).append(f.at)
        elif f.kind == "hung_tasks":  # a task stuck in D state on a local device
            hung += _every(f.at, f.at + lasts, HUNG_TASK_CHECK)[:HUNG_TASK_WARNINGS]
        elif f.kind == "cpu_lockup":
            add("soft_lockup", "", _every(f.at, f.at + f.duration("lasts", 300), SOFT_LOCKUP_EVERY))
        elif f.kind == "fs_readonly":  # ext4's error handler remounts the local scratch read-only
            device = str(f.param("device", "nvme1n1"))
            add("fs_error", device, [f.at])
            add("fs_readonly", device, [f.at + 0.5])
        elif f.kind == "disk_errors":
            if f.param("events", "nvme_failed") == "block_io_error":  # a failing disk's I/O errors at a rate
                add("block_io_error", str(f.param("device", "sdb")),
                    _poisson(rng, f.at, lasts, float(f.param("per_minute", 2)) / 60))
            else:  # an NVMe controller that times out, then is disabled
                device = str(f.param("device", "nvme2"))
                add("nvme_timeout", device, _every(f.at, f.at + 120, 30))
                add("nvme_failed", device, [f.at + 150])
        elif f.kind == "memory_uncorrectable":  # a machine check with EDAC's uncorrected error
            add("machine_check", "", [f.at])
            add("memory_uncorrected", str(f.param("device", "MC1")), [f.at])
        elif f.kind == "memory_ce_storm":
            per_minute = float(f.param("per_minute", 1))
            add("memory_corrected", str(f.param("device", "MC0")), _poisson(rng, f.at, lasts, per_minute / 60))
        elif f.kind == "pcie_uncorrectable":  # a non-fatal uncorrectable error on a GPU's upstream port
            add("pcie_aer_uncorrected", str(f.param("device", "0000:17:00.0")), [f.at, f.at + 40])
        elif f.kind == "nic_fault":  # the compute NIC's module overheats and its port goes down
            add("nic_hw_error", str(f.param("device", "0000:5e:00.0")), [f.at])
            add("nic_link_down", str(f.param("interface", "ibp94s0")), [f.at + 2])
        elif f.kind == "gpu_driver_fault":  # the GPU's system processor stops answering the driver
            add("gsp_timeout", "", [f.at])
            if f.param("xid", None) is not None:  # the driver's Xid 119 for the same timeout
                log.xids[(f.gpu, int(f.param("xid", 119)))] = _count(t, [f.at])
    for d in distractors:
        if d.kind == "oom_kills":  # the job's own processes over their memory: the job's fault
            add("oom_kill", "", [d.at + 20 * k for k in range(int(d.param("count", 3)))])
        elif d.kind == "memory_ce_trickle":  # a DIMM's occasional corrected error, well below a storm
            per_day = float(d.param("per_day", 4))
            span = d.duration("lasts", 3 * 86400)
            add("memory_corrected", str(d.param("device", "MC0")), _poisson(rng, d.at, span, per_day / 86400))
        elif d.kind == "sxid_nonfatal":  # one corrected single-bit ECC error in a switch: NVIDIA's non-fatal table
            code = str(d.param("sxid", 11012))
            sxids.setdefault((str(d.param("switch", 3)), "0000:08:00.0", code, "nonfatal"), []).append(d.at)
    for s in storage:
        server = str(s.param("server", NFS_SERVER))
        gone, back = outage(s, node, seed)
        add("nfs_not_responding", server, [gone])
        add("nfs_ok", server, [back])
        was = log.nfs_responding.get(server, np.full(t.size, np.nan))
        log.nfs_responding[server] = np.where((t >= gone) & (t < back), 0.0, np.where(t >= back, 1.0, was))
        first = s.at + HUNG_TASK_CHECK + rng.uniform(0, HUNG_TASK_CHECK)  # the first check past 120 s blocked
        hung += _every(first, back, HUNG_TASK_CHECK)[:HUNG_TASK_WARNINGS]
    if hung:
        add("hung_task", "", hung)
    log.events = {key: sorted(at) for key, at in times.items()}
    log.sxids = {key: sorted(at) for key, at in sxids.items()}
    return log


def series(t: np.ndarray, start: float, times: list[float]) -> tuple[np.ndarray, np.ndarray]:
    """(count, last event's unix time) per sample of a series with these event times: NaN before its
    first event, which the exporter serves from on."""
    count = _count(t, times)
    last = np.asarray(times)[np.maximum(count.astype(int) - 1, 0)] + start
    return np.where(count > 0, count, np.nan), np.where(count > 0, last, np.nan)
