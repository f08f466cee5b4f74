"""What to do with each node: a pure function of the firing alerts, what the scheduler shows, what
this service did before and the time. The service carries the steps out (or, in a dry run, only
records them); the fleet replay runs this same function over simulated timelines.

A node moves through phases kept in the state file:
  drained      drained for an alert; returns when its alerts have been resolved for the quiet period
  reset_wait   drained; its GPUs are reset once no job runs on it, then reset_done
  reboot_wait  the scheduler reboots it once idle and keeps it down, then rebooting, then rebooted
  reset_done, rebooted   return when resolved for the quiet period, its exporter sees every GPU and its
               NVLink fabric is complete (held when the fabric is not within fabric_wait); held when an
               alert asking for the same cure begins after it (the fault outlived the reset or reboot)
  held         waits for a person, who resumes it in the scheduler; never returned automatically
No wait is endless: jobs that do not end within idle_timeout, a reboot not complete within
reboot_timeout, or an NVLink fabric not complete within fabric_wait hold the node for a person.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from gpunode_remediate.alerts import Alert
from gpunode_remediate.policy import ACTIONS, Policy

MARKER = "gpunode:"  # every drain reason this service writes begins with it
RETURNING = {"drained": False, "reset_done": True, "rebooted": True}  # phase -> health check first
PHASES = ("drained", "reset_wait", "reset_done", "reboot_wait", "rebooting", "rebooted", "held")
_PHASE_OF = {"drain": "drained", "reset": "reset_wait", "reboot": "reboot_wait", "hold": "held",
             "rebooted": "rebooted"}
# What Slurm writes when a reboot does not bring the node back within ResumeTimeout.
REBOOT_TIMED_OUT = "reboot timed out"


@dataclass(frozen=True)
class NodeView:
    """A node as the scheduler lists it."""

    name: str
    state: str  # base state, lower case: idle, allocated, mixed, down, ...
    flags: frozenset[str] = frozenset()  # drain, reboot_requested, reboot_issued, reserved, ...
    reason: str = ""
    jobs: tuple[str, ...] = ()
    started: float = 0.0  # Unix seconds its node daemon last started (after a reboot, a new time); 0: unknown

    @property
    def ours(self) -> bool:
        return self.reason.startswith(MARKER)

    @property
    def busy(self) -> bool:
        return self.state in ("allocated", "mixed", "completing") or "completing" in self.flags

    @property
    def out_of_service(self) -> bool:
        """Drained, down or reserved: if not by this service, by a person or the scheduler."""
        return (bool(self.flags & {"drain", "reserved", "maintenance", "fail"})
                or self.state in ("down", "drained", "fail", "future", "unknown"))

    @property
    def rebooting(self) -> bool:
        return bool(self.flags & {"reboot_requested", "reboot_issued"})


@dataclass(frozen=True)
class Record:
    """What this service holds of a node it took out of service."""

    node: str
    phase: str
    action: str
    why: str
    since: float
    gpus: tuple[str, ...] = ()


@dataclass(frozen=True)
class History:
    """Counts from the action log, as of now."""

    drains: Mapping[str, int] = field(default_factory=dict)  # node -> drains in repeat_offender.window
    reboots: Mapping[str, int] = field(default_factory=dict)  # node -> reboots in reboot_repeat_window
    budget_used: int = 0  # nodes drained in budget.window (since the breaker's last reset)
    breaker_open: bool = False
    requeues: Mapping[str, tuple[int, float]] = field(default_factory=dict)  # job -> (count, last at)
    paused: str = ""  # why a person opened the breaker (a pause: no call at all); "" when they did not


@dataclass(frozen=True)
class Step:
    node: str
    kind: str  # drain reboot reset resume requeue hold: calls; adopt release note block: bookkeeping
    why: str
    phase: str | None = None  # the node's phase once the step is done; None: forget the node
    action: str = ""
    reason: str = ""  # the drain reason the step writes
    new_drain: bool = False  # takes a node into service's care: counts against budget and repeats
    gpus: tuple[str, ...] = ()
    job: str = ""
    fingerprints: tuple[str, ...] = ()
    health: bool = False  # ask the node's exporter first: its GPU count, its NVLink fabric

    @property
    def calls(self) -> bool:
        return self.kind in ("drain", "reboot", "reset", "resume", "requeue", "hold")


@dataclass(frozen=True)
class Wanted:
    action: str
    why: str
    alertname: str
    gpus: tuple[str, ...]
    fingerprints: tuple[str, ...]
    labels: Mapping[str, str]


def wanted(policy: Policy, alerts: Iterable[Alert]) -> Wanted | None:
    """The strongest action the node's firing alerts ask for (None: none asks for one)."""
    best: tuple[int, Alert, str] | None = None
    gpus: set[str] = set()
    fingerprints = []
    for alert in alerts:
        rule = policy.action(alert.labels)
        if rule is None or rule.action == "none":
            continue
        rank = ACTIONS.index(rule.action)
        fingerprints.append(alert.fingerprint)
        if alert.labels.get("gpu"):
            gpus.add(alert.labels["gpu"])
        if best is None or rank > best[0]:
            best = (rank, alert, rule.why)
    if best is None:
        return None
    rank, alert, why = best
    return Wanted(ACTIONS[rank], why, alert.name, tuple(sorted(gpus, key=lambda g: (len(g), g))),
                  tuple(sorted(fingerprints)), alert.labels)


# The alert labels that say what failed where: the Xid and its action, the fabric's cause, the GPU,
# a port's device and number.
_DETAILS = ("xid", "action", "cause", "gpu", "device", "port")


def details(labels: Mapping[str, str]) -> list[str]:
    """`xid=79 gpu=3`, `device=mlx5_3 port=1`: what an alert's labels say failed where."""
    return [f"{k}={labels[k]}" for k in _DETAILS if labels.get(k)]


def drain_reason(action: str, want: Wanted, extra: str = "") -> str:
    """`gpunode: reboot GpuXidHardwareFault xid=79 gpu=3`: what sinfo -R shows an operator."""
    text = " ".join([MARKER, action, want.alertname, *details(want.labels)]) + (f" ({extra})" if extra else "")
    return text[:200]


def counted(policy: Policy, views: Mapping[str, NodeView]) -> int:
    """The nodes the budget is a share of: those the policy selects, less those out of service by
    someone else (down, drained by a person): a fleet half down does not double the budget. A node
    in state unknown counts: every node is, for seconds after the controller restarts."""
    return sum(1 for name, view in views.items() if policy.nodes.selects(name)
               and (view.ours or view.state == "unknown" or not view.out_of_service))


def plan(now: float, policy: Policy, views: Mapping[str, NodeView], firing: Mapping[str, Sequence[Alert]],
         last_resolved: Mapping[str, float], records: Mapping[str, Record], history: History,
         returns_rebooted: bool = False, lemons: Mapping[str, str] | None = None) -> list[Step]:
    """Steps for every node that has firing alerts or a record, first-alerted node first (it gets the
    budget first). `lemons`: node -> why job recovery blames it (remediate/jobs.py): held as a repeat
    offender when not in care already. `last_resolved`: node -> when its latest alert resolved. `returns_rebooted`: the
    scheduler returns a node to service once it registers after a reboot (Slurm's ReturnToService=2),
    so a rebooted node back in service before its checks is the scheduler's doing, not a person's."""
    nodes = counted(policy, views)
    budget, care = policy.budget.nodes(nodes), policy.budget.care(nodes)
    used = history.budget_used
    breaker_open = history.breaker_open
    steps: list[Step] = []
    # Nodes drained with this service's marker but in no record were cut short by a restart (or the
    # state file is new): taken back into care.
    strays = {name for name, view in views.items() if view.ours and name not in records}
    in_care = len(records) + len(strays)
    lemons = lemons or {}
    order = sorted(set(firing) | set(records) | strays | set(lemons),
                   key=lambda n: (min((a.starts_at for a in firing.get(n, ())), default=float("inf")), n))
    for node in order:
        want = wanted(policy, firing.get(node, ()))
        if node in lemons and (want is None or want.action != "hold"):
            want = Wanted("hold", lemons[node], "lemon", want.gpus if want else (),
                          want.fingerprints if want else (), {})
        record = records.get(node)
        view = views.get(node)
        if record is None:
            if node in strays:
                steps.append(_adopt(node, views[node], want))
                continue
            if want is None:
                continue
            if not policy.nodes.selects(node):
                steps.append(Step(node, "note", "left alone: outside the policy's nodes.include/exclude",
                                  fingerprints=want.fingerprints))
                continue
            step = _take(node, want, view, history, policy)
            if step.new_drain:
                if breaker_open or used >= budget or in_care >= care:
                    why = _blocked(policy, history.paused, breaker_open, used, budget, in_care, care, nodes)
                    steps.append(Step(node, "block", why, fingerprints=want.fingerprints))
                    breaker_open = True
                    continue
                used += 1
                in_care += 1
            steps.append(step)
        else:
            steps.extend(_follow(now, policy, node, want, view, record, history, last_resolved.get(node),
                                 returns_rebooted, firing.get(node, ())))
    return steps


def _blocked(policy: Policy, paused: str, breaker_open: bool, used: int, budget: int, in_care: int, care: int,
             nodes: int) -> str:
    if paused:
        return f"paused by a person ({paused})"
    if breaker_open:
        return "circuit breaker open"
    if used >= budget:
        return f"circuit breaker open: {used} of {budget} nodes drained in {policy.budget.window / 3600:g}h"
    return (f"circuit breaker open: {in_care} of {care} nodes in the service's care "
            f"(budget.in_care {policy.budget.in_care:g} of {nodes})")


def _take(node: str, want: Wanted, view: NodeView | None, history: History, policy: Policy) -> Step:
    """A node not yet in this service's care, whose alerts ask for an action."""
    fp = want.fingerprints
    if view is None:
        return Step(node, "note", "the scheduler lists no such node", fingerprints=fp)
    if view.out_of_service and not view.ours:
        return Step(node, "note", f"left alone: out of service by someone else ({view.reason or view.state})",
                    fingerprints=fp)
    action = want.action
    held = ""
    if action == "reboot" and history.reboots.get(node, 0) >= 1:
        held = f"a second reboot fault within {policy.reboot_repeat_window / 86400:g}d"
    elif want.alertname != "lemon" and history.drains.get(node, 0) + 1 >= policy.repeat_offender.drains:
        held = (f"repeat offender: drain {history.drains.get(node, 0) + 1} within "
                f"{policy.repeat_offender.window / 86400:g}d")
    if held:
        return Step(node, "drain", held, phase="held", action="hold", reason=drain_reason("hold", want, held),
                    new_drain=True, gpus=want.gpus, fingerprints=fp)
    kind = "reboot" if action == "reboot" else "drain"
    extra = want.why.removeprefix("lemon: ") if want.alertname == "lemon" else ""
    return Step(node, kind, want.why, phase=_PHASE_OF[action], action=action,
                reason=drain_reason(action, want, extra),
                new_drain=True, gpus=want.gpus, fingerprints=fp)


def _adopt(node: str, view: NodeView, want: Wanted | None) -> Step:
    """A node drained with this service's marker, its phase read back from the reason it wrote."""
    words = view.reason.removeprefix(MARKER).split()
    word = words[0] if words and words[0] in _PHASE_OF else "drain"
    phase, action = _PHASE_OF[word], "reboot" if word == "rebooted" else word
    if action == "reboot" and view.state == "down" and not view.rebooting:
        phase = "rebooted"
    return Step(node, "adopt", "drained by this service before", phase=phase, action=action, reason=view.reason,
                gpus=want.gpus if want else (), fingerprints=want.fingerprints if want else ())


def _follow(now: float, policy: Policy, node: str, want: Wanted | None, view: NodeView | None,
            record: Record, history: History, resolved_at: float | None, returns_rebooted: bool,
            alerts: Sequence[Alert] = ()) -> list[Step]:
    """A node in this service's care."""
    fp = want.fingerprints if want else ()
    if view is None:
        return [Step(node, "release", "the scheduler no longer lists it")]
    rebooting = record.phase in ("reboot_wait", "rebooting")
    if rebooting and REBOOT_TIMED_OUT in view.reason.lower():
        return [_hold(node, record, "the reboot did not complete: the scheduler gave up on it (ResumeTimeout)")]
    rebooted = (rebooting and view.started >= record.since > 0) or (record.phase == "rebooted" and returns_rebooted)
    if rebooted and not view.out_of_service and not view.ours:
        # Slurm's ReturnToService=2 returns a rebooted node as soon as it registers, nextstate=DOWN or
        # not: not this service's return. Taken back until the quiet period and the GPU check pass.
        why = "the scheduler returned it after its reboot (ReturnToService=2): taken back for its checks"
        return [Step(node, "drain", why, phase="rebooted", action=record.action,
                     reason=f"{MARKER} rebooted and held for its checks (the scheduler returned it)", gpus=record.gpus)]
    if not view.ours and not (rebooting and view.rebooting):
        # A person resumed it or wrote their own reason: theirs now.
        return [Step(node, "release", f"taken over by someone else ({view.reason or view.state})")]
    if record.phase == "held":
        return []
    if want is not None and ACTIONS.index(want.action) > ACTIONS.index(record.action):
        if want.action == "hold" or (want.action == "reboot" and history.reboots.get(node, 0) >= 1):
            why = want.why if want.action == "hold" else "a second reboot fault"
            return [Step(node, "hold", why, phase="held", action="hold", reason=drain_reason("hold", want, why),
                         gpus=want.gpus, fingerprints=fp)]
        if want.action == "reboot":
            return [Step(node, "reboot", want.why, phase="reboot_wait", action="reboot",
                         reason=drain_reason("reboot", want), gpus=want.gpus, fingerprints=fp)]
        if record.phase == "drained":  # drain -> reset
            return [Step(node, "note", want.why, phase="reset_wait", action="reset",
                         gpus=tuple(sorted(set(record.gpus) | set(want.gpus))), fingerprints=fp)]
    outlived = _outlived(policy, node, view, record, alerts)
    if outlived is not None:
        return [outlived]
    waited = now - record.since
    if record.phase in ("reset_wait", "reboot_wait") and view.busy:
        if waited > policy.idle_timeout:
            return [_hold(node, record, f"idle_timeout: jobs still running after {span(waited)}")]
        return []
    if record.phase == "reset_wait":
        return [Step(node, "reset", "no job runs on it", phase="reset_done", action=record.action,
                     gpus=record.gpus, fingerprints=fp)]
    if rebooting and (view.rebooting or view.state != "down"):
        if record.phase == "reboot_wait" and "reboot_issued" in view.flags:
            return [Step(node, "note", "the scheduler reboots it", phase="rebooting", action=record.action,
                         gpus=record.gpus)]
        if record.phase == "rebooting" and waited > policy.reboot_timeout:
            return [_hold(node, record, f"reboot_timeout: the reboot not complete after {span(waited)}")]
        return []
    if rebooting:
        return [Step(node, "note", "rebooted", phase="rebooted", action=record.action, gpus=record.gpus)]
    steps = []
    if record.phase == "drained" and policy.requeue.enabled:
        steps = _requeue(now, policy, node, view, record, history)
        if steps:
            return steps
    if want is None and record.phase in RETURNING:
        quiet_since = max(resolved_at or record.since, record.since)
        if now - quiet_since >= policy.quiet_period:
            return [Step(node, "resume", f"alerts resolved for {span(policy.quiet_period)}", phase=None,
                         action=record.action, gpus=record.gpus,
                         health=RETURNING[record.phase] and policy.health_check.enabled)]
    return steps


_CURED = {"rebooted": "reboot", "reset_done": "reset"}  # phase -> the cure the node has had


def _outlived(policy: Policy, node: str, view: NodeView, record: Record, alerts: Sequence[Alert]) -> Step | None:
    """A node rebooted (reset) on which an alert that asks for a reboot (reset) began after the cure: the
    fault outlived it (a fabric that never comes up, rows pending remap again), so a person looks. An alert
    that began before is the old fault Alertmanager has not resolved yet and does not count; nor does one
    that never stopped firing across the cure (it cannot be told from such a late resolution)."""
    cure = _CURED.get(record.phase)
    if cure is None or record.action != cure:
        return None
    # When the cure was done. A reboot: the boot itself, the node daemon's start (view.started), which is
    # also right for a record adopted after a restart of this service or taken back from the scheduler's
    # return (their `since` is later than the boot); the record's `since` (when this service saw the reboot
    # done, one look after the boot) where the scheduler does not say. A reset: the record's `since`, when
    # this service ran reset_command.
    done = view.started if cure == "reboot" and view.started > 0 else record.since
    again = sorted(((a, rule) for a in alerts if a.starts_at > done
                    and (rule := policy.action(a.labels)) is not None and rule.action == cure),
                   key=lambda pair: (pair[0].starts_at, pair[0].name))
    if not again:
        return None
    first, rule = again[0]
    after = f"fired again after its {cure}" + (f": {rule.why}" if rule.why else "")
    gpus = set(record.gpus) | {a.labels["gpu"] for a, _ in again if a.labels.get("gpu")}
    return Step(node, "hold", f"{first.name} {after}", phase="held", action="hold",
                reason=" ".join([MARKER, "hold", first.name, *details(first.labels), after])[:200],
                gpus=tuple(sorted(gpus, key=lambda g: (len(g), g))),
                fingerprints=tuple(sorted(a.fingerprint for a, _ in again)))


def _hold(node: str, record: Record, why: str) -> Step:
    """A wait that ran out, or what a reboot or reset could not cure: a person looks."""
    return Step(node, "hold", why, phase="held", action="hold", reason=f"{MARKER} hold {why}"[:200],
                gpus=record.gpus)


def span(seconds: float) -> str:
    """A wait as a person reads it: 40 s, 25 min, 2.0 h."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.0f} min"


def _requeue(now: float, policy: Policy, node: str, view: NodeView, record: Record,
             history: History) -> list[Step]:
    """The straggler's running jobs restart without it, with the report's backoff between requeues."""
    backoff = policy.requeue.backoff
    steps = []
    for job in view.jobs:
        count, last = history.requeues.get(job, (0, 0.0))
        if count > len(backoff):
            why = f"job {job} requeued {count} times"
            return [Step(node, "hold", why, phase="held", action="hold",
                         reason=f"{MARKER} hold {record.why} ({why})"[:200])]
        if count == 0 or now - last >= backoff[count - 1]:
            steps.append(Step(node, "requeue", f"requeue {count + 1} of job {job}", phase=record.phase,
                              action=record.action, job=job, gpus=record.gpus))
    return steps
