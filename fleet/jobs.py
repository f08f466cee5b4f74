"""Who runs what, when: a scenario's jobs expanded into attempts (runs of one job between failures).

A shared fleet runs several jobs at once, each on its own nodes. A training job that fails
(a fault that kills it, or a failure the scenario lists: an NCCL timeout, a user's error)
stops on every node at once and restarts a few minutes later as a new attempt, without the
nodes whose GPU was lost, as the Lablup B200 operations report's retry chains did (median
11 minutes between attempts). Each attempt has a workload id of its own, as a requeued job
or a new session gets one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from gpunode_common.config import ConfigError
from gpunode_exporter.nvmlsim.scenario import seconds

KINDS = ("training", "single", "inference", "burnin")
SOURCES = ("slurm", "kubernetes", "systemd")
RETRY_GAP_MEDIAN = 660.0  # seconds between a failure and the next attempt (the report: median 11 min)
# Faults of a node past its GPUs that end the job on it at once (its ranks die: a stuck CPU, the NVSwitch
# fabric gone, writes refused on a read-only filesystem, a poisoned page, the compute NIC lost, the GPU's
# firmware stopped, a fabric port down or flapping under NCCL, a reboot whose NVLink fabric does not come up),
# and keep the node out of later attempts (the scheduler's node health check fails).
NODE_KILLS = ("nvswitch_fatal", "cpu_lockup", "fs_readonly", "memory_uncorrectable", "nic_fault", "gpu_driver_fault",
              "port_down", "port_flapping", "fabric_not_ready")
STORAGE_KILLS = ("nfs_server_down",)  # a storage server every node mounts: every training job waits on it
NCCL_TIMEOUT = 600.0  # a job blocked on storage this long is ended by its collective's watchdog
GOLDEN = (5 ** 0.5 - 1) / 2
DEFAULT_LOAD = {"training": "25m", "single": "5m"}  # the report's session start loads took 25-33 min


@dataclass(frozen=True)
class Job:
    name: str
    kind: str
    nodes: tuple[int, ...]
    start: float
    end: float
    checkpoint_every: float
    load: float  # checkpoint load at the start of every attempt (GPUs idle, NFS reads)
    failures: tuple[float, ...]  # failures that kill the job, besides the faults that do
    restart_gap: float | None  # None: drawn per restart around RETRY_GAP_MEDIAN
    restart_on_fault: bool  # a job-killing fault on one of its nodes ends the attempt
    source: str
    save: float | None = None  # seconds a save lasts, at a random phase to the scrapes; None: one sample, on it

    @property
    def first_save(self) -> float:
        """The first save this long after the checkpoint origin (a session of the old form: at it)."""
        return self.checkpoint_every if self.restart_on_fault else 0.0


@dataclass(frozen=True)
class Attempt:
    job: Job
    number: int  # 0 for the first run of the job
    workload: str  # the id gpunode-exporter would report for it
    nodes: tuple[int, ...]
    start: float
    end: float

    @property
    def checkpoint_origin(self) -> float:
        """Saves fall every checkpoint_every from here (a session of the old form: from the scenario's start)."""
        return self.start + self.job.load if self.job.restart_on_fault else 0.0

    def saves(self, step: float) -> list[tuple[float, float]]:
        """Each save's (start, end), seconds from the scenario's start: every checkpoint_every from
        the origin while the attempt runs past its load. A save of a given length starts at a phase
        to the scrapes of its own, as a real job's saves fall anywhere between scrapes."""
        every, first = self.job.checkpoint_every, self.checkpoint_origin + self.job.first_save
        k = max(0, math.ceil((self.start + self.job.load - first) / every))
        out = []
        while (at := first + k * every) < self.end:
            if self.job.save is None:
                out.append((at, at + step))
            else:
                # evenly spread phases (the golden ratio's sequence): over n saves the scrapes see
                # every phase as random ones would, without their ~1/sqrt(n) scatter
                phase = (k + 7 * self.number) * GOLDEN % 1 * step
                if at + phase + self.job.save <= self.end:
                    out.append((at + phase, at + phase + self.job.save))
            k += 1
        return out


def parse_nodes(value: object, where: str, nodes: int) -> tuple[int, ...]:
    """Node indices: an int, "a-b" (inclusive), or a list of either."""
    items = value if isinstance(value, list) else [value]
    out: list[int] = []
    for item in items:
        text = str(item)
        first, _, last = text.partition("-")
        if not first.isdigit() or (last and not last.isdigit()):
            raise ConfigError(f"{where}: want node numbers or ranges such as 0-59, got {item!r}")
        out.extend(range(int(first), int(last or first) + 1))
    if not out or any(not 0 <= n < nodes for n in out) or len(set(out)) != len(out):
        raise ConfigError(f"{where}: want distinct nodes from 0 to {nodes - 1}")
    return tuple(out)


def parse_job(data: object, where: str, nodes: int, duration: float) -> Job:
    known = {"name", "kind", "nodes", "start", "end", "checkpoint_every", "load", "failures", "restart_gap", "source",
             "save"}
    if not isinstance(data, dict) or not {"kind", "nodes"} <= set(data):
        raise ConfigError(f"{where}: want a mapping with kind and nodes")
    if unknown := set(data) - known:
        raise ConfigError(f"{where}: unknown key '{sorted(unknown)[0]}'")
    if data["kind"] not in KINDS:
        raise ConfigError(f"{where}.kind: want one of {', '.join(KINDS)}, got {data['kind']!r}")
    members = parse_nodes(data["nodes"], f"{where}.nodes", nodes)
    if data["kind"] == "single" and len(members) != 1:
        raise ConfigError(f"{where}.nodes: a single-node session runs on one node")
    source = data.get("source", "slurm")
    if source not in SOURCES:
        raise ConfigError(f"{where}.source: want one of {', '.join(SOURCES)}")
    start, end = seconds(data.get("start", 0), f"{where}.start"), seconds(data.get("end", duration), f"{where}.end")
    if not start < end:
        raise ConfigError(f"{where}: want start before end")
    gap = data.get("restart_gap")
    every = seconds(data.get("checkpoint_every", "133m"), f"{where}.checkpoint_every")
    return Job(str(data.get("name", where)), data["kind"], members, start, end, every,
               seconds(data.get("load", DEFAULT_LOAD.get(data["kind"], 0)), f"{where}.load"),
               tuple(seconds(f, f"{where}.failures") for f in data.get("failures", [])),
               None if gap is None else seconds(gap, f"{where}.restart_gap"), True, source,
               None if data.get("save") is None else seconds(data["save"], f"{where}.save"))


def sessions_as_jobs(sessions: tuple[tuple[float, float], ...], nodes: int, checkpoint_every: float) -> tuple[Job, ...]:
    """The older form: each session is one job over every node, saving on the fleet's common cadence
    from the scenario's start, not restarted by faults."""
    return tuple(Job(f"session{k}", "training", tuple(range(nodes)), a, b, checkpoint_every, 0.0, (), None, False,
                     "slurm") for k, (a, b) in enumerate(sessions))


def kills(fault_kind: str, at: float, params: dict[str, object]) -> list[float]:
    """When a fault ends the job on its node: an Xid 79 or a lost GPU, each Xid 94 (contained
    uncorrectable error: the application is killed), a node fault past the GPU that kills it (NODE_KILLS),
    the job's own processes killed for memory (oom_kills: the job's fault)."""
    if fault_kind in ("xid79_collapse", "getattr_spike", "oom_kills", *NODE_KILLS):
        return [at]
    if fault_kind == "uncorrectable_steps":
        return [at + seconds(s, "steps") for s in params.get("steps", [0, 7200, 18000])]  # type: ignore[union-attr]
    if fault_kind == "correctable_acceleration":
        return [at + seconds(params.get("loss_after", 9 * 86400), "loss_after")]
    return []


def loses_gpu(fault_kind: str, at: float, params: dict[str, object]) -> float | None:
    """When the node's GPU is lost for good (the node leaves later attempts), or None."""
    if fault_kind in ("xid79_collapse", *NODE_KILLS):
        return at
    if fault_kind == "correctable_acceleration":
        return at + seconds(params.get("loss_after", 9 * 86400), "loss_after")
    return None


Faults = list[tuple[str, int, float, dict[str, object]]]  # (kind, node, at, params)


def storage_waits(job: Job, faults: Faults, start: float) -> dict[float, float]:
    """A training job blocked on a storage server that stops answering: its collective's watchdog ends
    it NCCL_TIMEOUT later if the server is still away. When each such end falls -> when the server is back."""
    if not job.restart_on_fault or job.kind not in ("training", "single"):
        return {}
    out = {}
    for kind, _node, at, params in faults:
        back = at + seconds(params.get("lasts", 1800), "lasts")  # type: ignore[arg-type]
        if kind in STORAGE_KILLS and back - at > NCCL_TIMEOUT and start < at + NCCL_TIMEOUT < job.end:
            out[at + NCCL_TIMEOUT] = back
    return out


def expand(jobs: tuple[Job, ...], faults: list[tuple[str, int, float, dict[str, object]]], seed: int) -> list[Attempt]:
    """Every job's attempts, workload ids numbered from 1000 in order. faults: (kind, node, at, params)."""
    rng = np.random.default_rng((seed, 0x10B5))
    attempts: list[Attempt] = []
    for job in jobs:
        start, members, number = job.start, job.nodes, 0
        while start < job.end and members:
            ends = [f for f in job.failures if start < f < job.end]
            if job.restart_on_fault:
                ends += [k for kind, node, at, params in faults if node in members and kind not in STORAGE_KILLS
                         for k in kills(kind, at, params) if start < k < job.end]
            waits = storage_waits(job, faults, start)  # kill -> when the storage is back
            end = min([*ends, *waits, job.end])
            attempts.append(Attempt(job, number, str(1000 + len(attempts)), members, start, end))
            if end >= job.end:
                break
            gap = job.restart_gap if job.restart_gap is not None else float(
                np.clip(RETRY_GAP_MEDIAN * rng.lognormal(0, 0.5), 180, 2400))
            gap += max(0.0, waits.get(end, end) - end)  # its retries fail until the storage is back
            lost = {node for kind, node, at, params in faults
                    if (when := loses_gpu(kind, at, params)) is not None and when <= end}
            start, members, number = end + gap, tuple(n for n in members if n not in lost), number + 1
    busy: dict[int, list[Attempt]] = {}
    for a in attempts:
        for n in a.nodes:
            for other in busy.get(n, []):
                if a.start < other.end and other.start < a.end:
                    raise ConfigError(f"jobs {other.job.name} and {a.job.name} both run on node {n} at "
                                      f"{max(a.start, other.start):.0f} s")
            busy.setdefault(n, []).append(a)
    return attempts
