"""A demo scenario file: the training job's checkpoint cycle, the NFS mount, the simulated
NVML (whose Xids also go to the kernel log) and the alerts the webhook must receive.

Times are real seconds since the demo started. The schema is in docs/demo.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpunode_common.config import ConfigError, load_yaml, seconds
from gpunode_exporter import nvmlsim

SHIPPED = Path(__file__).parent / "scenarios"


@dataclass(frozen=True)
class Checkpoint:
    first: float  # the first save starts this long after the start
    every: float
    save_seconds: float
    save_bytes: int  # written to NFS per save
    staged_bytes: int  # really written to the staging tmpfs per save (a scaled-down copy)


@dataclass(frozen=True)
class Mount:
    server: str
    export: str
    mountpoint: str
    slots: int
    saturated_from: float | None  # saves from then on fill the slot table ...
    saturated_save_seconds: float  # ... and take this long


@dataclass(frozen=True)
class Xid:
    at: float
    pci_bus_id: str  # NVML's form
    xid: int


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    duration: float
    checkpoint: Checkpoint
    nfs: Mount
    nvml: dict[str, Any]  # docs/nvml-simulation.md; speedup must be 1 (times are real seconds)
    xids: tuple[Xid, ...]
    expect: tuple[dict[str, str], ...]  # label sets, one per alert that must arrive
    also: frozenset[str]  # alert names that may arrive too (consequences of the faults)

    def nvml_file(self, directory: Path) -> Path:
        path = directory / f"{self.name}.nvml.yaml"
        path.write_text(yaml.safe_dump(self.nvml, sort_keys=False))
        return path


def _mapping(data: Any, where: str, keys: set[str]) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: want a mapping")
    for key in keys ^ set(data):
        raise ConfigError(f"{where}: {'missing' if key in keys else 'unknown'} key '{key}'")
    return data


def _build(name: str, data: Any) -> Scenario:
    top = _mapping(data, "scenario", {"description", "duration", "checkpoint", "nfs", "nvml", "expect",
                                        "also"})
    ck = _mapping(top["checkpoint"], "checkpoint", {"first", "every", "save_seconds", "save_bytes", "staged_bytes"})
    nfs = _mapping(top["nfs"], "nfs", {"server", "export", "mountpoint", "slots", "saturated_from",
                                        "saturated_save_seconds"})
    checkpoint = Checkpoint(*(seconds(ck[k], f"checkpoint.{k}") for k in ("first", "every", "save_seconds")),
                            int(ck["save_bytes"]), int(ck["staged_bytes"]))
    saturated = nfs["saturated_from"]
    mount = Mount(str(nfs["server"]), str(nfs["export"]), str(nfs["mountpoint"]), int(nfs["slots"]),
                  None if saturated is None else seconds(saturated, "nfs.saturated_from"),
                  seconds(nfs["saturated_save_seconds"], "nfs.saturated_save_seconds"))
    for key, length in (("checkpoint.save_seconds", checkpoint.save_seconds),
                        ("nfs.saturated_save_seconds", mount.saturated_save_seconds)):
        if not 0 < length < checkpoint.every:
            raise ConfigError(f"{key}: a save must take time and end before the next begins")
    if top["nvml"].get("speedup", 1) != 1:
        raise ConfigError("nvml.speedup: the demo's times are real seconds; leave speedup at 1")
    xids = tuple(Xid(seconds(x["at"], "nvml.gpus.xids.at"), str(g["pci_bus_id"]), int(x["xid"]))
                 for g in top["nvml"].get("gpus", []) for x in g.get("xids", []))
    if not isinstance(top["expect"], list) or not all(isinstance(e, dict) for e in top["expect"]):
        raise ConfigError("expect: want a list of label mappings")
    expect = tuple({str(k): str(v) for k, v in e.items()} for e in top["expect"])
    if not isinstance(top["also"], list):
        raise ConfigError("also: want a list of alert names")
    return Scenario(name, str(top["description"]), seconds(top["duration"], "duration"), checkpoint, mount,
                    top["nvml"], tuple(sorted(xids, key=lambda x: x.at)), expect, frozenset(map(str, top["also"])))


def load(name_or_path: str, scratch: Path) -> Scenario:
    """A shipped scenario by name (demo/scenarios/NAME.yaml) or a file; its NVML part is checked too."""
    path = Path(name_or_path)
    if not path.suffix:
        path = SHIPPED / f"{name_or_path}.yaml"
    found = load_yaml(path, lambda data: _build(path.stem, data))
    try:
        nvmlsim.load(found.nvml_file(scratch))
    except ConfigError as err:
        raise ConfigError(f"{path}: nvml: {str(err).split(': ', 1)[1]}") from None
    return found
