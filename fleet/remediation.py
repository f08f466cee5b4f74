"""What gpunode-remediate would have done with a fleet run's alerts: the service itself (remediate/engine.py
with its state in memory and the plan of remediate/plan.py) fed the alert episodes in time order, against a
simulated scheduler, then scored against the simulator's truth.

- Alertmanager is modelled by what reaches the service: only the alert names its policy has rules for (the
  route in alertmanager/alertmanager.yml), none while an inhibition there mutes it (GpuDown mutes the other
  alerts of its GPU, a reboot Xid the reset Xids of its node); an alert once sent stays firing in the service
  until its episode ends, then resolves at the episode's last firing evaluation. Group waits (10 s) and
  intervals (1 min) are not added.
- The scheduler: every node idle and in service unless the service took it. A drain drains it; a reboot
  leaves it down one step later (the reboot done, the node down until returned); a GPU reset is done at
  once (no job runs); a resume returns it. The health check before a rebooted or reset node returns passes.
- The service reconciles at every step and at each alert's start, in enforce mode (a dry run plans the same
  steps: it shows the plan the nodes it would have taken as taken).

`python -m fleet --remediation` adds the tables to each scenario's report;
`python -m fleet.remediation --alerts DIR/alerts.json --scenario NAME --start T` scores a run's episodes again.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import random
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from fleet.alertmanager import Inhibition, fingerprint, inhibitions, muted
from fleet.harness import Firing
from fleet.jobs import NODE_KILLS
from fleet.simulate import Truth
from gpunode_remediate.alerts import Alert, Notification
from gpunode_remediate.engine import Engine
from gpunode_remediate.plan import NodeView, Step
from gpunode_remediate.policy import Policy
from gpunode_remediate.state import State

# The service runs this to reset a GPU. The replay never runs it; a policy without one holds a node
# that wants a reset for a person instead (remediate/engine.py), so the replay configures one.
SIMULATED_RESET = ("gpu-reset", "{node}", "{gpu}")
POLICY = Policy(mode="enforce", reset_command=SIMULATED_RESET)  # every other key at its default

# Faults whose node the service should take out of service: a lost GPU, memory that fails, a straggler, and
# every family of the node past its GPUs (fleet/kernel.py). A storage server's outage is no node's.
NODE_ACTION = ("xid79_collapse", "uncorrectable_steps", "correctable_acceleration", "throttle", "nvlink_degraded",
               "fabric_link", "pcie_downgrade", "host_starved", "nvswitch_fatal", "hung_tasks", "cpu_lockup",
               "fs_readonly", "disk_errors", "memory_uncorrectable", "memory_ce_storm", "pcie_uncorrectable",
               "nic_fault", "gpu_driver_fault", "port_down", "port_flapping", "port_degraded", "fabric_not_ready")
# Damage the simulator never repairs: the GPU stays lost, the remapped rows stay, a node fault that keeps
# the node out of later attempts (fleet/jobs.py NODE_KILLS) stays, and so do a failing disk, DIMM or PCIe
# link. Such a node counts as faulty from its fault's window on to the end of the run.
LASTING = ("xid79_collapse", "correctable_acceleration", "uncorrectable_steps", *NODE_KILLS, "disk_errors",
           "memory_ce_storm", "pcie_uncorrectable", "port_degraded")
TAKES = ("drain", "reboot", "hold")  # calls that take a node out of service


# --- The simulated scheduler

class SimScheduler:
    """Every node idle and in service unless the service took it (remediate/scheduler's protocol)."""

    def __init__(self, nodes: Iterable[str], clock: list[float], reboot_takes: float) -> None:
        self.views = {n: NodeView(n, "idle") for n in nodes}
        self.clock = clock
        self.reboot_takes = reboot_takes
        self.rebooting: dict[str, float] = {}
        self.out_since: dict[str, float] = {}
        self.out: dict[str, list[tuple[float, float]]] = {}  # node -> closed out-of-service spans
        self.resets: list[tuple[str, tuple[str, ...], float]] = []

    def nodes(self, with_jobs: bool = False) -> dict[str, NodeView]:
        now = self.clock[0]
        for node, since in list(self.rebooting.items()):
            if now >= since + self.reboot_takes:  # rebooted; nextstate=DOWN keeps it down with our reason
                self.views[node] = NodeView(node, "down", frozenset({"drain"}), self.views[node].reason)
                del self.rebooting[node]
        return dict(self.views)

    def _take(self, node: str) -> None:
        self.out_since.setdefault(node, self.clock[0])

    def drain(self, node: str, reason: str) -> None:
        view = self.views[node]
        self.views[node] = replace(view, flags=view.flags | {"drain"}, reason=reason)
        self._take(node)

    def reboot(self, node: str, reason: str) -> None:
        self.views[node] = NodeView(node, "idle", frozenset({"drain", "reboot_requested"}), reason)
        self.rebooting[node] = self.clock[0]
        self._take(node)

    def resume(self, node: str) -> None:
        self.views[node] = NodeView(node, "idle")
        self.rebooting.pop(node, None)
        if node in self.out_since:
            self.out.setdefault(node, []).append((self.out_since.pop(node), self.clock[0]))

    def requeue(self, job: str) -> None:  # no jobs run in the simulated scheduler
        pass

    def returns_rebooted(self) -> bool:  # nextstate=DOWN holds: ReturnToService 0 or 1
        return False

    def reset(self, node: str, gpus: tuple[str, ...]) -> None:
        self.resets.append((node, gpus, self.clock[0]))

    def spans(self, end: float) -> dict[str, list[tuple[float, float]]]:
        spans = {node: list(s) for node, s in self.out.items()}
        for node, since in self.out_since.items():
            spans.setdefault(node, []).append((since, end))
        return spans


class SimEngine(Engine):
    """The service's engine; a GPU reset goes to the simulated scheduler instead of a command."""

    def _carry_out(self, step: Step) -> None:
        if step.kind == "reset":
            self.scheduler.reset(step.node, step.gpus)  # type: ignore[attr-defined]
        else:
            super()._carry_out(step)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    log = logging.getLogger("gpunode-remediate")
    was, log.disabled = log.disabled, True
    try:
        yield
    finally:
        log.disabled = was


# --- The replay

@dataclass(frozen=True)
class Event:
    """One entry of a node's action timeline: a step the service took (or a block)."""

    at: float
    kind: str  # drain reboot reset resume hold block note release
    why: str
    phase: str | None
    alerts: tuple[str, ...] = ()  # the names of the alerts behind it
    new_drain: bool = False


@dataclass
class Replay:
    nodes: list[str]
    start: float
    end: float
    step: float
    budget: int
    timeline: dict[str, list[Event]]
    out: dict[str, list[tuple[float, float]]]  # node -> spans out of service by the service
    breaker: tuple[float, str] | None  # when the circuit breaker opened, and why
    sent: list[Firing] = field(default_factory=list)  # the episodes that reached the service

    def taken(self) -> set[str]:
        return {node for node, events in self.timeline.items() if any(e.kind in TAKES for e in events)}

    def blocked(self) -> set[str]:
        return {node for node, events in self.timeline.items() if any(e.kind == "block" for e in events)}

    def out_hours(self) -> float:
        return sum(b - a for spans in self.out.values() for a, b in spans) / 3600

    def summary(self) -> dict[str, Any]:
        kinds: dict[str, int] = {}
        for events in self.timeline.values():
            for e in events:
                kinds[e.kind] = kinds.get(e.kind, 0) + 1
        return {"nodes": len(self.nodes), "budget": self.budget, "taken": len(self.taken()),
                "blocked": len(self.blocked() - self.taken()), "steps": kinds,
                "out_of_service_node_hours": round(self.out_hours(), 2),
                "breaker_opened": self.breaker[0] if self.breaker else None}


def _routed(policy: Policy) -> set[str]:
    return {rule.alertname for rule in policy.rules}


def replay(firing: list[Firing], nodes: list[str], policy: Policy = POLICY, start: float | None = None,
           end: float | None = None, step: float = 60.0,
           inhibit: Sequence[Inhibition] | None = None) -> Replay:
    """Feed the alert episodes to the service in time order, from start to end, and take its steps.
    `inhibit`: Alertmanager's inhibitions (default: alertmanager/alertmanager.yml's; () for none)."""
    policy = replace(policy, mode="enforce")
    rules = inhibitions() if inhibit is None else tuple(inhibit)
    episodes = sorted(firing, key=lambda e: e.start)
    if start is None:
        start = min((e.start for e in episodes), default=0.0)
    if end is None:
        end = max((e.end for e in episodes), default=start) + 2 * policy.quiet_period
    episodes = [e for e in episodes if e.end >= start and e.start <= end]
    labels = [{"alertname": e.alertname, **e.labels} for e in episodes]
    prints = [fingerprint(lab) for lab in labels]
    names = dict(zip(prints, (e.alertname for e in episodes), strict=True))
    routed = _routed(policy)
    grid = {start + k * step for k in range(int((end - start) // step) + 1)}
    times = sorted(grid | {e.start for e in episodes if start <= e.start <= end})
    clock = [start]
    scheduler = SimScheduler(nodes, clock, step)
    with _quiet():
        engine = SimEngine(policy, State(Path(":memory:")), scheduler, clock=lambda: clock[0],
                         healthy=lambda node, policy: None)
        timeline: dict[str, list[Event]] = {}
        sent: dict[int, bool] = {}  # episode -> resolved yet
        breaker = None
        upcoming = 0
        active: list[int] = []
        for now in times:
            clock[0] = now
            while upcoming < len(episodes) and episodes[upcoming].start <= now:
                active.append(upcoming)
                upcoming += 1
            active = [i for i in active if episodes[i].end >= now]
            news = []
            live = [labels[i] for i in active]
            for i in active:
                if i not in sent and episodes[i].alertname in routed and not muted(labels[i], live, rules):
                    sent[i] = False
                    news.append(Alert(prints[i], "firing", labels[i], episodes[i].start, None))
            for i, resolved in sent.items():
                if not resolved and episodes[i].end < now:
                    sent[i] = True
                    news.append(Alert(prints[i], "resolved", labels[i], episodes[i].start, episodes[i].end))
            if news:
                status = "firing" if any(a.status == "firing" for a in news) else "resolved"
                engine.receive(Notification("gpunode-remediate", status, tuple(news)), now)
            if not news and not scheduler.out_since and all(sent.values()):
                continue  # nothing fires, no node is in the service's care: the plan has no step
            for s in engine.reconcile():
                # What the node gets: a drain into the held phase is a hold; so is a reset without a reset command.
                held = (s.kind == "drain" and s.phase == "held") or (s.kind == "reset" and not policy.reset_command)
                kind = "hold" if held else s.kind
                event = Event(now, kind, s.why, s.phase, tuple(sorted({names.get(f, "?") for f in s.fingerprints})),
                              s.new_drain)
                events = timeline.setdefault(s.node, [])
                if events and (events[-1].kind, events[-1].why, events[-1].phase) == (kind, s.why, s.phase):
                    continue  # a block or note the service repeats at each look
                events.append(event)
                if kind == "block" and breaker is None:
                    breaker = (now, s.why)
        engine.state.close()
    return Replay(list(nodes), start, end, step, policy.budget.nodes(len(nodes)), timeline,
                  scheduler.spans(end), breaker, [episodes[i] for i in sorted(sent)])


def storm(nodes: list[str], at: float, fraction: float = 0.3, lasts: float = 2 * 3600,
          alertname: str = "GpuNodeHostStarved", seed: int = 1) -> list[Firing]:
    """A bad rule: `fraction` of the nodes (drawn at random, reproducibly) fire `alertname` at one instant."""
    count = max(1, round(fraction * len(nodes)))
    chosen = sorted(random.Random(seed).sample(nodes, count))
    return [Firing(alertname, {"alertname": alertname, "instance": node, "job": "gpunode", "severity": "warning"},
                   at, at + lasts) for node in chosen]


# --- Against the truth

@dataclass(frozen=True)
class FaultOutcome:
    kind: str
    node: str
    onset: float  # the fault's reference time
    needs_action: bool
    taken: float | None  # when the service first had the node out of service within the fault's window
    actions: tuple[str, ...]  # the service's calls on the node within the window, in order
    by: tuple[str, ...]  # the alerts behind the first of them
    blocked: bool  # the breaker (or budget) kept the service from taking it
    unruled: tuple[str, ...]  # alerts on the node in the window that no policy rule acts on

    @property
    def delay(self) -> float | None:
        return None if self.taken is None else self.taken - self.onset


@dataclass(frozen=True)
class Outcome:
    faults: tuple[FaultOutcome, ...]
    healthy_takes: tuple[tuple[str, float, str], ...]  # (node, when, why) taken with no fault in the truth
    healthy_hours: float  # node-hours out of service by the service with no fault in the truth
    out_hours: float
    breaker: tuple[float, str] | None
    summary: dict[str, Any]

    @property
    def isolated(self) -> tuple[int, int]:
        needed = [f for f in self.faults if f.needs_action]
        return sum(f.taken is not None for f in needed), len(needed)


def _acts(policy: Policy, alert: Firing) -> bool:
    rule = policy.action({"alertname": alert.alertname, **alert.labels})
    return rule is not None and rule.action != "none"


def _windows(truth: Sequence[Truth], node: str, end: float) -> list[tuple[float, float]]:
    return [(t.start, end if t.kind in LASTING else t.end) for t in truth if t.node == node]


def _outside(span: tuple[float, float], windows: list[tuple[float, float]]) -> float:
    """Seconds of span that no window covers."""
    a, b = span
    covered, at = 0.0, a
    for w0, w1 in sorted(windows):
        lo, hi = max(w0, at), min(w1, b)
        if hi > lo:
            covered += hi - lo
            at = hi
    return (b - a) - covered


def _inside(at: float, windows: list[tuple[float, float]]) -> bool:
    return any(w0 <= at <= w1 for w0, w1 in windows)


def score(result: Replay, truth: Sequence[Truth], firing: Sequence[Firing] = (),
          policy: Policy = POLICY) -> Outcome:
    """Each fault with a node: was it taken out of service in its window (the alerts' window of
    fleet/score.py: an hour before the reference time to an hour after the fault), how soon after the
    reference time, by what. Nodes taken with no fault in the truth, and their hours out of service."""
    outcomes = []
    for t in sorted((t for t in truth if t.node), key=lambda t: (t.onset, t.node)):
        window_end = result.end if t.kind in LASTING else t.end
        spans = [s for s in result.out.get(t.node, []) if s[1] >= t.start and s[0] <= window_end]
        taken = min((max(a, t.start) for a, _b in spans), default=None)
        events = [e for e in result.timeline.get(t.node, []) if t.start <= e.at <= window_end]
        calls = [e for e in events if e.kind in (*TAKES, "reset", "resume")]
        first = next((e for e in calls if e.kind in TAKES), None)
        near = [f for f in firing if f.labels.get("instance") == t.node and f.end >= t.start
                and f.start <= window_end and f.labels.get("severity") != "info"]
        unruled = tuple(sorted({f.alertname for f in near if not _acts(policy, f)}))
        outcomes.append(FaultOutcome(t.kind, t.node, t.onset, t.kind in NODE_ACTION, taken,
                                     tuple(e.kind for e in calls), first.alerts if first else (),
                                     any(e.kind == "block" for e in events), unruled))
    takes, hours = [], 0.0
    for node in result.nodes:
        windows = _windows(truth, node, result.end)
        takes += [(node, e.at, f"{e.kind} ({', '.join(e.alerts)})") for e in result.timeline.get(node, [])
                  if e.new_drain and e.kind in TAKES and not _inside(e.at, windows)]
        hours += sum(_outside(s, windows) for s in result.out.get(node, [])) / 3600
    return Outcome(tuple(outcomes), tuple(takes), hours, result.out_hours(), result.breaker, result.summary())


@dataclass(frozen=True)
class Outage:
    server: str
    onset: float
    end: float  # an hour after the server's return (its truth's window)
    taken: tuple[str, ...]  # nodes the service newly took out meanwhile, none of them for a fault of its own


def storage_outages(result: Replay, truth: Sequence[Truth]) -> list[Outage]:
    """For each storage server's outage, the nodes the service took out during it (it should take none)
    that had no fault of their own in the truth then."""
    out = []
    for t in (t for t in truth if t.server):
        taken = sorted({node for node, events in result.timeline.items() for e in events
                        if e.new_drain and e.kind in TAKES and t.start <= e.at <= t.end
                        and not _inside(e.at, _windows(truth, node, result.end))})
        out.append(Outage(t.server, t.onset, t.end, tuple(taken)))
    return out


# --- The report

def _when(t: float, start: float) -> str:
    s = max(0, round(t - start))
    return f"{s // 86400}d{s % 86400 // 3600}h{s % 3600 // 60:02d}m"


def _minutes(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds / 60:+.1f}"


def _budget(policy: Policy, nodes: int) -> str:
    b = policy.budget
    return f"{b.nodes(nodes)} of {nodes} nodes per {b.window / 3600:g} h"


def fault_table(outcome: Outcome, start: float) -> list[str]:
    lines = ["| fault | node | reference time | node action wanted | taken out | minutes after the reference time "
             "| the service's calls | by | alerts no policy rule acts on |",
             "|---|---|---|---|---|---|---|---|---|"]
    for f in outcome.faults:
        taken = "yes" if f.taken is not None else "blocked by the breaker" if f.blocked else "no"
        lines.append(f"| {f.kind} | {f.node} | {_when(f.onset, start)} | {'yes' if f.needs_action else 'no'} | "
                     f"{taken} | {_minutes(f.delay)} | {' -> '.join(f.actions) or '-'} | "
                     f"{', '.join(f.by) or '-'} | {', '.join(f.unruled) or '-'} |")
    return lines


def by_kind(outcome: Outcome) -> list[str]:
    """The faults per kind: how many, how many taken out, minutes from the reference time, by which calls."""
    lines = ["| fault | faults | taken out | minutes after the reference time | the service's first call (alert) |",
             "|---|---|---|---|---|"]
    for kind in dict.fromkeys(f.kind for f in sorted(outcome.faults, key=lambda f: f.kind)):
        faults = [f for f in outcome.faults if f.kind == kind]
        delays = sorted(f.delay for f in faults if f.delay is not None)
        span = "-" if not delays else _minutes(delays[0]) if delays[0] == delays[-1] else \
            f"{_minutes(delays[0])} to {_minutes(delays[-1])}"
        calls = sorted({f"{f.actions[0]} ({', '.join(f.by)})" for f in faults if f.actions and f.by})
        lines.append(f"| {kind} | {len(faults)} | {sum(f.taken is not None for f in faults)} | {span} | "
                     f"{'; '.join(calls) or '-'} |")
    return lines


@dataclass(frozen=True)
class StormResult:
    label: str
    fraction: float
    firing: int
    budget: int
    taken: int
    blocked: int
    breaker: bool
    out_hours: float
    isolated: tuple[int, int] | None = None  # the scenario's faults isolated, when the storm came among them


def storm_runs(firing: list[Firing], truth: Sequence[Truth], nodes: list[str], start: float, end: float,
               policy: Policy = POLICY, step: float = 60.0, at: float | None = None) -> list[StormResult]:
    """A false-alert storm (30 % of the nodes fire GpuNodeHostStarved for 2 hours) with the breaker
    (the policy's budget) and without it (a budget of every node): alone, and among the run's alerts."""
    at = start + min(86400.0, (end - start) / 4) if at is None else at
    bad = storm(nodes, at)
    out = []
    for label, p in (("with the breaker", policy),
                     ("without (budget fraction and in_care 1.0)",
                      replace(policy, budget=replace(policy.budget, fraction=1.0, maximum=None, in_care=1.0)))):
        alone = replay(bad, nodes, p, start, end, step)
        out.append(StormResult(f"storm alone, {label}", 0.3, len(bad), alone.budget, len(alone.taken()),
                               len(alone.blocked() - alone.taken()), alone.breaker is not None, alone.out_hours()))
        mixed = replay([*firing, *bad], nodes, p, start, end, step)
        s = score(mixed, truth, firing, p)
        out.append(StormResult(f"storm among the run's alerts, {label}", 0.3, len(bad), mixed.budget,
                               len(mixed.taken()), len(mixed.blocked() - mixed.taken()), mixed.breaker is not None,
                               mixed.out_hours(), s.isolated))
    return out


def section(name: str, backend: str, firing: list[Firing], truth: Sequence[Truth], nodes: list[str], start: float,
            end: float, policy: Policy = POLICY, step: float = 60.0, storms: bool = True) -> tuple[str, dict[str, Any]]:
    """The report's remediation tables for one backend's run, and the same as data."""
    result = replay(firing, nodes, policy, start, end, step)
    outcome = score(result, truth, firing, policy)
    done, needed = outcome.isolated
    lines = [f"#### Remediation replay: {name} on {backend}", "",
             f"What gpunode-remediate would have done with these alerts (policy defaults: budget "
             f"{_budget(policy, len(nodes))}, quiet period {policy.quiet_period / 60:g} min; a GPU reset "
             f"command configured; the replay steps every {step:g} s and at each alert's start).", "",
             *(fault_table(outcome, start) if outcome.faults else ["No fault of a node in the truth."]), "",
             f"- Faults that want node action isolated: **{done} of {needed}**.",
             f"- Nodes taken out with no fault in the truth: **{len(outcome.healthy_takes)}**"
             + (" (" + "; ".join(f"{n} at {_when(at, start)}: {why}" for n, at, why in outcome.healthy_takes) + ")"
                if outcome.healthy_takes else "")
             + f"; node-hours out of service without a fault: **{outcome.healthy_hours:.1f}** "
               f"(of {outcome.out_hours:.1f} out of service in all).",
             "- Circuit breaker: " + (f"opened at {_when(outcome.breaker[0], start)} ({outcome.breaker[1]})"
                                      if outcome.breaker else "stayed closed") + "."]
    outages = storage_outages(result, truth)
    lines += [f"- Storage server `{o.server}` gone at {_when(o.onset, start)}: nodes taken out from then to an hour "
              f"after its return: **{len(o.taken)}**" + (f" ({', '.join(o.taken)})" if o.taken else "") + "."
              for o in outages]
    unlimited = replace(policy, budget=replace(policy.budget, fraction=1.0, maximum=None, in_care=1.0))
    free = replay(firing, nodes, unlimited, start, end, step) if outcome.breaker else None
    if free is not None:  # faults at rates scaled past the budget: what the policy does with each, unbudgeted
        freed = score(free, truth, firing, unlimited)
        lines += ["", "The breaker opened, so the same alerts again with a budget of every node (budget fraction "
                  "and in_care 1.0), the policy otherwise the same:", "", *by_kind(freed), "",
                  f"- Faults that want node action isolated: **{freed.isolated[0]} of {freed.isolated[1]}**; nodes "
                  f"taken out with no fault in the truth: **{len(freed.healthy_takes)}**; node-hours out of "
                  f"service without a fault: **{freed.healthy_hours:.1f}** (of {freed.out_hours:.1f}).",
                  *(f"- Storage server `{o.server}` gone at {_when(o.onset, start)}: nodes taken out from then to "
                    f"an hour after its return: **{len(o.taken)}**" + (f" ({', '.join(o.taken)})" if o.taken else "")
                    + "." for o in storage_outages(free, truth))]
    stormed = storm_runs(firing, truth, nodes, start, end, policy, step) if storms else []
    if stormed:
        lines += ["", f"A false-alert storm: a bad rule makes 30 % of the nodes fire GpuNodeHostStarved at "
                  f"{_when(start + min(86400.0, (end - start) / 4), start)} for 2 hours, alone and among the run's "
                  "alerts. The replay never closes an open breaker (a person would, with "
                  "`gpunode-remediate breaker reset`): every later fault is left alone.", "",
                  "| run | nodes firing | budget | nodes drained | nodes blocked | breaker opened "
                  "| node-hours out of service | faults isolated |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in stormed:
            lines.append(f"| {r.label} | {r.firing} | {r.budget} | {r.taken} | {r.blocked} | "
                         f"{'yes' if r.breaker else 'no'} | {r.out_hours:.1f} | "
                         f"{'-' if r.isolated is None else f'{r.isolated[0]} of {r.isolated[1]}'} |")
    data = {"scenario": name, "backend": backend, "start": start, "end": end, "step": step,
            "summary": outcome.summary,
            "faults": [{**asdict(f), "delay": f.delay} for f in outcome.faults],
            "healthy_takes": [list(t) for t in outcome.healthy_takes], "healthy_hours": outcome.healthy_hours,
            "breaker": list(outcome.breaker) if outcome.breaker else None,
            "timeline": {n: [asdict(e) for e in events] for n, events in result.timeline.items()},
            "storms": [asdict(r) for r in stormed], "outages": [asdict(o) for o in outages],
            "unbudgeted": None if free is None else {
                "faults": [{**asdict(f), "delay": f.delay} for f in freed.faults],
                "outages": [asdict(o) for o in storage_outages(free, truth)],
                "healthy_takes": [list(t) for t in freed.healthy_takes], "healthy_hours": freed.healthy_hours}}
    return "\n".join(lines) + "\n", data


def load_alerts(path: Path) -> list[Firing]:
    """The alert episodes `python -m fleet` wrote (alerts.json)."""
    return [Firing(a["alertname"], a["labels"], a["start"], a["end"]) for a in json.loads(path.read_text())]


def main(argv: list[str] | None = None) -> int:
    from fleet import scenario
    from fleet.simulate import Fleet, node_name

    parser = argparse.ArgumentParser(prog="python -m fleet.remediation", description=__doc__.split("\n\n")[0])
    parser.add_argument("--alerts", type=Path, required=True, help="a run's alerts.json")
    parser.add_argument("--scenario", required=True)
    parser.add_argument("--start", type=float, required=True,
                        help="the run's start: unix seconds, in its remediation.json")
    parser.add_argument("--backend", default="?")
    args = parser.parse_args(argv)
    sc = scenario.load(args.scenario)
    fleet = Fleet(sc, args.start)
    text, _data = section(sc.name, args.backend, load_alerts(args.alerts), fleet.truth(),
                          [node_name(n) for n in range(sc.nodes)], args.start, args.start + sc.duration)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
