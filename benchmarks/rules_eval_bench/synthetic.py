"""The synthetic fleet: every node's series as its exporters would serve them, a few percent of
nodes deviating so that the alerts have work, as values that are functions of time, so that
every backend is given the same input, scraped or written ahead."""

from __future__ import annotations

import math
import random
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fleet import remote_write
from gpunode_exporter.config import NFS_OPERATIONS, NFS_TRANSPORT_SERIES, NFS_TRANSPORT_SERIES_ALL

TAU = 2 * math.pi

# NFSv4.2's per-op list as the kernel prints it in mountstats (tests/golden/real.prom, /mnt/nfsv4.2).
_NFS_OPS = ("NULL READ WRITE COMMIT OPEN OPEN_CONFIRM OPEN_NOATTR OPEN_DOWNGRADE CLOSE SETATTR FSINFO RENEW "
           "SETCLIENTID SETCLIENTID_CONFIRM LOCK LOCKT LOCKU ACCESS GETATTR LOOKUP LOOKUP_ROOT REMOVE RENAME LINK "
           "SYMLINK CREATE PATHCONF STATFS READLINK READDIR SERVER_CAPS DELEGRETURN GETACL SETACL FS_LOCATIONS "
           "RELEASE_LOCKOWNER SECINFO FSID_PRESENT EXCHANGE_ID CREATE_SESSION DESTROY_SESSION SEQUENCE "
           "GET_LEASE_TIME RECLAIM_COMPLETE LAYOUTGET GETDEVICEINFO LAYOUTCOMMIT LAYOUTRETURN SECINFO_NO_NAME "
           "TEST_STATEID FREE_STATEID GETDEVICELIST BIND_CONN_TO_SESSION DESTROY_CLIENTID SEEK ALLOCATE DEALLOCATE "
           "LAYOUTSTATS CLONE COPY LOOKUPP")
NFS_OPS = tuple(_NFS_OPS.split())
# ops/s per mount (checkpoint mount, home mount) on a healthy node; the rest of NFS_OPS stay idle.
NFS_ACTIVE = {"READ": (40, 5), "WRITE": (20, 1), "COMMIT": (1, 0.1), "OPEN": (10, 2), "CLOSE": (10, 2),
              "SETATTR": (2, 0.2), "ACCESS": (50, 10), "GETATTR": (300, 20), "LOOKUP": (50, 10),
              "READDIR": (1, 1), "SEQUENCE": (100, 20), "DELEGRETURN": (1, 0.1)}
# The exporter's default sums the operations it does not serve into op="OTHER".
NFS_ACTIVE["OTHER"] = tuple(sum(rates[m] for op, rates in NFS_ACTIVE.items() if op not in NFS_OPERATIONS)
                            for m in (0, 1))  # type: ignore[assignment]
NFS_BYTES = {"READ": (200, 1 << 20), "WRITE": (1 << 20, 200)}  # (sent, received) bytes per op; others ~200/120
GPU_BUS = ("1B", "43", "52", "61", "9D", "C3", "D1", "DF")  # a DGX H100's GPU PCI buses
COLLECTORS = ("gpu", "nfs", "xid", "staging", "storage_network", "gpu_processes", "checkpoint")
NET_DEVICES = ("lo", "eno1", "enp64s0np0", *(f"ibp{i}s0" for i in range(8)), "docker0", "veth1a2b3c", "veth4d5e6f")
IB_PORTS = tuple(f"mlx5_{i}" for i in range(10))  # 0-7 compute fabric, 8-9 storage (RoCE)
RDMA_COUNTERS = ("ecn_marked_packets", "cnp_sent", "cnp_handled", "cnp_ignored", "out_of_sequence_packets",
                 "packet_sequence_errors", "implied_nak_sequence_errors", "local_ack_timeouts", "duplicate_requests",
                 "rnr_naks_received", "out_of_buffer_drops", "transport_retries_exceeded", "rnr_retries_exceeded",
                 "adaptive_retransmissions", "adaptive_retransmission_timeouts", "slow_restarts",
                 "slow_restart_cnps", "icrc_error_packets")
XID_ACTIONS = (("79", "RESTART_BM"), ("94", "RESTART_APP"), ("48", "WORKFLOW_XID_48"), ("13", "RESTART_APP"),
               ("31", "RESTART_APP"), ("119", "RESET_GPU"), ("45", "WORKFLOW_XID_45"), ("145", "WORKFLOW_NVLINK5_ERR"),
               ("95", "CONTACT_SUPPORT"), ("43", "IGNORE"))
CLOCK_REASONS = ("gpu_idle", "applications_clocks_setting", "sw_power_cap", "hw_slowdown", "sync_boost",
                 "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown", "display_clock_setting")
VIOLATION_POLICIES = ("power", "thermal", "sync_boost", "board_limit", "low_utilization", "reliability")
# Share of nodes (or of GPUs) in each deviating role; at least one each.
ROLES = {"node_down": 0.001, "exporter_down": 0.002, "gpu_lost": 0.003, "pcie_width": 0.005, "pcie_gen": 0.005,
         "xid_history": 0.04, "xid_live": 0.01, "recovery_action": 0.003, "kmsg_lost": 0.002,
         "collector_failing": 0.003, "precursor": 0.02, "failslow": 0.02, "nfs_slots": 0.02, "nfs_timeouts": 0.005,
         "nfs_paradox": 0.01, "checkpoint_load": 0.01, "out_of_service": 0.005}
GPU_ROLES = {"remap_correctable": 0.03, "remap_uncorrectable": 0.005, "remap_pending": 0.003,
             "remap_failure": 0.001, "remap_accelerating": 0.001}
JOB_NODES = (8, 16, 32, 64, 128)  # nodes per training job; the jobs take ~90 % of the nodes, the rest idle
# The reference node's 4 NFSv4.2 mounts with nconnect=8 (docs/series-budget.md): (mountpoint,
# export, server, device, nconnect, 0 for the checkpoint mount's rates or 1 for the others').
NFS_MOUNTS = (("/mnt/ckpt", "stor-a.example:/ckpt", "10.20.0.5", "enp64s0np0", 8, 0),
              ("/mnt/datasets", "stor-b.example:/datasets", "10.20.0.6", "enp64s0np0", 8, 1),
              ("/mnt/scratch", "stor-b.example:/scratch", "10.20.0.6", "enp64s0np0", 8, 1),
              ("/home", "home-nas.example:/export/home", "10.10.0.9", "eno1", 8, 1))
NFS_MOUNTS_BEFORE = (NFS_MOUNTS[0], (*NFS_MOUNTS[3][:4], 1, 1))  # --nfs-mounts 2: the earlier runs' input
CHECKPOINT = (900.0, 120.0, 240.0)  # every node saves every 15 min for 2 min, the first 4 min after the start

# Series kinds; each dynamic series is (prefix, kind, a, b, c, d, e, integer).
LINEAR, WAVE, PHASED, STEPS, STEPTIME = range(5)


@dataclass
class Family:
    name: str
    kind: str
    static: list[str] = field(default_factory=list)
    dynamic: list[tuple[Any, ...]] = field(default_factory=list)
    static_bytes: bytes = b""


class Fleet:
    """Every node's series; render(now) is one exposition. Values are functions of now - epoch, so
    set_epoch() at each backend's start gives every backend the same sequence of values."""

    def __init__(self, nodes: int, gpus: int, nfs_ops: int, seed: int, every_nfs_series: bool = False,
                 nfs_mounts: int = 4) -> None:
        self.nodes, self.gpus, self.nfs_mounts = nodes, gpus, nfs_mounts
        self.ops: tuple[str, ...] = NFS_OPS[:nfs_ops]
        self.transport_series = NFS_TRANSPORT_SERIES_ALL
        self.per_transport = True
        if not every_nfs_series:  # as the exporter serves them by default (docs/series-budget.md)
            self.ops = (*(op for op in self.ops if op in NFS_OPERATIONS), "OTHER")
            self.transport_series = NFS_TRANSPORT_SERIES
            self.per_transport = False  # a mount's transports summed, transport="all"
        self.rng = random.Random(seed)
        self.families: dict[str, Family] = {}
        self.epoch = time.time()
        self.roles = {role: set(self.rng.sample(range(nodes), max(1, round(share * nodes))))
                      for role, share in ROLES.items()}
        n_gpus = nodes * gpus
        self.gpu_roles = {role: set(self.rng.sample(range(n_gpus), max(1, round(share * n_gpus))))
                          for role, share in GPU_ROLES.items()}
        self.workload = self._jobs(nodes)
        for node in range(nodes):
            self._node(node)
        self._finish()

    def _finish(self) -> None:
        """The static series as one text per family; the counts."""
        for fam in self.families.values():
            fam.static_bytes = "".join(fam.static).encode()
            fam.static = []
        self.series = sum(len(f.static_bytes.splitlines()) + len(f.dynamic) for f in self.families.values())
        self.dynamic_series = sum(len(f.dynamic) for f in self.families.values())

    def _jobs(self, nodes: int) -> dict[int, str]:
        """node -> its training job (the rules' peer groups); idle nodes have none."""
        order = list(range(nodes))
        self.rng.shuffle(order)
        out: dict[int, str] = {}
        job = 0
        while len(out) < 0.9 * nodes:
            size = min(self.rng.choice(JOB_NODES), max(1, nodes // 4))
            out.update((n, f"train-{job:04d}") for n in order[len(out):len(out) + size])
            job += 1
        return out

    # -- adding series --

    def _fam(self, name: str, kind: str) -> Family:
        fam = self.families.get(name)
        if fam is None:
            fam = self.families[name] = Family(name, kind)
        return fam

    def const(self, name: str, kind: str, labels: str, value: float) -> None:
        text = str(int(value)) if float(value).is_integer() else repr(float(value))
        self._fam(name, kind).static.append(f"{name}{labels} {text}\n")

    def counter(self, name: str, labels: str, base: float, rate: float, wobble: float = 0.3,
                integer: bool = True) -> None:
        """base + rate * t, wobbling (rate * (1 + wobble * cos)) so that peers differ; static at rate 0."""
        if rate <= 0:
            self.const(name, "counter", labels, int(base) if integer else round(base, 3))
            return
        period = self.rng.uniform(90, 600)
        self._fam(name, "counter").dynamic.append(
            (f"{name}{labels} ", LINEAR, base, rate, min(wobble, 1.0), period, self.rng.uniform(0, TAU), integer))

    def wave(self, name: str, labels: str, mean: float, amp: float, integer: bool = False) -> None:
        self._fam(name, "gauge").dynamic.append(
            (f"{name}{labels} ", WAVE, mean, amp, 0.0, self.rng.uniform(60, 900), self.rng.uniform(0, TAU), integer))

    def phased(self, name: str, labels: str, base: float, rate: float, extra: float,
               phase: tuple[float, float, float] = CHECKPOINT, integer: bool = True) -> None:
        """A counter rising by rate, and by extra more during `length` of every `period`."""
        period, length, first = phase
        self._fam(name, "counter").dynamic.append(
            (f"{name}{labels} ", PHASED, base, rate, extra, period, (length, period - first), integer))

    def steps(self, name: str, labels: str, base: float, period: float, first: float) -> None:
        """A counter of events: +1 at first, first + period, ... seconds after the epoch."""
        self._fam(name, "counter").dynamic.append((f"{name}{labels} ", STEPS, base, 1.0, 0.0, period, first, True))

    def step_time(self, name: str, labels: str, before: float, period: float, first: float) -> None:
        """The Unix time of the latest of those events (epoch + before until the first)."""
        self._fam(name, "gauge").dynamic.append((f"{name}{labels} ", STEPTIME, before, 0.0, 0.0, period, first, True))

    # -- one node --

    def _node(self, n: int) -> None:
        host = f"gpu{n + 1:04d}"
        roles = {role for role, members in self.roles.items() if n in members}
        rng = self.rng
        down = "node_down" in roles
        for job in ("gpunode", "node", "dcgm"):
            value = 0 if down or (job == "gpunode" and "exporter_down" in roles) else 1
            self.const("up", "gauge", f'{{instance="{host}",job="{job}"}}', value)
        if down:
            return
        if "out_of_service" in roles:  # node_exporter's textfile metric, set by a drain hook
            self.const("node_out_of_service", "gauge", f'{{instance="{host}",job="node"}}', 1)
        jitter = rng.uniform(0.95, 1.05)
        uuids = [f"GPU-{n:08x}-{g:04x}-4000-8000-{n * self.gpus + g:012x}" for g in range(self.gpus)]
        lost_gpu = rng.randrange(self.gpus) if "gpu_lost" in roles else -1
        idle_gpu = rng.randrange(self.gpus) if "precursor" in roles and rng.random() < 0.5 else -1
        precursor = set(rng.sample(("interrupts", "procs_running", "pgpgout", "nfs_getattr", "gpu_idle", "roce_cnp",
                                    "roce_ecn"), rng.randint(2, 3))) if "precursor" in roles else set()
        if idle_gpu < 0:
            precursor.discard("gpu_idle")
        elif "precursor" in roles:
            precursor.add("gpu_idle")

        # node_exporter
        base = f'instance="{host}",job="node"'
        lab = "{" + base + "}"
        self.counter("node_intr_total", lab, 4e9 * jitter,
                     10_000 * jitter * (0.2 if "interrupts" in precursor else 1))
        self.wave("node_procs_running", lab, 0.5 if "procs_running" in precursor else 24 * jitter,
                  0.5 if "procs_running" in precursor else 4, integer=True)
        self.counter("node_vmstat_pgpgout", lab, 9e8 * jitter,
                     3000 * jitter * (25 if "pgpgout" in precursor else 1))
        self.counter("node_pressure_cpu_waiting_seconds_total", lab, 5e4, 0.03 * jitter, integer=False)
        # A job's healthy nodes move their traffic within ~1 % of each other, steadily (the
        # straggler proxies network and rdma, which make a job's level).
        slow_net = (0.75 if "failslow" in roles else 1.0) * rng.uniform(0.99, 1.01) / jitter
        for dev in NET_DEVICES:
            dl = f'{{{base},device="{dev}"}}'
            if dev == "enp64s0np0":  # the storage NIC: checkpoint saves go out here
                low = 0.05 if "nfs_paradox" in roles else 1.0
                self.counter("node_network_receive_bytes_total", dl, 3e12, 6e7 * jitter * low * slow_net, wobble=0.02)
                self.phased("node_network_transmit_bytes_total", dl, 5e12, 2e7 * jitter * low * slow_net,
                            0 if "nfs_paradox" in roles else 2e9)
                continue
            rate = {"lo": 1e5, "eno1": 2e6, "docker0": 1e4}.get(dev, 5e4 if dev.startswith("veth") else 4e6)
            self.counter("node_network_receive_bytes_total", dl, 1e10, rate * jitter * slow_net, wobble=0.02)
            self.counter("node_network_transmit_bytes_total", dl, 1e10, rate * jitter * slow_net, wobble=0.02)
        for i, dev in enumerate(IB_PORTS):
            dl = f'{{{base},device="{dev}",port="1"}}'
            rate = (5e9 if i < 8 else 1e8) * jitter * slow_net
            self.counter("node_infiniband_port_data_received_bytes_total", dl, 4e14, rate, wobble=0.02)
            self.counter("node_infiniband_port_data_transmitted_bytes_total", dl, 4e14, rate, wobble=0.02)
            if i < 8:  # the compute fabric's ports: transmit wait, and the odd symbol error
                self.counter("node_infiniband_port_transmit_wait_total", dl, 1e12, 2e6 * jitter, wobble=0.1)
                self.const("node_infiniband_symbol_error_total", "counter", dl, rng.choice((0, 0, 0, 1, 3)))
                self.const("node_infiniband_link_error_recovery_total", "counter", dl, 0)
                self.const("node_infiniband_rate_bytes_per_second", "gauge", dl, 5e10)

        # dcgm-exporter
        base = f'instance="{host}",job="dcgm"'
        slow = "failslow" in roles
        for g in range(self.gpus):
            if g == lost_gpu:
                continue  # DCGM no longer sees it
            dl = (f'{{{base},gpu="{g}",UUID="{uuids[g]}",pci_bus_id="00000000:{GPU_BUS[g % 8]}:00.0",'
                  f'device="nvidia{g}",modelName="NVIDIA H100 80GB HBM3",Hostname="{host}"}}')
            loading = "checkpoint_load" in roles
            util = 2.0 if g == idle_gpu or loading else 97.5 * (0.85 if slow else 1.0)
            self.wave("DCGM_FI_DEV_GPU_UTIL", dl, util, 0 if util < 5 else 1.5, integer=True)
            self.wave("DCGM_FI_DEV_POWER_USAGE", dl, 120 if util < 5 else 650 * (0.82 if slow else 1), 15)
            self.wave("DCGM_FI_DEV_SM_CLOCK", dl, 1980 * (0.88 if slow else 1), 10, integer=True)
            nvlink = 0.0 if util < 5 else 1.2e8 * (0.8 if slow else 1)
            self.wave("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", dl, nvlink, nvlink * 0.03, integer=True)
            self.wave("DCGM_FI_PROF_NVLINK_TX_BYTES", dl, nvlink * 100, nvlink * 3, integer=True)
            self.wave("DCGM_FI_PROF_NVLINK_RX_BYTES", dl, nvlink * 100, nvlink * 3, integer=True)

        if "exporter_down" in roles:
            return
        self._gpunode(n, host, roles, uuids, lost_gpu, precursor, jitter)

    def _gpunode(self, n: int, host: str, roles: set[str], uuids: list[str], lost_gpu: int,
                 precursor: set[str], jitter: float) -> None:
        rng = self.rng
        base = f'instance="{host}",job="gpunode"'
        lab = "{" + base + "}"
        if n in self.workload:
            self.const("gpunode_node_workload_info", "gauge",
                       f'{{{base},source="slurm",workload="{self.workload[n]}"}}', 1)
        self.const("gpunode_exporter_build_info", "gauge", f'{{{base},python_version="3.11.2",version="0.1.0"}}', 1)
        for c in COLLECTORS:
            ok = 0 if c == "nfs" and "collector_failing" in roles else 1
            self.const("gpunode_scrape_collector_success", "gauge", f'{{{base},collector="{c}"}}', ok)
            self.wave("gpunode_scrape_collector_duration_seconds", f'{{{base},collector="{c}"}}', 0.004, 0.001)

        # gpu
        visible = self.gpus - (lost_gpu >= 0)
        self.const("gpunode_gpus_visible", "gauge", f'{{{base},source="pci"}}', self.gpus)
        self.const("gpunode_gpus_visible", "gauge", f'{{{base},source="nvml"}}', visible)
        self.const("gpunode_gpus_expected", "gauge", lab, self.gpus)
        width_gpu = rng.randrange(self.gpus) if "pcie_width" in roles else -1
        gen_gpu = rng.randrange(self.gpus) if "pcie_gen" in roles else -1
        for g in range(self.gpus):
            gid = n * self.gpus + g
            ids = f'{base},gpu="{g}",uuid="{uuids[g]}"'
            bus = f"00000000:{GPU_BUS[g % 8]}:00.0"
            self.const("gpunode_gpu_info", "gauge", f'{{{ids},pci_bus_id="{bus}",name="NVIDIA H100 80GB HBM3",'
                       f'serial="16549220{gid:05d}",driver_version="550.54.15"}}', 1)
            self.const("gpunode_gpu_up", "gauge", "{" + ids + "}", 0 if g == lost_gpu else 1)
            corr = rng.randint(1, 40) if gid in self.gpu_roles["remap_correctable"] else 0
            unc = rng.randint(1, 3) if gid in self.gpu_roles["remap_uncorrectable"] else 0
            rows = f'{{{ids},cause="correctable"}}'
            if gid in self.gpu_roles["remap_accelerating"]:
                self.steps("gpunode_gpu_remapped_rows_total", rows, corr + 30, rng.uniform(60, 120), rng.uniform(0, 60))
            else:
                self.const("gpunode_gpu_remapped_rows_total", "counter", rows, corr)
            self.const("gpunode_gpu_remapped_rows_total", "counter", f'{{{ids},cause="uncorrectable"}}', unc)
            self.const("gpunode_gpu_row_remap_pending", "gauge", "{" + ids + "}",
                       int(gid in self.gpu_roles["remap_pending"]))
            self.const("gpunode_gpu_row_remap_failure", "gauge", "{" + ids + "}",
                       int(gid in self.gpu_roles["remap_failure"]))
            used = min(corr + unc, 2560)
            low = 1 if gid in self.gpu_roles["remap_failure"] else 0
            for avail, value in (("max", 2560 - used), ("high", max(0, used - 2 - low)), ("partial", min(used, 2)),
                                 ("low", low), ("none", 0)):
                self.const("gpunode_gpu_remap_banks", "gauge", f'{{{ids},availability="{avail}"}}', value)
            self.const("gpunode_gpu_pcie_link_generation", "gauge", f'{{{ids},kind="current"}}',
                       4 if g == gen_gpu else 5)
            self.const("gpunode_gpu_pcie_link_generation", "gauge", f'{{{ids},kind="max"}}', 5)
            self.const("gpunode_gpu_pcie_link_width", "gauge", f'{{{ids},kind="current"}}',
                       8 if g == width_gpu else 16)
            self.const("gpunode_gpu_pcie_link_width", "gauge", f'{{{ids},kind="max"}}', 16)
            # What names a straggler's cause: a failslow node's GPU 0 is thermally throttled.
            throttled = "failslow" in roles and g == 0
            for reason in CLOCK_REASONS:
                active = (reason == "sw_thermal_slowdown" and throttled) or (reason == "sw_power_cap" and g % 3 == 0)
                self.const("gpunode_gpu_clock_event_active", "gauge", f'{{{ids},reason="{reason}"}}', int(active))
            for policy in VIOLATION_POLICIES:
                rate = {"power": 0.3 * jitter, "thermal": 1.0 if throttled else 0.0}.get(policy, 0.0)
                self.counter("gpunode_gpu_clock_violation_seconds_total", f'{{{ids},policy="{policy}"}}', 1e4, rate,
                             integer=False)
            for reason in ("sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown"):
                self.counter("gpunode_gpu_clock_event_seconds_total", f'{{{ids},reason="{reason}"}}', 1e3,
                             1.0 if throttled and reason == "sw_thermal_slowdown" else 0.0, integer=False)
            for kind in ("replay", "recovery", "crc_flit"):
                self.const("gpunode_gpu_nvlink_errors_total", "counter", f'{{{ids},link="all",type="{kind}"}}',
                           rng.choice((0, 0, 2)) if kind == "crc_flit" else 0)
            self.const("gpunode_gpu_nvlink_links_up", "gauge", "{" + ids + "}", 18)
            self.const("gpunode_gpu_pcie_replays_total", "counter", "{" + ids + "}", 0)
            action = rng.choice((1, 2)) if "recovery_action" in roles and g == 0 else 0
            self.const("gpunode_gpu_recovery_action", "gauge",
                       f'{{{ids},pci_bus_id="0000:{GPU_BUS[g % 8].lower()}:00.0"}}', action)

        # xid
        self.const("gpunode_xid_source", "gauge", f'{{{base},source="kmsg"}}', 1)
        self.const("gpunode_xid_source", "gauge", f'{{{base},source="nvml"}}', 0)
        for op in ("load", "save", "lock"):
            self.const("gpunode_xid_state_errors_total", "counter", f'{{{base},operation="{op}"}}', 0)
        if "kmsg_lost" in roles:
            self.steps("gpunode_kmsg_records_lost_total", lab, 0, rng.uniform(200, 400), rng.uniform(0, 300))
        else:
            self.const("gpunode_kmsg_records_lost_total", "counter", lab, 0)
        self.const("gpunode_kmsg_records_malformed_total", "counter", lab, 0)
        if "xid_history" in roles or "xid_live" in roles:
            for k in range(rng.randint(1, 3)):
                g = rng.randrange(self.gpus)
                xid, action = XID_ACTIONS[rng.randrange(len(XID_ACTIONS))]
                if k == 0 and "xid_live" in roles:  # a new event every few minutes while we watch
                    xid, action = rng.choice((("79", "RESTART_BM"), ("94", "RESTART_APP"), ("119", "RESET_GPU")))
                    period, first = rng.uniform(240, 480), rng.uniform(0, 240)
                else:
                    period, first = math.inf, math.inf
                xl = (f'{{{base},gpu="{g}",uuid="{uuids[g]}",pci_bus_id="0000:{GPU_BUS[g % 8].lower()}:00.0",'
                      f'xid="{xid}",action="{action}"}}')
                before = -rng.uniform(3600, 40 * 86400)
                self.steps("gpunode_xid_errors_total", xl, rng.randint(1, 5), period, first)
                self.step_time("gpunode_xid_last_event_timestamp_seconds", xl, before, period, first)

        # nfs
        mounts = NFS_MOUNTS if self.nfs_mounts == 4 else NFS_MOUNTS_BEFORE
        self.const("gpunode_nfs_slot_table_limit", "gauge", f'{{{base},protocol="tcp"}}', 65536)
        self.const("gpunode_nfs_parse_errors_total", "counter", lab, 0)
        if "collector_failing" not in roles:
            for mountpoint, export, addr, dev, nconnect, m in mounts:
                self._mount(base, mountpoint, export, addr, dev, nconnect, m, roles, precursor, jitter)

        # storage network
        for dev, speed in (("enp64s0np0", 50e9), ("eno1", 3.125e9)):
            self.const("gpunode_storage_interface_info", "gauge", f'{{{base},device="{dev}",source="nfs_route"}}', 1)
            self.const("gpunode_network_link_speed_bytes", "gauge", f'{{{base},device="{dev}"}}', speed)
            for direction in ("rx", "tx"):
                for prio in range(8):
                    pl = f'{{{base},device="{dev}",direction="{direction}",priority="{prio}"}}'
                    self.counter("gpunode_network_pfc_pause_frames_total", pl, 1000 if prio == 3 else 0,
                                 10 * jitter if prio == 3 and dev != "eno1" else 0)
        precursor_counters = {("cnp_sent", "roce_cnp"), ("ecn_marked_packets", "roce_ecn")} & {
            (c, signal) for c in ("cnp_sent", "ecn_marked_packets") for signal in precursor}
        for dev, netdev in (("mlx5_8", "enp64s0np0"), ("mlx5_9", "enp65s0np0")):
            self.const("gpunode_rdma_port_info", "gauge",
                       f'{{{base},device="{dev}",port="1",netdev="{netdev}",link_layer="Ethernet"}}', 1)
            for counter in RDMA_COUNTERS:
                rate = {"ecn_marked_packets": 100.0, "cnp_sent": 50.0, "cnp_handled": 80.0,
                        "out_of_sequence_packets": 0.5, "packet_sequence_errors": 0.5}.get(counter, 0.0)
                if (counter, "roce_cnp") in precursor_counters or (counter, "roce_ecn") in precursor_counters:
                    rate *= 50
                self.counter(f"gpunode_rdma_{counter}_total", f'{{{base},device="{dev}",port="1"}}',
                             rate * 1e5, rate * jitter)

        # gpu processes, staging
        self.const("gpunode_gpu_processes", "gauge", lab, self.gpus)
        self.counter("gpunode_gpu_process_read_bytes_total", lab, 4e10, 5e7 * jitter)
        self.phased("gpunode_gpu_process_write_bytes_total", lab, 8e10, 1e6 * jitter, 2e9)
        self.counter("gpunode_gpu_process_read_syscalls_total", lab, 2.5e6, 500 * jitter)
        self.counter("gpunode_gpu_process_write_syscalls_total", lab, 4.8e6, 100 * jitter)
        self.const("gpunode_gpu_process_checks_pending", "gauge", lab, 0)
        for f in ("fd", "io"):
            self.const("gpunode_gpu_process_unreadable", "gauge", f'{{{base},file="{f}"}}', 0)
        self.wave("gpunode_staging_used_bytes", f'{{{base},path="/mnt/staging"}}', 2e11, 1e11, integer=True)
        self.const("gpunode_staging_size_bytes", "gauge", f'{{{base},path="/mnt/staging"}}', 1.6e12)
        # The checkpoint clock: a second a second while the node saves, a save each CHECKPOINT period.
        self.phased("gpunode_checkpoint_save_seconds_total", lab, 0.0, 0.0, 1.0, integer=False)
        self.steps("gpunode_checkpoint_saves_total", lab, 0.0, CHECKPOINT[0], CHECKPOINT[2])
        self.counter("gpunode_checkpoint_samples_total", lab, 0.0, 1.0, wobble=0)

    def _mount(self, base: str, mountpoint: str, export: str, addr: str, dev: str, nconnect: int, m: int,
               roles: set[str], precursor: set[str], jitter: float) -> None:
        rng = self.rng
        ml = f'{base},mountpoint="{mountpoint}",export="{export}"'
        self.const("gpunode_nfs_mount_info", "gauge",
                   f'{{{ml},protocol="tcp",server_address="{addr}",device="{dev}"}}', 1)
        ckpt = m == 0
        saturated = ckpt and ("nfs_slots" in roles or "nfs_paradox" in roles)
        loading = ckpt and "checkpoint_load" in roles
        total_ops = mount_timeouts = 0.0
        for op in self.ops:
            ol = f'{{{ml},op="{op}"}}'
            rate = NFS_ACTIVE.get(op, (0.0, 0.0))[m] * jitter
            extra = 0.0
            if op == "WRITE" and ckpt:
                extra = 0.0 if "nfs_paradox" in roles else 2000.0  # checkpoint saves: ~2 GB/s per node
            if op == "READ" and loading:
                rate += 300.0  # a restart reads its checkpoint
            total_ops += rate + extra * CHECKPOINT[1] / CHECKPOINT[0]
            idle_base = rng.randint(0, 3) if rate == 0 else rng.randint(10**5, 10**7)
            sent, received = NFS_BYTES.get(op, (200, 120))
            execute = 0.0006 if op == "GETATTR" else 0.002 if op in ("READ", "WRITE", "COMMIT") else 0.0008
            if op == "GETATTR" and "nfs_getattr" in precursor and ckpt:
                execute *= 20
            queue = execute * (3.0 if saturated else 0.05)
            execute_total = execute + queue
            if extra:
                self.phased("gpunode_nfs_rpc_operations_total", ol, idle_base, rate, extra)
                self.phased("gpunode_nfs_rpc_transmissions_total", ol, idle_base, rate, extra)
                self.phased("gpunode_nfs_rpc_sent_bytes_total", ol, idle_base * sent, rate * sent, extra * sent)
                self.phased("gpunode_nfs_rpc_received_bytes_total", ol, idle_base * received, rate * received,
                            extra * received)
                for metric, per_op in (("queue", queue), ("rtt", execute * 0.8), ("execute", execute_total)):
                    self.phased(f"gpunode_nfs_rpc_{metric}_seconds_total", ol, idle_base * per_op, rate * per_op,
                                extra * per_op, integer=False)
            else:
                self.counter("gpunode_nfs_rpc_operations_total", ol, idle_base, rate)
                self.counter("gpunode_nfs_rpc_transmissions_total", ol, idle_base, rate)
                self.counter("gpunode_nfs_rpc_sent_bytes_total", ol, idle_base * sent, rate * sent)
                self.counter("gpunode_nfs_rpc_received_bytes_total", ol, idle_base * received, rate * received)
                for metric, per_op in (("queue", queue), ("rtt", execute * 0.8), ("execute", execute_total)):
                    self.counter(f"gpunode_nfs_rpc_{metric}_seconds_total", ol, idle_base * per_op, rate * per_op,
                                 integer=False)
            timeouts = 0.05 if op == "WRITE" and ckpt and "nfs_timeouts" in roles else 0.0
            self.counter("gpunode_nfs_rpc_major_timeouts_total", ol, 0, timeouts, wobble=0)
            self.const("gpunode_nfs_rpc_errors_total", "counter", ol, 0)
            mount_timeouts += timeouts
        self.counter("gpunode_nfs_mount_major_timeouts_total", f"{{{ml}}}", 0, mount_timeouts, wobble=0)
        max_slots = 128 if saturated else rng.choice((16, 32, 64))
        occupancy = 0.96 * max_slots if saturated else rng.uniform(1, 4)
        # Each transport as the exporter's per_transport serves it, or by default their sum
        # (the same per-send ratios; max_slots the same on each).
        for t in range(nconnect) if self.per_transport else ("all",):
            tl = f'{{{ml},transport="{t}",protocol="tcp"}}'
            sends = total_ops / nconnect if self.per_transport else total_ops
            wanted = self.transport_series
            if "sends" in wanted:
                self.counter("gpunode_nfs_transport_sends_total", tl, 1e7, sends)
            if "receives" in wanted:
                self.counter("gpunode_nfs_transport_receives_total", tl, 1e7, sends)
            if "bad_xids" in wanted:
                self.const("gpunode_nfs_transport_bad_xids_total", "counter", tl, 0)
            if "connects" in wanted:
                self.const("gpunode_nfs_transport_connects_total", "counter", tl, 1 if self.per_transport else nconnect)
            if "in_flight_sum" in wanted:
                self.counter("gpunode_nfs_transport_in_flight_sum_total", tl, 4e7, sends * occupancy, wobble=0.1)
            if "backlog_sum" in wanted:
                self.counter("gpunode_nfs_transport_backlog_sum_total", tl, 0, sends * (40 if saturated else 0))
            if "sending_sum" in wanted:
                self.counter("gpunode_nfs_transport_sending_sum_total", tl, 0, sends * 0.1)
            if "pending_sum" in wanted:
                self.counter("gpunode_nfs_transport_pending_sum_total", tl, 1e7, sends * occupancy * 0.9, wobble=0.1)
            if "max_slots" in wanted:
                self.const("gpunode_nfs_transport_max_slots", "gauge", tl, max_slots)

    # -- rendering --

    def produces(self) -> set[str]:
        return set(self.families)

    def render(self, now: float) -> bytes:
        dt = now - self.epoch
        epoch = self.epoch
        sin = math.sin
        chunks = []
        for fam in self.families.values():
            chunks.append(f"# TYPE {fam.name} {fam.kind}\n".encode())
            chunks.append(fam.static_bytes)
            if not fam.dynamic:
                continue
            out = []
            for prefix, kind, a, b, c, d, e, integer in fam.dynamic:
                if kind == LINEAR:  # a base, b rate, c wobble, d period, e phase
                    v = a + b * dt
                    if c:
                        v += b * c * d / TAU * (sin(TAU * dt / d + e) - sin(e))
                elif kind == WAVE:  # a mean, b amplitude
                    v = a + b * sin(TAU * dt / d + e)
                elif kind == PHASED:  # a base, b rate, c extra rate, d period, e (length, offset)
                    full, rem = divmod(dt + e[1], d)
                    v = a + b * dt + c * (full * e[0] + min(rem, e[0]))
                elif kind == STEPS:  # a base, d period, e first
                    v = a + (0 if dt < e else 1 + (dt - e) // d)
                else:  # STEPTIME: a the time before the first event, relative to the epoch
                    v = epoch + (a if dt < e else e + (dt - e) // d * d)
                out.append(f"{prefix}{int(v) if integer else f'{v:.4f}'}\n")
            chunks.append("".join(out).encode())
        return b"".join(chunks)

    def matrix(self, fam: Family, times: np.ndarray) -> tuple[list[bytes], np.ndarray]:
        """One family's series over times (unix seconds), as render() would give them there:
        (remote-write labels per series, values series x times)."""
        labels, rows = [], []
        for line in fam.static_bytes.decode().splitlines():
            prefix, _, value = line.rpartition(" ")
            labels.append(_labels(prefix))
            rows.append(np.full(times.size, float(value)))
        if fam.dynamic:
            p = np.array([(*item[2:5], item[5]) for item in fam.dynamic], dtype=float)
            kind = np.array([item[1] for item in fam.dynamic])
            e = np.array([item[6][1] if item[1] == PHASED else item[6] for item in fam.dynamic], dtype=float)[:, None]
            length = np.array([item[6][0] if item[1] == PHASED else 0.0 for item in fam.dynamic])[:, None]
            a, b, c, d = (p[:, i:i + 1] for i in range(4))
            dt = (times - self.epoch)[None, :]
            with np.errstate(divide="ignore", invalid="ignore"):
                linear = a + b * dt + np.where(c > 0, b * c * d / TAU * (np.sin(TAU * dt / d + e) - np.sin(e)), 0.0)
                wave = a + b * np.sin(TAU * dt / d + e)
                full, rem = np.divmod(dt + e, d)
                phased = a + b * dt + c * (full * length + np.minimum(rem, length))
                later = dt >= e
                steps = a + np.where(later, 1 + np.floor((dt - e) / d), 0.0)
                steptime = self.epoch + np.where(later, e + np.floor((dt - e) / d) * d, a)
            k = kind[:, None]
            v = np.select([k == LINEAR, k == WAVE, k == PHASED, k == STEPS], [linear, wave, phased, steps], steptime)
            integer = np.array([item[7] for item in fam.dynamic])[:, None]
            rows.extend(np.where(integer, np.trunc(v), np.round(v, 4)))
            labels.extend(_labels(item[0].rstrip()) for item in fam.dynamic)
        return labels, np.vstack(rows) if rows else np.empty((0, times.size))


class Recordings(Fleet):
    """The fleet tier's input for `nodes` nodes: what it read at the end of an earlier run's
    measurement (the local tier's recordings of source_nodes nodes, the out-of-service marker),
    copied with the node (`instance`) and its job (`workload`) renamed, so that every copy is
    its own set of nodes and peer groups; each value held over time."""

    def __init__(self, snapshot: dict[str, Any], nodes: int) -> None:
        self.nodes, self.gpus, self.families, self.epoch = nodes, 0, {}, time.time()
        self.roles, self.gpu_roles, self.workload = {}, {}, {}
        source = snapshot["nodes"]
        self.copies = max(1, round(nodes / source))
        for copy in range(self.copies):
            for name, items in snapshot["series"].items():
                for labels, value in items:
                    labels = {k: (f"{v}-{copy}" if copy and k in ("instance", "workload") and v else v)
                              for k, v in labels.items() if k != "__name__"}
                    text = ",".join(f'{k}="{escape(v)}"' for k, v in sorted(labels.items()))
                    self.const(name, "gauge", f"{{{text}}}", value)
        self._finish()


def _labels(text: str) -> bytes:
    """`name{k="v",...}` -> remote write labels (the generator's values need no unescaping)."""
    name, _, rest = text.partition("{")
    return remote_write.labels_bytes([("__name__", name), *re.findall(r'(\w+)="([^"]*)"', rest)])


def escape(value: str) -> str:
    """A label value as the text format quotes it."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def write_backfill(path: Path, series: dict[str, list[tuple[dict[str, str], float]]], start: float, end: float,
                   step: float, ms: bool) -> int:
    """Points every step from start to end for each series, at one value (the cost of a query
    depends on how many samples it reads, not on their values)."""
    first = math.ceil(start / step) * step
    stamps = [int((first + i * step) * (1000 if ms else 1)) for i in range(int((end - first) // step) + 1)]
    points = 0
    with path.open("w") as f:
        for name, items in series.items():
            for labels, value in items:
                text = ",".join(f'{k}="{escape(v)}"' for k, v in sorted(labels.items()) if k != "__name__")
                prefix = f"{name}{{{text}}} {value!r} "
                f.writelines(f"{prefix}{t}\n" for t in stamps)
                points += len(stamps)
        if not ms:
            f.write("# EOF\n")
    return points
