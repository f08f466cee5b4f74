"""A fleet scenario file: the fleet, its jobs, the faults with their onsets, the distractors."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleet import nfs
from fleet.jobs import Job, parse_job, parse_nodes, sessions_as_jobs
from gpunode_common.config import ConfigError, load_yaml
from gpunode_exporter.nvmlsim.scenario import seconds

SHIPPED = Path(__file__).parent / "scenarios"
# Fault kinds and what they model (docs/fleet.md).
FAULTS = ("xid79_collapse", "getattr_spike", "uncorrectable_steps", "correctable_acceleration",
          "throttle", "nvlink_degraded", "fabric_link", "pcie_downgrade", "host_starved", "nfs_saturation",
          "job_slowdown",
          # the kernel log past Xid (fleet/kernel.py), one per family, and a storage server all nodes lose
          "nvswitch_fatal", "hung_tasks", "cpu_lockup", "fs_readonly", "disk_errors", "memory_uncorrectable",
          "memory_ce_storm", "pcie_uncorrectable", "nic_fault", "gpu_driver_fault", "nfs_server_down",
          # the fabric (fleet/fabric.py): RDMA ports, the NVLink fabric
          "port_down", "port_flapping", "port_degraded", "fabric_not_ready")
# Older names: a fail-slow node was a throttled GPU (its clock and power below its peers').
ALIASES = {"failslow": "throttle"}
DISTRACTORS = ("short_spike", "drain", "leave", "join", "known_slow", "gc_pauses", "pipeline_stage", "warm_room",
               "power_cap_busy", "oom_kills", "memory_ce_trickle", "sxid_nonfatal",
               "never_cabled", "link_downed_saturated", "reboot")
# Each cause's choices (docs/fleet.md).
CHOICES = {"reason": ("thermal", "power_cap", "power_brake"), "fabric": ("infiniband", "roce"),
           "cause": ("not_started", "in_progress", "unhealthy", "nvswitch_missing")}
# Persistent per-GPU differences, as a fraction of the level (the standard deviation of a GPU's offset).
SPREAD_KEYS = ("power", "sm_clock")


@dataclass(frozen=True)
class Event:
    kind: str
    node: int
    at: float  # seconds from the start: a fault's onset, a distractor's start
    gpu: int = 0
    params: tuple[tuple[str, Any], ...] = ()

    def param(self, name: str, default: Any) -> Any:
        return dict(self.params).get(name, default)

    def covers(self, node: int) -> bool:
        """Whether the event acts on this node: its own, or one of its `nodes`."""
        listed = self.param("nodes", None)
        return node == self.node if listed is None else node in parse_nodes(listed, self.kind, 1 << 20)

    def duration(self, name: str, default: float) -> float:
        return seconds(self.param(name, default), f"{self.kind}.{name}")


@dataclass(frozen=True)
class Scenario:
    name: str
    nodes: int
    duration: float
    step: float
    seed: int
    jobs: tuple[Job, ...]  # `sessions` become one training job each, over every node
    faults: tuple[Event, ...]
    distractors: tuple[Event, ...]
    gpu_spread: tuple[tuple[str, float], ...] = ()  # SPREAD_KEYS -> standard deviation of a GPU's offset
    daily_drift: float = 0.01  # every GPU's clock moves by this share over the day, lowest in the afternoon
    no_save_clock: tuple[int, ...] = ()  # nodes whose exporter keeps no save clock (an older one)
    storage: nfs.Storage | None = None  # None: the fixed NFS client of fleet/nfs.py


def _events(data: Any, where: str, kinds: tuple[str, ...], nodes: int) -> tuple[Event, ...]:
    if not isinstance(data, list):
        raise ConfigError(f"{where}: want a list")
    events = []
    for n, item in enumerate(data):
        if not isinstance(item, dict) or not {"kind", "node", "at"} <= set(item):
            raise ConfigError(f"{where}[{n}]: want a mapping with kind, node and at")
        kind = ALIASES.get(item["kind"], item["kind"])
        if kind not in kinds:
            raise ConfigError(f"{where}[{n}].kind: want one of {', '.join(kinds)}, got {item['kind']!r}")
        if "nodes" in item:  # distractors of several nodes: a warm room, a pipeline's last stage
            parse_nodes(item["nodes"], f"{where}[{n}].nodes", nodes)
        for key, allowed in CHOICES.items():
            if key in item and item[key] not in allowed:
                raise ConfigError(f"{where}[{n}].{key}: want one of {', '.join(allowed)}, got {item[key]!r}")
        if not 0 <= int(item["node"]) < nodes:
            raise ConfigError(f"{where}[{n}].node: want 0 to {nodes - 1}")
        params = tuple(sorted((k, v) for k, v in item.items() if k not in ("kind", "node", "at", "gpu")))
        events.append(Event(kind, int(item["node"]), seconds(item["at"], f"{where}[{n}].at"),
                            int(item.get("gpu", 0)), params))
    return tuple(events)


def _build(name: str, data: Any) -> Scenario:
    known = {"description", "nodes", "duration", "step", "seed", "checkpoint_every", "sessions", "jobs", "faults",
             "distractors", "gpu_spread", "daily_drift", "no_save_clock", "storage"}
    if not isinstance(data, dict):
        raise ConfigError("want a mapping")
    if unknown := set(data) - known:
        raise ConfigError(f"unknown key '{sorted(unknown)[0]}'")
    if {"sessions", "jobs"} <= set(data):
        raise ConfigError("give sessions (one job over every node) or jobs, not both")
    nodes = int(data.get("nodes", 60))
    duration = seconds(data.get("duration", "7d"), "duration")
    if "jobs" in data:
        if not isinstance(data["jobs"], list):
            raise ConfigError("jobs: want a list")
        jobs = tuple(parse_job(j, f"jobs[{n}]", nodes, duration) for n, j in enumerate(data["jobs"]))
    else:
        sessions = tuple((seconds(s[0], "sessions"), seconds(s[1], "sessions")) for s in
                         data.get("sessions", [[0, duration]]))
        jobs = sessions_as_jobs(sessions, nodes, seconds(data.get("checkpoint_every", "133m"), "checkpoint_every"))
    spread = data.get("gpu_spread", {})
    if not isinstance(spread, dict) or set(spread) - set(SPREAD_KEYS):
        raise ConfigError(f"gpu_spread: want a mapping of {', '.join(SPREAD_KEYS)} to fractions")
    return Scenario(name, nodes, duration, seconds(data.get("step", 30), "step"), int(data.get("seed", 1)),
                    jobs, _events(data.get("faults", []), "faults", FAULTS, nodes),
                    _events(data.get("distractors", []), "distractors", DISTRACTORS, nodes),
                    tuple(sorted((k, float(v)) for k, v in spread.items())), float(data.get("daily_drift", 0.01)),
                    parse_nodes(data["no_save_clock"], "no_save_clock", nodes) if "no_save_clock" in data else (),
                    nfs.parse(data["storage"]) if "storage" in data else None)


def load(name_or_path: str, duration: str | float | None = None) -> Scenario:
    """A shipped scenario by name, or a scenario file; `duration` (`14d`, seconds) in place of the
    file's: jobs without an `end` then run to the new end, events stay where the file puts them."""
    path = Path(name_or_path)
    if not path.suffix:
        path = SHIPPED / f"{name_or_path}.yaml"
    return load_yaml(path, lambda data: _build(path.stem, data if duration is None or not isinstance(data, dict)
                                               else {**data, "duration": duration}))
