"""The job recovery replay's cluster (fleet/jobreplay.py): its scenario files and a simulated Slurm.

- The cluster: nodes of 8 GPUs; jobs (nodes, training work, start load, checkpoint interval, priority)
  placed gang-wise on the lowest-named free nodes outside their ExcNodeList, highest priority first. A job
  whose StartTime has come and that does not fit preempts running jobs of lower priority (Slurm requeues
  them: PreemptMode=REQUEUE), or else keeps the nodes it could use from the jobs after it (as backfill plans
  it); a job waiting for its StartTime keeps nothing (the main scheduler passes it by). A StartTime of now
  starts at once, a later one at the first backfill pass after it (every 30 s). Requeuehold, release,
  update (AdminComment, ExcNodeList, StartTime), drain, `reboot ASAP nextstate=DOWN` (5 min once idle) and
  resume as Slurm 22.05 does them; an ended job's record lasts MinJobAge (300 s).
- Faults: an application Xid (`app`) ends the job running on its node; a node fault (`node`, an Xid whose
  action is a reboot) ends it and fails every attempt placed there until the node is rebooted (by the
  service, or by a person `lasts` after); a throttled node (`straggler`) slows its job until the training's
  step-time watchdog ends it `fails_after` in; a `lemon` ends every attempt placed on it `fails_after` in,
  without an alert; a fault of the job itself (`job`: a network or software fault no restart cures) ends
  its running attempt and every later one `fails_after` in; a `transient` fault (an NCCL timeout) ends the
  job on its node once, without an alert. A `storage` fault is an NFS server every node mounts (`server`)
  that stops answering for `lasts`: every attempt running, or starting, while it is away blocks and is
  ended by its collective's watchdog `fails_after` in (600 s by default), if the server is still away then.
  A `port` fault is a fabric port of the node down (`device`, its cable pulled): the job running there ends
  `fails_after` later (NCCL's transport retries run out), every attempt placed there fails the same way,
  and no reboot cures it: a person replaces the cable `lasts` after (0: never).
- A scenario file (fleet/scenarios/jobs-*.yaml): `name`, `description`, `nodes`, `duration`, `seed`;
  `defaults` (`load`, `checkpoint`) for its `jobs` (`name`, `nodes`, `work`, `submit`, `priority`, `load`,
  `checkpoint`, `ends_after`); `faults` (`kind`, `at`, `node` or `job`, `xid`, `fails_after`, `lasts`,
  `server`, `device`);
  `stream` (smaller jobs drawn: `backlog`, `every`, `nodes`, `work`, `load`, `checkpoint`) and
  `background` (faults drawn on every node: `per_gpu_hour`, `mix`, `repair`). Durations as 90s, 15m, 2.2h.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gpunode_common.config import ConfigError, load_yaml, seconds
from gpunode_remediate.jobs import JobView
from gpunode_remediate.plan import NodeView

SCENARIOS = Path(__file__).resolve().parent / "scenarios"
T0 = 1_750_000_000.0  # the replay's clock: Unix seconds, as the service keeps them
GPUS = 8
BACKFILL = 30.0  # Slurm's bf_interval
MIN_JOB_AGE = 300.0
REBOOT_TAKES = 300.0
KINDS = ("app", "node", "straggler", "lemon", "job", "transient", "storage", "port")
STORAGE_WATCHDOG = 600.0  # a job blocked on storage this long is ended by its collective's watchdog
NODE_FAULTS = ("node", "straggler", "lemon", "port")  # a node with one of these is not healthy


# --- The scenario

@dataclass(frozen=True)
class JobSpec:
    name: str
    nodes: int
    work: float  # seconds of training to complete
    submit: float = 0.0
    priority: int = 0
    load: float = 1800.0  # each attempt's start (checkpoint load) before it trains
    checkpoint: float = 3600.0
    ends_after: int | None = None  # a person cancels it at its N-th abnormal end under the fixed retry


@dataclass(frozen=True)
class Fault:
    kind: str  # KINDS
    at: float = 0.0  # seconds from the start; a lemon is one from the start
    node: str = ""
    job: str = ""
    xid: int = 0
    fails_after: float = 300.0  # an attempt placed where the fault is ends this long after its start
    lasts: float = 0.0  # straggler: how long it throttles; node: when a person repairs it (0: never)
    delay: float = 75.0  # from the fault to its notification
    server: str = ""  # storage: the NFS server (every node mounts it)
    device: str = ""  # port: the RDMA device whose port went down (its cable pulled)


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    nodes: int
    duration: float
    seed: int
    jobs: tuple[JobSpec, ...]
    faults: tuple[Fault, ...]

    @property
    def names(self) -> list[str]:
        return [node_name(n) for n in range(1, self.nodes + 1)]


def node_name(number: int) -> str:
    return f"gpu{number:03d}"


def _keys(data: Any, known: set[str], where: str, required: tuple[str, ...] = ()) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: want a mapping, got {data!r}")
    unknown = set(data) - known
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(sorted(map(str, unknown)))}")
    missing = [key for key in required if key not in data]
    if missing:
        raise ConfigError(f"{where}: missing key(s) {', '.join(missing)}")
    return data


def _job(data: Any, defaults: dict[str, Any], where: str) -> JobSpec:
    data = {**defaults, **_keys(data, set(JobSpec.__dataclass_fields__), where, ("name", "nodes", "work"))}
    durations = {k: seconds(data[k], f"{where}.{k}") for k in ("work", "submit", "load", "checkpoint") if k in data}
    ends = data.get("ends_after")
    return JobSpec(str(data["name"]), int(data["nodes"]), priority=int(data.get("priority", 0)),
                   ends_after=None if ends is None else int(ends), **durations)


def _fault(data: Any, rng: random.Random, where: str) -> Fault:
    data = _keys(data, set(Fault.__dataclass_fields__) - {"delay"}, where, ("kind",))
    if data.get("kind") not in KINDS:
        raise ConfigError(f"{where}.kind: want one of {', '.join(KINDS)}, got {data.get('kind')!r}")
    durations = {k: seconds(data[k], f"{where}.{k}") for k in ("at", "fails_after", "lasts") if k in data}
    if data["kind"] == "storage":
        if not data.get("server") or "lasts" not in data:
            raise ConfigError(f"{where}: a storage fault wants its server and how long it lasts")
        durations.setdefault("fails_after", STORAGE_WATCHDOG)
    return Fault(data["kind"], node=str(data.get("node", "")), job=str(data.get("job", "")),
                 xid=int(data.get("xid", 0)), delay=rng.uniform(60.0, 90.0), server=str(data.get("server", "")),
                 device=str(data.get("device", "mlx5_0" if data["kind"] == "port" else "")), **durations)


def _stream(data: Any, rng: random.Random, duration: float) -> list[JobSpec]:
    """Small jobs sharing the cluster: `backlog` queued at the start, then one every `every` on average
    (exponential gaps), each of a size drawn from `nodes` and work drawn between `work`'s two bounds."""
    data = _keys(data, {"backlog", "every", "nodes", "work", "load", "checkpoint"}, "stream",
                 ("every", "nodes", "work", "load", "checkpoint"))
    low, high = (seconds(w, "stream.work") for w in data["work"])
    load, checkpoint = seconds(data["load"], "stream.load"), seconds(data["checkpoint"], "stream.checkpoint")
    every = seconds(data["every"], "stream.every")
    out, at = [], 0.0
    while at < duration:
        n = len(out) + 1
        out.append(JobSpec(f"s{n:04d}", int(rng.choice(data["nodes"])), rng.uniform(low, high), at, 0, load,
                           checkpoint))
        if n >= int(data.get("backlog", 0)):
            at += rng.expovariate(1.0 / every)
    return out


def _background(data: Any, rng: random.Random, nodes: list[str], duration: float) -> list[Fault]:
    """Faults drawn at a rate per GPU-hour on every node, of the kinds `mix` weighs: application Xids
    (13, 31, 94), Xid 79 (repaired by a person `repair` after), transient NCCL timeouts."""
    data = _keys(data, {"per_gpu_hour", "mix", "repair"}, "background", ("per_gpu_hour", "mix", "repair"))
    rate = float(data["per_gpu_hour"]) * GPUS / 3600.0  # per node-second
    kinds, weights = zip(*sorted(data["mix"].items()), strict=True)
    repair = seconds(data["repair"], "background.repair")
    out = []
    for node in nodes:
        at = rng.expovariate(rate)
        while at < duration:
            kind = rng.choices(kinds, weights)[0]
            xid = {"app": rng.choice((13, 31, 94)), "node": 79}.get(kind, 0)
            out.append(Fault(kind, at, node, xid=xid, fails_after=300.0, lasts=repair if kind == "node" else 0.0,
                             delay=rng.uniform(60.0, 90.0)))
            at += rng.expovariate(rate)
    return out


def build(data: Any) -> Scenario:
    data = _keys(data, {"name", "description", "nodes", "duration", "seed", "defaults", "jobs", "faults",
                        "stream", "background"}, "scenario", ("name", "nodes", "duration"))
    rng = random.Random(int(data.get("seed", 0)))
    duration = seconds(data["duration"], "duration")
    defaults = _keys(data.get("defaults", {}), {"load", "checkpoint"}, "defaults")
    jobs = [_job(j, defaults, f"jobs[{n}]") for n, j in enumerate(data.get("jobs", []))]
    faults = [_fault(f, rng, f"faults[{n}]") for n, f in enumerate(data.get("faults", []))]
    nodes = [node_name(n) for n in range(1, int(data["nodes"]) + 1)]
    if "stream" in data:
        jobs += _stream(data["stream"], rng, duration)
    if "background" in data:
        faults += _background(data["background"], rng, nodes, duration)
    names = {j.name for j in jobs}
    for f in faults:
        if (f.node and f.node not in nodes) or (f.job and f.job not in names):
            raise ConfigError(f"fault {f.kind} at {f.at:g}: no such node or job ({f.node or f.job})")
    return Scenario(str(data["name"]), str(data.get("description", "")), len(nodes), duration,
                    int(data.get("seed", 0)), tuple(jobs), tuple(sorted(faults, key=lambda f: (f.at, f.node))))


def load(path: Path | str) -> Scenario:
    """A scenario file, or a shipped scenario's name."""
    path = Path(path)
    if not path.exists() and (SCENARIOS / f"{path}.yaml").exists():
        path = SCENARIOS / f"{path}.yaml"
    return load_yaml(path, build)


# --- The simulated Slurm

@dataclass
class Attempt:
    job: str
    index: int  # 1: the job's first attempt
    nodes: tuple[str, ...]
    start: float
    end: float = 0.0
    outcome: str = "running"  # completed, failed, cancelled, preempted, running
    cause: str = ""  # the fault kind that ended it
    alerted: bool = False  # an alert named the fault's node
    lost_gpu_hours: float = 0.0  # its GPU time less the training it checkpointed


@dataclass
class SimNode:
    name: str
    job: str = ""
    drain: bool = False
    reason: str = ""
    reboot: str = ""  # "", requested, issued
    down: bool = False
    started: float = 0.0
    broken: Fault | None = None  # a node fault no reboot has cured yet

    @property
    def free(self) -> bool:
        return not (self.job or self.drain or self.down or self.reboot)

    def view(self) -> NodeView:
        flags = {"drain"} if self.drain else set()
        if self.reboot:
            flags.add(f"reboot_{self.reboot}")
        state = "allocated" if self.job else "down" if self.down else "idle"
        return NodeView(self.name, state, frozenset(flags), self.reason, (self.job,) if self.job else (),
                        self.started)


@dataclass
class SimJob:
    spec: JobSpec
    id: str
    state: str = "pending"
    held: bool = False
    restarts: int = 0
    start_at: float = 0.0
    eligible: float = 0.0  # when a pass of the scheduler may start it
    exc: tuple[str, ...] = ()
    comment: str = ""
    end: float = 0.0
    saved: float = 0.0  # training checkpointed
    ends: int = 0  # abnormal ends so far
    attempt: Attempt | None = None

    def view(self, now: float) -> JobView:
        reason = ("job_requeued_in_held_state" if self.held else "BeginTime" if self.start_at > now
                  else "None" if self.state != "pending" else "Priority")
        status = 1 << 8 if self.state in ("failed", "node_fail") else 0
        nodes = self.attempt.nodes if self.attempt and self.state != "pending" else ()
        return JobView(self.id, self.state, reason, status, nodes, "gpu", self.spec.nodes, True, self.restarts, True,
                       self.end)


class SimSlurm:
    """The scheduler protocol remediate/recovery.py and remediate/engine.py call, over in-memory state."""

    def __init__(self, scenario: Scenario, clock: list[float], wake: Callable[[float, str, Any], None]) -> None:
        self.nodes = {n: SimNode(n) for n in scenario.names}
        self.jobs = {str(1000 + n): SimJob(spec, str(1000 + n), start_at=T0 + spec.submit, eligible=T0 + spec.submit)
                     for n, spec in enumerate(scenario.jobs)}
        self.by_name = {j.spec.name: j for j in self.jobs.values()}
        self.clock = clock
        self.wake = wake
        self.faults: dict[str, list[Fault]] = {}
        self.job_faults: dict[str, list[Fault]] = {}
        self.storage = [f for f in scenario.faults if f.kind == "storage"]
        for f in scenario.faults:
            if f.kind != "storage":
                (self.job_faults.setdefault(f.job, []) if f.kind == "job"
                 else self.faults.setdefault(f.node, [])).append(f)
        self.attempts: list[Attempt] = []
        self.excluded: set[str] = set()  # every node ever in an ExcNodeList
        self.taken: dict[str, float] = {}  # node -> when the service first drained or rebooted it
        self.holds: dict[str, int] = {}  # job name -> the attempt at which the service held it

    def note_holds(self, waiting: Callable[[SimJob], bool] = lambda j: False) -> None:
        """Jobs still held once the service's pass is done were held for a person, not requeued; but
        those `waiting` for a storage server, which the service releases once it answers."""
        for j in self.jobs.values():
            if j.held and j.spec.name not in self.holds and not waiting(j):
                self.holds[j.spec.name] = j.restarts

    # The protocol

    def nodes_view(self) -> dict[str, NodeView]:
        return {n: node.view() for n, node in self.nodes.items()}

    def jobs_view(self) -> dict[str, JobView]:
        now = self.clock[0]
        return {j.id: j.view(now) for j in self.jobs.values() if T0 + j.spec.submit <= now
                and not (j.state not in ("pending", "running") and now - j.end > MIN_JOB_AGE)}

    def drain(self, node: str, reason: str) -> None:
        self.nodes[node].drain, self.nodes[node].reason = True, reason
        self.taken.setdefault(node, self.clock[0])

    def reboot(self, node: str, reason: str) -> None:
        self.drain(node, reason)
        self.nodes[node].reboot = "requested"
        self._reboot_if_idle(node)

    def resume(self, node: str) -> None:
        self.nodes[node] = replace(self.nodes[node], drain=False, reason="", reboot="", down=False)
        self.wake(self.clock[0], "pass", None)

    def requeue(self, job: str) -> None:  # the node plan's requeue of a straggler's jobs: off in this replay
        raise NotImplementedError("requeue.enabled is off in the job recovery replay")

    def returns_rebooted(self) -> bool:
        return False

    def reset(self, node: str, gpus: tuple[str, ...]) -> None:
        broken = self.nodes[node].broken
        if broken is not None and broken.kind != "port":
            self.nodes[node].broken = None

    def job_detail(self, job: str) -> tuple[str, tuple[str, ...]] | None:
        j = self.jobs.get(job)
        return None if j is None else (j.spec.name, j.exc)

    def requeuehold(self, job: str) -> None:
        j = self.jobs[job]
        assert j.state in ("failed", "node_fail"), f"requeuehold of a {j.state} job"
        j.state, j.held, j.restarts = "pending", True, j.restarts + 1

    def update_job(self, job: str, comment: str, exclude: tuple[str, ...] = (), start_at: float | None = None) -> None:
        j = self.jobs[job]
        j.comment = comment
        if exclude:
            j.exc = tuple(exclude)
            self.excluded.update(exclude)
        if start_at is not None:
            self._start_at(j, start_at)

    def release(self, job: str) -> None:
        j = self.jobs[job]
        j.held = False
        self.wake(j.eligible, "pass", None)

    # The cluster

    def _start_at(self, j: SimJob, at: float) -> None:
        """Now: the main scheduler starts it at once; later: the first backfill pass after it."""
        now = self.clock[0]
        j.start_at = max(at, now)
        j.eligible = now if at <= now else math.ceil(at / BACKFILL) * BACKFILL

    def requeue_at(self, j: SimJob, at: float) -> None:
        """The fixed retry: the ended job back in the queue to start at `at`, its nodes as before."""
        j.state, j.restarts = "pending", j.restarts + 1
        self._start_at(j, at)
        self.wake(j.eligible, "pass", None)

    def _reboot_if_idle(self, node: str) -> None:
        n = self.nodes[node]
        if n.reboot == "requested" and not n.job:
            n.reboot = "issued"
            self.wake(self.clock[0] + REBOOT_TAKES, "rebooted", node)

    def rebooted(self, node: str) -> None:
        """nextstate=DOWN: back, down with the service's reason, until it resumes it; the reboot cures a
        fault whose action is a reboot."""
        n = self.nodes[node]
        n.reboot, n.down, n.started = "", True, self.clock[0]
        if n.broken is not None and n.broken.kind != "port":  # no reboot plugs a cable back in
            n.broken = None

    def schedule(self) -> None:
        """One pass, highest priority first: a job whose StartTime has come starts on the lowest-named free
        nodes it may use, preempting (requeueing) running jobs of lower priority if it must; one that still
        cannot start keeps the nodes it may use from the jobs after it (as backfill plans it). A job waiting
        for its StartTime keeps nothing: Slurm's main scheduler passes it by until then."""
        now = self.clock[0]
        kept: set[str] = set()
        pending = [j for j in self.jobs.values() if j.state == "pending" and not j.held and j.eligible <= now
                   and T0 + j.spec.submit <= now]
        for j in sorted(pending, key=lambda j: (-j.spec.priority, j.spec.submit, j.id)):
            free = [n for n, node in self.nodes.items() if node.free and n not in kept]
            if not free:
                break
            usable = [n for n in free if n not in j.exc]
            if len(usable) < j.spec.nodes:
                usable = self._preempt(j, usable, kept)
            if len(usable) >= j.spec.nodes:
                self._place(j, tuple(usable[:j.spec.nodes]))
            else:
                kept.update(usable)

    def _preempt(self, j: SimJob, usable: list[str], kept: set[str]) -> list[str]:
        """Running jobs of lower priority requeued (Slurm's PreemptMode=REQUEUE), newest first, until the
        job fits; none if it cannot fit even so. The nodes it may use then, by name."""
        pool = set(usable)
        victims = []
        running = [v for v in self.jobs.values() if v.state == "running" and v.spec.priority < j.spec.priority]
        for v in sorted(running, key=lambda v: (v.spec.priority, -v.spec.submit, v.id)):
            if len(pool) >= j.spec.nodes:
                break
            assert v.attempt is not None
            gain = {n for n in v.attempt.nodes if n not in j.exc and n not in kept and not self.nodes[n].drain
                    and not self.nodes[n].reboot}
            if gain:
                victims.append(v)
                pool |= gain
        if len(pool) < j.spec.nodes:
            return usable
        for v in victims:
            assert v.attempt is not None
            self.end(v, v.attempt, "preempted", "preempted")
        return sorted(pool)

    def _place(self, j: SimJob, nodes: tuple[str, ...]) -> None:
        now = self.clock[0]
        for n in nodes:
            self.nodes[n].job = j.id
        j.state = "running"
        j.attempt = Attempt(j.spec.name, j.restarts + 1, nodes, now)
        self.attempts.append(j.attempt)
        end, outcome, fault = self._fate(j, nodes, now)
        self.wake(end, "end", (j.id, j.attempt, outcome, fault))

    def _fate(self, j: SimJob, nodes: tuple[str, ...], now: float) -> tuple[float, str, Fault | None]:
        """When and how the attempt starting now ends (the fault that ends it), unless a person cancels it."""
        spec = j.spec
        fates: list[tuple[float, str, Fault | None]] = [(now + spec.load + spec.work - j.saved, "completed", None)]
        for f in self.job_faults.get(spec.name, ()):  # the running attempt when it strikes, every later one
            fates.append((T0 + f.at if T0 + f.at > now else now + f.fails_after, "failed", f))
        for f in self.storage:  # blocked on the server: ended by the watchdog if it is still away
            kill = max(now, T0 + f.at) + f.fails_after
            if kill <= T0 + f.at + f.lasts:
                fates.append((kill, "failed", f))
        for n in nodes:
            broken = self.nodes[n].broken
            if broken is not None:
                fates.append((now + broken.fails_after, "failed", broken))
            for f in self.faults.get(n, ()):
                fates += self._node_fate(f, now)
        return min(fates, key=lambda fate: fate[0])

    @staticmethod
    def _node_fate(f: Fault, now: float) -> list[tuple[float, str, Fault | None]]:
        at = T0 + f.at
        if f.kind == "lemon":
            return [(now + f.fails_after, "failed", f)]
        if f.kind == "straggler":
            kill = max(now, at) + f.fails_after
            return [(kill, "failed", f)] if kill <= at + f.lasts else []
        if f.kind == "port":  # NCCL's transport retries run out fails_after the port went down
            return [(at + f.fails_after, "failed", f)] if at > now else []
        return [(at, "failed", f)] if at > now else []

    def end(self, j: SimJob, attempt: Attempt, outcome: str, cause: str) -> None:
        """The attempt ends: its nodes are free, its checkpoints kept. A preempted job is back in the queue
        (Slurm requeues it itself)."""
        now = self.clock[0]
        if j.attempt is not attempt or attempt.outcome != "running":
            return  # cancelled or killed before
        spec = j.spec
        run = now - attempt.start
        kept = spec.work - j.saved if outcome == "completed" else \
            math.floor(max(0.0, run - spec.load) / spec.checkpoint) * spec.checkpoint
        j.saved += kept
        attempt.end, attempt.outcome, attempt.cause = now, outcome, cause
        attempt.lost_gpu_hours = 0.0 if outcome == "completed" else (run - kept) * spec.nodes * GPUS / 3600
        j.state, j.end = {"completed": "completed", "cancelled": "cancelled", "preempted": "pending"}.get(
            outcome, "failed"), now
        if outcome == "preempted":
            j.restarts += 1
            j.start_at = j.eligible = now
        j.ends += outcome == "failed"
        for n in attempt.nodes:
            self.nodes[n].job = ""
            self._reboot_if_idle(n)
        self.wake(now, "pass", None)

    def cancel(self, j: SimJob) -> None:
        """A person's scancel: a running attempt ends, a queued or ended job is gone."""
        if j.state == "running" and j.attempt is not None:
            self.end(j, j.attempt, "cancelled", "person")
        elif j.state != "completed":
            j.state, j.held, j.end = "cancelled", False, self.clock[0]
            self.wake(self.clock[0], "pass", None)  # the nodes it was waiting for are free for others

    def fault(self, f: Fault) -> bool:
        """A fault strikes its node: a node fault stays until a reboot. Whether a job ran there (an
        application Xid happens only under one)."""
        node = self.nodes.get(f.node)
        if node is None:
            return False
        if f.kind in ("node", "port"):
            node.broken = f
            if f.lasts:
                self.wake(T0 + f.at + f.lasts, "repair", (f.node, f))
        return bool(node.job)
