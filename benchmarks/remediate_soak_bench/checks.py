"""What the logs say about the run: every scheduler call the service made (the scontrol and squeue
wrappers' logs), every GPU reset it ran (the reset command's log), what Slurm showed, every attempt of
every soak job (the jobs' own log) and the service's own log.

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
  soak's clock. Lemon node-hours apart: from a lemon hold that took effect to the node's next return
  (the crew's) or the end. Every lemon of the soak is a healthy node: its jobs fail on cue, anywhere.
- a lemon hold (`gpunode: hold lemon ... (JOB, ...)`) has its cause when each job it names had an
  abnormal end on that node before it; after a person's return it touches nothing when the jobs it
  names had abnormal ends on the node after the service last took it as a lemon (jobs.lemon.jobs of
  them), nor does a drain the breaker stopped there when jobs.lemon.jobs jobs had such ends within
  jobs.lemon.window (the person released the node's alerts: a lemon is all the service can want of it).

Jobs. An abnormal end: an attempt whose script exited non-zero (the jobs' log), or one Slurm showed
NODE_FAIL or FAILED with no end logged. An effective call: one that reached Slurm and exited 0. Definitions:
- doubled requeue: an effective `requeuehold` of a job whose latest end before it was an abnormal end
  another effective requeuehold answered already; an attempt number skipped ($SLURM_RESTART_COUNT n
  with no attempt n-1); an attempt n begun, or a RestartCnt n shown, before n abnormal ends.
- forbidden requeue: any requeuehold, update jobid= or release of a job of a kind the service must
  never requeue (--no-requeue, cancelled by a person, submitted --hold, completed at once, a name
  jobs.select leaves out, the episodes' own `soak` jobs), whatever became of the call; an effective
  requeuehold of a job whose latest end was a success, or that had not ended.
- chain past its limit: a job that, after the jobs.max_attempts-th abnormal end since a person last
  released its held chain, starts again, ends abnormally again or gets a `release` from the service,
  before a person releases it. Miscounted (a figure): an update whose AdminComment's `attempt N`
  differs from the abnormal ends since the person's last release, or `held` before the limit.
- excluded node run: an attempt begun on a node of the ExcNodeList that an effective update gave the
  job before it.
- job budget exceeded: more requeues decided (the service's `job N (attempt ...): BRANCH:` lines,
  held ones left out) within a budget window, since the last `breaker reset`, than jobs.budget.
"""

from __future__ import annotations

import bisect
import re
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from gpunode_remediate.policy import build
from gpunode_remediate.scheduler.slurm import fields
from remediate_soak_bench.driver import Run, in_service
from remediate_soak_bench.episodes import Episode
from remediate_soak_bench.jobs import abnormal_ends, read_attempts

SEP = "\x1f"
_LOG_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) level=\w+ gpunode-remediate: (.*)$")
DECISION = re.compile(r"^job (\d+) \(attempt (\d+), on ([^)]*)\): (app_fault|node_fault|backoff|held): (.*)$")
COMMENT = re.compile(r"^gpunode: (app_fault|node_fault|backoff|held) attempt (\d+):")
LEMON = "gpunode: hold lemon"


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
        """drain, hold, resume, reboot; "" for a read or a job's call."""
        if self.argv[:1] == ["reboot"]:
            return "reboot"
        if self.argv[:1] == ["update"] and not self.job:
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

    @property
    def job(self) -> str:
        """The job of a requeuehold, `update jobid=` or release; "" for any other call."""
        if self.argv[:1] in (["requeuehold"], ["release"]) and len(self.argv) > 1:
            return self.argv[1]
        if self.argv[:1] == ["update"] and len(self.argv) > 1 and self.argv[1].startswith("jobid="):
            return self.argv[1].removeprefix("jobid=")
        return ""

    @property
    def effective(self) -> bool:
        return self.reached_slurm and self.rc == 0

    def value(self, key: str) -> str:
        return next((a.split("=", 1)[1] for a in self.argv[1:] if a.startswith(f"{key}=")), "")


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
        every = read_calls(run.calls)
        self.job_calls = [c for c in every if c.job]
        self.attempts = read_attempts(run.job_runs)
        self.ends = {job.id: abnormal_ends(self.attempts.get(job.id, []), run.job_seen.get(job.id, []))
                     for job in run.jobs}
        self.decisions = [(at, m.group(1), int(m.group(2)), m.group(4)) for at, said in self.log
                          if (m := DECISION.match(said))]

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

    def lemon_cause(self, call: Call) -> tuple[list[str], list[str]]:
        """(the jobs a lemon hold names, those of them with an abnormal end on its node before it)."""
        listed = re.search(r"\(([\d, ]+)\)\)?$", call.reason)
        named = re.findall(r"\d+", listed.group(1)) if listed else []
        failed = [job for job in named if any(call.node in nodes and at < call.at
                                              for at, _, nodes in self.ends.get(job, []))]
        return named, failed

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


def fresh_lemon(story: Story, call: Call) -> bool:
    """A lemon hold whose jobs (jobs.lemon.jobs of those it names) failed on the node after the service
    last took it as a lemon: blames a person's return has not spent."""
    if not call.reason.startswith(LEMON):
        return False
    taken = max((c.at for c in story.calls if c.node == call.node and c.reason.startswith(LEMON)
                 and c.at < call.at and story.took_effect(c)), default=0.0)
    named, _ = story.lemon_cause(call)
    fresh = [job for job in named if any(call.node in nodes and taken < at < call.at
                                         for at, _, nodes in story.ends.get(job, []))]
    return len(fresh) >= story.policy.jobs.lemon.jobs


def lemon_due(story: Story, node: str, at: float) -> bool:
    """jobs.lemon.jobs different jobs with abnormal ends on the node within jobs.lemon.window before `at`,
    after the service last took it as a lemon: a drain the breaker stopped on a node with no alert of its
    own (a person released its alerts) is then a lemon's."""
    lemon = story.policy.jobs.lemon
    taken = max((c.at for c in story.calls if c.node == node and c.reason.startswith(LEMON) and c.at < at
                 and story.took_effect(c)), default=0.0)
    jobs = {job for job, ends in story.ends.items()
            if any(node in nodes and max(taken, at - lemon.window) < end < at for end, _, nodes in ends)}
    return len(jobs) >= lemon.jobs


def touched(story: Story) -> list[str]:
    found = []
    for took, node, what in story.run.person_took:
        until = story.next_start(node, took)
        found += [f"{node}: {c.kind} at {c.at:.3f} ({c.reason or 'return'}), after a person's {what} at {took:.3f}"
                  for c in story.calls if c.node == node and took < c.at < until and c.reached_slurm
                  and not fresh_lemon(story, c)]
        found += [f"{node}: GPU reset at {at:.3f}, after a person's {what} at {took:.3f}"
                  for at, n, _ in story.resets if n == node and took < at < until]
        found += [f"{node}: {said!r} at {at:.3f}, after a person's {what} at {took:.3f}"
                  for at, said in story.log if said.startswith(f"{node}: not drained") and took < at < until
                  and not lemon_due(story, node, at)]
    return found


def uncaused(story: Story) -> list[str]:
    """Actions on a node whose alert asks for none, or that had no alert."""
    found = []
    for call in story.calls:
        if call.reason.startswith(LEMON):
            named, failed = story.lemon_cause(call)
            if call.reached_slurm and (len(failed) < len(named) or not named):
                found.append(f"{call.node}: lemon hold at {call.at:.3f} naming jobs {named}, of which only "
                             f"{failed} failed on it")
            continue
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
STAMP_SLACK = 1.0


def budget_exceeded(story: Story) -> list[str]:
    window, found = story.policy.budget.window, []
    drains = story.new_drains()
    fallback = story.policy.budget.nodes(len(story.run.nodes))
    for drain in drains:
        reset = max((r for r in story.run.breaker_resets if r <= drain.at), default=0.0)
        start = max(drain.at - window + STAMP_SLACK, reset)
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
    """Episode id -> (its first new drain, the return after it) for every episode the service took; a
    lemon's hold is no episode's (lemon_hours)."""
    out: dict[int, tuple[float, float | None]] = {}
    for drain in story.new_drains():
        episode = story.episode_at(drain.node, drain.at)
        if drain.reason.startswith(LEMON):
            continue
        if episode is None or episode.id in out:
            continue
        back = next((c.at for c in story.calls if c.node == drain.node and c.kind == "resume" and c.at > drain.at
                     and story.episode_at(c.node, c.at) is episode and story.took_effect(c)), None)
        out[episode.id] = (drain.at, back)
    return out


def lemon_hours(story: Story) -> float:
    run, total = story.run, 0.0
    for hold in (c for c in story.new_drains() if c.reason.startswith(LEMON)):
        back = [t for t, node, what in run.person_took if node == hold.node and what == "resume" and t > hold.at]
        back += [c.at for c in story.calls if c.node == hold.node and c.kind == "resume" and c.at > hold.at
                 and story.took_effect(c)]
        total += min(back, default=run.finished) - hold.at
    return total / 3600


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
