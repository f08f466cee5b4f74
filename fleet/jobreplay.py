"""Job recovery replay: a fixed retry against gpunode-remediate's job recovery, over the same timeline of
multi-node training jobs and failures on a simulated Slurm cluster (fleet/jobcluster.py: the cluster, its
faults and the scenario files).

- Alerts: an Xid's is the rule pack's (GpuXidApplicationFault or GpuXidHardwareFault, by NVIDIA's action
  for the code in the packaged catalog; none for IGNORE), firing for its 15-minute window; a straggler
  fires GpuNodeClockThrottled after its 4-minute `for` while it lasts; a storage server that stops answering
  fires NfsServerNotResponding{server} (no node) from its clients' major timeout (3 minutes) while it is away;
  a port down fires GpuNodeFabricPortDown{device,port} after its 2-minute `for` until a person repairs it;
  a lemon, a job's own fault and a transient one fire nothing. Each reaches the service `delay` (60-90 s:
  rule evaluation and Alertmanager) after the fault.
- Two policies over the same faults: the fixed retry (every abnormal end requeued to start 10 minutes
  later, on any nodes, no exclusion, no hold: the Lablup B200 operations report's automatic retry), and
  gpunode-remediate (remediate/engine.py with job recovery on, every other key at its default, enforcing,
  its state in memory) looking every 15 s while anything is unsettled and at once on each notification.
- A person: a job with `ends_after: N` is cancelled where its chain ended in the source (its N-th abnormal
  end under the fixed retry), at the same time in both runs. A node fault is repaired by a person `lasts`
  after it. Nobody releases a held job.

`python -m fleet.jobreplay --scenario fleet/scenarios/jobs-retry-chains.yaml` prints the comparison as a
Markdown table; `--all` runs the shipped scenarios.
"""

from __future__ import annotations

import argparse
import contextlib
import heapq
import itertools
import logging
import math
import statistics
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleet.alertmanager import fingerprint
from fleet.jobcluster import MIN_JOB_AGE, NODE_FAULTS, T0, Attempt, Fault, Scenario, SimJob, SimSlurm, load
from fleet.remediation import SIMULATED_RESET, SimEngine
from gpunode_common.config import ConfigError
from gpunode_exporter.xid import catalog
from gpunode_remediate.alerts import Alert, Notification
from gpunode_remediate.engine import Engine
from gpunode_remediate.jobs import Decision, JobView
from gpunode_remediate.plan import NodeView
from gpunode_remediate.policy import Jobs, Policy
from gpunode_remediate.state import State

SHIPPED = ("jobs-retry-chains", "jobs-crash-loop")
POLICY = Policy(mode="enforce", jobs=Jobs(enabled=True), reset_command=SIMULATED_RESET)
FIXED_DELAY = 600.0  # the report's automatic retry: 10 minutes
TICK = 15.0  # the service's interval
NODE_TICK = 60.0  # node steps (reboots, quiet periods) need no finer look
XID_WINDOW = 900.0  # the rule pack's recent_window: an Xid alerts this long
THROTTLE_FOR = 240.0  # GpuNodeClockThrottled's `for`
GROUP_WAIT = 30.0  # of the delay to the service: the alert fired this much before it arrived
NFS_MAJOR_TIMEOUT = 180.0  # a client names the server after it (nfs(5): timeo=600, retrans=2 over TCP)
PORT_DOWN_FOR = 120.0  # GpuNodeFabricPortDown's `for` (rulepack/spec.yaml fabric.down_for)
# rules/spec.yaml: which NVIDIA actions page as a hardware fault, which as an application fault.
HARDWARE_ACTIONS = {"RESET_GPU", "RESTART_BM", "RESTART_VM", "CONTACT_SUPPORT", "CHECK_MECHANICALS", "UPDATE_SWFW",
                    "WORKFLOW_XID_48", "WORKFLOW_NVLINK_ERR", "WORKFLOW_NVLINK5_ERR", "UNKNOWN"}
APP_ACTIONS = {"RESTART_APP", "CHECK_UVM", "WORKFLOW_XID_45"}
POLICIES = ("fixed", "ours")
log = logging.getLogger("gpunode-remediate")


class _State(State):
    """The service's state in memory, keeping every job decision (the state forgets a released chain's)."""

    def __init__(self) -> None:
        super().__init__(Path(":memory:"))
        self.decisions: list[Decision] = []

    def begin_job_end(self, decision: Decision, status: str, now: float) -> None:
        self.decisions.append(decision)
        super().begin_job_end(decision, status, now)


class _Protocol:
    """The scheduler as the engine sees it (nodes() and jobs() listing the simulated cluster)."""

    def __init__(self, slurm: SimSlurm) -> None:
        self.slurm = slurm

    def nodes(self, with_jobs: bool = False) -> dict[str, NodeView]:
        return self.slurm.nodes_view()

    def jobs(self) -> dict[str, JobView]:
        return self.slurm.jobs_view()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.slurm, name)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    was, log.disabled = log.disabled, True
    try:
        yield
    finally:
        log.disabled = was


# --- Alerts

def alert(f: Fault) -> tuple[dict[str, str], float, float] | None:
    """(labels, fires, resolves) of the rule pack's alert about a fault, or None (no alert)."""
    at = T0 + f.at
    labels = {"instance": f"{f.node}:19835", "job": "gpunode"}
    if f.kind == "storage":
        labels = {"alertname": "NfsServerNotResponding", "server": f.server, "severity": "critical"}
        fires = at + NFS_MAJOR_TIMEOUT + f.delay - GROUP_WAIT
        return labels, fires, at + f.lasts + f.delay - GROUP_WAIT
    if f.kind == "port":
        fires = at + PORT_DOWN_FOR + f.delay - GROUP_WAIT
        repaired = at + f.lasts if f.lasts else math.inf
        return ({"alertname": "GpuNodeFabricPortDown", **labels, "device": f.device, "port": "1",
                 "severity": "critical"}, fires, repaired + f.delay - GROUP_WAIT)
    if f.kind == "straggler":
        fires = at + THROTTLE_FOR + f.delay - GROUP_WAIT
        return ({"alertname": "GpuNodeClockThrottled", **labels, "cause": "thermal", "severity": "warning"},
                fires, at + f.lasts + f.delay - GROUP_WAIT)
    if f.kind not in ("app", "node"):
        return None
    action = catalog.load().action(f.xid)
    name = "GpuXidHardwareFault" if action in HARDWARE_ACTIONS else "GpuXidApplicationFault" \
        if action in APP_ACTIONS else None
    if name is None:
        return None
    fires = at + f.delay - GROUP_WAIT
    severity = "critical" if name == "GpuXidHardwareFault" else "warning"
    return ({"alertname": name, **labels, "xid": str(f.xid), "action": action, "gpu": "3", "severity": severity},
            fires, fires + XID_WINDOW)


# --- The replay

@dataclass
class Result:
    scenario: Scenario
    policy: str
    attempts: list[Attempt]
    cancels: dict[str, float]  # job -> when a person cancelled it
    holds: dict[str, int]  # job -> the attempt at which the service held it
    excluded: set[str]
    taken: dict[str, float]
    branches: dict[tuple[str, int], str] = field(default_factory=dict)  # (job, attempt) -> the service's branch
    breaker: tuple[float, str] | None = None  # when the service's circuit breaker opened, and why

    @property
    def faulty(self) -> set[str]:
        return {f.node for f in self.scenario.faults if f.kind in NODE_FAULTS}

    @property
    def lemons(self) -> list[str]:
        return sorted({f.node for f in self.scenario.faults if f.kind == "lemon"})


class Replay:
    def __init__(self, scenario: Scenario, policy: str, cancels: dict[str, float] | None = None) -> None:
        self.sc = scenario
        self.policy = policy
        self.clock = [T0]
        self.queue: list[tuple[float, int, int, str, Any]] = []
        self.seq = 0
        self.slurm = SimSlurm(scenario, self.clock, self.push)
        self.cancels: dict[str, float] = dict(cancels or {})
        self.engine: Engine | None = None
        self.next_tick = 0.0
        self.dirty = False  # a pass of the scheduler is due

    def push(self, at: float, kind: str, payload: Any) -> None:
        # Ends and faults before notifications, notifications before the scheduler's pass at one instant.
        order = {"fault": 0, "end": 1, "repair": 1, "rebooted": 1, "cancel": 1, "notify": 2}.get(kind, 3)
        self.seq += 1
        heapq.heappush(self.queue, (at, order, self.seq, kind, payload))

    def run(self) -> Result:
        for j in self.slurm.jobs.values():
            self.push(T0 + j.spec.submit, "pass", None)
        for f in self.sc.faults:
            if f.kind != "lemon" and f.kind != "job":
                self.push(T0 + f.at, "fault", f)
        if self.policy == "ours":
            for name, at in self.cancels.items():
                self.push(at, "cancel", self.slurm.by_name[name].id)
        with _quiet():
            if self.policy == "ours":
                # Every node mounts every storage server of the scenario (its exporter's gpunode_nfs_mount_info).
                mounts = frozenset(f.server for f in self.sc.faults if f.kind == "storage")
                self.engine = SimEngine(POLICY, _State(), _Protocol(self.slurm),  # type: ignore[arg-type]
                                      clock=lambda: self.clock[0], healthy=lambda node, policy: None,
                                      sleep=lambda _seconds: None,  # the simulated Slurm launches at once
                                      mounted=lambda node, policy: mounts)
            self._loop()
            branches = self._branches()
            breaker = None
            if self.engine is not None:
                b = self.engine.state.breaker(POLICY.mode)
                breaker = (b.since, b.why) if b.open else None
                self.engine.state.close()
        s = self.slurm
        return Result(self.sc, self.policy, s.attempts, self.cancels, s.holds, s.excluded, s.taken, branches, breaker)

    def _loop(self) -> None:
        end = T0 + self.sc.duration
        while self.queue and self.queue[0][0] <= end:
            now = self.queue[0][0]
            self.clock[0] = now
            notified = False
            while self.queue and self.queue[0][0] == now:
                _at, _order, _seq, kind, payload = heapq.heappop(self.queue)
                notified |= self._handle(kind, payload)
            if self.dirty:
                self.dirty = False
                self.slurm.schedule()
            if self.engine is not None and (notified or now >= self.next_tick):
                self.engine.reconcile()  # a release or resume now wakes a pass of the scheduler now
                self.slurm.note_holds(self._waits_for_storage)
                self._tick(now)

    def _waits_for_storage(self, j: SimJob) -> bool:
        """The job is held by the service until an NFS server answers again (not for a person)."""
        assert self.engine is not None and isinstance(self.engine.state, _State)
        return any(d.job == j.id and d.restarts + 1 == j.restarts and d.waits_for
                   for d in self.engine.state.decisions)

    def _tick(self, now: float) -> None:
        """The service looks again in 15 s while a job's end waits for its decision, every minute while a
        node is in its care or an alert fires; else at the next notification or end."""
        assert self.engine is not None
        ended = any(j.state in ("failed", "node_fail") and now - j.end <= MIN_JOB_AGE
                    for j in self.slurm.jobs.values())
        state = self.engine.state
        busy = state.firing() or any(r.phase != "held" for r in state.records().values())
        step = TICK if ended else NODE_TICK if busy else 0.0
        if step:
            self.next_tick = (math.floor(now / step) + 1) * step
            self.push(self.next_tick, "tick", None)
        else:
            self.next_tick = math.inf

    def _handle(self, kind: str, payload: Any) -> bool:
        s = self.slurm
        if kind == "fault":
            self._fault(payload)
        elif kind == "end":
            job, attempt, outcome, fault = payload
            s.end(s.jobs[job], attempt, outcome, fault.kind if fault else "")
            attempt.alerted = attempt.outcome == "failed" and fault is not None and alert(fault) is not None
            self._ended(s.jobs[job], attempt)
        elif kind == "rebooted":
            s.rebooted(payload)
        elif kind == "repair":
            node, f = payload
            if s.nodes[node].broken is f:
                s.nodes[node].broken = None
        elif kind == "cancel":
            s.cancel(s.jobs[payload])
        elif kind == "notify" and self.engine is not None:
            self.engine.receive(payload, self.clock[0])
            return True
        elif kind == "tick":
            self.next_tick = min(self.next_tick, self.clock[0])
        elif kind == "pass":
            self.dirty = True
        return False

    def _fault(self, f: Fault) -> None:
        ran = self.slurm.fault(f)
        if self.engine is None or (f.kind == "app" and not ran):
            return  # the fixed retry reads no alert; an application Xid needs an application
        found = alert(f)
        if found is None:
            return
        labels, fires, resolves = found
        fp = fingerprint(labels)
        self.push(fires + GROUP_WAIT, "notify", Notification("gpunode-remediate", "firing",
                                                              (Alert(fp, "firing", labels, fires, None),)))
        self.push(resolves + GROUP_WAIT, "notify", Notification("gpunode-remediate", "resolved",
                                                                 (Alert(fp, "resolved", labels, fires, resolves),)))

    def _ended(self, j: SimJob, attempt: Attempt) -> None:
        """After an abnormal end: the fixed retry requeues it for 10 minutes later, unless a person ends the
        chain there (its end in the source); gpunode-remediate looks at its next pass."""
        now = self.clock[0]
        if attempt.outcome != "failed":
            return
        if self.policy == "fixed":
            if j.spec.ends_after is not None and j.ends >= j.spec.ends_after:
                self.cancels[j.spec.name] = now
                self.slurm.cancel(j)
            else:
                self.slurm.requeue_at(j, now + FIXED_DELAY)
        else:
            self.next_tick = min(self.next_tick, (math.floor(now / TICK) + 1) * TICK)
            self.push(self.next_tick, "tick", None)

    def _branches(self) -> dict[tuple[str, int], str]:
        if self.engine is None:
            return {}
        names = {j.id: j.spec.name for j in self.slurm.jobs.values()}
        state = self.engine.state
        assert isinstance(state, _State)
        return {(names[d.job], d.restarts + 1): d.branch for d in state.decisions}


def replay(scenario: Scenario) -> dict[str, Result]:
    """Both policies over one scenario: the fixed retry first, whose chain ends set when a person cancels."""
    fixed = Replay(scenario, "fixed").run()
    ours = Replay(scenario, "ours", fixed.cancels).run()
    return {"fixed": fixed, "ours": ours}


# --- Measures

def failed_gpu_hours(r: Result, retries: bool = False) -> float:
    """GPU time of attempts that failed (or a person cancelled) less what they checkpointed; `retries`:
    a job's later attempts only, the cost of retrying."""
    return sum(a.lost_gpu_hours for a in r.attempts
               if a.outcome in ("failed", "cancelled") and (a.index > 1 or not retries))


def gaps(r: Result) -> list[tuple[Attempt, float]]:
    """Each abnormal end followed by another attempt of its job: (the ended attempt, seconds to the next start)."""
    out = []
    by_job: dict[str, list[Attempt]] = {}
    for a in r.attempts:
        by_job.setdefault(a.job, []).append(a)
    for chain in by_job.values():
        out += [(a, b.start - a.end) for a, b in itertools.pairwise(chain) if a.outcome == "failed"]
    return out


def lemon_attempts(r: Result, node: str) -> tuple[int, float | None]:
    """Attempts placed on a lemon while it was in service, and when it was taken out for good (None: never)."""
    out = r.taken.get(node)
    placed = [a for a in r.attempts if node in a.nodes]
    if out is not None and any(a.start > out for a in placed):
        out = None  # placed again after: not out
    return sum(1 for a in placed if out is None or a.start <= out), out


def left_failed(r: Result) -> list[str]:
    """Jobs whose last attempt failed and that nobody requeued, held or cancelled: the user resubmits."""
    last: dict[str, Attempt] = {}
    for a in r.attempts:
        last[a.job] = a
    return sorted(j for j, a in last.items() if a.outcome == "failed" and j not in r.holds and j not in r.cancels)


def healthy_excluded(r: Result) -> set[str]:
    """Nodes in an ExcNodeList, drained or rebooted by the service, with no fault of their own."""
    return (set(r.excluded) | set(r.taken)) - r.faulty


def summary(r: Result) -> dict[str, Any]:
    preempted = [a for a in r.attempts if a.outcome == "preempted"]
    return {
        "attempts": len(r.attempts),
        "jobs": len({a.job for a in r.attempts}),
        "failed": sum(a.outcome == "failed" for a in r.attempts),
        "failed_gpu_hours": failed_gpu_hours(r),
        "retry_gpu_hours": failed_gpu_hours(r, retries=True),
        "preempted": len(preempted),
        "preempted_gpu_hours": sum(a.lost_gpu_hours for a in preempted),
        "median_gap": _median([g for _a, g in gaps(r)]),
        "median_alerted_gap": _median([g for a, g in gaps(r) if a.alerted]),
        "lemons": {n: lemon_attempts(r, n) for n in r.lemons},
        "held": len(r.holds),
        "left_failed": len(left_failed(r)),
        "healthy_excluded": sorted(healthy_excluded(r)),
        "breaker": r.breaker,
        "completed": sum(a.outcome == "completed" for a in r.attempts),
    }


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


# --- The report

def _when(s: float) -> str:
    s = max(0, round(s))
    return f"{s // 86400}d{s % 86400 // 3600}h{s % 3600 // 60:02d}m"


def _minutes(v: float | None) -> str:
    return "-" if v is None else f"{v / 60:.1f}"


def _lemon_cell(m: dict[str, Any]) -> str:
    if not m["lemons"]:
        return "no lemon"
    return "; ".join(f"{count} (out at {_when(out - T0)})" if out is not None else f"never out ({count} in the run)"
                     for _node, (count, out) in sorted(m["lemons"].items()))


def _breaker_cell(m: dict[str, Any], policy: str) -> str:
    if policy == "fixed":
        return "none"
    if m["breaker"] is None:
        return "stayed closed"
    at, why = m["breaker"]
    return f"opened at {_when(at - T0)} ({why.removeprefix('circuit breaker open: ')})"


MEASURES: tuple[tuple[str, Callable[[dict[str, Any], str], str]], ...] = (
    ("attempts (jobs that ran)", lambda m, p: f"{m['attempts']:,} ({m['jobs']:,})"),
    ("failed attempts", lambda m, p: f"{m['failed']:,}"),
    ("GPU-hours on failed attempts", lambda m, p: f"{m['failed_gpu_hours']:,.0f}"),
    ("of which on retries (a job's later attempts)", lambda m, p: f"{m['retry_gpu_hours']:,.0f}"),
    ("attempts preempted by a higher-priority restart (GPU-hours lost)",
     lambda m, p: f"{m['preempted']:,} ({m['preempted_gpu_hours']:,.0f})"),
    ("median minutes from a failure to the next attempt", lambda m, p: _minutes(m["median_gap"])),
    ("the same, failures an alert named", lambda m, p: _minutes(m["median_alerted_gap"])),
    ("attempts placed on the lemon until it is out", lambda m, p: _lemon_cell(m)),
    ("jobs held for a person", lambda m, p: str(m["held"])),
    ("jobs left failed, not requeued", lambda m, p: str(m["left_failed"])),
    ("healthy nodes excluded or drained", lambda m, p: str(len(m["healthy_excluded"]))),
    ("circuit breaker", _breaker_cell),
    ("jobs completed", lambda m, p: f"{m['completed']:,}"),
)


def table(scenario: Scenario, results: dict[str, Result]) -> str:
    rows = {p: summary(results[p]) for p in POLICIES}
    lines = [f"#### {scenario.name}: {scenario.description}", "",
             "| | fixed retry | gpunode-remediate |", "|---|---|---|"]
    lines += [f"| {label} | {cell(rows['fixed'], 'fixed')} | {cell(rows['ours'], 'ours')} |"
              for label, cell in MEASURES]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fleet.jobreplay", description=__doc__.split("\n\n")[0])
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--scenario", help="a job recovery scenario file (fleet/scenarios/jobs-*.yaml) or its name")
    which.add_argument("--all", action="store_true", help="every shipped job recovery scenario")
    args = parser.parse_args(argv)
    names = SHIPPED if args.all else (args.scenario,)
    try:
        scenarios = [load(n) for n in names]
    except (ConfigError, OSError) as err:
        parser.error(str(err))
    print("\n".join(table(sc, replay(sc)) for sc in scenarios), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
