"""Alerts against the truth: per fault class and overall, precision, recall, lead time, false alerts.

An alert episode (an alert's labels firing over consecutive evaluations) detects a fault when
it fires on the fault's node within the fault's window, its name is one of the class's
detecting alerts and, for a straggler, its `cause` label names the fault's cause (a power cap
named as a thermal throttle sends someone to the wrong fix). An alert of a whole job
(GpuJobSlowedDown: a workload, no node) matches a fault that slows that workload: it detects a
job-wide slowdown, and is a consequence of a straggler. Lead time is the first detecting
episode's start minus the fault's reference time (the Xid, the slowdown's onset, the GPU's
loss): negative = before it.
Episodes of severity info (advice, e.g. the checkpoint interval) are not counted as alerts.
An episode matching no fault is false; false alerts are counted per 1,000 healthy node-days
(node time outside every fault window).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fleet.harness import Firing
from fleet.simulate import Truth

DETECTS = {
    "xid79_collapse": {"GpuXidHardwareFault", "GpuNodePrecursorMultiSignal", "GpuDown"},
    "getattr_spike": {"GpuNodePrecursorMultiSignal", "GpuXidApplicationFault", "GpuXidHardwareFault"},
    "uncorrectable_steps": {"GpuRowRemapUncorrectableIncrease", "GpuXidApplicationFault"},
    "correctable_acceleration": {"GpuRowRemapCorrectableAcceleration"},
    "throttle": {"GpuNodeClockThrottled"},
    "nvlink_degraded": {"GpuNvLinkDegraded"},
    "fabric_link": {"GpuNodeFabricLinkErrors"},
    "pcie_downgrade": {"GpuPcieLinkDegraded"},
    "host_starved": {"GpuNodeHostStarved"},
    "nfs_saturation": {"NfsSlotTableSaturated", "NfsSlotWaitDominates", "NfsBandwidthParadox"},
    "job_slowdown": {"GpuJobSlowedDown"},
    # The kernel log past Xid (fleet/kernel.py): each family by its alert; a GSP timeout logged with its
    # Xid 119 by the Xid's alert (the driver-fault alert then yields to it).
    "nvswitch_fatal": {"GpuNvSwitchFatalError"},
    "hung_tasks": {"GpuNodeHungTasks"},
    "cpu_lockup": {"GpuNodeCpuLockup"},
    "fs_readonly": {"GpuNodeFilesystemReadOnly"},
    "disk_errors": {"GpuNodeDiskErrors"},
    "memory_uncorrectable": {"GpuNodeMemoryUncorrectable"},
    "memory_ce_storm": {"GpuNodeMemoryCorrectableRate"},
    "pcie_uncorrectable": {"GpuNodePcieUncorrectable"},
    "nic_fault": {"GpuNodeNicFault"},
    "gpu_driver_fault": {"GpuNodeGpuDriverFault", "GpuXidHardwareFault"},
    # The fabric (fleet/fabric.py): a port by its alert, the NVLink fabric by GpuFabricNotReady with its cause.
    "port_down": {"GpuNodeFabricPortDown"},
    "port_flapping": {"GpuNodeFabricPortFlapping"},
    "port_degraded": {"GpuNodeFabricPortDegraded"},
    "fabric_not_ready": {"GpuFabricNotReady"},
    # A storage server (no node): by the alert that names it; its clients' own alerts are false.
    "nfs_server_down": {"NfsServerNotResponding"},
}
# Alerts that a fault also sets off, which are right but not how we detect it (GpuDown after
# the Xid 79, for instance): matched to the fault, not counted false.
CONSEQUENCES = {"GpuDown", "GpuXidHardwareFault", "GpuXidApplicationFault", "GpuRowRemapPending",
                "GpuXidRepeatedHardwareFaults", "GpuRecoveryActionRequired", "NfsSlotWaitDominates",
                "NfsBandwidthParadox", "GpuJobSlowedDown", "GpuNodePrecursorMultiSignal",
                # the filesystem error ext4 logs as it remounts read-only; the per-node warning of a server
                # that stopped, which Alertmanager inhibits beneath the server's alert
                "GpuNodeDiskErrors", "NfsServerNotRespondingOnNode"}


@dataclass(frozen=True)
class ClassScore:
    kind: str
    faults: int
    detected: int
    alerts: int  # episodes attributed to this class
    true_alerts: int
    leads: tuple[float, ...]  # seconds, per detected fault

    @property
    def recall(self) -> float:
        return self.detected / self.faults if self.faults else float("nan")

    @property
    def precision(self) -> float:
        return self.true_alerts / self.alerts if self.alerts else float("nan")

    @property
    def false_alerts(self) -> int:
        """Episodes of this class's detecting alerts that matched no fault."""
        return self.alerts - self.true_alerts


@dataclass(frozen=True)
class Score:
    classes: tuple[ClassScore, ...]
    false_alerts: tuple[Firing, ...]
    healthy_node_days: float
    episodes: int

    @property
    def false_per_1000_node_days(self) -> float:
        return 1000 * len(self.false_alerts) / self.healthy_node_days if self.healthy_node_days else float("nan")

    @property
    def precision(self) -> float:
        true = sum(c.true_alerts for c in self.classes)
        return true / (true + len(self.false_alerts)) if true + len(self.false_alerts) else float("nan")

    @property
    def recall(self) -> float:
        faults = sum(c.faults for c in self.classes)
        return sum(c.detected for c in self.classes) / faults if faults else float("nan")


def _on(alert: Firing, fault: Truth) -> bool:
    """The alert is about the fault's node, or (an alert of a whole job) a workload the fault slows, or
    (a storage server's fault) names its server: an alert of a node that names no server is not on it."""
    if fault.server:
        return alert.labels.get("server") == fault.server
    if "instance" in alert.labels:
        return alert.labels["instance"] == fault.node
    return alert.labels.get("workload") in fault.workloads


def _hits(alerts: list[Firing], fault: Truth) -> list[Firing]:
    """The alerts about the fault (as _on says) that fire within its window."""
    return [f for f in alerts if _on(f, fault) and f.end >= fault.start and f.start <= fault.end]


def _detects(alert: Firing, fault: Truth) -> bool:
    """One of the class's detecting alerts, with the fault's cause where both name one (an alert
    of a rule pack from before the `cause` label names none)."""
    return alert.alertname in DETECTS[fault.kind] and (
        not fault.cause or alert.labels.get("cause", fault.cause) == fault.cause)


def score(firing: list[Firing], truth: list[Truth], nodes: list[str], span: float) -> Score:
    alerts = [f for f in firing if f.labels.get("severity") != "info"]
    matched: set[int] = set()
    found = []
    for kind in sorted({t.kind for t in truth}):
        faults = [t for t in truth if t.kind == kind]
        detected, leads, true_alerts = 0, [], 0
        for fault in faults:
            hits = _hits(alerts, fault)
            detecting = [f for f in hits if _detects(f, fault)]
            for f in hits:
                if f.alertname in DETECTS[kind] or f.alertname in CONSEQUENCES:
                    if id(f) not in matched:
                        true_alerts += 1
                    matched.add(id(f))
            if detecting:
                detected += 1
                leads.append(min(f.start for f in detecting) - fault.onset)
        found.append((kind, len(faults), detected, true_alerts, tuple(leads)))
    false = tuple(f for f in alerts if id(f) not in matched)
    # A class's precision: of the episodes that would be read as this class (its detecting
    # alerts and their consequences), the share that matched one of its faults.
    classes = [ClassScore(kind, faults, detected, true + sum(f.alertname in DETECTS[kind] for f in false), true, leads)
               for kind, faults, detected, true, leads in found]
    fault_time = sum(t.end - t.start for t in truth if t.node)
    healthy = (len(nodes) * span - fault_time) / 86400
    return Score(tuple(classes), false, healthy, len(alerts))


def first_detection(firing: list[Firing], fault: Truth) -> float | None:
    """Seconds from the fault's onset to its first detecting alert, or None."""
    starts = [f.start for f in _hits(firing, fault) if f.labels.get("severity") != "info" and _detects(f, fault)]
    return min(starts) - fault.onset if starts else None


def lead_summary(leads: tuple[float, ...]) -> tuple[float, float]:
    """(median, p90) in seconds; NaN without any."""
    if not leads:
        return float("nan"), float("nan")
    return float(np.median(leads)), float(np.percentile(leads, 90))
