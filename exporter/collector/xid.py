"""Xid events per GPU and code, with NVIDIA's recommended action; the GPU's recovery action;
and from the same kernel log reader, NVSwitch SXids and kernel events past Xid
(docs/kernel-events.md): hung tasks, lockups, OOM kills, storage, NFS, memory, PCIe, NIC, GPU.

Counting happens in the tracker's thread as the driver logs each Xid (see
exporter/xid/tracker.py); a scrape only reads the counts.
"""

from __future__ import annotations

from collections.abc import Iterator

from gpunode_exporter.collector.base import Collector, Context, Family, MetricSpec, register
from gpunode_exporter.xid import catalog
from gpunode_exporter.xid.gpus import GpuDirectory
from gpunode_exporter.xid.tracker import XidTracker

_GPU = ("gpu", "uuid", "pci_bus_id")
XID_ERRORS = MetricSpec("gpunode_xid_errors_total", "counter",
                        "Xid events the NVIDIA driver reported, by code; action is NVIDIA's immediate "
                        "resolution bucket for the code (UNKNOWN: not in the catalog).",
                        (*_GPU, "xid", "action"))
XID_LAST = MetricSpec("gpunode_xid_last_event_timestamp_seconds", "gauge",
                      "When the latest Xid of this code was logged (Unix time). Alert on time() minus "
                      "this: unlike increase(), it sees the first Xid of a new series.", (*_GPU, "xid", "action"))
RECOVERY = MetricSpec("gpunode_gpu_recovery_action", "gauge",
                      "What the driver says the GPU needs (Xid 154, NVML): 0 none, 1 GPU reset, "
                      "2 node reboot, 3 drain P2P, 4 drain and reset, 5 recover the IMEX domain, 6 bus reset, "
                      "7 system reboot.", _GPU)
LOST = MetricSpec("gpunode_kmsg_records_lost_total", "counter",
                  "Kernel log records overwritten before they were read (the reader fell behind, or "
                  "the exporter was not running): Xids among them were not counted.")
READ = MetricSpec("gpunode_kmsg_records_read_total", "counter",
                  "Kernel log records read (any subsystem): the log's rate, and with the lost count, "
                  "how far behind the reader runs.")
MALFORMED = MetricSpec("gpunode_kmsg_records_malformed_total", "counter",
                       "Kernel log records that could not be parsed (bad header, overlong line, a number "
                       "or device no kernel prints) and were skipped, and events refused because their "
                       "table already holds 4096 series.")
SOURCE = MetricSpec("gpunode_xid_source", "gauge",
                    "1 for the source Xids are counted from: the kernel log (kmsg) or NVML events "
                    "(nvml, when the log cannot be read). All 0: neither works.", ("source",))
STATE_ERRORS = MetricSpec("gpunode_xid_state_errors_total", "counter",
                          "Problems with the Xid state file under --path.state (load: corrupt or "
                          "unreadable, replaced; save; lock: another exporter uses it).", ("operation",))
SXID_ERRORS = MetricSpec("gpunode_sxid_errors_total", "counter",
                         "NVSwitch SXid events, one per event (its Severity and Data lines count nothing); "
                         "switch is the nvidia-nvswitchN index, severity what the line says or else NVIDIA's "
                         "SXid tables (unknown: neither).", ("switch", "pci_bus_id", "sxid", "severity"))
SXID_LAST = MetricSpec("gpunode_sxid_last_event_timestamp_seconds", "gauge",
                       "When the latest SXid of this series was logged (Unix time): time() minus this sees "
                       "the first SXid of a new series.", ("switch", "pci_bus_id", "sxid", "severity"))
KERNEL_EVENTS = MetricSpec("gpunode_kernel_events_total", "counter",
                           "Kernel log events past Xid, one per event (docs/kernel-events.md lists the kinds "
                           "and their lines); device is what the line names, empty where it names none.",
                           ("kind", "device"))
KERNEL_LAST = MetricSpec("gpunode_kernel_event_last_timestamp_seconds", "gauge",
                         "When the latest kernel event of this kind and device was logged (Unix time).",
                         ("kind", "device"))
NFS_RESPONDING = MetricSpec("gpunode_nfs_server_responding", "gauge",
                            "0 from the kernel's \"nfs: server X not responding\" until its \"nfs: server X OK\", "
                            "1 after; absent for servers the log never named.", ("server",))
READER_FAILURES = MetricSpec("gpunode_xid_reader_failures_total", "counter",
                             "Times the Xid reader failed and was started again; while it is down "
                             "the xid collector reports failure.")


@register
class XidCollector(Collector):
    name = "xid"
    description = ("Xid events from the kernel log (or NVML events), with NVIDIA's action; NVSwitch SXids "
                   "and kernel events from the same log.")
    metrics = (XID_ERRORS, XID_LAST, RECOVERY, LOST, READ, MALFORMED, SOURCE, STATE_ERRORS, READER_FAILURES,
               SXID_ERRORS, SXID_LAST, KERNEL_EVENTS, KERNEL_LAST, NFS_RESPONDING)

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self.catalog = catalog.load()
        self.tracker = XidTracker(ctx.kmsg, ctx.state_dir, ctx.persist_state, ctx.procfs,
                                  GpuDirectory(ctx.nvml, ctx.sysfs, ctx.procfs), ctx.nvml)
        self.tracker.start()
        self._first = True

    def collect(self) -> Iterator[Family]:
        if self._first:  # Xids already in the log belong in the first scrape
            self.tracker.caught_up.wait(self.ctx.config.collector_timeout_seconds / 2)
            self._first = False
        snap = self.tracker.snapshot()
        errors, last = XID_ERRORS.family(), XID_LAST.family()
        for bus, (gpu, uuid), xid, count, when in snap.counts:
            action = self.catalog.action(xid)
            errors.add((gpu, uuid, bus, str(xid), action), count)
            last.add((gpu, uuid, bus, str(xid), action), when)
        yield errors
        yield last
        recovery = RECOVERY.family()
        for bus, (gpu, uuid) in sorted(snap.identities.items()):
            if bus:
                recovery.add((gpu, uuid, bus), snap.recovery.get(bus, 0))
        yield recovery
        lost, read, malformed = LOST.family(), READ.family(), MALFORMED.family()
        lost.add((), snap.records_lost)
        read.add((), snap.records_read)
        malformed.add((), snap.records_malformed)
        yield lost
        yield read
        yield malformed
        source = SOURCE.family()
        for name in ("kmsg", "nvml"):
            source.add((name,), 1 if snap.source == name else 0)
        yield source
        state_errors = STATE_ERRORS.family()
        for operation in ("load", "save", "lock"):
            state_errors.add((operation,), snap.state_errors.get(operation, 0))
        yield state_errors
        failures = READER_FAILURES.family()
        failures.add((), snap.reader_failures)
        yield failures
        sxids, sxid_last = SXID_ERRORS.family(), SXID_LAST.family()
        for switch, bus, code, severity, count, when in snap.sxids:
            sxids.add((str(switch), bus, str(code), severity), count)
            sxid_last.add((str(switch), bus, str(code), severity), when)
        yield sxids
        yield sxid_last
        events, events_last = KERNEL_EVENTS.family(), KERNEL_LAST.family()
        for kind, device, count, when in snap.kernel:
            events.add((kind, device), count)
            events_last.add((kind, device), when)
        yield events
        yield events_last
        nfs = NFS_RESPONDING.family()
        for server, up in sorted(snap.nfs_servers.items()):
            nfs.add((server,), up)
        yield nfs
        if snap.reader_error is not None:  # the counts above stand, but no longer grow
            raise RuntimeError(f"Xid reader down: {snap.reader_error}")

    def close(self) -> None:
        self.tracker.close()
