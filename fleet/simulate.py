"""Series a fleet's exporters would have scraped, from a scenario: numpy arrays per series, and the truth.

A node runs what the scenario's jobs put on it (fleet/jobs.py) and idles between them: training
(GPUs ~99 % busy, every node of a job saving a checkpoint at once on the job's cadence: one 30 s
sample of GPU dip, page-out and NFS WRITE burst, RPC backlog; a checkpoint load at each attempt's
start), a single-node session, inference on a daily curve, burn-in. Per-sample noise is a few
percent; GPUs may differ persistently in power and clock (gpu_spread). Faults and distractors
change a node's series from their onset (docs/fleet.md says how each is modelled).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from exporter.nvmlsim.scenario import seconds
from fleet import jobs
from fleet.jobs import Attempt
from fleet.scenario import Event, Scenario

GPUS = 8
SAVE_BYTES = 20.55e9  # per node and save (the Lablup B200 operations report)
LOAD_BYTES = 5e8  # per second and node while an attempt loads its checkpoint
WSIZE = 1 << 20
NODE_JOBS = {"gpunode": "gpunode", "node": "node", "dcgm": "dcgm"}
XID_ACTIONS = {79: "RESTART_BM", 145: "RESET_GPU", 94: "RESTART_APP"}


@dataclass(frozen=True)
class Series:
    name: str
    labels: tuple[tuple[str, str], ...]
    values: np.ndarray  # NaN where the target was not scraped


@dataclass(frozen=True)
class Truth:
    kind: str
    node: str
    onset: float  # unix seconds: the fault's reference time (the Xid, the slowdown, the GPU's loss)
    start: float  # alerts on the node from here to end count as detecting it
    end: float


def node_name(n: int) -> str:
    return f"gpu{n:03d}"


def pod_uid(attempt: Attempt, node: int) -> str:
    return f"{zlib.crc32(f'{attempt.job.name}/{attempt.number}'.encode()):08x}-0000-4000-8000-{node:012x}"


class Fleet:
    def __init__(self, scenario: Scenario, start: float) -> None:
        self.s, self.start = scenario, start
        self.t = np.arange(0.0, scenario.duration, scenario.step)
        self.rng = np.random.default_rng(scenario.seed)
        self.attempts = jobs.expand(scenario.jobs, [(f.kind, f.node, f.at, dict(f.params)) for f in scenario.faults],
                                    scenario.seed)

    @property
    def timestamps(self) -> np.ndarray:
        return self.start + self.t

    def _between(self, a: float, b: float) -> np.ndarray:
        return (self.t >= a) & (self.t < b)

    def _noise(self, level: float) -> np.ndarray:
        return 1.0 + level * self.rng.standard_normal(self.t.size)

    def _counter(self, rate: np.ndarray, start: float = 1e6) -> np.ndarray:
        return start + np.cumsum(np.maximum(rate, 0) * self.s.step)

    def truth(self) -> list[Truth]:
        out = []
        for f in self.s.faults:
            onset, start, end = f.at, f.at - 3600, f.at + 3600 + f.duration("lasts", 0)
            if f.kind == "correctable_acceleration":
                onset = f.at + f.duration("loss_after", 9 * 86400)  # the loss
                start, end = f.at, onset + 3600
            elif f.kind == "uncorrectable_steps":
                end = f.at + 3600 + max(seconds(x, "steps") for x in f.param("steps", [0, 7200, 18000]))
            elif f.kind in ("failslow", "pcie_downgrade"):
                start, end = f.at, f.at + f.duration("lasts", self.s.duration)
            out.append(Truth(f.kind, node_name(f.node), self.start + onset, self.start + start, self.start + end))
        return out

    def series(self, nodes: range | None = None) -> Iterator[Series]:
        nodes = nodes if nodes is not None else range(self.s.nodes)
        if 0 in nodes:
            yield from self._cluster()
        for n in nodes:
            yield from self._node(n)

    def _schedule(self, n: int, drained: np.ndarray) -> dict[str, np.ndarray]:
        """Per sample, what the node does: masks by job kind and phase, and the inference load (0-1)."""
        t, step = self.t, self.s.step
        m = {k: np.zeros(t.size, bool) for k in ("training", "single", "inference", "burnin", "load", "save")}
        m["demand"] = np.zeros(t.size)
        for a in self.attempts:
            if n not in a.nodes:
                continue
            during = self._between(a.start, a.end) & ~drained
            m[a.job.kind] |= during
            m["load"] |= during & (t < a.start + a.job.load)
            if a.job.kind in ("training", "single"):
                since = t - a.checkpoint_origin
                m["save"] |= during & (since >= a.job.first_save) & ((since % a.job.checkpoint_every) < step)
            if a.job.kind == "inference":  # a daily curve, 24-90 % busy, its peak in the afternoon
                curve = 0.57 - 0.33 * np.cos(2 * np.pi * (t + self.start - 5 * 3600) / 86400)
                m["demand"] = np.where(during, curve, m["demand"])
        m["save"] &= ~m["load"]
        return m

    def _node(self, n: int) -> Iterator[Series]:
        self.rng = np.random.default_rng((self.s.seed, n))  # the same series however the fleet is chunked
        extra = np.random.default_rng((self.s.seed, n, 1))  # draws the older scenarios did not make
        s, t = self.s, self.t
        faults = [f for f in s.faults if f.node == n]
        distractors = [d for d in s.distractors if d.node == n]
        present = np.ones(t.size, bool)
        for d in distractors:
            if d.kind == "leave":
                present &= t < d.at
            if d.kind == "join":
                present &= t >= d.at
        drained = np.zeros(t.size, bool)
        for d in distractors:
            if d.kind == "drain":
                drained |= self._between(d.at, d.at + d.duration("lasts", 4 * 3600))
        m = self._schedule(n, drained)
        training = m["training"] | m["single"]  # a training job's processes run (loading, stepping or saving)
        save, load = m["save"], m["load"]
        busy = training & ~save & ~load
        demand = m["demand"] * (1 + 0.02 * extra.standard_normal(t.size))  # the load balancer's unevenness
        active = training | m["inference"] | m["burnin"]
        slow = np.ones(t.size)
        spike = np.ones(t.size)
        for f in faults:
            if f.kind in ("failslow", "pcie_downgrade"):
                window = self._between(f.at, f.at + f.duration("lasts", s.duration))
                slow[window] *= 1 - float(f.param("slowdown", 0.1))
        for d in distractors:
            if d.kind == "short_spike":
                spike[self._between(d.at, d.at + d.duration("lasts", 120))] = float(d.param("factor", 3))
            if d.kind == "known_slow":  # slow for good, and known to be: isolated in sessions of its own
                slow[t >= d.at] *= 1 - float(d.param("slowdown", 0.04))

        node = node_name(n)
        base = {"instance": node}

        def emit(name: str, job: str, values: np.ndarray, **labels: str) -> Series:
            values = np.where(present, values, np.nan)
            return Series(name, tuple(sorted({**base, "job": job, **labels}.items())), values)

        # --- dcgm-exporter, per GPU
        util = np.where(busy, 99.0, np.where(save, 40.0, np.where(load, 3.0, 0.0)))
        util = np.where(m["inference"], 100 * demand, np.where(m["burnin"], 100.0, util))
        gpu_util = util[None, :] * np.ones((GPUS, 1))
        # Level of power, SM clock and NVLink as a fraction of a training step's.
        idle = np.where(save, 0.5, 0.1)
        levels = {"DCGM_FI_DEV_POWER_USAGE": np.where(m["inference"], 0.3 + 0.7 * demand, idle),
                  "DCGM_FI_DEV_SM_CLOCK": np.where(m["inference"], 1.0, idle),
                  "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": np.where(m["inference"], 0.05 + 0.2 * demand, idle)}
        for name, level in levels.items():
            levels[name] = np.where(busy | m["burnin"], slow, np.where(m["inference"], level * slow, level))
        spread = dict(s.gpu_spread)
        offsets = {name: 1 + np.clip(extra.normal(0, spread.get(key, 0.0), GPUS), -0.06, 0.06)
                   for name, key in (("DCGM_FI_DEV_POWER_USAGE", "power"), ("DCGM_FI_DEV_SM_CLOCK", "sm_clock"))}
        lost = np.zeros((GPUS, t.size), bool)
        for f in faults:
            if f.kind == "xid79_collapse":
                lead = f.duration("lead", 600)
                gpu_util[f.gpu, t >= f.at - lead] = 0.0
                lost[f.gpu, t >= f.at] = True
            if f.kind == "correctable_acceleration":
                lost[f.gpu, t >= f.at + f.duration("loss_after", 9 * 86400)] = True
        gpu_util[lost] = 0.0
        for g in range(GPUS):
            labels = {"gpu": str(g), "UUID": f"GPU-{n:08x}-0000-0000-0000-{g:012x}"}
            up = ~lost[g]
            yield emit("DCGM_FI_DEV_GPU_UTIL", "dcgm", np.where(up, np.clip(gpu_util[g] * self._noise(0.003), 0, 100),
                                                                np.nan).round(), **labels)
            for name, scale, noise in (("DCGM_FI_DEV_POWER_USAGE", 690.0, 0.01),
                                       ("DCGM_FI_DEV_SM_CLOCK", 1980.0, 0.002),
                                       ("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", 2.0e8, 0.02)):
                level = scale * levels[name] * (offsets[name][g] if name in offsets else 1.0)
                yield emit(name, "dcgm", np.where(up, level * self._noise(noise), np.nan), **labels)

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
        # A multi-node job's traffic between its nodes; a single node, inference and burn-in move little.
        nic = np.where(busy, np.where(m["single"], 5e7, 1.2e9 * slow),
                       np.where(save, np.where(m["single"], 5e7, 1.2e9) + save_bytes / s.step, 1e6))
        nic = np.where(load, 1e6 + LOAD_BYTES, np.where(m["inference"], 1e6 + 2e8 * demand, nic)) * self._noise(0.02)
        for direction in ("receive", "transmit"):
            yield emit(f"node_network_{direction}_bytes_total", "node", self._counter(nic / 2), device="eth0")
        rdma = np.where(busy & m["training"], 2.0e10 * slow, 1e6) * self._noise(0.02)
        for direction in ("received", "transmitted"):
            yield emit(f"node_infiniband_port_data_{direction}_bytes_total", "node", self._counter(rdma / 2),
                       device="mlx5_0", port="1")

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
        yield from self._gpunode(n, faults, save, emit, lost, load, save_bytes)
        for job in ("gpunode", "node", "dcgm"):
            yield emit("up", job, np.ones(t.size))

    def _cluster(self) -> Iterator[Series]:
        """kube-state-metrics' pods and their owners, for the jobs that run on Kubernetes."""
        for a in self.attempts:
            if a.job.source != "kubernetes":
                continue
            during = np.where(self._between(a.start, a.end), 1.0, np.nan)
            kind = "ReplicaSet" if a.job.kind == "inference" else "PyTorchJob"
            for n in a.nodes:
                pod = f"{a.job.name}-{a.number}-{n}"
                base = {"job": "kube-state-metrics", "instance": "kube-state-metrics", "namespace": "ml", "pod": pod}
                info = {**base, "uid": pod_uid(a, n), "node": node_name(n)}
                yield Series("kube_pod_info", tuple(sorted(info.items())), during)
                yield Series("kube_pod_owner", tuple(sorted({**base, "owner_kind": kind, "owner_name": a.job.name,
                                                             "owner_is_controller": "true"}.items())), during)

    def _gpunode(self, n: int, faults: list[Event], save: np.ndarray, emit, lost: np.ndarray, load: np.ndarray,
                 save_bytes: np.ndarray) -> Iterator[Series]:
        t = self.t
        ones = np.ones(t.size)
        yield emit("gpunode_gpus_expected", "gpunode", ones * GPUS)
        for source in ("nvml", "pci"):
            yield emit("gpunode_gpus_visible", "gpunode", ones * GPUS, source=source)
        yield emit("gpunode_kmsg_records_lost_total", "gpunode", ones * 0)
        xids: dict[tuple[int, int], np.ndarray] = {}
        for g in range(GPUS):
            uuid = f"GPU-{n:08x}-0000-0000-0000-{g:012x}"
            gl = {"gpu": str(g), "uuid": uuid}
            correctable, uncorrectable = ones * 0, ones * 0
            width = ones * 16
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
                if f.kind == "pcie_downgrade":
                    width = np.where(t >= f.at, 8, 16)
                if f.kind == "xid79_collapse":
                    for code in (79, 145):
                        xids[(g, code)] = np.where(t >= f.at, 1, 0)
                if f.kind == "getattr_spike":
                    xids[(g, 94)] = np.where(t >= f.at, 1, 0)
            yield emit("gpunode_gpu_up", "gpunode", np.where(lost[g], 0, 1), **gl)
            yield emit("gpunode_gpu_remapped_rows_total", "gpunode", correctable, cause="correctable", **gl)
            yield emit("gpunode_gpu_remapped_rows_total", "gpunode", uncorrectable, cause="uncorrectable", **gl)
            yield emit("gpunode_gpu_row_remap_pending", "gpunode", (correctable + uncorrectable > 0) * 0, **gl)
            yield emit("gpunode_gpu_row_remap_failure", "gpunode", ones * 0, **gl)
            yield emit("gpunode_gpu_recovery_action", "gpunode", ones * 0, pci_bus_id=f"0000:{g:02x}:00.0", **gl)
            for kind, value in (("current", width), ("max", ones * 16)):
                yield emit("gpunode_gpu_pcie_link_width", "gpunode", value, kind=kind, **gl)
                yield emit("gpunode_gpu_pcie_link_generation", "gpunode", ones * 5, kind=kind, **gl)
        for (g, code), count in xids.items():
            xl = {"gpu": str(g), "uuid": f"GPU-{n:08x}-0000-0000-0000-{g:012x}", "xid": str(code),
                  "action": XID_ACTIONS[code], "pci_bus_id": f"0000:{g:02x}:00.0"}
            first = self.start + t[np.argmax(count > 0)] if count.any() else 0
            shown = count > 0  # the exporter exports an Xid series from its first event on
            yield emit("gpunode_xid_errors_total", "gpunode", np.where(shown, count, np.nan), **xl)
            yield emit("gpunode_xid_last_event_timestamp_seconds", "gpunode", np.where(shown, first, np.nan), **xl)
        yield from self._nfs(n, faults, save, emit, load, save_bytes)
        yield from self._roce(faults, emit)

    def _nfs(self, n: int, faults: list[Event], save: np.ndarray, emit, load: np.ndarray,
             save_bytes: np.ndarray) -> Iterator[Series]:
        t, step = self.t, self.s.step
        mount = {"mountpoint": "/ckpt", "export": "nas:/ckpt"}
        saturated = np.zeros(t.size, bool)
        for f in faults:
            if f.kind == "nfs_saturation":
                saturated |= self._between(f.at, f.at + f.duration("lasts", 1500))
        getattr_ms = 0.6 * self._noise(0.05)
        for f in faults:
            if f.kind == "getattr_spike":
                getattr_ms[self._between(f.at - f.duration("lead", 600), f.at + 600)] *= 30
        getattr_ops = np.full(t.size, 50.0)
        write_ops = np.where(save, save_bytes / WSIZE / step, 0.5)
        # A fault's load saturates the slots (the report: 2.5 GB/s per node); a restart's load reads less.
        read_ops = np.where(saturated, 2400.0, np.where(load, LOAD_BYTES / WSIZE, 2.0))
        queue_ms = {"WRITE": np.where(save, 5.0, 1.0), "READ": np.where(saturated, 1400.0, 1.0), "GETATTR": 0.0}
        rtt_ms = {"WRITE": 110.0, "READ": 120.0, "GETATTR": getattr_ms}
        for op, ops in (("GETATTR", getattr_ops), ("WRITE", write_ops), ("READ", read_ops)):
            q, r = queue_ms[op] * np.ones(t.size), rtt_ms[op] * np.ones(t.size)
            labels = {**mount, "op": op}
            yield emit("gpunode_nfs_rpc_operations_total", "gpunode", self._counter(ops), **labels)
            yield emit("gpunode_nfs_rpc_queue_seconds_total", "gpunode", self._counter(ops * q / 1000), **labels)
            yield emit("gpunode_nfs_rpc_rtt_seconds_total", "gpunode", self._counter(ops * r / 1000), **labels)
            yield emit("gpunode_nfs_rpc_execute_seconds_total", "gpunode", self._counter(ops * (q + r + 0.1) / 1000),
                       **labels)
            sent = ops * (WSIZE if op == "WRITE" else 200)
            received = ops * (WSIZE if op == "READ" else 200)
            yield emit("gpunode_nfs_rpc_sent_bytes_total", "gpunode", self._counter(sent), **labels)
            yield emit("gpunode_nfs_rpc_received_bytes_total", "gpunode", self._counter(received), **labels)
            yield emit("gpunode_nfs_rpc_major_timeouts_total", "gpunode", np.zeros(t.size), **labels)
        sends = getattr_ops + write_ops + read_ops
        in_flight = np.where(saturated, 128.0, np.where(save, 40.0, np.where(load, 30.0, 2.0)))
        backlog = np.where(saturated, 600.0, 0.0)
        tr = {**mount, "transport": "0", "protocol": "tcp"}
        yield emit("gpunode_nfs_transport_sends_total", "gpunode", self._counter(sends), **tr)
        yield emit("gpunode_nfs_transport_in_flight_sum_total", "gpunode", self._counter(sends * in_flight), **tr)
        yield emit("gpunode_nfs_transport_backlog_sum_total", "gpunode", self._counter(sends * backlog), **tr)
        yield emit("gpunode_nfs_transport_max_slots", "gpunode", np.maximum.accumulate(in_flight) * 0 + 128, **tr)
        yield emit("gpunode_nfs_mount_info", "gpunode", np.ones(t.size), **mount, protocol="tcp",
                   server_address="10.20.0.5", device="eth0")
        yield emit("gpunode_storage_interface_info", "gpunode", np.ones(t.size), device="eth0", source="nfs_route")
        yield emit("gpunode_network_link_speed_bytes", "gpunode", np.full(t.size, 2.5e10), device="eth0")

    def _roce(self, faults: list[Event], emit) -> Iterator[Series]:
        t = self.t
        surge = np.ones(t.size)
        for f in faults:
            if f.kind == "pcie_downgrade":
                surge[t >= f.at] = float(f.param("congestion", 20))
        port = {"device": "mlx5_0", "port": "1"}
        yield emit("gpunode_rdma_port_info", "gpunode", np.ones(t.size), netdev="eth1", link_layer="Ethernet", **port)
        yield emit("gpunode_rdma_cnp_sent_total", "gpunode", self._counter(5.0 * surge * self._noise(0.2)), **port)
        yield emit("gpunode_rdma_ecn_marked_packets_total", "gpunode", self._counter(8.0 * surge * self._noise(0.2)),
                   **port)
