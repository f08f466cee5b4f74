"""The soak's batch jobs: `sbatch` scripts that fail on cue, attempt by attempt (as in
tests/test_remediate_jobs_slurm.py), each attempt's start and end written to one log, and the kinds
the driver draws them from: jobs the service recovers (by backoff, after an application fault, without
the node of a node fault), chains that keep failing until the service holds them, and jobs it must
never requeue (--no-requeue, cancelled by a person, submitted --hold, completed, a name the policy's
select leaves out)."""

from __future__ import annotations

import random
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from gpunode_remediate.scheduler.slurm import expand_hostlist

SELECT = "train-.*"  # the policy's jobs.select.name: the soak's own jobs but notebook-N (and the episodes' soak)
FOREVER = 1000  # failing attempts of a chain that never recovers
CODES = (1, 2, 3, 42, 134)  # exit codes of a failing attempt

# (weight, kind): the stream's mix.
MIX: tuple[tuple[int, str], ...] = (
    (20, "recovers"),  # fails 1-2 attempts, no alert: requeued by backoff, then completes
    (12, "hopeless"),  # fails every attempt, no alert: held at max_attempts; a person releases half of them
    (14, "app_fault"),  # fails 1 (a fifth: 2) attempts under GpuXidApplicationFault on one of its nodes
    (14, "node_fault"),  # fails 1 (a fifth: 2) attempts under a node-fault alert on one of its nodes
    (8, "no_requeue"),  # sbatch --no-requeue, fails: never requeued
    (8, "cancelled"),  # runs long; a person cancels it 1-3 s after it starts: never requeued
    (6, "user_held"),  # sbatch --hold, never released: never touched
    (10, "completed"),  # exits 0: never requeued
    (8, "unselected"),  # fails, named notebook-N: never requeued
)
RECOVERED = ("recovers", "hopeless", "app_fault", "node_fault")  # the kinds the service may requeue
NEVER = ("no_requeue", "cancelled", "user_held", "completed", "unselected")  # the kinds it must never touch


@dataclass
class SoakJob:
    n: int
    kind: str
    nodes: int
    seconds: float
    fails: int  # attempts 0 .. fails-1 exit with `code`; the later ones exit 0
    code: int
    alerts: tuple[str, ...] = ()  # attempt n -> "app" or "node": an alert on one of its nodes while it runs
    release: bool = False  # a person releases its chain once the service held it
    id: str = ""
    submitted_at: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"notebook-{self.n}" if self.kind == "unselected" else f"train-{self.kind}-{self.n}"

    @property
    def options(self) -> tuple[str, ...]:
        return {"no_requeue": ("--no-requeue",), "user_held": ("--requeue", "--hold")}.get(self.kind, ("--requeue",))

    def exit_code(self, attempt: int) -> int:
        return self.code if attempt < self.fails else 0

    def script(self, log: Path) -> str:
        """The batch script: attempt n ($SLURM_RESTART_COUNT) logs its start, sleeps, logs its end with its
        exit code and exits with it."""
        q = shlex.quote(str(log))
        fail = f'[ "$n" -lt {self.fails} ] && c={self.code}; ' if self.fails else ""
        return (f'n=${{SLURM_RESTART_COUNT:-0}}; echo "start $SLURM_JOB_ID $n $SLURM_JOB_NODELIST $(date +%s.%N)" '
                f'>> {q}; sleep {self.seconds:.1f}; c=0; {fail}'
                f'echo "end $SLURM_JOB_ID $n $SLURM_JOB_NODELIST $(date +%s.%N) $c" >> {q}; exit $c')


def first_kinds(rng: random.Random) -> list[str]:
    """The stream's first jobs: one of each kind, those the service recovers first (a held chain takes
    half a minute and more), so that a short run has them all."""
    slow = [k for _, k in MIX if k in RECOVERED and k != "hopeless"]
    never = [k for _, k in MIX if k in NEVER]
    rng.shuffle(slow)
    rng.shuffle(never)
    return ["hopeless", *slow, *never]


def draw_job(rng: random.Random, n: int, kind: str = "") -> SoakJob:
    """Job number n of the mix; of `kind` when given (the first ones: a hopeless one a person releases)."""
    first, kind = bool(kind), kind or rng.choices([k for _, k in MIX], weights=[w for w, _ in MIX])[0]
    nodes = 1 if rng.random() < 0.6 else 2
    seconds = rng.uniform(2, 4)
    code = rng.choice(CODES)
    if kind == "recovers":
        return SoakJob(n, kind, nodes, seconds, rng.choice((1, 1, 2)), code)
    if kind == "hopeless":
        return SoakJob(n, kind, nodes, seconds, FOREVER, code, release=first or rng.random() < 0.5)
    if kind in ("app_fault", "node_fault"):
        fails = 2 if rng.random() < 0.2 else 1
        # Long enough for the alert to reach the service before the end: the driver posts it once it
        # sees the attempt start, Alertmanager waits 1 s (group_wait).
        return SoakJob(n, kind, nodes, rng.uniform(4, 6), fails, code, alerts=(kind.split("_")[0],) * fails)
    if kind == "cancelled":  # exits 0 should the person's scancel never land: completed, never requeued either
        return SoakJob(n, kind, nodes, 60, 0, 0)
    if kind == "completed":
        return SoakJob(n, kind, nodes, seconds, 0, 0)
    return SoakJob(n, kind, nodes, seconds, FOREVER, code)  # no_requeue, user_held, unselected


@dataclass(frozen=True)
class Attempt:
    """One attempt as the job's script logged it."""

    job: str
    attempt: int
    nodes: tuple[str, ...]
    started: float
    ended: float | None = None
    code: int | None = None  # None: it never ended by itself (cancelled, or still running)

    @property
    def abnormal(self) -> bool:
        return self.code is not None and self.code != 0


def read_attempts(path: Path) -> dict[str, list[Attempt]]:
    """job id -> its attempts in order, from the scripts' log."""
    starts: dict[tuple[str, int], Attempt] = {}
    for line in path.read_text().splitlines() if path.exists() else []:
        words = line.split()
        if len(words) < 5 or words[0] not in ("start", "end"):
            continue
        job, attempt, nodes, at = words[1], int(words[2]), tuple(expand_hostlist(words[3])), float(words[4])
        if words[0] == "start":
            starts[(job, attempt)] = Attempt(job, attempt, nodes, at)
        elif (job, attempt) in starts:
            starts[(job, attempt)] = Attempt(job, attempt, nodes, starts[(job, attempt)].started, at, int(words[5]))
    out: dict[str, list[Attempt]] = {}
    for (job, _), attempt in sorted(starts.items(), key=lambda kv: (kv[0][0], kv[1].started)):
        out.setdefault(job, []).append(attempt)
    return out


End = tuple[float, int, tuple[str, ...]]  # (when, attempt, nodes) of an abnormal end


def abnormal_ends(attempts: list[Attempt], seen: list[tuple[float, str, str, int, str, str, str]]) -> list[End]:
    """A job's abnormal ends: attempts its script ended non-zero, and attempts Slurm showed ended
    abnormally (NODE_FAIL, FAILED) whose script logged no end (killed with its node)."""
    ends = [(a.ended, a.attempt, a.nodes) for a in attempts if a.abnormal and a.ended is not None]
    logged = {a.attempt for a in attempts if a.ended is not None}
    for at, state, _, restarts, nodes, _, _ in seen:
        if state in ("NODE_FAIL", "FAILED") and restarts not in logged:
            logged.add(restarts)
            hosts = tuple(expand_hostlist(nodes)) if nodes and nodes != "(null)" else ()
            ends.append((at, restarts, hosts))
    return sorted(ends)
