"""The optional --config.file: YAML for what flags don't cover, strictly checked."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, get_type_hints

from gpunode_common.config import ConfigError, load_yaml
from gpunode_exporter.workload import SOURCES

# The NFS operations served one by one unless nfs.operations says otherwise: the data path and
# the metadata operations a training job's file handling shows in (the rule pack reads the first
# seven). A mount's other operations, most of ~60 idle, are summed into op="OTHER".
NFS_OPERATIONS = ("READ", "WRITE", "COMMIT", "GETATTR", "LOOKUP", "ACCESS", "OPEN", "CLOSE", "SETATTR",
                  "READDIR", "READDIRPLUS")
# Per-transport series, gpunode_nfs_transport_NAME[_total]: every one, and those served unless
# nfs.transport_series says otherwise (what the rule pack and the dashboards read).
NFS_TRANSPORT_SERIES_ALL = ("sends", "receives", "bad_xids", "connects", "in_flight_sum", "backlog_sum",
                            "sending_sum", "pending_sum", "max_slots")
NFS_TRANSPORT_SERIES = ("sends", "connects", "in_flight_sum", "backlog_sum", "max_slots")
_OPERATION = re.compile(r"[A-Z][A-Z0-9_]*")


@dataclass(frozen=True)
class NFSConfig:
    # Look up which interface routes to each NFS server (netlink, cached).
    resolve_devices: bool = True
    route_cache_seconds: float = 60.0
    # Operations served on their own, the rest of a mount's summed into op="OTHER"; [all]: each its own.
    operations: tuple[str, ...] = NFS_OPERATIONS
    # Transport series served (names above); [all]: every one.
    transport_series: tuple[str, ...] = NFS_TRANSPORT_SERIES
    # One set of transport series per transport (transport="0", "1" ...) rather than per mount:
    # with nconnect the kernel sends round robin, so a mount's transports fill alike and their sum
    # (transport="all"; max_slots their largest) tells the same at 1/nconnect of the series.
    per_transport: bool = False

    def __post_init__(self) -> None:
        if self.operations != ("all",):
            for op in self.operations:
                if not _OPERATION.fullmatch(op) or op == "OTHER":
                    raise ConfigError(f"key 'nfs.operations': {op!r} is no NFS operation name (READ, GETATTR, ...)")
        if self.transport_series != ("all",):
            for name in self.transport_series:
                if name not in NFS_TRANSPORT_SERIES_ALL:
                    raise ConfigError(f"key 'nfs.transport_series': unknown {name!r} "
                                      f"(known: {', '.join(NFS_TRANSPORT_SERIES_ALL)}, or all)")


@dataclass(frozen=True)
class GPUConfig:
    # GPUs this node should have; exported as gpunode_gpus_expected (absent when unset).
    expected_count: int | None = None
    # NVSwitches this node should have (4 on an HGX H100 baseboard); gpunode_nvswitches_expected.
    nvswitches_expected: int | None = None
    # gpunode_gpu_nvlink_errors_total per link; by default one series per GPU and type, link="all":
    # 18 links per GPU would add 8 x 18 series per type and node (docs/series-budget.md).
    nvlink_per_link: bool = False


@dataclass(frozen=True)
class StagingConfig:
    # Filesystems where checkpoints are staged: gpunode_staging_{used,size}_bytes{path}.
    paths: tuple[str, ...] = ("/dev/shm",)


@dataclass(frozen=True)
class GPUProcessesConfig:
    # A process is re-checked for GPU device files until it is this old (CUDA starts late).
    rescan_young_seconds: float = 300.0
    # Time one scrape may spend checking processes' fds; the rest wait for the next scrape.
    check_budget_seconds: float = 0.05


@dataclass(frozen=True)
class WorkloadConfig:
    # Where a GPU's workload (the job whose nodes are its peers) is read, first match wins
    # (exporter/workload.py, docs/workloads.md). Leave out a source to never read it.
    sources: tuple[str, ...] = ("pattern", "job_mapping", "slurm", "kubernetes", "environment", "container",
                                "systemd")
    # dcgm-exporter's HPC job-mapping directory (its --hpc-job-mapping-dir); '' reads none.
    job_mapping_dir: str = ""
    # Environment variables of GPU processes that name their job; no other variable is read.
    environment: tuple[str, ...] = ("TORCHELASTIC_RUN_ID", "SLURM_JOB_ID")
    # Regular expressions over cgroup paths, each with a named group `workload`, for other schedulers.
    cgroup_patterns: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for source in self.sources:
            if source not in SOURCES:
                raise ConfigError(f"key 'workload.sources': unknown source {source!r} (known: {', '.join(SOURCES)})")
        for pattern in self.cgroup_patterns:
            try:
                compiled = re.compile(pattern)
            except re.error as err:
                raise ConfigError(f"key 'workload.cgroup_patterns': {pattern!r}: {err}") from None
            if "workload" not in compiled.groupindex:
                raise ConfigError(f"key 'workload.cgroup_patterns': {pattern!r} has no group (?P<workload>...)")


@dataclass(frozen=True)
class CheckpointConfig:
    # The node's own clock of its checkpoint saves (collector checkpoint): a save is a run of
    # seconds in which the node's NFS mounts send WRITE payload faster than save_write_bytes per
    # second, the rule pack's save threshold (its checkpoint.save_write_bytes), read every
    # sample_seconds; a dip shorter than gap_seconds (a pause between files, a COMMIT) continues it.
    save_write_bytes: float = 333e6
    sample_seconds: float = 1.0
    gap_seconds: float = 5.0
    # Mount points counted (regular expressions, any matching); none: every NFS mount, as the rule
    # pack's checkpoint.mounts counts every mount by default.
    mountpoints: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for pattern in self.mountpoints:
            try:
                re.compile(pattern)
            except re.error as err:
                raise ConfigError(f"key 'checkpoint.mountpoints': {pattern!r}: {err}") from None


@dataclass(frozen=True)
class StorageConfig:
    # Interfaces that carry storage traffic besides those routing to NFS servers (e.g. NFS over RDMA).
    interfaces: tuple[str, ...] = ()


@dataclass(frozen=True)
class FabricConfig:
    # RDMA ports (InfiniBand or RoCE) that should be ACTIVE on this node; gpunode_fabric_ports_expected.
    ports_expected: int | None = None


@dataclass(frozen=True)
class Config:
    # A collector still running after this many seconds is reported failed for the scrape.
    collector_timeout_seconds: float = 5.0
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    fabric: FabricConfig = field(default_factory=FabricConfig)
    gpu: GPUConfig = field(default_factory=GPUConfig)
    gpu_processes: GPUProcessesConfig = field(default_factory=GPUProcessesConfig)
    nfs: NFSConfig = field(default_factory=NFSConfig)
    staging: StagingConfig = field(default_factory=StagingConfig)
    storage: StorageConfig = field(default_factory=StorageConfig)
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)


def _build(cls: type, data: Any, where: str) -> Any:
    if not isinstance(data, dict):
        raise ConfigError(f"{where or 'top level'}: want a mapping, got {type(data).__name__}")
    hints = get_type_hints(cls)
    known = {f.name for f in fields(cls)}
    for key in data:
        if key not in known:
            raise ConfigError(f"unknown key '{where + '.' if where else ''}{key}'")
    values = {}
    for name, value in data.items():
        path = f"{where}.{name}" if where else name
        want = hints[name]
        if is_dataclass(want):
            values[name] = _build(want, value, path)
        elif want is bool:
            if not isinstance(value, bool):
                raise ConfigError(f"key '{path}': want true or false, got {value!r}")
            values[name] = value
        elif want in (int, int | None):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(f"key '{path}': want a whole number >= 0, got {value!r}")
            values[name] = value
        elif want == tuple[str, ...]:
            if isinstance(value, str) and value:
                value = [value]  # one item may be written without the brackets (`operations: all`)
            if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
                raise ConfigError(f"key '{path}': want a list of strings, got {value!r}")
            values[name] = tuple(value)
        elif want is str:
            if not isinstance(value, str):
                raise ConfigError(f"key '{path}': want a string, got {value!r}")
            values[name] = value
        elif want is float:
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise ConfigError(f"key '{path}': want a positive number, got {value!r}")
            values[name] = float(value)
        else:  # pragma: no cover - a new field type needs a branch here
            raise ConfigError(f"key '{path}': unsupported type")
    return cls(**values)


def load(path: Path | None) -> Config:
    if path is None:
        return Config()
    return load_yaml(path, lambda data: _build(Config, data, ""))
