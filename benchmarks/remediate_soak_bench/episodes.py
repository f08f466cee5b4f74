"""Alert episodes: an alert on one node fires, then resolves a while later. Their mix is the
remediation policy's default rules (docs/remediation.md's table); labels as the rule pack's alerts
carry them (tests/remediation.alert_json: instance NODE:19835, gpu, xid, action)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from gpunode_remediate.policy import Policy
from tests.remediation import alert_json, rfc3339

# (weight, alertname, labels): what the default rules do with each is looked up, not assumed.
MIX: tuple[tuple[int, str, dict[str, str]], ...] = (
    (15, "GpuXidHardwareFault", {"xid": "79", "action": "RESTART_BM"}),  # reboot
    (12, "GpuXidHardwareFault", {"xid": "119", "action": "RESET_GPU"}),  # reset
    (13, "GpuRowRemapPending", {}),  # reset
    (18, "GpuNvLinkDegraded", {}),  # drain: a straggler
    (17, "GpuNodeClockThrottled", {}),  # drain: a straggler
    (5, "GpuRowRemapFailure", {}),  # hold
    (20, "GpuXidApplicationFault", {"xid": "43", "action": "RESTART_APP"}),  # nothing
)
PER_GPU = {"GpuXidHardwareFault", "GpuRowRemapPending", "GpuNvLinkDegraded", "GpuRowRemapFailure",
           "GpuXidApplicationFault"}
FALSE_ALARMS = 0.2  # of drain and reset episodes: a flap of a few seconds on a healthy node
WITH_JOB = 0.5  # of reset and reboot episodes: a job runs on the node, and the action waits for it
LONG_JOB = 0.1  # of those jobs: one that outlasts idle_timeout, so the node is held


@dataclass
class Episode:
    id: int
    node: str
    alertname: str
    labels: dict[str, str]
    action: str  # what the default rules ask for: none drain reset reboot hold
    firing_for: float  # seconds
    role: str = ""  # "", or a scripted part: stuck_reboot, operator_resume, operator_drain
    false_alarm: bool = False
    job_seconds: float = 0.0  # a job started on the node just before the alert; 0: none
    fired_at: float = 0.0
    resolved_at: float | None = None
    closed_at: float | None = None  # the node was back in service, or taken by a person, and the driver moved on
    sleeper: str = ""  # the Slurm id of the episode's own job (job_seconds)
    about_job: str = ""  # a soak job (jobs.py) whose running attempt the alert hits: it fails under it
    notes: list[str] = field(default_factory=list)

    def alert(self, status: str = "firing") -> dict[str, Any]:
        ends = self.resolved_at if status == "resolved" else None
        return alert_json(self.alertname, self.node, status, starts=self.fired_at, ends=ends, **self.labels)

    def ends_at(self) -> str:
        return rfc3339(self.resolved_at or 0.0)


def action_of(alertname: str, labels: dict[str, str]) -> str:
    rule = Policy().action({"alertname": alertname, **labels})
    return rule.action if rule else "none"


def draw(rng: random.Random, number: int, node: str, idle_timeout: float) -> Episode:
    """One episode of the mix on `node`."""
    _, alertname, labels = rng.choices(MIX, weights=[m[0] for m in MIX])[0]
    labels = dict(labels)
    if alertname in PER_GPU:
        labels["gpu"] = str(rng.randrange(8))
    action = action_of(alertname, labels)
    false_alarm = action in ("drain", "reset") and rng.random() < FALSE_ALARMS
    episode = Episode(number, node, alertname, labels, action,
                      rng.uniform(2, 4) if false_alarm else rng.uniform(6, 30), false_alarm=false_alarm)
    if action in ("reset", "reboot") and rng.random() < WITH_JOB:
        episode.job_seconds = idle_timeout + 15 if rng.random() < LONG_JOB else rng.uniform(5, 25)
    return episode


def job_fault(rng: random.Random, number: int, node: str, fault: str, job: str) -> Episode:
    """The alert a failing attempt of a soak job dies under, on one of its nodes: an application fault
    (GpuXidApplicationFault, RESTART_APP: the node side does nothing) or a node fault of the mix (a drain,
    reset, reboot or hold once the job is off the node). Firing past the attempt's end and the service's
    culprit_wait."""
    if fault == "app":
        alertname, labels = "GpuXidApplicationFault", {"xid": rng.choice(("13", "31", "43")), "action": "RESTART_APP"}
        firing = rng.uniform(7, 10)
    else:
        faults = [m for m in MIX if action_of(m[1], m[2]) != "none"]
        _, alertname, labels = rng.choices(faults, weights=[m[0] for m in faults])[0]
        labels = dict(labels)
        firing = rng.uniform(8, 15)
    if alertname in PER_GPU:
        labels["gpu"] = str(rng.randrange(8))
    return Episode(number, node, alertname, labels, action_of(alertname, labels), firing, about_job=job)


def scripted(number: int, node: str, role: str, firing_for: float) -> Episode:
    """The episodes of the scripted parts: a reboot that never completes, and the two operators'."""
    alertname, labels = {"stuck_reboot": ("GpuXidHardwareFault", {"xid": "79", "action": "RESTART_BM", "gpu": "3"}),
                         "operator_resume": ("GpuRowRemapPending", {"gpu": "5"}),
                         "operator_drain": ("GpuNvLinkDegraded", {"gpu": "2"})}[role]
    return Episode(number, node, alertname, labels, action_of(alertname, labels), firing_for, role=role)
