"""Series a fleet's exporters would have scraped, from a scenario: numpy arrays per series, and the truth.

A node runs what the scenario's jobs put on it (fleet/jobs.py) and idles between them: training
(GPUs ~99 % busy, every node of a job saving a checkpoint at once on the job's cadence: one 30 s
sample of GPU dip, page-out and NFS WRITE burst, RPC backlog; a checkpoint load at each attempt's
start), a single-node session, inference on a daily curve, burn-in. A training job is synchronous:
it steps at its slowest node's pace (fleet/physics.py), so a straggler slows every node's traffic
and the waiting nodes' power, and only its cause names it (fleet/causes.py). Per-sample noise is
a few percent; GPUs may differ persistently in power and clock (gpu_spread); the room's heat moves
every clock over the day (daily_drift). docs/fleet.md says how each fault and distractor is modelled.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from fleet import causes, fabric, jobs, kernel, nfs, physics
from fleet.causes import GPUS, IB_PORTS
from fleet.jobs import Attempt
from fleet.scenario import Event, Scenario
from gpunode_exporter.nvmlsim.scenario import seconds

SAVE_BYTES = 20.55e9  # per node and save (the Lablup B200 operations report)
XID_ACTIONS = {79: "RESTART_BM", 145: "RESET_GPU", 94: "RESTART_APP", 119: "RESET_GPU"}
SYNCHRONOUS = ("training", "single")  # jobs whose nodes meet in a collective every step


@dataclass(frozen=True)
class Series:
    name: str
    labels: tuple[tuple[str, str], ...]
    values: np.ndarray  # NaN where the target was not scraped


@dataclass(frozen=True)
class Truth:
    kind: str
    node: str  # "" for a fault of a whole job (job_slowdown)
    onset: float  # unix seconds: the fault's reference time (the Xid, the slowdown, the GPU's loss)
    start: float  # alerts on the node from here to end count as detecting it
    end: float
    workloads: tuple[str, ...] = ()  # the workloads (as the rule pack labels them) this fault slows
    detail: str = ""  # for the report: the cause's variant, how much it slows the job, the job's size
    cause: str = ""  # a straggler's: the `cause` label its node's alert must carry (fleet/causes.py CAUSE)
    server: str = ""  # a storage server's fault (no node): the `server` label of the alert about it


def node_name(n: int) -> str:
    return f"gpu{n:03d}"


def pod_uid(attempt: Attempt, node: int) -> str:
    return f"{zlib.crc32(f'{attempt.job.name}/{attempt.number}'.encode()):08x}-0000-4000-8000-{node:012x}"


def owner_kind(attempt: Attempt) -> str:
    return "ReplicaSet" if attempt.job.kind == "inference" else "PyTorchJob"


def workload_label(attempt: Attempt) -> str:
    """The attempt's workload as the rule pack's peer rules label it (Kubernetes: its pods' owner)."""
    if attempt.job.source == "kubernetes":
        return f"ml/{owner_kind(attempt)}/{attempt.job.name}"
    if attempt.job.source == "systemd":
        return f"{attempt.job.name}.service"
    return attempt.workload


class Fleet:
    def __init__(self, scenario: Scenario, start: float) -> None:
        self.s, self.start = scenario, start
        self.t = np.arange(0.0, scenario.duration, scenario.step)
        self.rng = np.random.default_rng(scenario.seed)
        # the job's own OOM kills end its attempt as a fault does (fleet/jobs.py)
        ending = [*scenario.faults, *(d for d in scenario.distractors if d.kind == "oom_kills")]
        self.attempts = jobs.expand(scenario.jobs, [(f.kind, f.node, f.at, dict(f.params)) for f in ending],
                                    scenario.seed)
        # The room warms in the afternoon and every GPU clocks a little lower (heat moves a job's throughput
        # 1-2 % over the day: the Llama 3 report, 3.3.4).
        self.drift = 1 - scenario.daily_drift * np.cos(2 * np.pi * (self.t + start - 15 * 3600) / 86400)

    @property
    def timestamps(self) -> np.ndarray:
        return self.start + self.t

    def _between(self, a: float, b: float) -> np.ndarray:
        return (self.t >= a) & (self.t < b)

    def _noise(self, level: float) -> np.ndarray:
        return 1.0 + level * self.rng.standard_normal(self.t.size)

    def _counter(self, rate: np.ndarray, start: float = 1e6) -> np.ndarray:
        return start + np.cumsum(np.maximum(rate, 0) * self.s.step)

    def attempt_at(self, node: int, at: float) -> Attempt | None:
        """The attempt running on the node at `at`, or else the next one to start there."""
        ahead = [a for a in self.attempts if node in a.nodes and a.end > at]
        return min(ahead, key=lambda a: a.start) if ahead else None

    def job_events(self, kind: str) -> list[tuple[Event, list[Attempt]]]:
        """Events of a whole job (named by one of its nodes): each with the attempts of that job in its window."""
        out = []
        for e in [*self.s.faults, *self.s.distractors]:
            if e.kind != kind or (first := self.attempt_at(e.node, e.at)) is None:
                continue
            end = e.at + e.duration("lasts", self.s.duration)
            out.append((e, [a for a in self.attempts if a.job is first.job and a.start < end and a.end > e.at]))
        return out

    def truth(self) -> list[Truth]:
        out = []
        for f in self.s.faults:
            onset, start, end = f.at, f.at - 3600, f.at + 3600 + f.duration("lasts", 0)
            if f.kind == "correctable_acceleration":
                onset = f.at + f.duration("loss_after", 9 * 86400)  # the loss
                start, end = f.at, onset + 3600
            elif f.kind == "uncorrectable_steps":
                end = f.at + 3600 + max(seconds(x, "steps") for x in f.param("steps", [0, 7200, 18000]))
            elif f.kind in (*causes.CULPRIT_CAUSES, "job_slowdown"):
                start, end = f.at, f.at + f.duration("lasts", self.s.duration)
            elif f.kind in jobs.STORAGE_KILLS:  # from the server's stop to an hour after its return
                start, end = f.at, f.at + f.duration("lasts", 1800) + 3600
            elif f.kind == "fabric_not_ready":  # from the node's return: its fabric should come up then
                onset = fabric.onset(f)
                start, end = f.at, onset + f.duration("lasts", self.s.duration) + 3600
            elif f.kind in ("port_down", "port_flapping", "port_degraded"):
                end = f.at + f.duration("lasts", self.s.duration) + 3600
            slowed = tuple(sorted({workload_label(a) for a in self.attempts if a.job.kind in SYNCHRONOUS
                                   and f.node in a.nodes and a.start < end and a.end > start}))
            if f.kind not in (*causes.CULPRIT_CAUSES, "job_slowdown"):
                slowed = ()
            server = str(f.param("server", kernel.NFS_SERVER)) if f.kind in jobs.STORAGE_KILLS else ""
            out.append(Truth(f.kind, "" if f.kind == "job_slowdown" or server else node_name(f.node),
                             self.start + onset, self.start + start, self.start + end, slowed, self._detail(f),
                             causes.cause(f) if f.kind in causes.CULPRIT_CAUSES
                             else str(f.param("cause", "not_started")) if f.kind == "fabric_not_ready" else "", server))
        if nfs.saturates_loads(self.s.storage):  # each load fills the slot table: NfsSlotTableSaturated is right
            out += [Truth("nfs_saturation", node_name(n), self.start + a.start, self.start + a.start - 3600,
                          self.start + a.start + min(a.job.load, a.end - a.start) + 3600)
                    for a in self.attempts if a.job.load > 0 for n in a.nodes]
        return out

    def _detail(self, f: Event) -> str:
        if f.kind not in (*causes.CULPRIT_CAUSES, "job_slowdown"):
            return ""
        variant = f.param("reason", "thermal") if f.kind == "throttle" else f.param("fabric", "infiniband") \
            if f.kind == "fabric_link" else "link down" if f.param("link_down", False) else ""
        job = self.attempt_at(f.node, f.at)
        size = f"{len(job.nodes)}-node job" if job is not None and job.start <= f.at else "idle"
        return " ".join(x for x in (variant, f"{float(f.param('slowdown', 0.05)):.0%},", size) if x)

    def series(self, nodes: range | None = None) -> Iterator[Series]:
        nodes = nodes if nodes is not None else range(self.s.nodes)
        if 0 in nodes:
            yield from self._cluster()
        for n in nodes:
            yield from self._node(n)

    # --- who does what, when

    def _presence(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """(scraped, drained) per sample."""
        t = self.t
        present, drained = np.ones(t.size, bool), np.zeros(t.size, bool)
        for d in self.s.distractors:
            if d.node != n:
                continue
            if d.kind == "leave":
                present &= t < d.at
            if d.kind == "join":
                present &= t >= d.at
            if d.kind == "drain":
                drained |= self._between(d.at, d.at + d.duration("lasts", 4 * 3600))
        present &= ~self._rebooting(n)
        return present, drained

    def _rebooting(self, n: int) -> np.ndarray:
        """Per sample: the node is rebooting (its targets down, fleet/fabric.py)."""
        out = np.zeros(self.t.size, bool)
        for gone, back in fabric.reboots([e for e in (*self.s.faults, *self.s.distractors) if e.node == n]):
            out |= self._between(gone, back)
        return out

    def _schedule(self, n: int, drained: np.ndarray) -> dict[str, np.ndarray]:
        """Per sample, what the node does: masks by job kind and phase, and the inference load (0-1)."""
        t, step = self.t, self.s.step
        m = {k: np.zeros(t.size, bool) for k in ("training", "single", "inference", "burnin", "load", "save")}
        m["demand"] = np.zeros(t.size)
        m["save_part"] = np.zeros(t.size)
        m["save_clock"] = np.zeros(t.size)
        for a in self.attempts:
            if n not in a.nodes:
                continue
            during = self._between(a.start, a.end) & ~drained
            m[a.job.kind] |= during
            m["load"] |= during & (t < a.start + a.job.load)
            if a.job.kind in SYNCHRONOUS:
                for begin, end in a.saves(step):
                    # a save of a given length: every sample whose interval [t, t + step) it touches;
                    # otherwise the first sample from its start
                    touched = (t + step > begin) & (t < end) if a.job.save is not None else (t >= begin) & (t < end)
                    m["save"] |= during & touched
                    # its writeback spread over the samples it touches, each above the save phase's threshold
                    m["save_part"][during & touched] = 1 / min(2, max(1, (during & touched).sum()))
                    # the exporter's save clock: the seconds sampled at 1 s whose writes pass the threshold
                    # (those the save fills more than half of), in the sample that carries its bytes; a single
                    # node's save (a quarter of the bytes) stays under it
                    first, last = round(begin), round(end if a.job.save is not None else begin + step)
                    if (during & touched).any() and a.job.kind == "training":
                        m["save_clock"] += np.clip(t + step - first, 0, last - first)
            if a.job.kind == "inference":  # a daily curve, 24-90 % busy, its peak in the afternoon
                curve = 0.57 - 0.33 * np.cos(2 * np.pi * (t + self.start - 5 * 3600) / 86400)
                m["demand"] = np.where(during, curve, m["demand"])
        m["save"] &= ~m["load"]
        return m

    def _job_context(self, n: int, drained: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(extra work of the node's pipeline stage, its garbage-collection pauses) per sample."""
        rng = np.random.default_rng((self.s.seed, n, 3))
        extra, gc = np.zeros(self.t.size), np.zeros(self.t.size)
        for d, attempts in self.job_events("pipeline_stage"):
            if d.covers(n):
                for a in attempts:
                    extra[self._between(max(a.start, d.at), a.end)] = float(d.param("extra", 0.06))
        for d, attempts in self.job_events("gc_pauses"):
            for a in attempts:
                if n not in a.nodes:
                    continue
                # Pauses move between ranks: about one node of the job pauses in each sample.
                during = self._between(max(a.start, d.at), min(a.end, d.at + d.duration("lasts", self.s.duration)))
                pausing = during & (rng.random(self.t.size) < 1 / len(a.nodes)) & ~drained
                size = float(d.param("pause", 0.04)) * rng.uniform(0.5, 1.5, self.t.size)
                gc = np.where(pausing, size, gc)
        return extra, gc

    def _own(self, n: int) -> tuple[causes.Own, dict[str, np.ndarray], np.ndarray, np.ndarray]:
        present, drained = self._presence(n)
        m = self._schedule(n, drained)
        extra, gc = self._job_context(n, drained)
        active = m["training"] | m["single"] | m["burnin"] | m["inference"]
        own = causes.build(self.t, self.s.step, np.random.default_rng((self.s.seed, n, 2)),
                           [f for f in self.s.faults if f.node == n], [d for d in self.s.distractors if d.covers(n)],
                           active, self.drift, extra, gc)
        return own, m, present, drained

    @cached_property
    def node_steps(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(own step time, link delay, drained) per node and sample: what each node brings to its job's step."""
        nodes, size = self.s.nodes, self.t.size
        time, delay, drained = np.zeros((nodes, size)), np.zeros((nodes, size)), np.zeros((nodes, size), bool)
        for n in range(nodes):
            own, _m, _present, drained[n] = self._own(n)
            time[n], delay[n] = own.step.time, own.delay
        return time, delay, drained

    @cached_property
    def _pace(self) -> tuple[np.ndarray, np.ndarray]:
        """(step time, input stall) of the job each node runs, per node and sample: 1 and 0 where none."""
        nodes, size = self.s.nodes, self.t.size
        time, delay, drained = self.node_steps
        step, stall = np.ones((nodes, size)), np.zeros((nodes, size))
        stalls = {id(a): np.zeros(size) for a in self.attempts}
        for e, attempts in self.job_events("job_slowdown"):  # input or storage too slow for every node alike
            window = self._between(e.at, e.at + e.duration("lasts", self.s.duration))
            for a in attempts:
                stalls[id(a)][window] = physics.delay_for(float(e.param("slowdown", 0.05)))
        for a in self.attempts:
            if a.job.kind not in SYNCHRONOUS:
                continue
            during = self._between(a.start, a.end)
            members = list(a.nodes)
            own_times = np.where(drained[members], 0.0, time[members])  # a drained node left the job
            job = own_times.max(axis=0) + delay[members].max(axis=0) + stalls[id(a)]
            for n in members:
                step[n, during], stall[n, during] = job[during], stalls[id(a)][during]
        return step, stall

    # --- the series

    def _node(self, n: int) -> Iterator[Series]:
        self.rng = np.random.default_rng((self.s.seed, n))  # the same series however the fleet is chunked
        extra = np.random.default_rng((self.s.seed, n, 1))  # draws the older scenarios did not make
        s, t = self.s, self.t
        faults = [f for f in s.faults if f.node == n and f.kind not in jobs.STORAGE_KILLS]
        own, m, present, drained = self._own(n)
        job_step, stall = self._pace[0][n], self._pace[1][n]
        training = m["training"] | m["single"]  # a training job's processes run (loading, stepping or saving)
        save, load = m["save"], m["load"]
        busy = training & ~save & ~load
        demand = m["demand"] * (1 + 0.02 * extra.standard_normal(t.size))  # the load balancer's unevenness
        active = training | m["inference"] | m["burnin"]
        rate = np.where(training, 1 / job_step, 1.0)  # the job's steps per nominal step: its traffic
        shares = physics.shares(own.step, job_step, stall)
        spike = np.ones(t.size)
        for d in s.distractors:
            if d.node == n and d.kind == "short_spike":
                spike[self._between(d.at, d.at + d.duration("lasts", 120))] = float(d.param("factor", 3))

        node = node_name(n)
        base = {"instance": node}

        def emit(name: str, job: str, values: np.ndarray, **labels: str) -> Series:
            values = np.where(present, values, np.nan)
            return Series(name, tuple(sorted({**base, "job": job, **labels}.items())), values)

        # --- dcgm-exporter, per GPU
        util = np.where(busy, 99.0 * shares.utilization, np.where(save, 40.0, np.where(load, 3.0, 0.0)))
        util = np.where(m["inference"], 100 * demand, np.where(m["burnin"], 100.0, util))
        # Level of power, SM clock and NVLink as a fraction of a training step's.
        idle_level = np.where(save, 0.5, 0.1)
        power = np.where(busy, shares.power(own.busy_power), idle_level)
        power = np.where(m["inference"], (0.3 + 0.7 * demand) * own.busy_power, power)
        power = np.where(m["burnin"], own.busy_power, power)
        clock = np.where(active & ~save & ~load, own.clock, idle_level)
        nvlink = np.where(busy, rate, np.where(m["inference"], 0.05 + 0.2 * demand, idle_level))
        nvlink = np.where(m["burnin"], 0.1, nvlink) * np.ones((GPUS, 1))
        spread = dict(s.gpu_spread)
        offsets = {key: 1 + np.clip(extra.normal(0, spread.get(key, 0.0), GPUS), -0.06, 0.06)
                   for key in ("power", "sm_clock")}
        temperature = np.where(active, 38 + 30 * power, 32) + own.temperature
        lost = np.zeros((GPUS, t.size), bool)
        for f in faults:
            if f.kind == "xid79_collapse":
                lead = f.duration("lead", 600)
                util[f.gpu, t >= f.at - lead] = 0.0
                lost[f.gpu, t >= f.at] = True
            if f.kind == "correctable_acceleration":
                lost[f.gpu, t >= f.at + f.duration("loss_after", 9 * 86400)] = True
        util[lost] = 0.0
        for g in range(GPUS):
            labels = {"gpu": str(g), "UUID": f"GPU-{n:08x}-0000-0000-0000-{g:012x}"}
            up = ~lost[g]
            yield emit("DCGM_FI_DEV_GPU_UTIL", "dcgm", np.where(up, np.clip(util[g] * self._noise(0.003), 0, 100),
                                                                np.nan).round(), **labels)
            for name, scale, level, noise in (
                    ("DCGM_FI_DEV_POWER_USAGE", 690.0 * offsets["power"][g], power[g], 0.01),
                    ("DCGM_FI_DEV_SM_CLOCK", 1980.0 * offsets["sm_clock"][g], clock[g], 0.002),
                    ("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", 2.0e8, nvlink[g], 0.02)):
                yield emit(name, "dcgm", np.where(up, scale * level * self._noise(noise), np.nan), **labels)
            yield emit("DCGM_FI_DEV_GPU_TEMP", "dcgm", np.where(up, temperature[g] + extra.normal(0, 0.7, t.size),
                                                                np.nan).round(), **labels)

        # --- node_exporter
        intr = np.where(active, np.where(m["inference"], 3000.0 + 7000.0 * demand, 10000.0), 2000.0)
        intr = intr * self._noise(0.02) * spike
        procs = np.where(training, 130.0, np.where(m["inference"], 40.0, np.where(m["burnin"], 12.0, 4.0)))
        save_bytes = np.where(m["single"], SAVE_BYTES / 4, SAVE_BYTES)  # a single node saves its own model
        pgpgout = np.where(save, 700000.0 * save_bytes / SAVE_BYTES, 2000.0) * self._noise(0.05) * spike
        for f in faults:
            lead = f.duration("lead", 600)
            if f.kind == "xid79_collapse":
                window = self._between(f.at - lead, f.at + 3600)
                intr[window] = 2800.0 * self._noise(0.05)[window]
                procs[window] = 1.0
            if f.kind == "getattr_spike":
                pgpgout[self._between(f.at - lead, f.at + 600)] *= 50
        yield emit("node_intr_total", "node", self._counter(intr))
        yield emit("node_out_of_service", "node", drained * 1.0)  # the drain hook's textfile metric
        yield emit("node_procs_running", "node", np.maximum(0, procs + self.rng.normal(0, 3, t.size)).round())
        yield emit("node_vmstat_pgpgout", "node", self._counter(pgpgout))
        cpu_waiting = own.cpu_waiting + np.where(save, 0.12, 0.0)  # a save's copy keeps the CPUs busy
        yield emit("node_pressure_cpu_waiting_seconds_total", "node", self._counter(cpu_waiting, 5e4))
        # A multi-node job's traffic between its nodes, at its pace; a single node, inference and burn-in move little.
        nic = np.where(busy, np.where(m["single"], 5e7, 1.2e9 * rate),
                       np.where(save, np.where(m["single"], 5e7, 1.2e9) + save_bytes / s.step, 1e6))
        wobble = self._noise(0.02)
        nic = np.where(load, 1e6 + nfs.LOAD_BYTES, np.where(m["inference"], 1e6 + 2e8 * demand, nic)) * wobble
        client = nfs.client(s.storage, s.step, save, load, self._saturated(faults), save_bytes * m["save_part"])
        for direction, nfs_direction in (("receive", "received"), ("transmit", "sent")):
            # A scenario's `storage:` has a link of its own (the report's 200 Gb/s RoCE): NFS alone on it.
            traffic = nic / 2 if s.storage is None else (5e5 + client.bytes(nfs_direction)) * wobble
            yield emit(f"node_network_{direction}_bytes_total", "node", self._counter(traffic), device="eth0")
        rdma = np.where(busy & m["training"], 2.0e10 * rate, 1e6) * self._noise(0.02)
        for p in range(IB_PORTS):
            port = {"device": f"mlx5_{p}", "port": "1"}
            for direction in ("received", "transmitted"):
                yield emit(f"node_infiniband_port_data_{direction}_bytes_total", "node",
                           self._counter(rdma / 2 / IB_PORTS), **port)
            waits = own.ib["port_transmit_wait"][p] * np.where(busy & m["training"], rate, 0.05)
            yield emit("node_infiniband_port_transmit_wait_total", "node", self._counter(waits), **port)
            yield emit("node_infiniband_symbol_error_total", "node", self._counter(own.ib["symbol_error"][p], 0),
                       **port)
            yield emit("node_infiniband_link_error_recovery_total", "node",
                       self._counter(own.ib["link_error_recovery"][p], 0), **port)

        # --- gpunode-exporter
        # The workload: each attempt of a job has its id (a Kubernetes pod its UID); a node between
        # attempts, or drained, runs none, so the series is absent.
        for a in self.attempts:
            running = (self._between(a.start, a.end) & ~drained) if n in a.nodes else np.zeros(t.size, bool)
            if running.any():
                source, workload = a.job.source, a.workload
                if source == "kubernetes":
                    workload = pod_uid(a, n)
                elif source == "systemd":
                    workload = f"{a.job.name}.service"
                yield emit("gpunode_node_workload_info", "gpunode", np.where(running, 1.0, np.nan),
                           source=source, workload=workload)
        yield from self._gpunode(n, faults, save, emit, lost, client, own, m)
        rebooting = self._rebooting(n)  # Prometheus records its targets down meanwhile
        for job in ("gpunode", "node", "dcgm"):
            yield Series("up", tuple(sorted({**base, "job": job}.items())),
                         np.where(rebooting, 0.0, emit("up", job, np.ones(t.size)).values))

    def _cluster(self) -> Iterator[Series]:
        """kube-state-metrics' pods and their owners, for the jobs that run on Kubernetes."""
        for a in self.attempts:
            if a.job.source != "kubernetes":
                continue
            during = np.where(self._between(a.start, a.end), 1.0, np.nan)
            for n in a.nodes:
                pod = f"{a.job.name}-{a.number}-{n}"
                base = {"job": "kube-state-metrics", "instance": "kube-state-metrics", "namespace": "ml", "pod": pod}
                info = {**base, "uid": pod_uid(a, n), "node": node_name(n)}
                yield Series("kube_pod_info", tuple(sorted(info.items())), during)
                yield Series("kube_pod_owner", tuple(sorted({**base, "owner_kind": owner_kind(a),
                                                             "owner_name": a.job.name,
                                                             "owner_is_controller": "true"}.items())), during)

    def _gpunode(self, n: int, faults: list[Event], save: np.ndarray, emit, lost: np.ndarray, client: nfs.Client,
                 own: causes.Own, m: dict[str, np.ndarray]) -> Iterator[Series]:
        t = self.t
        ones = np.ones(t.size)
        yield emit("gpunode_gpus_expected", "gpunode", ones * GPUS)
        for source in ("nvml", "pci"):
            yield emit("gpunode_gpus_visible", "gpunode", ones * GPUS, source=source)
        yield emit("gpunode_kmsg_records_lost_total", "gpunode", ones * 0)
        if n not in self.s.no_save_clock:
            yield emit("gpunode_checkpoint_save_seconds_total", "gpunode", m["save_clock"])
        mine = [d for d in self.s.distractors if d.node == n]
        klog = kernel.build(t, n, self.s.seed, faults, mine, [f for f in self.s.faults if f.kind in jobs.STORAGE_KILLS])
        fab = fabric.build(t, self.s.step, n, self.s.seed, faults, mine)
        for key, times in fab.link_events.items():  # the ports' link lines beside the kernel's other events
            klog.events[key] = sorted([*klog.events.get(key, []), *times])
        xids: dict[tuple[int, int], np.ndarray] = dict(klog.xids)
        for g in range(GPUS):
            uuid = f"GPU-{n:08x}-0000-0000-0000-{g:012x}"
            gl = {"gpu": str(g), "uuid": uuid}
            correctable, uncorrectable = ones * 0, ones * 0
            for f in (f for f in faults if f.gpu == g):
                if f.kind == "uncorrectable_steps":
                    steps = [seconds(x, "steps") for x in f.param("steps", [0, 7200, 18000])]
                    for k, step_at in enumerate(f.at + np.array(steps)):
                        uncorrectable = np.where(t >= step_at, k + 1, uncorrectable)
                        xids[(g, 94)] = np.where(t >= step_at, k + 1, xids.get((g, 94), ones * 0))
                if f.kind == "correctable_acceleration":
                    creep = 0.3 / 86400 * t
                    fast = np.clip(t - f.at, 0, None) * float(f.param("rows_per_day", 30)) / 86400
                    correctable = np.floor(2 + creep + np.minimum(fast, 230))
                if f.kind == "xid79_collapse":
                    for code in (79, 145):
                        xids[(g, code)] = np.where(t >= f.at, 1, 0)
                if f.kind == "getattr_spike":
                    xids[(g, 94)] = np.where(t >= f.at, 1, 0)
            yield emit("gpunode_gpu_up", "gpunode", np.where(lost[g], 0, 1), **gl)
            if lost[g].all():
                continue
            shown = np.where(lost[g], np.nan, 1.0)  # a lost GPU has no other series
            yield emit("gpunode_gpu_remapped_rows_total", "gpunode", correctable * shown, cause="correctable", **gl)
            yield emit("gpunode_gpu_remapped_rows_total", "gpunode", uncorrectable * shown, cause="uncorrectable", **gl)
            yield emit("gpunode_gpu_row_remap_pending", "gpunode", ones * 0 * shown, **gl)
            yield emit("gpunode_gpu_row_remap_failure", "gpunode", ones * 0 * shown, **gl)
            yield emit("gpunode_gpu_recovery_action", "gpunode", ones * 0 * shown, pci_bus_id=f"0000:{g:02x}:00.0",
                       **gl)
            for kind, value in (("current", own.pcie_width[g]), ("max", ones * 16)):
                yield emit("gpunode_gpu_pcie_link_width", "gpunode", value * shown, kind=kind, **gl)
                yield emit("gpunode_gpu_pcie_link_generation", "gpunode", ones * 5 * shown, kind=kind, **gl)
            yield emit("gpunode_gpu_pcie_replays_total", "gpunode", self._counter(own.pcie_replays[g] / self.s.step, 0)
                       * shown, **gl)
            for reason, active in own.reasons.items():
                yield emit("gpunode_gpu_clock_event_active", "gpunode", active[g] * shown, reason=reason, **gl)
            for reason, spent in own.event_seconds.items():
                yield emit("gpunode_gpu_clock_event_seconds_total", "gpunode",
                           np.cumsum(spent[g]) * shown, reason=reason, **gl)
            for policy, spent in own.violation.items():
                yield emit("gpunode_gpu_clock_violation_seconds_total", "gpunode",
                           np.cumsum(spent[g]) * shown, policy=policy, **gl)
            for kind, errors in own.nvlink_errors.items():
                yield emit("gpunode_gpu_nvlink_errors_total", "gpunode", np.cumsum(errors[g]) * shown,
                           link="all", type=kind, **gl)
            yield emit("gpunode_gpu_nvlink_links_up", "gpunode", own.links_up[g] * shown, **gl)
            yield emit("gpunode_gpu_fabric_state", "gpunode", fab.gpu_state[g] * shown, **gl)
            yield emit("gpunode_gpu_fabric_healthy", "gpunode", fab.gpu_healthy[g] * shown, **gl)
        for (g, code), count in xids.items():
            xl = {"gpu": str(g), "uuid": f"GPU-{n:08x}-0000-0000-0000-{g:012x}", "xid": str(code),
                  "action": XID_ACTIONS[code], "pci_bus_id": f"0000:{g:02x}:00.0"}
            rose = np.diff(count, prepend=0) > 0
            last = np.maximum.accumulate(np.where(rose, self.start + t, 0))  # each event's time from it on
            shown = count > 0  # the exporter exports an Xid series from its first event on
            yield emit("gpunode_xid_errors_total", "gpunode", np.where(shown, count, np.nan), **xl)
            yield emit("gpunode_xid_last_event_timestamp_seconds", "gpunode", np.where(shown, last, np.nan), **xl)
        yield from self._nfs(faults, emit, client)
        yield from self._roce(emit, own, save)
        yield from self._kernel(klog, emit)
        yield from fabric.series(fab, t, emit)

    def _kernel(self, klog: kernel.KernelLog, emit) -> Iterator[Series]:
        """The kernel log past Xid as the exporter serves it (fleet/kernel.py)."""
        for (kind, device), times in sorted(klog.events.items()):
            count, last = kernel.series(self.t, self.start, times)
            yield emit("gpunode_kernel_events_total", "gpunode", count, kind=kind, device=device)
            yield emit("gpunode_kernel_event_last_timestamp_seconds", "gpunode", last, kind=kind, device=device)
        for (switch, bus, sxid, severity), times in sorted(klog.sxids.items()):
            count, last = kernel.series(self.t, self.start, times)
            labels = {"switch": switch, "pci_bus_id": bus, "sxid": sxid, "severity": severity}
            yield emit("gpunode_sxid_errors_total", "gpunode", count, **labels)
            yield emit("gpunode_sxid_last_event_timestamp_seconds", "gpunode", last, **labels)
        for server, responding in sorted(klog.nfs_responding.items()):
            yield emit("gpunode_nfs_server_responding", "gpunode", responding, server=server)

    def _saturated(self, faults: list[Event]) -> np.ndarray:
        out = np.zeros(self.t.size, bool)
        for f in faults:
            if f.kind == "nfs_saturation":
                out |= self._between(f.at, f.at + f.duration("lasts", 1500))
        return out

    def _nfs(self, faults: list[Event], emit, client: nfs.Client) -> Iterator[Series]:
        """The NFS client's counters (fleet/nfs.py), a GETATTR spike's slow server on top."""
        t = self.t
        mount = {"mountpoint": "/ckpt", "export": kernel.NFS_EXPORT}
        getattr_ms = 0.6 * self._noise(0.05)
        for f in faults:
            if f.kind == "getattr_spike":
                getattr_ms[self._between(f.at - f.duration("lead", 600), f.at + 600)] *= 30
        client.rtt_ms["GETATTR"] = getattr_ms
        for op in ("GETATTR", "WRITE", "READ"):
            ops, q, r = client.ops[op], client.queue_ms[op] * np.ones(t.size), client.rtt_ms[op] * np.ones(t.size)
            labels = {**mount, "op": op}
            yield emit("gpunode_nfs_rpc_operations_total", "gpunode", self._counter(ops), **labels)
            yield emit("gpunode_nfs_rpc_queue_seconds_total", "gpunode", self._counter(ops * q / 1000), **labels)
            yield emit("gpunode_nfs_rpc_rtt_seconds_total", "gpunode", self._counter(ops * r / 1000), **labels)
            yield emit("gpunode_nfs_rpc_execute_seconds_total", "gpunode",
                       self._counter(ops * (q + r + nfs.CLIENT_MS) / 1000), **labels)
            yield emit("gpunode_nfs_rpc_sent_bytes_total", "gpunode", self._counter(client.op_bytes(op, "sent")),
                       **labels)
            yield emit("gpunode_nfs_rpc_received_bytes_total", "gpunode",
                       self._counter(client.op_bytes(op, "received")), **labels)
            yield emit("gpunode_nfs_rpc_major_timeouts_total", "gpunode", np.zeros(t.size), **labels)
        yield emit("gpunode_nfs_mount_major_timeouts_total", "gpunode", np.zeros(t.size), **mount)
        storage = self.s.storage or nfs.Storage()  # the fixed client's slots and link are its defaults
        for k in range(client.transports):
            tr = {**mount, "transport": str(k), "protocol": "tcp"}
            yield emit("gpunode_nfs_transport_sends_total", "gpunode", self._counter(client.sends), **tr)
            yield emit("gpunode_nfs_transport_in_flight_sum_total", "gpunode", self._counter(client.in_flight), **tr)
            yield emit("gpunode_nfs_transport_backlog_sum_total", "gpunode", self._counter(client.backlog), **tr)
            yield emit("gpunode_nfs_transport_max_slots", "gpunode", np.full(t.size, float(storage.slots)), **tr)
        yield emit("gpunode_nfs_mount_info", "gpunode", np.ones(t.size), **mount, protocol="tcp",
                   server_address="10.20.0.5", device="eth0")
        yield emit("gpunode_storage_interface_info", "gpunode", np.ones(t.size), device="eth0", source="nfs_route")
        yield emit("gpunode_network_link_speed_bytes", "gpunode", np.full(t.size, storage.link), device="eth0")

    def _roce(self, emit, own: causes.Own, save: np.ndarray) -> Iterator[Series]:
        """The RoCE NIC (storage and the job's traffic over Ethernet): congestion, PFC and its transport errors."""
        t = self.t
        port = {"device": "mlx5_4", "port": "1"}
        yield emit("gpunode_storage_interface_info", "gpunode", np.ones(t.size), device="eth1", source="config")
        yield emit("gpunode_rdma_cnp_sent_total", "gpunode", self._counter(5.0 * own.congestion * self._noise(0.2)),
                   **port)
        yield emit("gpunode_rdma_ecn_marked_packets_total", "gpunode",
                   self._counter(8.0 * own.congestion * self._noise(0.2)), **port)
        for counter, name in (("out_of_sequence", "gpunode_rdma_out_of_sequence_packets_total"),
                              ("packet_seq_err", "gpunode_rdma_packet_sequence_errors_total"),
                              ("local_ack_timeout_err", "gpunode_rdma_local_ack_timeouts_total")):
            yield emit(name, "gpunode", self._counter(own.roce[counter], 0), **port)
        sent = own.pfc_sent * np.where(save, 5.0, 1.0)  # a save's burst fills every node's buffers alike
        for direction, rate in (("tx", sent), ("rx", own.pfc_sent * 0.5)):
            yield emit("gpunode_network_pfc_pause_frames_total", "gpunode", self._counter(rate, 0), device="eth1",
                       direction=direction, priority="3")
