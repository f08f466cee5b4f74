"""The scenario file behind --nvml.simulate: a node's GPUs and how they change over time.

Pure: parses and validates YAML data into frozen objects and answers "what is the
value at simulated time t". The schema is documented in docs/nvml-simulation.md.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pynvml

from exporter.config import ConfigError, load_yaml

_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_UUID = re.compile(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_NVML_BUS_ID = re.compile(r"[0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.[0-7]")
HISTOGRAM_FIELDS = ("max", "high", "partial", "low", "none")
# Error names a scenario may use: pynvml's NVML_ERROR_* constants without the prefix.
ERROR_CODES = {name.removeprefix("NVML_ERROR_"): value for name, value in vars(pynvml).items()
               if name.startswith("NVML_ERROR_") and isinstance(value, int)}


def seconds(value: Any, where: str) -> float:
    """A duration: a number of seconds, or a string such as "90s", "15m", "1d12h", "2w"."""
    if isinstance(value, bool):
        raise ConfigError(f"{where}: want a duration, got {value!r}")
    if isinstance(value, int | float):
        if value < 0:
            raise ConfigError(f"{where}: want a duration >= 0, got {value!r}")
        return float(value)
    text = str(value).strip()
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ConfigError(f"{where}: want a duration such as 90s, 15m, 2h, 3d or 1d12h, got {value!r}")
    return float(sum(float(n) * _UNIT_SECONDS[u] for n, u in parts))


@dataclass(frozen=True)
class Timeline:
    """A value over simulated time: steps (hold until the next point) or linear ramps."""

    times: tuple[float, ...]
    values: tuple[Any, ...]
    linear: bool = False

    @classmethod
    def constant(cls, value: Any) -> Timeline:
        return cls((0.0,), (value,))

    def at(self, t: float) -> Any:
        i = bisect.bisect_right(self.times, t) - 1
        if i < 0:
            return self.values[0]
        if not self.linear or i + 1 == len(self.times):
            return self.values[i]
        t0, t1 = self.times[i], self.times[i + 1]
        v0, v1 = self.values[i], self.values[i + 1]
        return v0 + (v1 - v0) * (t - t0) / (t1 - t0)

    def last_change_before(self, t: float) -> float | None:
        """The latest point time <= t, for derived state such as 'pending since'."""
        i = bisect.bisect_right(self.times, t) - 1
        return self.times[i] if i >= 0 else None


def _timeline(data: Any, where: str, check: Any) -> Timeline:
    """A value = constant; [[t, v], ...] = steps; {linear: [[t, v], ...]} = ramps."""
    linear = False
    if isinstance(data, dict) and "linear" in data:
        if set(data) != {"linear"}:
            raise ConfigError(f"{where}: a linear timeline takes only the key 'linear'")
        data, linear = data["linear"], True
    if not isinstance(data, list):
        return Timeline.constant(check(data, where))
    if not data:
        raise ConfigError(f"{where}: a timeline needs at least one [time, value] point")
    times, values = [], []
    for n, point in enumerate(data):
        if not isinstance(point, list) or len(point) != 2:
            raise ConfigError(f"{where}[{n}]: want [time, value]")
        t = seconds(point[0], f"{where}[{n}]")
        if times and t <= times[-1]:
            raise ConfigError(f"{where}[{n}]: times must increase")
        times.append(t)
        values.append(check(point[1], f"{where}[{n}]"))
    return Timeline(tuple(times), tuple(values), linear)


def _count(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0 or value != int(value):
        raise ConfigError(f"{where}: want a whole number >= 0, got {value!r}")
    return int(value)


def _flag(value: Any, where: str) -> int:
    if value not in (0, 1) or isinstance(value, float):
        raise ConfigError(f"{where}: want 0 or 1, got {value!r}")
    return int(value)


def _histogram(value: Any, where: str) -> tuple[int, ...]:
    if not isinstance(value, dict) or set(value) - set(HISTOGRAM_FIELDS):
        raise ConfigError(f"{where}: want a mapping with keys among {', '.join(HISTOGRAM_FIELDS)}")
    return tuple(_count(value.get(k, 0), f"{where}.{k}") for k in HISTOGRAM_FIELDS)


def _keys(data: Any, where: str, required: set[str], optional: set[str]) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: want a mapping, got {type(data).__name__}")
    missing = required - set(data)
    if missing:
        raise ConfigError(f"{where}: missing key '{sorted(missing)[0]}'")
    unknown = set(data) - required - optional
    if unknown:
        raise ConfigError(f"{where}: unknown key '{sorted(unknown)[0]}'")
    return data


@dataclass(frozen=True)
class Fault:
    """A call that fails (error) or blocks (hang_seconds, real time) within [start, end) of simulated time."""

    function: str
    error: int | None
    hang_seconds: float
    start: float
    end: float

    def active(self, function: str, t: float) -> bool:
        return function == self.function and self.start <= t < self.end


@dataclass(frozen=True)
class XidEvent:
    at: float
    xid: int


@dataclass(frozen=True)
class RecoveryActionEvent:
    at: float
    action: int  # nvmlDeviceGpuRecoveryAction_t: 0 none ... 7 system reboot


@dataclass(frozen=True)
class GPU:
    uuid: str
    pci_bus_id: str  # NVML's form: 00000000:18:00.0
    name: str
    serial: str
    pci_device_id: int  # device << 16 | vendor, as NVML reports it
    pci_subsystem_id: int
    minor: int  # N of its /dev/nvidiaN: the driver numbers devices as it probes them, not by index
    correctable: Timeline
    uncorrectable: Timeline
    pending: Timeline | None  # None = derived from remaps since the last reset
    failure: Timeline
    histogram: Timeline | None  # None = derived: each remapped row used one spare of its own bank
    banks: int
    resets: tuple[float, ...]
    pcie_generation: tuple[Timeline, Timeline]  # (current, max)
    pcie_width: tuple[Timeline, Timeline]
    lost_at: float | None
    faults: tuple[Fault, ...]
    xids: tuple[XidEvent, ...]
    recovery_actions: tuple[RecoveryActionEvent, ...] = ()

    def lost(self, t: float) -> bool:
        return self.lost_at is not None and t >= self.lost_at

    def remapped(self, t: float) -> tuple[int, int]:
        return int(self.correctable.at(t)), int(self.uncorrectable.at(t))

    def remap_pending(self, t: float) -> int:
        if self.pending is not None:
            return int(self.pending.at(t))
        last_reset = max((r for r in self.resets if r <= t), default=0.0)
        return int(sum(self.remapped(t)) > sum(self.remapped(last_reset)))

    def remap_histogram(self, t: float) -> tuple[int, ...]:
        if self.histogram is not None:
            return self.histogram.at(t)
        used = min(sum(self.remapped(t)), self.banks)
        return (self.banks - used, used, 0, 0, 0)


@dataclass(frozen=True)
class Scenario:
    driver_version: str
    init_error: int | None
    missing_functions: frozenset[str]
    speedup: float
    start: float
    gpus: tuple[GPU, ...]
    faults: tuple[Fault, ...] = field(default=())  # node-level calls: count, driver version


def _error_code(value: Any, where: str) -> int:
    code = ERROR_CODES.get(str(value).upper())
    if code is None:
        raise ConfigError(f"{where}: unknown NVML error {value!r} (use e.g. NOT_SUPPORTED, UNKNOWN, TIMEOUT)")
    return code


def _faults(data: Any, where: str, known_functions: frozenset[str]) -> tuple[Fault, ...]:
    if not isinstance(data, list):
        raise ConfigError(f"{where}: want a list")
    faults = []
    for n, item in enumerate(data):
        w = f"{where}[{n}]"
        item = _keys(item, w, {"function"}, {"error", "hang_seconds", "from", "until"})
        if item["function"] not in known_functions:
            raise ConfigError(f"{w}.function: {item['function']!r} is not a simulated NVML function")
        if ("error" in item) == ("hang_seconds" in item):
            raise ConfigError(f"{w}: give exactly one of 'error' and 'hang_seconds'")
        error = _error_code(item["error"], f"{w}.error") if "error" in item else None
        hang = seconds(item.get("hang_seconds", 0), f"{w}.hang_seconds")
        start = seconds(item.get("from", 0), f"{w}.from")
        end = seconds(item["until"], f"{w}.until") if "until" in item else float("inf")
        faults.append(Fault(item["function"], error, hang, start, end))
    return tuple(faults)


def _gpu(data: Any, where: str, known_functions: frozenset[str], index: int) -> GPU:
    data = _keys(data, where, {"uuid", "pci_bus_id"}, {
        "name", "serial", "pci_device_id", "pci_subsystem_id", "minor", "remapped_rows", "pending", "failure",
        "histogram", "banks", "resets", "pcie", "lost_at", "errors", "xids", "recovery_actions"})
    uuid = str(data["uuid"])
    if not _UUID.fullmatch(uuid):
        raise ConfigError(f"{where}.uuid: want GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx (lower-case hex), got {uuid!r}")
    bus_id = str(data["pci_bus_id"])
    if not _NVML_BUS_ID.fullmatch(bus_id):
        raise ConfigError(f"{where}.pci_bus_id: want NVML's form 00000000:18:00.0, got {bus_id!r}")
    rows = _keys(data.get("remapped_rows", {}), f"{where}.remapped_rows", set(), {"correctable", "uncorrectable"})
    pcie = _keys(data.get("pcie", {}), f"{where}.pcie", set(), {"generation", "width"})
    gen = _keys(pcie.get("generation", {}), f"{where}.pcie.generation", set(), {"current", "max"})
    width = _keys(pcie.get("width", {}), f"{where}.pcie.width", set(), {"current", "max"})

    def tl(value: Any, key: str, check: Any = _count) -> Timeline:
        return _timeline(value, f"{where}.{key}", check)

    xids = []
    for n, item in enumerate(data.get("xids", [])):
        item = _keys(item, f"{where}.xids[{n}]", {"at", "xid"}, set())
        xids.append(XidEvent(seconds(item["at"], f"{where}.xids[{n}].at"), _count(item["xid"], f"{where}.xids[{n}]")))
    actions = []
    for n, item in enumerate(data.get("recovery_actions", [])):
        w = f"{where}.recovery_actions[{n}]"
        item = _keys(item, w, {"at", "action"}, set())
        action = _count(item["action"], w)
        if action > 7:
            raise ConfigError(f"{w}.action: want 0 (none) .. 7 (system reboot), got {action}")
        actions.append(RecoveryActionEvent(seconds(item["at"], f"{w}.at"), action))
    banks = _count(data.get("banks", 2560), f"{where}.banks")
    histogram = tl(data["histogram"], "histogram", _histogram) if "histogram" in data else None
    if histogram is not None and any(sum(h) != sum(histogram.values[0]) for h in histogram.values):
        raise ConfigError(f"{where}.histogram: every point must count the same number of banks")
    return GPU(
        uuid=uuid, pci_bus_id=bus_id,
        name=str(data.get("name", "NVIDIA H100 80GB HBM3")), serial=str(data.get("serial", "")),
        pci_device_id=_count(data.get("pci_device_id", 0x233010DE), f"{where}.pci_device_id"),
        pci_subsystem_id=_count(data.get("pci_subsystem_id", 0x16C110DE), f"{where}.pci_subsystem_id"),
        minor=_count(data.get("minor", index), f"{where}.minor"),
        correctable=tl(rows.get("correctable", 0), "remapped_rows.correctable"),
        uncorrectable=tl(rows.get("uncorrectable", 0), "remapped_rows.uncorrectable"),
        pending=tl(data["pending"], "pending", _flag) if "pending" in data else None,
        failure=tl(data.get("failure", 0), "failure", _flag),
        histogram=histogram, banks=banks,
        resets=tuple(sorted(seconds(r, f"{where}.resets") for r in data.get("resets", []))),
        pcie_generation=(tl(gen.get("current", 5), "pcie.generation.current"),
                         tl(gen.get("max", 5), "pcie.generation.max")),
        pcie_width=(tl(width.get("current", 16), "pcie.width.current"), tl(width.get("max", 16), "pcie.width.max")),
        lost_at=seconds(data["lost_at"], f"{where}.lost_at") if "lost_at" in data else None,
        faults=_faults(data.get("errors", []), f"{where}.errors", known_functions),
        xids=tuple(sorted(xids, key=lambda x: x.at)),
        recovery_actions=tuple(sorted(actions, key=lambda x: x.at)),
    )


def build(data: Any, known_functions: frozenset[str]) -> Scenario:
    data = _keys(data, "scenario", {"gpus"}, {"driver", "speedup", "start", "errors", "description"})
    driver = _keys(data.get("driver", {}), "driver", set(), {"version", "init_error", "missing_functions"})
    missing = driver.get("missing_functions", [])
    for name in missing:
        if name not in known_functions:
            raise ConfigError(f"driver.missing_functions: {name!r} is not a simulated NVML function")
    speedup = data.get("speedup", 1)
    if isinstance(speedup, bool) or not isinstance(speedup, int | float) or speedup <= 0:
        raise ConfigError(f"speedup: want a positive number, got {speedup!r}")
    if not isinstance(data["gpus"], list):
        raise ConfigError("gpus: want a list")
    gpus = tuple(_gpu(g, f"gpus[{n}]", known_functions, n) for n, g in enumerate(data["gpus"]))
    for attr in ("uuid", "pci_bus_id", "minor"):
        values = [getattr(g, attr) for g in gpus]
        if len(set(values)) != len(values):
            raise ConfigError(f"gpus: two GPUs share a {attr}")
    return Scenario(
        driver_version=str(driver.get("version", "550.54.15")),
        init_error=_error_code(driver["init_error"], "driver.init_error") if "init_error" in driver else None,
        missing_functions=frozenset(missing),
        speedup=float(speedup),
        start=seconds(data.get("start", 0), "start"),
        gpus=gpus,
        faults=_faults(data.get("errors", []), "errors", known_functions),
    )


def load(path: Path, known_functions: frozenset[str]) -> Scenario:
    return load_yaml(path, lambda data: build(data, known_functions))
