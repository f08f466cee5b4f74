"""What the logs say about the run: every scheduler call the service made (the scontrol wrapper's log),
every GPU reset it ran (the reset command's log), what Slurm showed, and the service's own log.

A call belongs to the episode of its node that fired last before it. Definitions:
- doubled: a second reboot that took effect in one episode; a second reset command run in one
  episode; a drain or reboot call on a node that Slurm showed, just before the call, already drained
  (or rebooting) by the service with that same reason; a second return in one episode. Calls after a
  person took the node over are not counted here but as touches.
- touched: a drain, reboot, return or reset of a node after a person took it over (an operator's
  resume mid-reset or drain with their own reason, or the crew's resume of a held node), before its
  next episode; a drain of it that only the circuit breaker stopped (the service's `not drained`) too.
- a new drain: a drain, hold or reboot that took effect on a node not drained by the service just
  before (as Slurm showed it before the call; when slurmctld could not answer, as the driver last saw
  it). Budget exceeded: more distinct nodes newly drained in a budget window, by the wrapper's clock
  (since the last `breaker reset`), than gpunode_remediate_budget_nodes said then.
- stuck: at the end, a node neither in service (IDLE, no reason), nor held by the service
  (`gpunode: hold ...`), nor an operator's.
- time to return: the episode's first new drain to the service's return (state=resume) that took effect.
- healthy node-hours taken: time out of service, from the service's new drain to its return (or the
  end of the run), of nodes whose episode was a false alarm (a flap of a few seconds on a healthy
  node) or an alert whose rule says nothing is to be done (GpuXidApplicationFault), in hours of the
  soak's clock.
"""

from __future__ import annotations

import bisect
import re
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common import percentile

from remediate.policy import build
from remediate.scheduler.slurm import fields
from remediate_soak_bench.driver import Run, in_service
from remediate_soak_bench.episodes import Episode

SEP = "\x1f"
_LOG_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) level=\w+ gpunode-remediate: (.*)$")


@dataclass
class Call:
    seq: int
    at: float
    fate: str  # call, fail (refused by the wrapper), hang (stalled before Slurm), late (answered, then stalled)
    argv: list[str]
    before: dict[str, str] | None = None  # the node as Slurm showed it just before the call
    rc: int | None = None  # None: it never ended (killed with the service, or timed out)

    @property
    def kind(self) -> str:
        """drain, hold, resume, reboot; "" for a read."""
        if self.argv[:1] == ["reboot"]:
            return "reboot"
        if self.argv[:1] == ["update"]:
            state = next((a for a in self.argv if a.startswith("state=")), "")
            return {"state=resume": "resume"}.get(state, "hold" if self.reason.startswith("gpunode: hold") else "drain")
        return ""

    @property
    def node(self) -> str:
        if self.kind == "reboot":
            return self.argv[-1]
        return self.argv[1].removeprefix("nodename=") if self.kind else ""

    @property
    def reason(self) -> str:
        return next((a.removeprefix("reason=") for a in self.argv if a.startswith("reason=")), "")

    @property
    def reached_slurm(self) -> bool:
        return self.fate in ("call", "late")


def read_calls(path: Path) -> list[Call]:
    calls: dict[int, Call] = {}
    for line in path.read_text().splitlines() if path.exists() else []:
        at, seq, what, rest = [*line.split("\t", 3), ""][:4]
        if what == "before":
            calls[int(seq)].before = fields(rest) if rest.startswith("NodeName=") else None
        elif what == "end":
            calls[int(seq)].rc = int(rest)
        else:
            calls[int(seq)] = Call(int(seq), float(at), what, rest.split(SEP))
    return sorted(calls.values(), key=lambda c: c.at)


def read_resets(path: Path) -> list[tuple[float, str, str]]:
    """(time, node, gpus) of every reset command run."""
    rows = [line.split() for line in path.read_text().splitlines()] if path.exists() else []
    return [(float(at), node, gpus) for at, node, gpus in rows]


def read_service_log(path: Path) -> list[tuple[float, str]]:
    out = []
    for line in path.read_text(errors="replace").splitlines() if path.exists() else []:
        if match := _LOG_LINE.match(line):
            stamp = time.mktime(time.strptime(match.group(1), "%Y-%m-%d %H:%M:%S")) + int(match.group(2)) / 1000
            out.append((stamp, match.group(3)))
    return out


class Story:
    """The run's episodes, calls and resets, each call and reset with its episode."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.policy = build(run.policy)
        self.calls = [c for c in read_calls(run.calls) if c.kind]
        self.resets = read_resets(run.resets)
        self.log = read_service_log(run.service_log)
        self.by_node: dict[str, list[Episode]] = {}
        for episode in sorted((e for e in run.episodes if e.fired_at), key=lambda e: e.fired_at):
            self.by_node.setdefault(episode.node, []).append(episode)
        self.starts = {node: [e.fired_at for e in eps] for node, eps in self.by_node.items()}

    def episode_at(self, node: str, at: float) -> Episode | None:
        index = bisect.bisect_right(self.starts.get(node, []), at) - 1
        return self.by_node[node][index] if index >= 0 else None

    def next_start(self, node: str, at: float) -> float:
        later = [t for t in self.starts.get(node, []) if t > at]
        return min(later, default=float("inf"))

    def took_effect(self, call: Call) -> bool:
        """Exit 0; or, cut short (killed with the service), Slurm showed its effect afterwards."""
        if not call.reached_slurm:
            return False
        if call.rc is not None:
            return call.rc == 0
        after = [(s, r) for t, s, r in self.run.seen.get(call.node, []) if call.at < t < call.at + 30]
        if call.kind == "resume":
            return bool(after) and in_service({"State": after[0][0], "Reason": after[0][1]})
        return any(r.startswith(call.reason) for _, r in after)

    def person_at(self, node: str, episode: Episode | None, at: float) -> bool:
        """A person took the node over during this episode, before `at`."""
        start = episode.fired_at if episode else 0.0
        return any(n == node and start <= t < at for t, n, _ in self.run.person_took)

    def reason_before(self, call: Call) -> str:
        """The node's Reason just before the call; when Slurm could not be asked then (slurmctld stopped),
        the last one the driver saw."""
        if call.before is not None:
            return call.before.get("Reason", "")
        seen = [r for t, _, r in self.run.seen.get(call.node, []) if t < call.at]
        return seen[-1] if seen else ""

    def new_drains(self) -> list[Call]:
        return [c for c in self.calls if c.kind in ("drain", "hold", "reboot") and self.took_effect(c)
                and not self.reason_before(c).startswith("gpunode:")]


def doubled(story: Story) -> list[str]:
    found = []
    own = [c for c in story.calls if not story.person_at(c.node, story.episode_at(c.node, c.at), c.at)]
    for call in own:
        before = call.before or {}
        state, reason = set(before.get("State", "").split("+")), before.get("Reason", "")
        if call.kind == "reboot" and reason.startswith("gpunode: reboot") and call.reached_slurm:
            found.append(f"{call.node}: reboot at {call.at:.3f} of a node Slurm showed rebooting already ({reason})")
        elif call.kind in ("drain", "hold") and "DRAIN" in state and reason == call.reason and call.reached_slurm:
            found.append(f"{call.node}: drain at {call.at:.3f} of a node drained already with {reason!r}")
    per_episode = Counter((c.node, id(story.episode_at(c.node, c.at)), c.kind) for c in own
                          if c.kind in ("reboot", "resume") and story.took_effect(c))
    found += [f"{node}: {count} {kind}s in one episode" for (node, _, kind), count in per_episode.items() if count > 1]
    resets = Counter((node, id(story.episode_at(node, at))) for at, node, _ in story.resets)
    found += [f"{node}: {count} GPU resets in one episode" for (node, _), count in resets.items() if count > 1]
    return found


def touched(story: Story) -> list[str]:
    found = []
    for took, node, what in story.run.person_took:
        until = story.next_start(node, took)
        found += [f"{node}: {c.kind} at {c.at:.3f} ({c.reason or 'return'}), after a person's {what} at {took:.3f}"
                  for c in story.calls if c.node == node and took < c.at < until and c.reached_slurm]
        found += [f"{node}: GPU reset at {at:.3f}, after a person's {what} at {took:.3f}"
                  for at, n, _ in story.resets if n == node and took < at < until]
        found += [f"{node}: {said!r} at {at:.3f}, after a person's {what} at {took:.3f}"
                  for at, said in story.log if said.startswith(f"{node}: not drained") and took < at < until]
    return found


def uncaused(story: Story) -> list[str]:
    """Actions on a node whose alert asks for none, or that had no alert."""
    found = []
    for call in story.calls:
        episode = story.episode_at(call.node, call.at)
        if call.reached_slurm and (episode is None or episode.action == "none"):
            alert = episode.alertname if episode else "no"
            found.append(f"{call.node}: {call.kind} at {call.at:.3f} with {alert} alert")
    for at, node, _ in story.resets:
        episode = story.episode_at(node, at)
        if episode is None or episode.action != "reset":
            found.append(f"{node}: GPU reset at {at:.3f} for {episode.action if episode else 'no'} episode")
    return found


# The service stamps a call as it begins it, a few milliseconds before the wrapper logs it: a drain that
# close to a window's start is left out, not taken as an excess.
_STAMP_SLACK = 1.0


def budget_exceeded(story: Story) -> list[str]:
    window, found = story.policy.budget.window, []
    drains = story.new_drains()
    fallback = story.policy.budget.nodes(len(story.run.nodes))
    for drain in drains:
        reset = max((r for r in story.run.breaker_resets if r <= drain.at), default=0.0)
        start = max(drain.at - window + _STAMP_SLACK, reset)
        within = [d for d in drains if start <= d.at <= drain.at]
        said = [b for t, b, _ in story.run.budget_seen if abs(t - drain.at) <= 5]
        limit = max(said, default=fallback)
        nodes = {d.node for d in within}
        if len(nodes) > limit:
            each = ", ".join(f"{d.node} {d.kind} #{d.seq} {drain.at - d.at:.1f} s before "
                             f"(Reason before {story.reason_before(d)[:40]!r})" for d in within)
            found.append(f"{drain.node} at {drain.at:.3f}: {len(nodes)} nodes newly drained "
                         f"since {start:.3f} (breaker reset {reset:.3f}): {each}; budget {limit:g}")
    return found


def end_state(story: Story) -> dict[str, list[str]]:
    states: dict[str, list[str]] = {"in_service": [], "held": [], "operators": [], "stuck": []}
    for node, (state, reason) in story.run.final.items():
        role = story.run.roles.get(node, "")
        if role.startswith("operator_") and (reason.startswith("operator:") or (state == "IDLE" and not reason)):
            states["operators"].append(node)
        elif state == "IDLE" and not reason:
            states["in_service"].append(node)
        elif reason.startswith("gpunode: hold"):
            states["held"].append(node)
        else:
            states["stuck"].append(f"{node}: State={state} Reason={reason}")
    return states


def returns(story: Story) -> dict[int, tuple[float, float | None]]:
    """Episode id -> (its first new drain, the return after it) for every episode the service took."""
    out: dict[int, tuple[float, float | None]] = {}
    for drain in story.new_drains():
        episode = story.episode_at(drain.node, drain.at)
        if episode is None or episode.id in out:
            continue
        back = next((c.at for c in story.calls if c.node == drain.node and c.kind == "resume" and c.at > drain.at
                     and story.episode_at(c.node, c.at) is episode and story.took_effect(c)), None)
        out[episode.id] = (drain.at, back)
    return out


def stale_while_firing(story: Story) -> list[str]:
    """Alerts the service took as resolved (no longer listed by Alertmanager) while they still fired."""
    found = []
    for at, said in story.log:
        if "no longer listed by Alertmanager" in said:
            node = said.split(":", 1)[0]
            episode = story.episode_at(node, at)
            if episode and (episode.resolved_at is None or episode.resolved_at > at):
                found.append(f"{at:.3f} {said}")
    return found


def breaker_after_controller_start(story: Story) -> list[str]:
    """Breaker openings within 15 s of slurmctld starting again, with the nodes the budget counted then."""
    starts = [t for t, kind, _ in story.run.faults if kind == "controller_start"]
    found = []
    for at, said in story.log:
        if said.startswith("circuit breaker opened") and any(0 <= at - s <= 15 for s in starts):
            counted = [c for t, _, c in story.run.budget_seen if abs(t - at) <= 3]
            found.append(f"{at:.3f} {said.split(';')[0]} (counted nodes scraped around then: {counted})")
    return found


def summarize(run: Run) -> dict[str, Any]:
    story = Story(run)
    every = read_calls(run.calls)
    taken = returns(story)
    back = [b - t for t, b in taken.values() if b is not None]
    by_id = {e.id: e for e in run.episodes}
    healthy = sum((b or run.finished) - t for eid, (t, b) in taken.items()
                  if by_id[eid].false_alarm or by_id[eid].action == "none")
    people = Counter((run.roles.get(node, "crew"), what) for _, node, what in run.person_took)
    faults = {"service_kills": sum(k == "service_kill" for _, k, _ in run.faults),
              "alertmanager_restarts": sum(k == "alertmanager_restart" for _, k, _ in run.faults),
              "controller_stops": sum(k == "controller_stop" for _, k, _ in run.faults),
              "scheduler_calls_failed": sum(c.fate == "fail" for c in every),
              "scheduler_calls_timed_out": sum(c.fate in ("hang", "late") for c in every),
              "webhooks_dropped": run.counters.get("webhooks_dropped", 0),
              "stuck_reboots": sum(e.role == "stuck_reboot" and e.fired_at > 0 for e in run.episodes),
              "operator_resumes_mid_reset": people[("operator_resume", "resume")],
              "operator_drains": people[("operator_drain", "drain")]}
    states = end_state(story)
    stuck_node = next(n for n, role in run.roles.items() if role == "stuck_reboot")
    found = {"doubled_actions": doubled(story), "operator_nodes_touched": touched(story),
             "budget_exceedances": budget_exceeded(story), "stuck_nodes": states["stuck"],
             "actions_without_cause": uncaused(story)}
    checks = {"no_doubled_actions": not found["doubled_actions"],
              "operator_nodes_untouched": not found["operator_nodes_touched"],
              "budget_never_exceeded": not found["budget_exceedances"], "no_stuck_nodes": not states["stuck"],
              "no_action_without_cause": not found["actions_without_cause"],
              "stuck_reboot_held": run.final.get(stuck_node, ("", ""))[1].startswith("gpunode: hold"),
              "every_fault_injected": all(faults.values()),
              "service_never_died_by_itself": not any(k == "service_died" for _, k, _ in run.faults)}
    episodes = [e for e in run.episodes if e.fired_at]
    return {
        "episodes": {"played": len(episodes), "by_action": dict(Counter(e.action for e in episodes)),
                     "false_alarms": sum(e.false_alarm for e in episodes),
                     "with_a_job": sum(bool(e.job_seconds) for e in episodes),
                     "taken_by_the_service": len(taken), "returned_by_the_service": len(back)},
        "faults_injected": faults,
        "people": {"crew_resumed_held_nodes": people[("crew", "resume")],
                   "breaker_resets": len(run.breaker_resets)},
        "doubled_actions": len(found["doubled_actions"]),
        "operator_nodes_touched": len(found["operator_nodes_touched"]),
        "budget_exceedances": len(found["budget_exceedances"]),
        "actions_without_cause": len(found["actions_without_cause"]),
        "stuck_nodes": len(states["stuck"]),
        "end_state": {k: len(v) for k, v in states.items()},
        "time_to_return_s": {"p50": round(percentile(back, 0.5), 1) if back else None,
                             "p90": round(percentile(back, 0.9), 1) if back else None, "returns": len(back)},
        "healthy_node_hours_taken": round(healthy / 3600, 4),
        "scheduler_calls": len(every), "service_actions": dict(Counter(c.kind for c in story.calls if c.reached_slurm)),
        "gpu_resets": len(story.resets),
        "breaker_opened": [f"{at:.3f} {said.split(';')[0]}" for at, said in story.log
                           if said.startswith("circuit breaker opened")],
        "breaker_opened_after_controller_start": breaker_after_controller_start(story),
        "alerts_taken_as_resolved_while_firing": stale_while_firing(story),
        "service_tracebacks": sum("Traceback" in line for line in
                                  run.service_log.read_text(errors="replace").splitlines()),
        "counters": run.counters,
        "checks": checks,
        "failed": sorted(name for name, ok in checks.items() if not ok),
        "evidence": found,
    }
