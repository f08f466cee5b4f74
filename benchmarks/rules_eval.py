#!/usr/bin/env python3
"""Rule pack evaluation cost at 1,000 nodes x 8 GPUs: Prometheus 2.42 vs VictoriaMetrics + vmalert.

    python benchmarks/rules_eval.py [--nodes 1000] [--warmup 300] [--measure 180]
    python benchmarks/rules_eval.py --tier fleet --nodes 10000   # the fleet tier, after a run as above
    python benchmarks/rules_eval.py --warmup 60 --measure 60 --nodes 100 --no-backfill   # a quick look

A synthetic fleet holds every node's series as gpunode-exporter (job="gpunode"), node_exporter
(job="node") and dcgm-exporter (job="dcgm") would serve them at the reference node's size
(docs/series-budget.md: 8 GPUs, 4 NFSv4.2 mounts with nconnect=8): the label sets of
tests/golden/*.prom and README's metric table, counters that rise, nodes in training jobs of
8-128 nodes (gpunode_node_workload_info, so the peer rules compare real groups), a few percent
of nodes deviating (Xids, lost GPUs, degraded links, remaps, precursor and fail-slow outliers,
NFS slot saturation, a checkpoint load, nodes out of service) so that the alerts have work.
Every metric the rule files read is found by parsing their expressions (promql_parser); the
run warns about any the generator does not produce.

Then, one after the other on identical input (2 CPUs: never both at once), each backend with
the rule pack loaded:

* Prometheus (/usr/bin/prometheus) with rules/prometheus/*.yml;
* VictoriaMetrics single-node (/usr/bin/victoria-metrics), /usr/bin/vmalert evaluating
  rules/vmalert/*.yml against it and writing recordings back to it.

--input prewritten (the default): before the rules start, every sample from a few minutes
back (as far as the rules read a raw series) to past the end of the measurement is written by
remote write, so that while measured the backend only evaluates rules: no generator, no
scrape. --input scrape: the backend scrapes this script's HTTP server every
--scrape-interval throughout, as a server in service scrapes its nodes.

--tier local|fleet: the pack's tiers (docs/scaling.md) instead of the single-server pack. An
all or local run saves what the fleet tier reads (the local recordings at the end of the
first backend's measurement) to --fleet-inputs; a fleet run copies it to --nodes nodes (each
copy its own nodes and jobs) and writes it, one sample per evaluation interval.

After --warmup (long-window inputs are backfilled, see --backfill-days; so are recordings read
further back than the warm-up, such as the 3 hours of 5-minute medians each fail-slow baseline
reads: from an evaluation of every group recording them whose range starts after the rules
have settled, at the value recorded, every interval of the group recording them, up to just
before the rules' first evaluation; the warm-up is lengthened to let that and one more
evaluation happen: 645 s for the baselines run every 30 s, as by default here, 1,125 s with
--max-group-interval 300) every group
evaluation during --measure is recorded: Prometheus' /api/v1/rules (evaluationTime, the value
of prometheus_rule_group_last_duration_seconds, per group and rule) and vmalert's
vmalert_iteration_duration_seconds (per-evaluation durations from the summary's _sum/_count
deltas, and its own quantiles). Also: iterations missed, backend CPU and RSS, series in the
TSDB, the series each recorded metric adds, the alerts that fire. Groups with an interval
longer than --max-group-interval (the hourly remap trend and Xid history) run at the
evaluation interval here, or they would not be evaluated at all in a few minutes; the report
says which.

Results: a table on stdout and benchmarks/results/rules_eval.json.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import datetime
import gzip
import hashlib
import http.server
import json
import math
import os
import platform
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import promql_parser
import requests
import yaml
from common import (  # benchmarks/ is on sys.path when run as a script
    BenchError,
    ServerProcess,
    cpu_model,
    cpu_times,
    finish,
    free_port,
    git_commit,
    machine_load,
    percentile,
    source_fingerprint,
    summarize,
)
from prometheus_client.parser import text_string_to_metric_families

from exporter.config import NFS_OPERATIONS, NFS_TRANSPORT_SERIES, NFS_TRANSPORT_SERIES_ALL

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository, for fleet/
from fleet import remote_write

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results" / "rules_eval.json"
RULES = ROOT / "rules"
PROMETHEUS = "/usr/bin/prometheus"
PROMTOOL = "/usr/bin/promtool"
VICTORIA = "/usr/bin/victoria-metrics"
VMALERT = "/usr/bin/vmalert"
# Where the backends read the pack's files: always the same path, because both engines start each
# group at an offset in its interval hashed from its file's path and its name, and groups that
# start together share the CPUs; from a temporary directory they came out differently every run.
RULES_COPY = Path(tempfile.gettempdir()) / "rules-eval-rules"
TARGET_SECONDS = 1.0  # the target: every group under 1 s per evaluation
POLL_SECONDS = 5.0
ALONE_REPEATS = 3  # each group's rules run alone at the end, this many times
PREWRITE_SLICE = 900.0  # seconds of every series per pass
PREWRITE_LEAD = 360.0  # seconds of input before the rules start: full 5 min windows at the first evaluation
TAU = 2 * math.pi
_libc = ctypes.CDLL(None, use_errno=True)


def die_with_parent() -> None:
    """preexec_fn: the backend gets SIGKILL if this process dies, however it dies."""
    _libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG


# --- the rule pack -------------------------------------------------------------------------


@dataclass
class Group:
    file: str  # base name of the rule file
    name: str
    interval: float  # seconds, as in the pack
    rules: int
    records: int
    alerts: int


def _seconds(text: str | None, default: float) -> float:
    if not text:
        return default
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
    total = 0.0
    for number, unit in re.findall(r"(\d+)(ms|[smhdwy])", str(text)):
        total += int(number) * units[unit]
    return total


RULE_DIRS = {"prometheus": RULES / "prometheus", "vmalert": RULES / "vmalert"}  # --tier local|fleet: rendered


def rule_files(target: str) -> list[Path]:
    return sorted(RULE_DIRS[target].glob("*.yml"))


def render_tier(tier: str, dest: Path) -> dict[str, Path]:
    """The pack's tier per target, rendered by the CLI (the committed files are the `all` tier)."""
    dirs = {}
    for target in RULE_DIRS:
        dirs[target] = dest / tier / target
        run = subprocess.run([sys.executable, "-m", "exporter", "rules", "render", "--target", target,
                              "--tier", tier, "--out", str(dirs[target])], capture_output=True, text=True,
                             check=False, cwd=ROOT)
        if run.returncode:
            raise BenchError(f"rules render --tier {tier} failed: {run.stderr[-500:]}")
    return dirs


UNREADABLE: dict[str, str] = {}  # rule file -> why it could not be read (warned once)


def rule_groups(path: Path) -> list[dict[str, Any]]:
    """The groups of one rule file; [] (and a warning, once) when it is not valid YAML."""
    try:
        groups = (yaml.safe_load(path.read_text()) or {}).get("groups") or []
    except (OSError, yaml.YAMLError, AttributeError) as err:
        if path.name not in UNREADABLE:
            UNREADABLE[path.name] = " ".join(str(err).split())[:300]
            print(f"WARNING: {path} is not a readable rule file, left out: {UNREADABLE[path.name]}", flush=True)
        return []
    return groups


def rules_fingerprint() -> str:
    digest = hashlib.sha256()
    for target in ("prometheus", "vmalert"):
        for path in rule_files(target):
            digest.update(f"{target}/{path.name}".encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()



def file_key(path: str | Path) -> str:
    """A rule file's name without the target: vmalert's xid.vmalert.rules.yml is xid.rules.yml."""
    return Path(path).name.replace(".vmalert.", ".")

def load_groups(target: str, default_interval: float) -> list[Group]:
    groups = []
    for path in rule_files(target):
        for g in rule_groups(path):
            rules = g.get("rules") or []
            groups.append(Group(path.name, g["name"], _seconds(g.get("interval"), default_interval), len(rules),
                                sum("record" in r for r in rules), sum("alert" in r for r in rules)))
    return groups


def _children(node: Any) -> Iterator[Any]:
    for attr in ("lhs", "rhs", "expr", "param"):
        child = getattr(node, attr, None)
        if child is not None and not isinstance(child, int | float | str):
            yield child
    yield from getattr(node, "args", None) or []


def _name(selector: Any) -> str:
    if selector.name:
        return selector.name
    for matcher in selector.matchers.matchers:
        if matcher.name == "__name__":
            return matcher.value
    return ""


def _offset(node: Any) -> float:
    offset = getattr(node, "offset", None)
    return offset.total_seconds() if offset else 0.0


def selectors(node: Any, reach: float = 0.0) -> Iterator[tuple[str, float]]:
    """(metric name, how far back it is read in seconds: range + offset, 0 for a plain instant
    selector) of every selector in the expression."""
    if isinstance(node, promql_parser.MatrixSelector):
        vs = node.vector_selector
        yield _name(vs), reach + node.range.total_seconds() + _offset(vs) + _offset(node)
        return
    if isinstance(node, promql_parser.VectorSelector):
        yield _name(node), reach + _offset(node)
        return
    if isinstance(node, promql_parser.SubqueryExpr):
        reach += node.range.total_seconds() + _offset(node)
    for child in _children(node):
        yield from selectors(child, reach)


def rule_reads(target: str, default_interval: float, files: list[Path] | None = None
               ) -> tuple[dict[str, float], dict[str, float], dict[str, float], list[str]]:
    """Metric name -> farthest back any rule reads it (range + offset, s); recorded name -> the
    shortest interval of a group recording it (s, as load_groups reads it); recorded name -> the
    farthest back a rule recording it reads (s); expressions that fail to parse."""
    reads: dict[str, float] = {}
    recorded: dict[str, float] = {}
    recorded_from: dict[str, float] = {}
    bad = []
    for path in rule_files(target) if files is None else files:
        for g in rule_groups(path):
            interval = _seconds(g.get("interval"), default_interval)
            for rule in g.get("rules") or []:
                if "record" in rule:
                    recorded[rule["record"]] = min(recorded.get(rule["record"], interval), interval)
                try:
                    tree = promql_parser.parse(rule["expr"])
                except (ValueError, TypeError) as err:
                    bad.append(f"{path.name}: {rule.get('alert') or rule.get('record')}: {err}")
                    continue
                for name, window in selectors(tree):
                    reads[name] = max(reads.get(name, 0.0), window)
                    if "record" in rule:
                        recorded_from[rule["record"]] = max(recorded_from.get(rule["record"], 0.0), window)
    return reads, recorded, recorded_from, bad


def templates_with_queries(target: str) -> list[str]:
    """Alerts whose annotations run PromQL (`query`): evaluated for every active alert, every evaluation."""
    out = []
    for path in rule_files(target):
        for g in rule_groups(path):
            for rule in g.get("rules") or []:
                text = " ".join(str(v) for v in (rule.get("annotations") or {}).values())
                n = len(re.findall(r"\|\s*query\b", text))
                if n:
                    out.append(f"{g['name']}/{rule.get('alert')}: {n} template queries per active alert")
    return out


def check_argv(target: str, path: Path) -> list[str]:
    """The backend's own check of one rule file."""
    if target == "prometheus":
        return [PROMTOOL, "check", "rules", str(path)]
    return [VMALERT, "-dryRun", f"-rule={path}"]


def copy_rules(target: str, dest: Path, max_interval: float, eval_interval: float,
               ) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """The pack's files into dest; groups slower than max_interval run every eval_interval here.
    A file the backend's own check rejects (another engineer may be half-way through it) is left
    out: (groups whose interval changed, rejected file -> why)."""
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    changed, rejected = [], {}
    for path in rule_files(target):
        data = {"groups": rule_groups(path)}
        if not data["groups"]:
            rejected[path.name] = UNREADABLE.get(path.name, "no groups")
            continue
        for g in data["groups"]:
            interval = _seconds(g.get("interval"), eval_interval)
            if interval > max_interval:
                g["interval"] = f"{int(eval_interval)}s"
                changed.append({"file": path.name, "group": g["name"], "pack_interval_s": interval,
                                "here_interval_s": eval_interval})
        copy = dest / path.name
        copy.write_text(yaml.safe_dump(data, sort_keys=False, width=10_000, allow_unicode=True))
        check = subprocess.run(check_argv(target, copy), capture_output=True, text=True, check=False, timeout=60)
        if check.returncode:
            why = (check.stderr or check.stdout).strip().splitlines()
            rejected[path.name] = next((line for line in reversed(why) if "rror" in line or "fatal" in line),
                                       why[-1] if why else f"exit {check.returncode}")[-400:]
            copy.unlink()
            print(f"  WARNING: {target} rejects {path.name}, left out: {rejected[path.name]}", flush=True)
    return changed, rejected


# --- the synthetic fleet -------------------------------------------------------------------

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
COLLECTORS = ("gpu", "nfs", "xid", "staging", "storage_network", "gpu_processes")
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

    def _mount(self, base: str, mountpoint: str, export: str, addr: str, dev: str, nconnect: int, m: int,
               roles: set[str], precursor: set[str], jitter: float) -> None:
        rng = self.rng
        ml = f'{base},mountpoint="{mountpoint}",export="{export}"'
        self.const("gpunode_nfs_mount_info", "gauge",
                   f'{{{ml},protocol="tcp",server_address="{addr}",device="{dev}"}}', 1)
        ckpt = m == 0
        saturated = ckpt and ("nfs_slots" in roles or "nfs_paradox" in roles)
        loading = ckpt and "checkpoint_load" in roles
        total_ops = 0.0
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
                    text = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()))
                    self.const(name, "gauge", f"{{{text}}}", value)
        self._finish()


def snapshot_inputs(backend: Backend, names: set[str], nodes: int, path: Path) -> int:
    """What the fleet tier reads, as the backend holds it now: the input of a later --tier fleet run."""
    series = {name: [(r["metric"], float(r["value"][1])) for r in backend.query(f'{{__name__="{name}"}}')]
              for name in sorted(names)}
    with gzip.open(path, "wt") as f:
        json.dump({"nodes": nodes, "taken": time.time(), "backend": backend.key, "series": series}, f)
    return sum(len(v) for v in series.values())


def _labels(text: str) -> bytes:
    """`name{k="v",...}` -> remote write labels (the generator's values need no unescaping)."""
    name, _, rest = text.partition("{")
    return remote_write.labels_bytes([("__name__", name), *re.findall(r'(\w+)="([^"]*)"', rest)])


class Generator:
    """The fleet over HTTP: GET /metrics, and POST anything (vmalert's notifier) is counted and dropped."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.lock = threading.Lock()
        self.renders: list[tuple[float, float, int]] = []  # (unix time, seconds to render, bytes)
        self.posts = 0
        self._cache: tuple[float, bytes] = (0.0, b"")
        gen = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                if self.path.split("?")[0] != "/metrics":
                    self.send_error(404)
                    return
                body = gen.body()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                with contextlib.suppress(OSError):
                    self.wfile.write(body)

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                gen.posts += 1
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *_args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def port(self) -> int:
        return self.server.server_address[1]

    def body(self) -> bytes:
        with self.lock:
            now = time.time()
            if now - self._cache[0] < 1.0:
                return self._cache[1]
            start = time.perf_counter()
            body = self.fleet.render(now)
            self.renders.append((now, time.perf_counter() - start, len(body)))
            self._cache = (now, body)
            return body

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# --- backends ------------------------------------------------------------------------------


def parse_metrics(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def wait_http(url: str, server: ServerProcess, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        server.check_running()
        with contextlib.suppress(requests.RequestException):
            if requests.get(url, timeout=2).ok:
                return
        time.sleep(0.5)
    raise BenchError(f"{server.label}: {url} not ready after {timeout:g} s")


@dataclass
class Evaluations:
    """Per group: each evaluation's duration (s) seen during the measurement; per rule likewise."""

    groups: dict[str, list[float]] = field(default_factory=dict)
    starts: dict[str, list[float]] = field(default_factory=dict)  # unix time each evaluation began
    rules: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    last_seen: dict[str, Any] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    multi: int = 0  # polls that saw more than one vmalert iteration of a group at once (mean recorded)


def record_rules(evals: Evaluations, groups: list[dict[str, Any]], record: bool,
                 ) -> Iterator[tuple[str, dict[str, Any]]]:
    """From an /api/v1/rules answer (Prometheus' or vmalert's): each group evaluated since the last
    call, after its rules' evaluation times (when recording) and errors are noted."""
    for g in groups:
        key = f"{file_key(g['file'])}/{g['name']}"
        stamp = g.get("lastEvaluation")
        if not stamp or stamp.startswith("0001-") or evals.last_seen.get(key) == stamp:
            continue
        evals.last_seen[key] = stamp
        for rule in g["rules"]:
            if rule.get("lastError"):
                evals.errors[f"{key}/{rule.get('name')}"] = rule["lastError"]
        if not record:
            continue
        evals.starts.setdefault(key, []).append(datetime.datetime.fromisoformat(stamp).timestamp())
        per_rule = evals.rules.setdefault(key, {})
        for i, rule in enumerate(g["rules"]):
            per_rule.setdefault(f"{i:02d} {rule.get('name')}", []).append(rule.get("evaluationTime", 0.0))
        yield key, g


class Backend:
    key = ""
    label = ""

    def __init__(self, tmp: Path, gen: Generator, args: argparse.Namespace) -> None:
        self.tmp, self.gen, self.args = tmp, gen, args
        self.procs: list[ServerProcess] = []
        self.evals = Evaluations()
        self.started = 0.0

    @property
    def query_url(self) -> str:
        raise NotImplementedError

    def stop_rules(self) -> None:
        raise NotImplementedError

    def query(self, expr: str) -> list[dict[str, Any]]:
        r = requests.get(f"{self.query_url}/api/v1/query", params={"query": expr}, timeout=120)
        data = r.json()
        if data.get("status") != "success":
            raise BenchError(f"{self.label}: query {expr!r} failed: {data.get('error') or r.text[:300]}")
        return data["data"]["result"]

    def stop(self) -> None:
        for p in reversed(self.procs):
            p.stop()

    def cpu(self) -> dict[str, float]:
        return {p.key: p.cpu_seconds() for p in self.procs}

    def memory(self) -> dict[str, dict[str, int]]:
        return {p.key: p.memory_kib() for p in self.procs}


def scrape_config(gen: Generator, args: argparse.Namespace, extra: str = "") -> str:
    """Prometheus' config; extra (its rule_files and evaluation_interval) is left out for VictoriaMetrics."""
    return (f"global:\n  scrape_interval: {args.scrape_interval}s\n  scrape_timeout: {args.scrape_interval - 1}s\n"
            f"{extra}"
            "scrape_configs:\n  - job_name: synthetic\n    honor_labels: true\n"
            f"    static_configs:\n      - targets: ['127.0.0.1:{gen.port}']\n")


class PrometheusBackend(Backend):
    key = "prometheus"
    label = "Prometheus"

    def start(self) -> None:
        self.rules = RULES_COPY / "prometheus"
        self.overridden, self.rejected = copy_rules("prometheus", self.rules, self.args.max_group_interval,
                                                    self.args.eval_interval)
        self.config = self.tmp / "prometheus.yml"
        self.config.write_text(self._config(rules=False))
        self.data = self.tmp / "prometheus-data"
        port = free_port()
        p = ServerProcess("prometheus", f"Prometheus ({PROMETHEUS})", [
            PROMETHEUS, f"--config.file={self.config}", f"--storage.tsdb.path={self.data}",
            f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=90d",
            "--web.enable-remote-write-receiver", "--web.enable-lifecycle"],
            port, self.tmp / "prometheus.log")
        self.procs.append(p)
        p.start(die_with_parent)
        wait_http(f"http://127.0.0.1:{port}/-/ready", p)
        self.url = f"http://127.0.0.1:{port}"
        self.write_url = f"{self.url}/api/v1/write"

    def _config(self, rules: bool) -> str:
        extra = (f"  evaluation_interval: {self.args.eval_interval}s\nrule_files:\n  - {self.rules}/*.yml\n"
                 if rules else "")
        if self.args.input == "scrape":
            return scrape_config(self.gen, self.args, extra)
        return "global:\n" + (extra or "  evaluation_interval: 1h\n")

    def load_rules(self) -> None:
        self.config.write_text(self._config(rules=True))
        requests.post(f"{self.url}/-/reload", timeout=60).raise_for_status()
        self.started = time.time()
        groups = requests.get(f"{self.url}/api/v1/rules", timeout=30).json()["data"]["groups"]
        if not groups:
            raise BenchError("Prometheus loaded no rule groups on reload")

    @property
    def query_url(self) -> str:
        return self.url

    def stop_rules(self) -> None:
        self.config.write_text(self._config(rules=False))
        requests.post(f"{self.url}/-/reload", timeout=60).raise_for_status()

    def poll(self, record: bool) -> None:
        groups = requests.get(f"{self.url}/api/v1/rules", timeout=30).json()["data"]["groups"]
        for key, g in record_rules(self.evals, groups, record):
            self.evals.groups.setdefault(key, []).append(g["evaluationTime"])

    def counters(self) -> dict[str, dict[str, float]]:
        m = parse_metrics(requests.get(f"{self.url}/metrics", timeout=30).text)
        out: dict[str, dict[str, float]] = {}
        for name, short in (("prometheus_rule_group_iterations_missed_total", "missed"),
                            ("prometheus_rule_group_iterations_total", "iterations"),
                            ("prometheus_rule_evaluation_failures_total", "failures")):
            for labels, value in m.get(name, []):
                file, _, group = labels["rule_group"].rpartition(";")
                out.setdefault(f"{file_key(file)}/{group}", {})[short] = value
        out["_tsdb"] = {"head_series": m["prometheus_tsdb_head_series"][0][1]}
        return out

    def backfill(self, series: dict[str, list[tuple[dict[str, str], float]]], start: float, end: float,
                 step: float) -> int:
        """OpenMetrics file -> promtool tsdb create-blocks-from openmetrics into the data directory;
        Prometheus loads new blocks within a minute."""
        om = self.tmp / "backfill.om"
        points = write_backfill(om, series, start, end, step, ms=False)
        run = subprocess.run([PROMTOOL, "tsdb", "create-blocks-from", "openmetrics", "--max-block-duration=1440h",
                              str(om), str(self.data)], capture_output=True, text=True, check=False)
        om.unlink()
        if run.returncode:
            raise BenchError(f"promtool create-blocks-from openmetrics failed: {run.stderr[-1000:]}")
        return points


class VictoriaBackend(Backend):
    key = "victoriametrics"
    label = "VictoriaMetrics + vmalert"

    def start(self) -> None:
        self.rules = RULES_COPY / "vmalert"
        self.overridden, self.rejected = copy_rules("vmalert", self.rules, self.args.max_group_interval,
                                                    self.args.eval_interval)
        scrape = []
        if self.args.input == "scrape":
            config = self.tmp / "vm-scrape.yml"
            config.write_text(scrape_config(self.gen, self.args).replace(
                "    honor_labels: true\n", "    honor_labels: true\n    stream_parse: true\n"))
            scrape = [f"-promscrape.config={config}", "-promscrape.maxScrapeSize=2GiB"]
        port = free_port()
        vm = ServerProcess("victoria-metrics", f"VictoriaMetrics ({VICTORIA})", [
            VICTORIA, f"-storageDataPath={self.tmp / 'vm-data'}", f"-httpListenAddr=127.0.0.1:{port}",
            # the report counts every recorded series (over 300,000 at 1,000 reference nodes)
            *scrape, "-retentionPeriod=90d", "-search.maxUniqueTimeseries=5000000"],
            port, self.tmp / "victoria-metrics.log")
        self.procs.append(vm)
        vm.start(die_with_parent)
        self.url = f"http://127.0.0.1:{port}"
        self.write_url = f"{self.url}/api/v1/write"
        wait_http(f"{self.url}/health", vm)

    def load_rules(self) -> None:
        requests.get(f"{self.url}/internal/force_flush", timeout=60)  # the input searchable before the first rule
        alert_port = free_port()
        va = ServerProcess("vmalert", f"vmalert ({VMALERT})", [
            VMALERT, f"-rule={self.rules}/*.yml", f"-datasource.url={self.url}", f"-remoteWrite.url={self.url}",
            f"-notifier.url=http://127.0.0.1:{self.gen.port}", f"-evaluationInterval={self.args.eval_interval}s",
            f"-httpListenAddr=127.0.0.1:{alert_port}"], alert_port, self.tmp / "vmalert.log")
        self.procs.append(va)
        va.start(die_with_parent)
        self.started = time.time()
        self.alert_url = f"http://127.0.0.1:{alert_port}"
        wait_http(f"{self.alert_url}/health", va)
        self._prev: dict[str, tuple[float, float]] = {}

    @property
    def query_url(self) -> str:
        return self.url

    def stop_rules(self) -> None:
        self.procs[-1].stop()  # vmalert

    def _vmalert_metrics(self) -> dict[str, list[tuple[dict[str, str], float]]]:
        return parse_metrics(requests.get(f"{self.alert_url}/metrics", timeout=30).text)

    def poll(self, record: bool) -> None:
        m = self._vmalert_metrics()
        sums = {f"{file_key(lb['file'])}/{lb['group']}": v
                for lb, v in m.get("vmalert_iteration_duration_seconds_sum", [])}
        for labels, count in m.get("vmalert_iteration_duration_seconds_count", []):
            key = f"{file_key(labels['file'])}/{labels['group']}"
            prev = self._prev.get(key)
            self._prev[key] = (count, sums.get(key, 0.0))
            if not record or prev is None or count <= prev[0]:
                continue
            n = count - prev[0]
            self.evals.multi += n > 1
            self.evals.groups.setdefault(key, []).append((sums.get(key, 0.0) - prev[1]) / n)
        # Per rule: vmalert's /api/v1/rules (its group duration comes from the summary above).
        groups = requests.get(f"{self.alert_url}/api/v1/rules", timeout=30).json()["data"]["groups"]
        for _ in record_rules(self.evals, groups, record):
            pass

    def counters(self) -> dict[str, dict[str, float]]:
        m = self._vmalert_metrics()
        out: dict[str, dict[str, float]] = {}
        for name, short in (("vmalert_iteration_missed_total", "missed"), ("vmalert_iteration_total", "iterations")):
            for labels, value in m.get(name, []):
                out.setdefault(f"{file_key(labels['file'])}/{labels['group']}", {})[short] = value
        for labels, value in m.get("vmalert_iteration_duration_seconds", []):
            key = f"{file_key(labels['file'])}/{labels['group']}"
            out.setdefault(key, {})[f"summary_q{labels['quantile']}"] = value
        with contextlib.suppress(requests.RequestException, ValueError, KeyError):
            n = requests.get(f"{self.url}/api/v1/series/count", timeout=60).json()["data"][0]
            out["_tsdb"] = {"series": n}
        return out

    def backfill(self, series: dict[str, list[tuple[dict[str, str], float]]], start: float, end: float,
                 step: float) -> int:
        """/api/v1/import/prometheus (text with timestamps), then the rollup cache reset."""
        path = self.tmp / "backfill.prom"
        points = write_backfill(path, series, start, end, step, ms=True)
        with path.open("rb") as f:
            r = requests.post(f"{self.url}/api/v1/import/prometheus", data=f, timeout=600)
        path.unlink()
        if not r.ok:
            raise BenchError(f"VictoriaMetrics import failed: {r.status_code} {r.text[:300]}")
        requests.get(f"{self.url}/internal/force_flush", timeout=60)
        requests.get(f"{self.url}/internal/resetRollupResultCache", timeout=60)
        return points


def _escape(value: str) -> str:
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
                text = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()) if k != "__name__")
                prefix = f"{name}{{{text}}} {value!r} "
                f.writelines(f"{prefix}{t}\n" for t in stamps)
                points += len(stamps)
        if not ms:
            f.write("# EOF\n")
    return points


# --- one backend's run ---------------------------------------------------------------------


# From the first values to the ratios to the peers: a chain of peer rules, on vmalert a step per
# evaluation (value, in_peer_group, median, count, ratio: five at 30 s) and a margin.
RULES_SETTLE_SECONDS = 180.0
# A recording rule that reads further back than this reads the backfilled history, not the
# rules' first minutes (a baseline over 3 hours of medians).
RECENT_READ_SECONDS = 900.0


def recorded_backfill_after(plan: dict[str, dict[str, Any]]) -> float:
    """Seconds after the rules start when every recorded-history group has evaluated past the
    rules' first minutes: the settling, how far back its rule reads (if recent), and one interval
    as run here (at least a minute) for it to run; plus 15 s for the writes to be readable."""
    return 15 + max([RULES_SETTLE_SECONDS + (p["reads_s"] if p["reads_s"] <= RECENT_READ_SECONDS else 0.0)
                     + max(60.0, p["run_step_s"]) for p in plan.values() if p["tier"] == "recorded"], default=0.0)


def warmup_for_recorded_history(reads: dict[str, float], recorded: dict[str, float],
                                recorded_from: dict[str, float], args: argparse.Namespace) -> float:
    """The warm-up that lets the recorded history be written and read by one more evaluation of
    every group: at least --warmup. (Which recordings need history depends on the warm-up.)"""
    warmup = args.warmup
    for _ in range(5):
        plan = backfill_plan(reads, recorded, argparse.Namespace(**{**vars(args), "warmup": warmup}), recorded_from)
        steps = [max(60.0, p["run_step_s"]) for p in plan.values() if p["tier"] == "recorded"]
        needed = max(args.warmup, math.ceil(recorded_backfill_after(plan) + max(steps) + 30) if steps else 0)
        if needed == warmup:
            break
        warmup = needed
    return float(warmup)


def backfill_plan(reads: dict[str, float], recorded: dict[str, float], args: argparse.Namespace,
                  recorded_from: dict[str, float]) -> dict[str, dict[str, Any]]:
    """What history a short run lacks, per metric: "long" (read over >= 1 day, raw or recorded):
    hourly points up to --backfill-days; "raw" (a scraped metric read further back than the
    warm-up, < 1 day): points every scrape interval over that reach plus the 5 min lookback;
    "recorded" (a recording read further back than the warm-up, < 1 day: the fail-slow
    baseline's 3 hours of medians): points every interval of the group recording it, over that reach
    ("reads_s": how far back its own rule reads, from recorded_from)."""
    plan = {}
    for name, reach in reads.items():
        if not name or name in ("ALERTS", "ALERTS_FOR_STATE"):
            continue
        if reach >= 86400 and args.backfill_days > 0:
            plan[name] = {"tier": "long", "reach_s": reach, "step_s": 3600.0,
                          "span_s": min(reach, args.backfill_days * 86400) + 3600}
        elif args.warmup * 0.8 < reach < 86400:
            step = recorded[name] if name in recorded else float(args.scrape_interval)
            plan[name] = {"tier": "recorded" if name in recorded else "raw", "reach_s": reach, "step_s": step,
                          "span_s": reach + 300}
            if name in recorded:  # groups slower than --max-group-interval run every --eval-interval here
                plan[name]["reads_s"] = recorded_from.get(name, 0.0)
                plan[name]["run_step_s"] = step if step <= args.max_group_interval else args.eval_interval
    return plan


def _series_key(labels: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in labels.items() if k != "__name__"))


def do_backfill(backend: Backend, plan: dict[str, dict[str, Any]], tier: str, end: float,
                written: dict[str, set[tuple[tuple[str, str], ...]]] | None = None) -> dict[str, Any]:
    """Each planned metric's series as the backend holds them now (the smallest value seen in the
    last 10 min: a counter's earliest, so the history does not look like a reset; of a recording,
    the series of each recording group's latest evaluation, as a node in service has one basis
    for hours), up to end. With written (name -> the label sets written so far, updated here):
    only the series not written yet."""
    out: dict[str, Any] = {}
    start = time.perf_counter()
    for name, p in plan.items():
        if p["tier"] != tier:
            continue
        selector = f'{{__name__="{name}"}}'
        # A recording's current series: each group that records it (a group per proxy) evaluated
        # within one interval of the newest sample; a series its rules stopped is a step older.
        query = (f"{selector} and timestamp({selector}) > scalar(max(timestamp({selector}))) - {p['step_s']:g}"
                 if tier == "recorded" else f"min_over_time({selector}[10m])")
        found = [(r["metric"], float(r["value"][1])) for r in backend.query(query)]
        if written is not None:  # by labels without the name: the writer names every series itself
            seen = written.setdefault(name, set())
            found = [(labels, value) for labels, value in found if _series_key(labels) not in seen]
            seen.update(_series_key(labels) for labels, _ in found)
        points = backend.backfill({name: found}, end - p["span_s"], end, p["step_s"]) if found else 0
        out[name] = {**p, "series": len(found), "samples": points}
    out["_seconds"] = round(time.perf_counter() - start, 1)
    return out


def prewrite(backend: Backend, fleet: Fleet, plan: dict[str, dict[str, Any]],
             args: argparse.Namespace) -> dict[str, Any]:
    """Every series of the fleet, every scrape interval, from its lead before now (the 5 min
    windows, or the raw tier's reach) to past the end of the measurement, by remote write: the
    backend then only evaluates rules while it is measured. Samples after an evaluation's time
    are never read by it."""
    began = time.time()
    step = float(args.eval_interval if args.tier == "fleet" else args.scrape_interval)  # recordings: per evaluation
    until = began + args.write_allowance + args.warmup + args.measure + 60
    lead = {name: max(PREWRITE_LEAD, p["span_s"]) for name, p in plan.items() if p["tier"] == "raw"}
    fleet.epoch = began - max([PREWRITE_LEAD, *lead.values()])  # counters start at their base here
    series = samples = 0
    session = requests.Session()
    first = {name: math.ceil((began - lead.get(name, PREWRITE_LEAD)) / step) * step for name in fleet.families}
    # In time order, a slice of every series at a time: Prometheus' head takes no sample older
    # than an hour before the newest it holds.
    slices = np.arange(min(first.values()), until, PREWRITE_SLICE)
    seen: set[str] = set()
    for since in slices:
        def encoded(since: float = since) -> Iterator[bytes]:
            nonlocal series, samples
            for fam in fleet.families.values():
                times = np.arange(max(first[fam.name], since), min(since + PREWRITE_SLICE, until), step)
                if not times.size:
                    continue
                labels, values = fleet.matrix(fam, times)
                if fam.name not in seen:
                    seen.add(fam.name)
                    series += len(labels)
                samples += values.size
                yield from remote_write.encode(labels, values, np.round(times * 1000))

        remote_write.send(session, backend.write_url, encoded())
    seconds = time.time() - began
    if seconds > args.write_allowance:
        raise BenchError(f"{backend.label}: writing the input took {seconds:.0f} s, more than --write-allowance "
                         f"{args.write_allowance:g} s: the input would end before the measurement does")
    print(f"  {backend.label}: wrote {series:,} series, {samples:,} samples in {seconds:.0f} s", flush=True)
    return {"series": series, "samples": samples, "seconds": round(seconds, 1), "until_s_after_write": until - began,
            "lead_s": {"default": PREWRITE_LEAD, **lead}}


def alone(backend: Backend, repeats: int = ALONE_REPEATS) -> dict[str, dict[str, Any]]:
    """Each group's rules as instant queries, with the rules stopped and nothing else running: what
    a group costs on its own, beside what its evaluations took among all the others. work_s: one
    after another (the sum); p50_s: as the engine runs them, side by side where the group has a
    `concurrency` (vmalert), else the same. (The queries of alert templates are not in it; an HTTP
    query also pays for its JSON.)"""
    backend.stop_rules()
    time.sleep(2)
    at = time.time() - 5  # the recordings of the last evaluations are there
    session = requests.Session()

    def query(rule: dict[str, Any], client: Any = requests) -> int:
        r = client.get(f"{backend.query_url}/api/v1/query", timeout=120,
                       params={"query": rule["expr"], "time": f"{at:.3f}", "step": "5m"})
        return len(r.json().get("data", {}).get("result") or []) if r.ok else 0

    out = {}
    for path in sorted(backend.rules.glob("*.yml")):
        for g in rule_groups(path):
            rules, width = g.get("rules") or [], int(g.get("concurrency") or 1)
            totals, walls, series = [], [], 0
            for _ in range(repeats):
                total = 0.0
                for rule in rules:
                    begin = time.perf_counter()
                    series += query(rule, session)
                    total += time.perf_counter() - begin
                totals.append(total)
                if width > 1:
                    begin = time.perf_counter()
                    with ThreadPoolExecutor(width) as pool:
                        list(pool.map(query, rules))
                    walls.append(time.perf_counter() - begin)
            out[f"{file_key(path)}/{g['name']}"] = {"p50_s": percentile(walls or totals, 0.5),
                                                   "work_s": percentile(totals, 0.5), "series": series // repeats}
    return out


def run_backend(backend: Backend, gen: Generator, reads: dict[str, float], recorded: dict[str, float],
                recorded_from: dict[str, float],
                args: argparse.Namespace) -> dict[str, Any]:
    renders_before = len(gen.renders)
    posts_before = gen.posts
    plan = backfill_plan(reads, recorded, args, recorded_from) if args.backfill else {}
    backend.start()
    out: dict[str, Any] = {"label": backend.label, "input": args.input,
                           "groups_interval_overridden": backend.overridden, "rule_files_rejected": backend.rejected,
                           "executables": {p.key: p.exe() for p in backend.procs}}
    if args.input == "prewritten":
        out["prewritten"] = prewrite(backend, gen.fleet, plan, args)
        history_starts = gen.fleet.epoch
    else:
        gen.fleet.epoch = time.time()  # every backend sees the same values, relative to its start
    backend.load_rules()
    out["executables"] = {p.key: p.exe() for p in backend.procs}
    t0 = backend.started
    if args.input == "scrape":
        history_starts = t0 - max((p["span_s"] for p in plan.values() if p["tier"] == "raw"), default=0.0)
    print(f"  {backend.label}: rules loaded; warm-up {args.warmup:g} s", flush=True)
    backfill: dict[str, Any] = {"plan": plan}
    # Raw history first (a rule that reads it may only then record what the long tier needs; the
    # prewritten input has it), the long tier once Prometheus has loaded the first blocks (it
    # looks every minute). Recorded history once the rules have recorded a value to hold.
    todo, retried, written = dict(plan), False, {}
    # Recordings from an evaluation of every group recording them whose range starts after the
    # rules have settled (RULES_SETTLE_SECONDS), so none holds the rules' first minutes (e.g. a
    # fail-slow median of basis="self" from before the peers' ratios existed: a second baseline
    # per node that no node in a job has); then every 30 s the series that have appeared since
    # (vmalert's groups, a baseline once it has its history), until the measurement.
    recorded_due = t0 + recorded_backfill_after(plan)
    due = {"raw": t0 + 2 * args.scrape_interval + 15 if args.input == "scrape" else math.inf,
           "long": t0 + 75 if args.input == "prewritten" else math.inf, "recorded": recorded_due}
    while time.time() < t0 + args.warmup:
        for p in backend.procs:
            p.check_running()
        backend.poll(record=False)
        for tier in ("raw", "long", "recorded"):
            if time.time() < due[tier]:
                continue
            due[tier] = math.inf
            if any(p["tier"] == tier for p in todo.values()):
                # Before what the backend holds, so no series has two samples at one time: the raw
                # input's start, or the rules' first evaluation.
                end = {"raw": t0 - 60, "long": history_starts - 60, "recorded": t0 - 1}[tier]
                done = do_backfill(backend, todo, tier, end, written if tier == "recorded" else None)
                first = tier not in backfill
                found = {n: v["series"] for n, v in done.items() if not n.startswith("_")}
                backfill.setdefault(tier, {}).update({n: v for n, v in done.items() if first or found.get(n)})
                if first or any(found.values()):  # not every retry that finds nothing
                    print(f"  {backend.label}: backfilled ({tier}) {found} in {done['_seconds']} s", flush=True)
                # A long-tier metric vmalert has not written yet: once more, a minute later.
                todo = {n: p for n, p in todo.items() if p["tier"] != tier or tier == "recorded" or found.get(n) == 0}
                if tier == "long" and any(p["tier"] == "long" for p in todo.values()) and not retried:
                    retried, due["long"] = True, time.time() + 60
                if tier == "recorded" and time.time() + 30 < t0 + args.warmup:
                    due["recorded"] = time.time() + 30
            if tier == "raw":
                due["long"] = time.time() + 75
        time.sleep(POLL_SECONDS)
    # Not tried, or tried in vain (a baseline that is not there yet).
    missed = sorted(name for name, p in todo.items()
                    if (not written.get(name) if p["tier"] == "recorded" else due[p["tier"]] != math.inf))
    backfill["recorded_series_written"] = {name: len(labels) for name, labels in written.items()}
    if missed:
        print(f"  {backend.label}: WARNING: no history backfilled for {', '.join(missed)} within the warm-up",
              flush=True)
    backfill["not_done"] = missed

    # Did the history arrive? The samples of each backfilled metric within its reach, now.
    visible = {}
    for name, p in plan.items():
        with contextlib.suppress(BenchError, requests.RequestException, IndexError, KeyError):
            r = backend.query(f'sum(count_over_time({{__name__="{name}"}}[{int(p["span_s"] + 7200)}s]))')
            visible[name] = float(r[0]["value"][1]) if r else 0.0
    backfill["samples_visible_at_measure_start"] = visible

    print(f"  {backend.label}: measuring {args.measure:g} s", flush=True)
    counters0, cpu0, wall0 = backend.counters(), backend.cpu(), time.monotonic()
    backend.poll(record=False)
    end = time.monotonic() + args.measure
    while time.monotonic() < end:
        for p in backend.procs:
            p.check_running()
        backend.poll(record=True)
        time.sleep(POLL_SECONDS)
    backend.poll(record=True)
    counters1, cpu1, wall1 = backend.counters(), backend.cpu(), time.monotonic()
    out["cpu_cores"] = {k: round((cpu1[k] - cpu0[k]) / (wall1 - wall0), 3) for k in cpu1}
    out["memory_mib"] = {k: {kk: round(v / 1024, 1) for kk, v in mem.items()} for k, mem in backend.memory().items()}
    out["counters_start"], out["counters_end"] = counters0, counters1
    out["tsdb"] = counters1.get("_tsdb", {})

    intervals = {f"{file_key(path)}/{g['name']}": _seconds(g.get("interval"), args.eval_interval)
                 for path in backend.rules.glob("*.yml") for g in rule_groups(path)}  # as run here
    groups = {}
    for key, durations in backend.evals.groups.items():
        c0, c1 = counters0.get(key, {}), counters1.get(key, {})
        groups[key] = {
            "evaluations": len(durations), "last_s": durations[-1], "p50_s": percentile(durations, 0.5),
            "max_s": max(durations), "summary_ms": summarize(durations), "durations_s": durations,
            "iterations_missed_during_measure": c1.get("missed", 0) - c0.get("missed", 0),
            "iterations_missed_total": c1.get("missed", 0),
            "evaluation_failures_during_measure": c1.get("failures", 0) - c0.get("failures", 0),
            # when in its interval the group starts (both engines spread groups over it, Prometheus
            # by a hash of file and name): groups that start together share the CPUs
            "start_phase_s": round(percentile([t % intervals[key] for t in backend.evals.starts[key]], 0.5), 2)
            if backend.evals.starts.get(key) else None,
            **{k: v for k, v in c1.items() if k.startswith("summary_q")}}
        if key in backend.evals.rules:
            per_rule = {name: {"p50_s": percentile(d, 0.5), "max_s": max(d)}
                        for name, d in backend.evals.rules[key].items() if d}
            groups[key]["rules_slowest"] = dict(sorted(per_rule.items(), key=lambda kv: -kv[1]["p50_s"])[:5])
    for key, c in counters1.items():  # groups that never evaluated during the measurement
        if not key.startswith("_") and key not in groups:
            groups[key] = {"evaluations": 0, "iterations_missed_total": c.get("missed", 0)}
    out["groups"] = dict(sorted(groups.items()))
    out["rule_errors"] = backend.evals.errors
    out["vmalert_polls_with_several_iterations"] = backend.evals.multi

    if args.tier != "fleet" and backend.key == args.snapshot_from:
        n = snapshot_inputs(backend, args.fleet_input_names, args.nodes, args.fleet_inputs)
        print(f"  {backend.label}: the fleet tier's input ({n:,} series) saved to {args.fleet_inputs}", flush=True)
    # What the input and the rules produced.
    scraped = backend.query('scrape_samples_scraped{job="synthetic"}')
    out["samples_per_scrape"] = (float(scraped[0]["value"][1]) if scraped
                                 else out.get("prewritten", {}).get("series"))
    recorded = backend.query('count by (__name__) ({__name__=~"gpunode:.+"})')
    out["recorded_series"] = dict(sorted((r["metric"]["__name__"], int(float(r["value"][1]))) for r in recorded))
    alerts = requests.get(f"{getattr(backend, 'alert_url', backend.url)}/api/v1/alerts", timeout=60).json()
    states: dict[str, dict[str, int]] = {}
    for a in alerts["data"]["alerts"] or []:  # vmalert: null when none
        name = a["labels"]["alertname"]
        states.setdefault(name, {}).setdefault(a["state"], 0)
        states[name][a["state"]] += 1
    out["alerts"] = dict(sorted(states.items()))
    out["notifications_received"] = gen.posts - posts_before
    renders = [r for r in gen.renders[renders_before:] if r[0] >= t0]
    out["generator"] = {"scrapes_served": len(renders),
                        "render_s": summarize([r[1] for r in renders]) if renders else {},
                        "body_mib": round(renders[-1][2] / 2**20, 1) if renders else None}
    out["backfill"] = backfill
    print(f"  {backend.label}: each group alone ({ALONE_REPEATS} times)", flush=True)
    out["alone"] = alone(backend)
    for key, a in out["alone"].items():
        if key in out["groups"]:
            out["groups"][key]["alone_p50_s"] = a["p50_s"]
            out["groups"][key]["alone_work_s"] = a["work_s"]
    return out


# --- report --------------------------------------------------------------------------------


def machine_info() -> dict[str, Any]:
    def version(argv: list[str]) -> str:
        with contextlib.suppress(OSError):
            run = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=30)
            text = (run.stdout or run.stderr).strip()
            return text.splitlines()[0] if text else ""
        return ""

    dpkg = {}
    for pkg in ("prometheus", "victoria-metrics"):
        dpkg[pkg] = version(["dpkg-query", "-W", "-f=${Version}", pkg])
    mem = Path("/proc/meminfo").read_text().split("\n", 1)[0].split()[1]
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "python_version": platform.python_version(),
        "nproc": os.cpu_count(),
        "nproc_usable": len(os.sched_getaffinity(0)),
        "cpu_model": cpu_model(),
        "mem_total_gib": round(int(mem) / 2**20, 1),
        "kernel": platform.release(),
        "prometheus_version": version([PROMETHEUS, "--version"]),
        "dpkg_versions": dpkg,
        "loadavg_start": os.getloadavg(),
    }


def short(key: str) -> str:
    return key.replace(".rules.yml", "")


def table(results: dict[str, Any]) -> list[str]:
    backends = results["backends"]
    keys = sorted({k for b in backends.values() for k in b["groups"]})
    over = {o["group"]: o for b in backends.values() for o in b["groups_interval_overridden"]}
    head = "| group (file/name) | rules | interval |"
    line = "|---|---:|---|"
    for b in backends.values():
        head += f" {b['label']}: last / p50 / max ms (evals) | alone ms (one by one) | start s | missed |"
        line += "---:|---:|---:|---:|"
    rows = [head, line]
    for key in keys:
        g = results["groups"].get(key, {})
        name = key.rsplit("/", 1)[1]
        interval = f"{g.get('interval_s', 0):g} s"
        if name in over:
            interval = f"{over[name]['pack_interval_s']:g} s in the pack, {over[name]['here_interval_s']:g} s here"
        row = f"| {short(key)} | {g.get('rules', '?')} | {interval} |"
        for b in backends.values():
            x = b["groups"].get(key)
            if not x or not x.get("evaluations"):
                row += " not evaluated | | | |"
                continue
            alone = f"{x['alone_p50_s'] * 1000:.0f}" if "alone_p50_s" in x else "-"
            if x.get("alone_work_s", x.get("alone_p50_s")) != x.get("alone_p50_s"):  # side by side (vmalert)
                alone += f" ({x['alone_work_s'] * 1000:.0f})"
            phase = "-" if x.get("start_phase_s") is None else f"{x['start_phase_s']:.1f}"
            row += (f" {x['last_s'] * 1000:.1f} / {x['p50_s'] * 1000:.1f} / {x['max_s'] * 1000:.1f} "
                    f"({x['evaluations']}) | {alone} | {phase} | {x['iterations_missed_during_measure']:g} |")
        rows.append(row)
    rows.append("")
    rows.append("| | " + " | ".join(b["label"] for b in backends.values()) + " |")
    rows.append("|---|" + "---:|" * len(backends))

    def add(label: str, fn: Any) -> None:
        vals = []
        for b in backends.values():
            try:
                vals.append(fn(b))
            except (KeyError, TypeError, IndexError):
                vals.append("?")
        rows.append(f"| {label} | " + " | ".join(str(v) for v in vals) + " |")

    add("CPU during the measurement (cores)", lambda b: " + ".join(f"{k} {v:.2f}" for k, v in b["cpu_cores"].items()))
    add("RSS at the end (MiB)", lambda b: " + ".join(f"{k} {v['VmRSS']:.0f}" for k, v in b["memory_mib"].items()))
    add("peak RSS (MiB)", lambda b: " + ".join(f"{k} {v['VmHWM']:.0f}" for k, v in b["memory_mib"].items()))
    add("series in the TSDB", lambda b: f"{int(next(iter(b['tsdb'].values()))):,}")
    add("input series (samples per scrape)", lambda b: f"{int(b['samples_per_scrape']):,}")
    if results.get("input") == "prewritten":
        add("input written before the rules start: samples, seconds",
            lambda b: f"{b['prewritten']['samples']:,}, {b['prewritten']['seconds']:g}")
    add("series recorded by the rules", lambda b: f"{sum(b['recorded_series'].values()):,}")
    add("alerts firing / pending", lambda b: f"{sum(v.get('firing', 0) for v in b['alerts'].values())} / "
        f"{sum(v.get('pending', 0) for v in b['alerts'].values())}")
    add("rules with errors", lambda b: len(b["rule_errors"]))
    if results.get("input") == "scrape":
        add("generator render p50 (ms), body (MiB)",
            lambda b: f"{b['generator']['render_s']['p50_ms']:.0f}, {b['generator']['body_mib']}")
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--nodes", type=int, default=1000, help="nodes (default 1000)")
    p.add_argument("--gpus", type=int, default=8, help="GPUs per node (default 8)")
    p.add_argument("--warmup", type=float, default=300, help="seconds before measuring, per backend (default 300)")
    p.add_argument("--measure", type=float, default=180, help="seconds measured, per backend (default 180)")
    p.add_argument("--scrape-interval", type=int, default=15, help="seconds (default 15)")
    p.add_argument("--eval-interval", type=int, default=30, help="seconds (default 30)")
    p.add_argument("--max-group-interval", type=float, default=60,
                   help="groups with a longer interval run every --eval-interval here (default 60)")
    p.add_argument("--nfs-ops", type=int, default=len(NFS_OPS),
                   help=f"NFS ops per mount, of NFSv4.2's {len(NFS_OPS)} (default all)")
    p.add_argument("--nfs-mounts", type=int, choices=(2, 4), default=4,
                   help="NFS mounts per node: 4 with nconnect=8, as the reference node (default); 2: the "
                        "checkpoint mount (nconnect=8) and the home mount (nconnect=1) of the earlier runs")
    p.add_argument("--every-nfs-series", action="store_true",
                   help="every NFS operation and transport series, each transport on its own (nfs.operations "
                        "and transport_series: all, per_transport: true), not the exporter's default")
    p.add_argument("--tier", choices=("all", "local", "fleet"), default="all",
                   help="all: the single-server pack (default); local: the per-node tier; fleet: the fleet tier on "
                        "--nodes nodes' recordings, copied from what an earlier all/local run saved (--fleet-inputs)")
    p.add_argument("--fleet-inputs", type=Path, default=Path(tempfile.gettempdir()) / "rules-eval-fleet-inputs.json.gz",
                   help="written by all/local runs (the first backend's recordings at the end), read by fleet runs "
                        "(default %(default)s)")
    p.add_argument("--input", choices=("prewritten", "scrape"), default="prewritten",
                   help="prewritten: every sample up to past the measurement written by remote write before the "
                        "rules start, so that only the rules run while measured (default); scrape: the backend "
                        "scrapes the generator throughout, as a server in service scrapes its nodes")
    p.add_argument("--write-allowance", type=float,
                   help="seconds the prewritten input may take to write (default 60 + 1 per 4,000 series)")
    p.add_argument("--backfill", action=argparse.BooleanOptionalAction, default=True,
                   help="write the history a short run lacks into each backend before measuring (default: yes)")
    p.add_argument("--backfill-days", type=float, default=30,
                   help="hourly history, up to this many days, for metrics the rules read over >= 1 day (0: none; "
                        "default 30)")
    p.add_argument("--backends", default="prometheus,victoriametrics", help="which, in order (default both)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--output", type=Path, default=RESULTS, help=f"JSON results (default {RESULTS})")
    args = p.parse_args(argv)
    kinds = {"prometheus": PrometheusBackend, "victoriametrics": VictoriaBackend}
    wanted = [b.strip() for b in args.backends.split(",") if b.strip()]
    args.snapshot_from = wanted[0] if wanted else ""
    if args.tier == "fleet" and args.input != "prewritten":
        p.error("--tier fleet reads recordings: --input prewritten")
    if args.tier == "fleet" and not args.fleet_inputs.exists():
        p.error(f"--tier fleet needs {args.fleet_inputs}: run --tier all or local first (it saves it)")
    if (not 5 <= args.nodes <= 20_000 or not 1 <= args.gpus <= 16 or args.warmup < 30 or args.measure < 30
            or not 1 <= args.nfs_ops <= len(NFS_OPS) or not set(wanted) <= set(kinds) or not wanted
            or args.scrape_interval < 2 or args.eval_interval < 2):
        p.error("--nodes 5..20000, --gpus 1..16, --warmup and --measure >= 30, --nfs-ops 1..61, "
                "--backends of prometheus,victoriametrics")
    for exe in (PROMETHEUS, PROMTOOL, VICTORIA, VMALERT):
        if not os.access(exe, os.X_OK):
            p.error(f"{exe} not found (Debian packages prometheus and victoria-metrics)")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the finally blocks below

    # The rule pack as it is now (or the tier of it).
    rendered = Path(tempfile.mkdtemp(prefix="rules-eval-tiers-"))
    fleet_dirs = render_tier("fleet", rendered)
    fleet_reads, fleet_recorded, _, _ = rule_reads("prometheus", args.eval_interval,
                                                 sorted(fleet_dirs["prometheus"].glob("*.yml")))
    args.fleet_input_names = set(fleet_reads) - fleet_recorded.keys() - {"", "ALERTS", "ALERTS_FOR_STATE"}
    if args.tier != "all":
        RULE_DIRS.update(fleet_dirs if args.tier == "fleet" else render_tier(args.tier, rendered))
    reads, recorded, recorded_from, bad = rule_reads("prometheus", args.eval_interval)
    if args.backfill:  # the recorded history, then one more evaluation of what reads it, before measuring
        warmup = warmup_for_recorded_history(reads, recorded, recorded_from, args)
        if warmup > args.warmup:
            print(f"warm-up {warmup:g} s, not {args.warmup:g}: time to write the recorded history after the "
                  f"rules have settled and evaluate once more", flush=True)
            args.warmup = warmup
    groups: dict[str, dict[str, Any]] = {}
    for target in ("prometheus", "vmalert"):  # some groups are one target's only (docs/scaling.md)
        for g in load_groups(target, args.eval_interval):
            groups.setdefault(f"{file_key(g.file)}/{g.name}", {
                "rules": g.rules, "records": g.records, "alerts": g.alerts, "interval_s": g.interval, "targets": []
            })["targets"].append(target)
    print(f"rule pack: {len(rule_files('prometheus'))} files in rules/prometheus "
          f"({', '.join(p.name for p in rule_files('prometheus'))}), {len(groups)} groups, "
          f"{sum(g['rules'] for g in groups.values())} rules", flush=True)
    one = sorted(f"{short(k)} ({g['targets'][0]})" for k, g in groups.items() if len(g["targets"]) == 1)
    if one:
        print(f"groups of one target only: {', '.join(one)}")
    for line in bad:
        print(f"WARNING: cannot parse {line}")

    print(f"building the fleet: {args.nodes} nodes x {args.gpus} GPUs ...", flush=True)
    t_build = time.perf_counter()
    if args.tier == "fleet":
        with gzip.open(args.fleet_inputs, "rt") as f:
            snapshot = json.load(f)
        fleet: Fleet = Recordings(snapshot, args.nodes)
        print(f"  the recordings of {snapshot['nodes']} nodes ({args.fleet_inputs}, {snapshot['backend']}) "
              f"x {fleet.copies}", flush=True)
    else:
        fleet = Fleet(args.nodes, args.gpus, args.nfs_ops, args.seed, args.every_nfs_series, args.nfs_mounts)
    if args.write_allowance is None:
        args.write_allowance = 60 + fleet.series / 4000
    produced = fleet.produces()
    missing = sorted(name for name in reads if name and name not in produced and name not in recorded
                     and name not in ("ALERTS", "ALERTS_FOR_STATE"))
    if missing:
        print(f"WARNING: the rules read metrics the generator does not produce (those rules evaluate on "
              f"nothing here, so they cost less than they will): {', '.join(missing)}", flush=True)
    print(f"  {fleet.series:,} series ({fleet.dynamic_series:,} change between scrapes), built in "
          f"{time.perf_counter() - t_build:.1f} s", flush=True)

    results: dict[str, Any] = {
        "nodes": args.nodes, "gpus": args.gpus, "warmup_s": args.warmup, "measure_s": args.measure,
        "scrape_interval_s": args.scrape_interval, "eval_interval_s": args.eval_interval,
        "max_group_interval_s": args.max_group_interval, "nfs_ops": args.nfs_ops,
        "every_nfs_series": args.every_nfs_series, "nfs_mounts": args.nfs_mounts, "input": args.input,
        "tier": args.tier,
        "fleet_tier_reads": sorted(args.fleet_input_names),
        "backfill": args.backfill, "backfill_days": args.backfill_days, "seed": args.seed, "target_s": TARGET_SECONDS,
        "rule_files": [p.name for p in rule_files("prometheus")], "rules_sha256": rules_fingerprint(),
        "groups": groups, "metrics_read": {k: v for k, v in sorted(reads.items())},
        "metrics_read_not_generated": missing, "rule_parse_errors": bad,
        "template_queries": templates_with_queries("prometheus"),
        "fleet": {"series": fleet.series, "dynamic_series": fleet.dynamic_series,
                  "roles": {r: len(m) for r, m in fleet.roles.items()},
                  "gpu_roles": {r: len(m) for r, m in fleet.gpu_roles.items()},
                  "series_per_metric": {f.name: len(f.static_bytes.splitlines()) + len(f.dynamic)
                                        for f in fleet.families.values()},
                  "up_note": "up{job=node|dcgm|gpunode} is served by the generator (honor_labels keeps it): the "
                             "same series Prometheus would write per target; the scrape's own up is "
                             "up{job=\"synthetic\"}"},
        "machine": machine_info(), "commit": git_commit(ROOT), "exporter_source_sha256": source_fingerprint(),
        "backends": {}}
    idle0 = cpu_times()
    time.sleep(1.0)
    results["machine"]["before_run"] = machine_load(idle0, cpu_times())
    if results["machine"]["before_run"]["busy_pct"] > 20:
        print(f"WARNING: before the run the CPUs were {results['machine']['before_run']['busy_pct']}% busy: "
              "the figures will be noisy.", flush=True)

    gen = Generator(fleet)
    gen.start()
    gen.body()  # the first render, outside any measurement
    start_t, cpu_before = time.monotonic(), cpu_times()
    loads = {}
    try:
        for i, name in enumerate(wanted, 1):
            print(f"{i}/{len(wanted)} {name}", flush=True)
            with tempfile.TemporaryDirectory(prefix=f"rules-eval-{name}-") as tmp:
                backend = kinds[name](Path(tmp), gen, args)
                c0 = cpu_times()
                try:
                    results["backends"][name] = run_backend(backend, gen, reads, recorded, recorded_from, args)
                finally:
                    backend.stop()
                loads[name] = machine_load(c0, cpu_times())
                results["backends"][name]["machine_load"] = loads[name]
    except (BenchError, requests.RequestException) as err:
        sys.stderr.write(f"rules_eval: FAILED: {err}\n")
        results["failed"] = str(err)  # what the backends before it measured is kept
        args.output.with_suffix(".failed.json").write_text(json.dumps(results, indent=1, default=str))
        return 1
    finally:
        gen.stop()
        rules_end = rules_fingerprint()  # a tier's files are the rendered ones, removed here
        shutil.rmtree(rendered, ignore_errors=True)
    results["wall_seconds"] = round(time.monotonic() - start_t, 1)
    results["machine"]["during_run"] = machine_load(cpu_before, cpu_times())
    results["machine"]["loadavg_end"] = os.getloadavg()
    results["commit_end"] = git_commit(ROOT)
    results["exporter_source_changed_during_run"] = source_fingerprint() != results["exporter_source_sha256"]
    results["rules_changed_during_run"] = rules_end != results["rules_sha256"]

    over = []
    for name, b in results["backends"].items():
        for key, g in b["groups"].items():
            if g.get("evaluations") and g["max_s"] >= TARGET_SECONDS:
                over.append(f"{name} {key}: max {g['max_s']:.2f} s")
    results["targets"] = [{"target": f"every group < {TARGET_SECONDS:g} s per evaluation (max over the measurement)",
                           "over": over, "pass": not over}]
    print()
    for line in table(results):
        print(line)
    print()
    for b in results["backends"].values():
        print(f"{b['label']}: recorded series {b['recorded_series']}")
        print(f"{b['label']}: alerts {b['alerts']}")
        if b["rule_errors"]:
            print(f"{b['label']}: RULE ERRORS {b['rule_errors']}")
        for key, g in b["groups"].items():
            if g.get("rules_slowest"):
                top = next(iter(g["rules_slowest"].items()))
                print(f"{b['label']}: slowest rule of {short(key)}: {top[0]} p50 {top[1]['p50_s'] * 1000:.1f} ms")
    print(f"\ntarget (every group < {TARGET_SECONDS:g} s): {'PASS' if not over else 'MISS: ' + '; '.join(over)}")
    if results["rules_changed_during_run"]:
        print("WARNING: rules/ changed during the run; the figures are for the files as they were at each backend's "
              "start.")
    m = results["machine"]
    c = results["commit"]
    return finish(results, args.output,
                  f"{m['nproc']} CPUs ({m['cpu_model']}), {m['mem_total_gib']} GiB, {m['prometheus_version']}, "
                  f"victoria-metrics {m['dpkg_versions']['victoria-metrics']}; commit {c['head'][:12]}"
                  f"{' + local changes' if c['dirty'] else ''}")


if __name__ == "__main__":
    sys.exit(main())
