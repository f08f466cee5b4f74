"""The soak's run: alert episodes in the default rules' mix on a real Slurm cluster, a stream of batch
jobs that fail on cue (jobs.py; some under an alert posted on their node while they run), the faults at
seeded moments, the scripted parts (a reboot that never completes, an operator who resumes a node
mid-reset, one who drains a node in the service's care), the people who close an open breaker, fix held
nodes, cancel jobs and release held retry chains, and at the end every alert resolved, every job
cancelled and the cluster left to settle."""

from __future__ import annotations

import heapq
import itertools
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from demo.slurm import SlurmCluster, _tool
from gpunode_remediate.scheduler.slurm import fields
from gpunode_remediate.state import State
from remediate_soak_bench.clock import (
    APP_SETTLE,
    BACKOFF,
    BREAKER_DELAY,
    CREW_DELAY,
    CULPRIT_WAIT,
    IDLE_TIMEOUT,
    IN_SERVICE,
    JOB_BUDGET_SHARE,
    JOB_WINDOW,
    KEEP_RESOLVED,
    LEMON_JOBS,
    LEMON_WINDOW,
    MAX_ATTEMPTS,
    OPERATOR_PATIENCE,
    QUIET,
    REBOOT_TIMEOUT,
    RESEND,
    SCHEDULER_TIMEOUT,
    SETTLE,
    SETTLE_TIMEOUT,
    STALE,
    WINDOW,
)
from remediate_soak_bench.episodes import Episode, draw, scripted
from remediate_soak_bench.jobplay import JobPlayer
from remediate_soak_bench.jobs import MIX as JOB_MIX
from remediate_soak_bench.jobs import SELECT, SoakJob, first_kinds
from remediate_soak_bench.rig import (
    Alertmanager,
    DroppingProxy,
    PrometheusSender,
    Service,
    SoakCluster,
    read_new,
    reset_command,
    snapshot_sources,
    write_scontrol_wrapper,
    write_squeue_wrapper,
)


@dataclass(frozen=True)
class Settings:
    base: Path
    nodes: int = 30
    minutes: float = 20.0
    seed: int = 1
    episodes_per_minute: float = 0.0  # 0: a fifth of the nodes a minute
    jobs_per_minute: float = 0.0  # 0: the nodes / 2.5 a minute

    @property
    def seconds(self) -> float:
        return self.minutes * 60

    @property
    def rate(self) -> float:
        return self.episodes_per_minute or self.nodes / 5

    @property
    def job_rate(self) -> float:
        return self.jobs_per_minute or self.nodes / 2.5

    @property
    def job_budget(self) -> int:
        """jobs.budget: reachable in a burst of failures, not hit by the mix's average."""
        per_window = self.job_rate * WINDOW / 60 * expected_requeues()
        return max(3, math.ceil(JOB_BUDGET_SHARE * per_window))

    @property
    def outage(self) -> float:
        """How long slurmctld stays stopped: about a minute in a long run, less in a short one."""
        return min(60.0, max(8.0, 3 * self.minutes))

    def fault_counts(self) -> dict[str, int]:
        return {"service_kill": math.ceil(0.6 * self.minutes), "alertmanager_restart": math.ceil(self.minutes / 6),
                "controller_stop": math.ceil(self.minutes / 9)}


def expected_requeues() -> float:
    """Requeues a job of the mix asks for, on average (jobs.py's kinds): recovers 1-2 (4/3), hopeless 3 per
    chain and half of them released for a second, app_fault and node_fault 1 (a fifth: 2)."""
    each = {"recovers": 4 / 3, "hopeless": 3 * 1.5, "app_fault": 1.2, "node_fault": 1.2}
    return sum(w * each.get(kind, 0.0) for w, kind in JOB_MIX) / sum(w for w, _ in JOB_MIX)


def policy(base: Path, scontrol: Path, squeue: Path, alertmanager: str, job_budget: int) -> dict[str, Any]:
    return {"mode": "enforce", "state_path": str(base / "state.db"), "interval": "1s", "quiet_period": f"{QUIET:g}s",
            "scheduler": {"kind": "slurm", "scontrol": str(scontrol), "squeue": str(squeue),
                          "timeout": f"{SCHEDULER_TIMEOUT:g}s"},
            "alertmanager": {"url": alertmanager, "interval": "1s", "stale_after": f"{STALE:g}s"},
            "idle_timeout": f"{IDLE_TIMEOUT:g}s", "reboot_timeout": f"{REBOOT_TIMEOUT:g}s",
            "health_check": {"enabled": False}, "reset_command": reset_command(base / "resets.log"),
            "budget": {"fraction": 0.25, "window": f"{WINDOW:g}s", "in_care": 0.5},
            "repeat_offender": {"drains": 3, "window": "3m"}, "reboot_repeat_window": "3m",
            "jobs": {"enabled": True, "select": {"name": SELECT}, "culprit_wait": f"{CULPRIT_WAIT:g}s",
                     "backoff": [f"{b:g}s" for b in BACKOFF], "max_attempts": MAX_ATTEMPTS,
                     "window": f"{JOB_WINDOW:g}s", "budget": job_budget,
                     "lemon": {"jobs": LEMON_JOBS, "window": f"{LEMON_WINDOW:g}s"}}}


@dataclass(order=True)
class Fault:
    at: float  # seconds after the start
    kind: str
    back_after: float  # seconds until what was stopped starts again


def plan_faults(settings: Settings, rng: random.Random) -> list[Fault]:
    """Each kind's faults spread over the middle 80 % of the run, one in each equal slot, at a random moment."""
    faults = []
    for kind, count in settings.fault_counts().items():
        slot = 0.8 * settings.seconds / count
        for n in range(count):
            back = {"service_kill": rng.uniform(0.5, 3), "alertmanager_restart": rng.uniform(1, 3),
                    "controller_stop": settings.outage}[kind]
            at = 0.1 * settings.seconds + n * slot + rng.uniform(0, max(0.0, slot - back - 5))
            faults.append(Fault(at, kind, back))
    return sorted(faults)


@dataclass
class Run:
    """What the run did, for checks.py: with the logs, the whole story."""

    settings: Settings
    base: Path
    nodes: list[str]
    roles: dict[str, str]  # node -> stuck_reboot, operator_resume, operator_drain
    policy: dict[str, Any]
    started: float = 0.0
    driven: float = 0.0  # the driver stopped: every alert resolved from here
    finished: float = 0.0  # the settling ended
    episodes: list[Episode] = field(default_factory=list)
    faults: list[tuple[float, str, str]] = field(default_factory=list)  # (time, kind, detail)
    person_took: list[tuple[float, str, str]] = field(default_factory=list)  # (time, node, what the person did)
    # (time, gpunode_remediate_budget_nodes, gpunode_remediate_counted_nodes) every scrape
    budget_seen: list[tuple[float, float, float]] = field(default_factory=list)
    breaker_resets: list[float] = field(default_factory=list)  # budget_from of each `breaker reset`
    seen: dict[str, list[tuple[float, str, str]]] = field(default_factory=dict)  # node -> (time, State, Reason)
    final: dict[str, tuple[str, str]] = field(default_factory=dict)
    counters: dict[str, int] = field(default_factory=dict)
    jobs: list[SoakJob] = field(default_factory=list)
    job_people: list[tuple[float, str, str]] = field(default_factory=list)  # (time, job id, cancel or release)
    # job id -> (time, JobState, Reason, Restarts, NodeList, ExcNodeList, AdminComment) at each change
    job_seen: dict[str, list[tuple[float, str, str, int, str, str, str]]] = field(default_factory=dict)

    @property
    def calls(self) -> Path:
        return self.base / "scontrol-calls.log"

    @property
    def squeue_calls(self) -> Path:
        return self.base / "squeue-calls.log"

    @property
    def job_runs(self) -> Path:
        """Every attempt's start and end, as the jobs' scripts write them (jobs.read_attempts)."""
        return self.base / "job-runs.log"

    @property
    def resets(self) -> Path:
        return self.base / "resets.log"

    @property
    def service_log(self) -> Path:
        return self.base / "service.log"


def in_service(node: dict[str, str]) -> bool:
    return set(node.get("State", "").split("+")) <= IN_SERVICE and not node.get("Reason")


class Soak(JobPlayer):
    def __init__(self, run: Run, cluster: SlurmCluster, service: Service, alertmanager: Alertmanager,
                 sender: PrometheusSender) -> None:
        self.run, self.cluster, self.service, self.am, self.sender = run, cluster, service, alertmanager, sender
        seed = run.settings.seed
        self.rng = random.Random(f"episodes-{seed}")
        self.view: dict[str, dict[str, str]] = {}
        self.looked_at = 0.0  # the last try to look at the nodes
        self.viewed_at = 0.0  # the last look that Slurm answered: self.view is as of then
        self.active: dict[str, Episode] = {}  # node -> its episode, until the driver moves on
        self.held_since: dict[str, float] = {}
        self.events: list[tuple[float, int, str, Callable[[], None]]] = []
        self.order = itertools.count()  # ties in the timeline keep their order
        self.restarts: list[Callable[[], None]] = []  # what a fault stopped, to start at the end if still due
        self.controller_down = False
        self.breaker_reset_due: float | None = None
        self.next_episode = 0.0
        self.resolving: set[int] = set()  # scripted episodes whose resolution is on the timeline
        self.log = (run.base / "driver.log").open("a")
        self.job_rng = random.Random(f"jobs-{seed}")
        self.first_kinds = first_kinds(self.job_rng)
        self.next_job = 0.0
        self.by_id: dict[str, SoakJob] = {}
        self.runs_read = 0  # bytes of the jobs' log taken
        self.failed_attempts: dict[str, int] = {}  # job id -> its abnormal ends, from its log
        self.release_seen: dict[str, float] = {}  # job id -> since when a person sees its chain held
        self.released: set[str] = set()
        self.service_log_read = 0
        self.ending = False
        self.job_states: dict[str, str] = {}  # job id -> its JobState at the last look

    # The timeline

    def at(self, when: float, what: str, action: Callable[[], None]) -> None:
        heapq.heappush(self.events, (when, next(self.order), what, action))

    def say(self, what: str) -> None:
        self.log.write(f"{time.time():.3f} {what}\n")
        self.log.flush()

    def drive(self) -> None:
        run = self.run
        run.started = time.time()
        end = run.started + run.settings.seconds
        for fault in plan_faults(run.settings, random.Random(f"faults-{run.settings.seed}")):
            self.at(run.started + fault.at, fault.kind, self._fault(fault))
        stuck = next(n for n, role in run.roles.items() if role == "stuck_reboot")
        self.at(run.started + 2, "stuck reboot", lambda: self._start(scripted(self._number(), stuck, "stuck_reboot",
                                                                              run.settings.seconds)))
        for share, role in ((0.25, "operator_resume"), (0.4, "operator_drain")):
            self.at(run.started + share * run.settings.seconds, role, lambda r=role: self._operator_part(r))
        self.next_episode = run.started + 5
        self.next_job = run.started + 3
        while (now := time.time()) < end:
            self._tick(now)
            time.sleep(0.2)
        run.driven = time.time()
        self._finish()

    def _tick(self, now: float) -> None:
        while self.events and self.events[0][0] <= now:
            _, _, what, action = heapq.heappop(self.events)
            self.say(what)
            action()
        if now - self.looked_at >= 1:
            self._observe(now)
            self._observe_jobs(now)
            self._scrape(now)
            self._revive(now)
            self._crew(now)
        if now >= self.next_episode:
            self._new_episode()
            self.next_episode = now + self.rng.expovariate(self.run.settings.rate / 60)
        if now >= self.next_job:
            self._new_job()
            # The first of each kind at twice the rate and evenly: in a short run too, all of them early.
            rate = self.run.settings.job_rate / 60
            self.next_job = now + (0.5 / rate if self.first_kinds else self.job_rng.expovariate(rate))
        self._read_runs()
        for episode in list(self.active.values()):
            self._follow(episode, now)
        if self.breaker_reset_due is not None and now >= self.breaker_reset_due:
            self._close_breaker()

    def _number(self) -> int:
        return len(self.run.episodes) + 1

    # Looking, as an operator's dashboard would

    def _observe(self, now: float) -> None:
        self.looked_at = now
        if self.controller_down:
            return
        out = self.cluster.scontrol("-o", "show", "node", timeout=5)
        if out.returncode != 0:
            return
        self.viewed_at = now
        for line in out.stdout.splitlines():
            if line.startswith("NodeName="):
                node = fields(line)
                name, state, reason = node["NodeName"], node.get("State", ""), node.get("Reason", "")
                timeline = self.run.seen.setdefault(name, [])
                if not timeline or timeline[-1][1:] != (state, reason):
                    timeline.append((now, state, reason))
                self.view[name] = node

    def _scrape(self, now: float) -> None:
        if not self.service.up:
            return
        try:
            gauges = self.service.gauges()
        except (OSError, ValueError):  # requests' errors are OSErrors: the service died under us
            return
        self.run.budget_seen.append((now, gauges.get("gpunode_remediate_budget_nodes", 0.0),
                                     gauges.get("gpunode_remediate_counted_nodes", 0.0)))
        if gauges.get("gpunode_remediate_breaker_open") == 1 and self.breaker_reset_due is None:
            self.breaker_reset_due = now + BREAKER_DELAY

    def _revive(self, now: float) -> None:
        """The service gone without a kill of ours is a failure of its own: noted, and started again. So is
        its worker thread dead (a traceback in its log, "Exception in thread"): the process answers HTTP
        and does nothing more; killed and started again."""
        if not self.service.up and self.service.start not in self.restarts:
            self.run.faults.append((now, "service_died", f"exit {self.service.proc.returncode}"))
            self.say(f"the service died by itself (exit {self.service.proc.returncode}): started again")
            self.service.start()
        log = self.run.service_log
        text, self.service_log_read = read_new(log, self.service_log_read)
        if not text:
            return
        if "Exception in thread" in text and self.service.up and self.service.start not in self.restarts:
            last = [line for line in text.splitlines() if line.strip()][-1][:200]
            self.run.faults.append((now, "service_died", f"worker thread: {last}"))
            self.say(f"the service's worker thread died ({last}): killed and started again")
            self.service.kill()
            self.service.start()
            self.service_log_read = log.stat().st_size

    def _close_breaker(self) -> None:
        """A person looks at why it opened and closes it (`breaker reset`): the budget's window starts again."""
        self.breaker_reset_due = None
        try:
            still_open = self.service.gauges().get("gpunode_remediate_breaker_open") == 1
        except (OSError, ValueError):  # the service down: the person comes back later
            still_open = False
        if not still_open:
            return
        said = self.service.command("breaker", "reset")
        state = State(Path(self.run.policy["state_path"]), readonly=True)
        try:
            self.run.breaker_resets.append(state.breaker("enforce").budget_from)
        finally:
            state.close()
        self.say(f"breaker reset: {said.stdout.strip()[:200]}")

    # Episodes

    def _eligible(self) -> list[str]:
        return [n for n in self.run.nodes if n not in self.run.roles and n not in self.active
                and self.view.get(n, {}).get("State") == "IDLE" and not self.view[n].get("Reason")]

    def _new_episode(self) -> None:
        if not (nodes := self._eligible()):
            return
        episode = draw(self.rng, self._number(), self.rng.choice(nodes), IDLE_TIMEOUT)
        self._start(episode)

    def _start(self, episode: Episode) -> None:
        """A job first when the episode has one (the action waits for it), then the alert."""
        self.run.episodes.append(episode)
        self.active[episode.node] = episode
        if episode.job_seconds and not self.controller_down:
            submitted = self.cluster.run(_tool("sbatch"), "--parsable", f"--nodelist={episode.node}",
                                         f"--partition={self.cluster.partition}", "--job-name=soak",
                                         "--output=/dev/null", f"--wrap=sleep {episode.job_seconds:.0f}", timeout=10)
            if submitted.returncode == 0:
                episode.sleeper = submitted.stdout.strip().split(";")[0]
                self.at(time.time() + 1.5, f"fire {episode.id}", lambda: self._fire(episode))
                return
            episode.job_seconds = 0.0
        self._fire(episode)

    def _fire(self, episode: Episode) -> None:
        episode.fired_at = time.time()
        self.sender.fire(episode.id, episode.alert())
        self.say(f"episode {episode.id}: {episode.alertname} {episode.labels} on {episode.node} ({episode.action}"
                 f"{', false alarm' if episode.false_alarm else ''}{', job' if episode.job_seconds else ''})")

    def _resolve(self, episode: Episode) -> None:
        self.resolving.discard(episode.id)
        if episode.resolved_at is None and episode.fired_at:
            episode.resolved_at = time.time()
            self.sender.resolve(episode.id, episode.ends_at())
            self.say(f"episode {episode.id} resolved")

    def _follow(self, episode: Episode, now: float) -> None:
        node = self.view.get(episode.node, {})
        if episode.role:
            self._follow_scripted(episode, node, now)
            return
        if episode.fired_at and episode.resolved_at is None and now >= episode.fired_at + episode.firing_for:
            self._resolve(episode)
        if node.get("Reason", "").startswith("gpunode: hold"):
            self.held_since.setdefault(episode.node, now)
            if episode.resolved_at and now - self.held_since[episode.node] >= CREW_DELAY:
                self._person(episode.node, "resume", "fixed what held it")  # the crew
        else:
            self.held_since.pop(episode.node, None)
        # An application fault a job died under asks nothing of the node: the node takes another alert
        # soon after (jobs land on the lowest-numbered nodes, and each failing attempt wants an alert).
        settle = APP_SETTLE if episode.about_job and episode.action == "none" else SETTLE
        if episode.resolved_at and now >= episode.resolved_at + settle and self.viewed_at >= \
                episode.resolved_at + settle and in_service(node):
            episode.closed_at = now
            del self.active[episode.node]

    def _crew(self, now: float) -> None:
        """A node the service holds with no episode of its own (a lemon: blamed for failed attempts of
        several jobs) is fixed and resumed by the crew CREW_DELAY after it was held."""
        for node, view in self.view.items():
            if node in self.active or node in self.run.roles:
                continue
            if view.get("Reason", "").startswith("gpunode: hold"):
                self.held_since.setdefault(node, now)
                if now - self.held_since[node] >= CREW_DELAY:
                    self._person(node, "resume", "fixed what held it (no alert on it: a lemon)")
            else:
                self.held_since.pop(node, None)

    def _person(self, node: str, what: str, why: str) -> None:
        """A person's scontrol call, straight to Slurm: the node is theirs from now on."""
        args = ["state=resume"] if what == "resume" else ["state=drain", f"reason=operator: {why}"]
        self.run.person_took.append((time.time(), node, what))
        done = self.cluster.scontrol("update", f"nodename={node}", *args, timeout=10)
        self.held_since.pop(node, None)
        self.say(f"a person: {what} {node} ({why}): exit {done.returncode} {done.stderr.strip()}")

    # Jobs

    def _operator_part(self, role: str) -> None:
        """An episode on a node of its own, for an operator to take the node over at the right moment."""
        if not (nodes := self._eligible()):
            self.at(time.time() + 3, f"{role} again", lambda: self._operator_part(role))
            return
        node = self.rng.choice(nodes)
        self.run.roles[node] = role
        tries = f"{role}_nodes_tried"
        self.run.counters[tries] = self.run.counters.get(tries, 0) + 1
        episode = scripted(self._number(), node, role, self.run.settings.seconds)
        if role == "operator_resume":  # a job outlasting the run: the reset waits for it
            episode.job_seconds = self.run.settings.seconds + 300
        self._start(episode)

    def _follow_scripted(self, episode: Episode, node: dict[str, str], now: float) -> None:
        """The stuck node's alert resolves once the service holds it; an operator takes their node over
        as soon as the service has it (mid-reset: drained, its job still running; or drained) and the
        alert resolves 6 s later."""
        reason, state = node.get("Reason", ""), set(node.get("State", "").split("+"))
        if not episode.fired_at or episode.resolved_at is not None or episode.id in self.resolving:
            return
        if episode.role == "stuck_reboot":
            if reason.startswith("gpunode: hold"):
                self._resolve_at(episode, now + 2)
        elif episode.role == "operator_resume" and "DRAIN" in state and reason.startswith("gpunode: reset") \
                and state & {"ALLOCATED", "MIXED"}:
            self._person(episode.node, "resume", "mid-reset: the job matters more")
            self._resolve_at(episode, now + 6)
        elif episode.role == "operator_drain" and "DRAIN" in state and reason.startswith("gpunode: drain"):
            self._person(episode.node, "drain", "reseating the NVLink bridge, ticket 4711")
            self._resolve_at(episode, now + 6)
        elif episode.role != "stuck_reboot" and now - episode.fired_at > OPERATOR_PATIENCE:
            episode.notes.append("the service did not take the node in time: the part moves to another node")
            self._resolve(episode)
            del self.active[episode.node], self.run.roles[episode.node]
            self.at(now + 3, f"{episode.role} again", lambda: self._operator_part(episode.role))

    def _resolve_at(self, episode: Episode, when: float) -> None:
        self.resolving.add(episode.id)
        self.at(when, f"resolve {episode.id}", lambda: self._resolve(episode))

    # Faults

    def _fault(self, fault: Fault) -> Callable[[], None]:
        def inject() -> None:
            if fault.kind == "service_kill":
                if not self.service.up:  # still down from the last one: a moment later
                    self.at(time.time() + 5, fault.kind, inject)
                    return
                self.service.kill()
                self._back_after(fault, "service restart", self.service.start)
            elif fault.kind == "alertmanager_restart":
                self.am.kill()
                self._back_after(fault, "alertmanager start (state lost)", self.am.start)
            else:
                self.cluster.stop_controller()
                self.controller_down = True
                self._back_after(fault, "slurmctld start", self._start_controller)
            self.run.faults.append((time.time(), fault.kind, f"back after {fault.back_after:.1f} s"))
        return inject

    def _start_controller(self) -> None:
        self.cluster.start_controller()
        self.controller_down = False
        self.run.faults.append((time.time(), "controller_start", "slurmctld answers again"))

    def _back_after(self, fault: Fault, what: str, start: Callable[[], None]) -> None:
        def back() -> None:
            if start in self.restarts:
                self.restarts.remove(start)
                start()
        self.restarts.append(start)
        self.at(time.time() + fault.back_after, what, back)

    # The end

    def _finish(self) -> None:
        """Everything started again, every alert resolved, every job ended; then the cluster settles until
        every node is final (in service, held by the service, or an operator's) or SETTLE_TIMEOUT passes.
        A job the service requeues meanwhile (it failed just before the scancel) is cancelled again."""
        self.ending = True
        for start in list(self.restarts):
            self.restarts.remove(start)
            start()
        self.events.clear()
        for episode in self.run.episodes:
            self._resolve(episode)
        self.cluster.run(_tool("scancel"), "--partition", self.cluster.partition, timeout=30)
        self.say("driver stopped: every alert resolved, every job cancelled")
        deadline = time.time() + SETTLE_TIMEOUT
        settled_since = None
        while time.time() < deadline:
            now = time.time()
            self._observe(now)
            self._observe_jobs(now)
            self._read_runs()
            if any(state in ("PENDING", "RUNNING", "CONFIGURING", "REQUEUED") for state in self.job_states.values()):
                self.cluster.run(_tool("scancel"), "--partition", self.cluster.partition, timeout=30)
            self._scrape(now)
            self._revive(now)
            final = all(self._final(n) for n in self.run.nodes)
            settled_since = (settled_since or now) if final and now >= self.run.driven + SETTLE else None
            if settled_since and now - settled_since >= 3:
                break
            time.sleep(1)
        self.run.finished = time.time()
        self.run.final = {n: (self.view.get(n, {}).get("State", "?"), self.view.get(n, {}).get("Reason", ""))
                          for n in self.run.nodes}
        self.say("settled" if settled_since else "settling timed out")
        self.log.close()

    def _final(self, name: str) -> bool:
        node = self.view.get(name, {})
        reason = node.get("Reason", "")
        role = self.run.roles.get(name)
        return ((in_service(node) and node.get("State") == "IDLE") or reason.startswith("gpunode: hold")
                or (role == "operator_drain" and reason.startswith("operator:")))


def soak(settings: Settings) -> Run:
    """Build the rig, drive the run, take it down; the Run and the logs under settings.base hold the rest."""
    base = settings.base
    base.mkdir(parents=True, exist_ok=True)
    nodes = [f"gpu{i:03d}" for i in range(1, settings.nodes + 1)]
    source = snapshot_sources(base / "source")
    with SoakCluster(base / "slurm", nodes, stuck_reboots=[nodes[-1]]) as cluster:
        scontrol, squeue = base / "scontrol", base / "squeue"
        write_scontrol_wrapper(scontrol, cluster.scontrol_path, base / "scontrol-calls.log", settings.seed)
        write_squeue_wrapper(squeue, _tool("squeue"), base / "squeue-calls.log", settings.seed)
        proxy = DroppingProxy(settings.seed)
        am = Alertmanager(base / "alertmanager", proxy.url)
        rules = policy(base, scontrol, squeue, am.url, settings.job_budget)
        service = Service(base, source, cluster.env, rules)
        proxy.target = f"{service.url}/alerts"
        sender = PrometheusSender(am.url, RESEND, KEEP_RESOLVED)
        run = Run(settings, base, nodes, {nodes[-1]: "stuck_reboot"}, rules)
        try:
            proxy.start()
            am.start()
            service.start()
            sender.start()
            Soak(run, cluster, service, am, sender).drive()
        finally:
            sender.stop()
            service.stop()
            am.kill()
            proxy.stop()
        run.counters |= {"webhook_posts": proxy.posts, "webhooks_dropped": proxy.dropped,
                        "webhooks_refused_service_down": proxy.refused, "alertmanager_lives": am.lives,
                        "prometheus_posts": sender.posts, "prometheus_post_failures": sender.failures}
        run.counters["reboot_programs_run"] = len(cluster.reboot_log.read_text().splitlines()) \
            if cluster.reboot_log.exists() else 0
    return run
