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

from gpunode_common.config import ConfigError, load_yaml, seconds

_UUID = re.compile(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_NVML_BUS_ID = re.compile(r"[0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.[0-7]")
HISTOGRAM_FIELDS = ("max", "high", "partial", "low", "none")
# nvml.h's nvmlClocksEventReason* bits, written out here rather than taken from pynvml (as the
# structures in library.py are), so a wrong constant on either side shows in the tests.
CLOCK_REASONS = {"gpu_idle": 0x1, "applications_clocks_setting": 0x2, "sw_power_cap": 0x4, "hw_slowdown": 0x8,
                 "sync_boost": 0x10, "sw_thermal_slowdown": 0x20, "hw_thermal_slowdown": 0x40,
                 "hw_power_brake_slowdown": 0x80, "display_clock_setting": 0x100}
ALL_REASONS = sum(CLOCK_REASONS.values())
# nvmlPerfPolicyType_t 0..5, in order: NVML_FI_DEV_PERF_POLICY_POWER (74) .. _RELIABILITY (79).
POLICIES = ("power", "thermal", "sync_boost", "board_limit", "low_utilization", "reliability")
# The clocks event reasons whose time the driver counts in fields of their own (nvml.h:
# NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN 269, _HW_THERM_SLOWDOWN 270,
# _HW_POWER_BRAKE_SLOWDOWN 271; SW power cap and sync boost are the violation times 74 and 76).
EVENT_TIMES = ("sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown")
# Per-link error counters, by what the driver calls them: the DL counters of NVML_FI_DEV_NVLINK_ERROR_DL_*
# (replay, recovery, crc) before Blackwell; NVLink 5 (Blackwell) has link recovery events instead.
NVLINK_COUNTERS = {"legacy": ("replay", "recovery", "crc"), "nvlink5": ("recovery",)}
NVLINK_STATES = {"inactive": 0, "active": 1, "sleep": 2}
# GPU models a scenario may name; every key can still be given on its own. PCI ids as NVML reports them
# (device << 16 | vendor), from NVIDIA's open-gpu-kernel-modules README (its table of compatible GPUs).
# fabric: whether the GPU sits on an NVSwitch fabric (HGX baseboards) or has none (PCIe cards).
MODELS: dict[str, dict[str, Any]] = {
    "h100-sxm": {"name": "NVIDIA H100 80GB HBM3", "pci_device_id": 0x233010DE, "pci_subsystem_id": 0x16C110DE,
                 "nvlink_links": 18, "nvlink_counters": "legacy", "fabric": True},
    "b200": {"name": "NVIDIA B200", "pci_device_id": 0x290110DE, "pci_subsystem_id": 0x199910DE,
             "nvlink_links": 18, "nvlink_counters": "nvlink5", "fabric": True},
    "l40s": {"name": "NVIDIA L40S", "pci_device_id": 0x26B910DE, "pci_subsystem_id": 0x185110DE,
             "nvlink_links": 0, "nvlink_counters": "legacy", "fabric": False},
}
# nvml.h's NVML_GPU_FABRIC_STATE_*, and the healthMask fields (NVML_GPU_FABRIC_HEALTH_MASK_*), written
# out here as the clock reasons are. Each flag is a 2-bit field at its shift: 1 TRUE, 2 FALSE.
FABRIC_STATES = {"not_supported": 0, "not_started": 1, "in_progress": 2, "completed": 3}
FABRIC_FLAGS = {"degraded_bandwidth": 0, "route_recovery": 2, "route_unhealthy": 4, "access_timeout_recovery": 6}
# The 4-bit incorrect-configuration field at shift 8 (1 NONE); partition_assigned (12) and gfm_state (14)
# are left NOT_SUPPORTED (0), as on a single-node HGX baseboard.
FABRIC_CONFIGURATION_SHIFT = 8
FABRIC_CONFIGURATIONS = {"incorrect_sysguid": 2, "incorrect_chassis_sn": 3, "no_partition": 4,
                         "insufficient_nvlinks": 5, "incompatible_gpu_fw": 6, "invalid_location": 7,
                         "gpu_state_invalid": 8}
FABRIC_HEALTH_NAMES = (*FABRIC_FLAGS, *FABRIC_CONFIGURATIONS)
# Error names a scenario may use: pynvml's NVML_ERROR_* constants without the prefix.
ERROR_CODES = {name.removeprefix("NVML_ERROR_"): value for name, value in vars(pynvml).items()
               if name.startswith("NVML_ERROR_") and isinstance(value, int)}


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


@dataclass(frozen=True)
class Rate:
    """A counter growing at a rate per second that changes in steps; 0 before the first point."""

    times: tuple[float, ...]
    rates: tuple[float, ...]
    totals: tuple[float, ...]  # the count at each point

    def at(self, t: float) -> float:
        i = bisect.bisect_right(self.times, t) - 1
        if i < 0:
            return 0.0
        return self.totals[i] + self.rates[i] * (t - self.times[i])


def _counter(data: Any, where: str, check: Any) -> Timeline | Rate:
    """A counter: any timeline, or {rate: [[t, per second], ...]}."""
    if not (isinstance(data, dict) and "rate" in data):
        return _timeline(data, where, check)
    if set(data) != {"rate"}:
        raise ConfigError(f"{where}: a rate takes only the key 'rate'")
    steps = _timeline(data["rate"], f"{where}.rate", _amount)
    totals = [0.0]
    for i in range(1, len(steps.times)):
        totals.append(totals[-1] + steps.values[i - 1] * (steps.times[i] - steps.times[i - 1]))
    return Rate(steps.times, steps.values, tuple(totals))


def _amount(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < float("inf"):
        raise ConfigError(f"{where}: want a number >= 0, got {value!r}")
    return float(value)


def _reasons(value: Any, where: str) -> int:
    """Clock event reasons: a list of names, or nvml.h's bitmask as a number."""
    if isinstance(value, list):
        unknown = [v for v in value if v not in CLOCK_REASONS]
        if unknown:
            raise ConfigError(f"{where}: unknown clock event reason {unknown[0]!r} (use {', '.join(CLOCK_REASONS)})")
        return sum({CLOCK_REASONS[v] for v in value})
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2 ** 64:
        raise ConfigError(f"{where}: want a list of reason names or a bitmask, got {value!r}")
    return value


def _link_state(value: Any, where: str) -> int:
    if value in NVLINK_STATES:
        return NVLINK_STATES[value]
    if value in NVLINK_STATES.values() and not isinstance(value, bool):
        return int(value)
    raise ConfigError(f"{where}: want one of {', '.join(NVLINK_STATES)} (or 0, 1, 2), got {value!r}")


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


def _mapping(data: Any, where: str) -> dict[Any, Any]:
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: want a mapping, got {type(data).__name__}")
    return data


def _keys(data: Any, where: str, required: set[str], optional: set[str]) -> dict[str, Any]:
    _mapping(data, where)
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
    field: int | None = None  # nvmlDeviceGetFieldValues: the call succeeds, this field answers `error`
    link: int | None = None  # ... for this scopeId only (None: every one)

    def active(self, function: str, t: float) -> bool:
        return function == self.function and self.field is None and self.start <= t < self.end

    def hits_field(self, field_id: int, scope: int, t: float) -> bool:
        return (field_id == self.field and self.link in (None, scope) and self.start <= t < self.end)


@dataclass(frozen=True)
class XidEvent:
    at: float
    xid: int


@dataclass(frozen=True)
class RecoveryActionEvent:
    at: float
    action: int  # nvmlDeviceGpuRecoveryAction_t: 0 none ... 7 system reboot


@dataclass(frozen=True)
class Fabric:
    """What nvmlDeviceGetGpuFabricInfo(V) answers for a GPU on an NVSwitch fabric."""

    state: Timeline  # FABRIC_STATES values
    status: Timeline  # nvmlReturn_t of the probe (0 success)
    health: Timeline  # the healthMask
    clique_id: int = 0
    cluster_uuid: bytes = bytes(16)

    def health_summary(self, t: float) -> int:
        """v3's healthSummary: 1 healthy, 2 unhealthy, 3 limited capacity (degraded bandwidth alone)."""
        mask = self.health.at(t)
        bad = {name for name, shift in FABRIC_FLAGS.items() if (mask >> shift) & 0x3 == 1}
        if (mask >> FABRIC_CONFIGURATION_SHIFT) & 0xF not in (0, 1):
            bad.add("incorrect_configuration")
        if not bad:
            return 1
        return 3 if bad == {"degraded_bandwidth"} else 2


def fabric_mask(names: list[str] | tuple[str, ...]) -> int:
    """The healthMask a driver reports with these problems: every flag TRUE or FALSE, the configuration
    the named one or NONE."""
    mask = 0
    for flag, shift in FABRIC_FLAGS.items():
        mask |= (1 if flag in names else 2) << shift
    configurations = [FABRIC_CONFIGURATIONS[n] for n in names if n in FABRIC_CONFIGURATIONS]
    return mask | (configurations[0] if configurations else 1) << FABRIC_CONFIGURATION_SHIFT


def _fabric_state(value: Any, where: str) -> int:
    if value in FABRIC_STATES:
        return FABRIC_STATES[value]
    raise ConfigError(f"{where}: want one of {', '.join(FABRIC_STATES)}, got {value!r}")


def _fabric_status(value: Any, where: str) -> int:
    return 0 if str(value).upper() == "SUCCESS" else _error_code(value, where)


def _fabric_health(value: Any, where: str) -> int:
    """A list of problem names, or the healthMask as a number."""
    if isinstance(value, list):
        unknown = [v for v in value if v not in FABRIC_HEALTH_NAMES]
        if unknown:
            raise ConfigError(f"{where}: unknown fabric health {unknown[0]!r} (use {', '.join(FABRIC_HEALTH_NAMES)})")
        if sum(v in FABRIC_CONFIGURATIONS for v in value) > 1:
            raise ConfigError(f"{where}: at most one incorrect configuration")
        return fabric_mask(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2 ** 32:
        raise ConfigError(f"{where}: want a list of health problems or a 32-bit mask, got {value!r}")
    return value


def _fabric(data: Any, where: str, model: dict[str, Any]) -> Fabric | None:
    """`fabric: none` (or a model without one): the calls answer NOT_SUPPORTED."""
    if data == "none" or (data is None and not model["fabric"]):
        return None
    data = _keys(data if data is not None else {}, where, set(), {"state", "status", "health", "clique_id"})

    raw_health = data.get("health", [])
    if isinstance(raw_health, list) and all(isinstance(v, str) for v in raw_health):
        health = Timeline.constant(_fabric_health(raw_health, f"{where}.health"))  # names: a constant
    else:
        health = _timeline(raw_health, f"{where}.health", _fabric_health)
    return Fabric(state=_timeline(data.get("state", "completed"), f"{where}.state", _fabric_state),
                  status=_timeline(data.get("status", "SUCCESS"), f"{where}.status", _fabric_status),
                  health=health, clique_id=_count(data.get("clique_id", 0), f"{where}.clique_id"))


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
    clock_supported: int = ALL_REASONS
    clock_active: Timeline = field(default_factory=lambda: Timeline.constant(0))  # bitmask over time
    violations: dict[str, Timeline | Rate] = field(default_factory=dict)  # policy -> seconds
    event_seconds: dict[str, Timeline | Rate] = field(default_factory=dict)  # reason (EVENT_TIMES) -> seconds
    nvlink_links: int = 18
    nvlink_counters: str = "legacy"  # a key of NVLINK_COUNTERS
    nvlink_state: dict[int, Timeline] = field(default_factory=dict)  # link -> state; default active
    nvlink_errors: dict[tuple[int, str], Timeline | Rate] = field(default_factory=dict)  # (link, counter)
    pcie_replays: Timeline | Rate = field(default_factory=lambda: Timeline.constant(0))
    fabric: Fabric | None = None  # None: no NVSwitch fabric (the fabric calls answer NOT_SUPPORTED)

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

    def violation_ns(self, policy: str, t: float) -> int:
        timeline = self.violations.get(policy)
        return int(timeline.at(t) * 1e9) if timeline is not None else 0

    def event_ns(self, reason: str, t: float) -> int:
        timeline = self.event_seconds.get(reason)
        return int(timeline.at(t) * 1e9) if timeline is not None else 0

    def link_state(self, link: int, t: float) -> int:
        timeline = self.nvlink_state.get(link)
        return int(timeline.at(t)) if timeline is not None else NVLINK_STATES["active"]

    def link_errors(self, link: int, counter: str, t: float) -> int:
        timeline = self.nvlink_errors.get((link, counter))
        return int(timeline.at(t)) if timeline is not None else 0


@dataclass(frozen=True)
class Scenario:
    driver_version: str
    init_error: int | None
    missing_functions: frozenset[str]
    speedup: float
    start: float
    gpus: tuple[GPU, ...]
    faults: tuple[Fault, ...] = field(default=())  # node-level calls: count, driver version
    # The newest nvmlGpuFabricInfo struct version nvmlDeviceGetGpuFabricInfoV takes (2: healthMask,
    # 3: and healthSummary); a newer one answers ARGUMENT_VERSION_MISMATCH.
    fabric_info_version: int = 3


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
        item = _keys(item, w, {"function"}, {"error", "hang_seconds", "from", "until", "field", "link"})
        if item["function"] not in known_functions:
            raise ConfigError(f"{w}.function: {item['function']!r} is not a simulated NVML function")
        if ("error" in item) == ("hang_seconds" in item):
            raise ConfigError(f"{w}: give exactly one of 'error' and 'hang_seconds'")
        error = _error_code(item["error"], f"{w}.error") if "error" in item else None
        hang = seconds(item.get("hang_seconds", 0), f"{w}.hang_seconds")
        start = seconds(item.get("from", 0), f"{w}.from")
        end = seconds(item["until"], f"{w}.until") if "until" in item else float("inf")
        field_id = link = None
        if "field" in item or "link" in item:
            if item["function"] != "nvmlDeviceGetFieldValues" or "field" not in item or error is None:
                raise ConfigError(f"{w}: 'field' (and 'link') go with function nvmlDeviceGetFieldValues and an error")
            field_id = _count(item["field"], f"{w}.field")
            link = _count(item["link"], f"{w}.link") if "link" in item else None
        faults.append(Fault(item["function"], error, hang, start, end, field_id, link))
    return tuple(faults)


def _gpu(data: Any, where: str, known_functions: frozenset[str], index: int) -> GPU:
    data = _keys(data, where, {"uuid", "pci_bus_id"}, {
        "model", "name", "serial", "pci_device_id", "pci_subsystem_id", "minor", "remapped_rows", "pending",
        "failure", "histogram", "banks", "resets", "pcie", "lost_at", "errors", "xids", "recovery_actions",
        "clock_events", "violations", "nvlink", "fabric"})
    model = MODELS.get(str(data.get("model", "h100-sxm")))
    if model is None:
        raise ConfigError(f"{where}.model: want one of {', '.join(MODELS)}, got {data['model']!r}")
    uuid = str(data["uuid"])
    if not _UUID.fullmatch(uuid):
        raise ConfigError(f"{where}.uuid: want GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx (lower-case hex), got {uuid!r}")
    bus_id = str(data["pci_bus_id"])
    if not _NVML_BUS_ID.fullmatch(bus_id):
        raise ConfigError(f"{where}.pci_bus_id: want NVML's form 00000000:18:00.0, got {bus_id!r}")
    rows = _keys(data.get("remapped_rows", {}), f"{where}.remapped_rows", set(), {"correctable", "uncorrectable"})
    pcie = _keys(data.get("pcie", {}), f"{where}.pcie", set(), {"generation", "width", "replays"})
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
    clocks = _keys(data.get("clock_events", {}), f"{where}.clock_events", set(), {"active", "supported", "seconds"})
    event_seconds = _keys(clocks.get("seconds", {}), f"{where}.clock_events.seconds", set(), set(EVENT_TIMES))
    violations = _keys(data.get("violations", {}), f"{where}.violations", set(), set(POLICIES))
    return GPU(
        uuid=uuid, pci_bus_id=bus_id,
        name=str(data.get("name", model["name"])), serial=str(data.get("serial", "")),
        pci_device_id=_count(data.get("pci_device_id", model["pci_device_id"]), f"{where}.pci_device_id"),
        pci_subsystem_id=_count(data.get("pci_subsystem_id", model["pci_subsystem_id"]), f"{where}.pci_subsystem_id"),
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
        clock_supported=_reasons(clocks.get("supported", ALL_REASONS), f"{where}.clock_events.supported"),
        clock_active=_reasons_timeline(clocks.get("active", 0), f"{where}.clock_events.active"),
        violations={p: _counter(v, f"{where}.violations.{p}", _amount) for p, v in violations.items()},
        event_seconds={r: _counter(v, f"{where}.clock_events.seconds.{r}", _amount) for r, v in event_seconds.items()},
        pcie_replays=_counter(pcie.get("replays", 0), f"{where}.pcie.replays", _count),
        fabric=_fabric(data.get("fabric"), f"{where}.fabric", model),
        **_nvlink(data.get("nvlink", {}), f"{where}.nvlink", model),
    )


def _reasons_timeline(data: Any, where: str) -> Timeline:
    """A list of names is a constant here; steps are [[time, reasons], ...] (reasons a list or a bitmask)."""
    if isinstance(data, list) and all(isinstance(v, str) for v in data):
        return Timeline.constant(_reasons(data, where))
    return _timeline(data, where, _reasons)


def _nvlink(data: Any, where: str, model: dict[str, Any]) -> dict[str, Any]:
    data = _keys(data, where, set(), {"links", "counters", "state", "errors"})
    links = _count(data.get("links", model["nvlink_links"]), f"{where}.links")
    counters = data.get("counters", model["nvlink_counters"])
    if counters not in NVLINK_COUNTERS:
        raise ConfigError(f"{where}.counters: want one of {', '.join(NVLINK_COUNTERS)}, got {counters!r}")

    def link(key: Any, w: str) -> int:
        if isinstance(key, bool) or not isinstance(key, int) or not 0 <= key < links:
            raise ConfigError(f"{w}: want a link number 0..{links - 1}, got {key!r}")
        return key

    state, errors = (_mapping(data.get(k, {}), f"{where}.{k}") for k in ("state", "errors"))
    by_link = {}
    for key, counts in errors.items():
        w = f"{where}.errors.{key}"
        for name, value in _keys(counts, w, set(), set(NVLINK_COUNTERS[counters])).items():
            by_link[(link(key, w), name)] = _counter(value, f"{w}.{name}", _count)
    return {"nvlink_links": links, "nvlink_counters": counters, "nvlink_errors": by_link,
            "nvlink_state": {link(k, f"{where}.state.{k}"): _timeline(v, f"{where}.state.{k}", _link_state)
                             for k, v in state.items()}}


def build(data: Any, known_functions: frozenset[str]) -> Scenario:
    data = _keys(data, "scenario", {"gpus"}, {"driver", "speedup", "start", "errors", "description"})
    driver = _keys(data.get("driver", {}), "driver", set(), {"version", "init_error", "missing_functions",
                                                              "fabric_info_version"})
    fabric_version = driver.get("fabric_info_version", 3)
    if fabric_version not in (2, 3) or isinstance(fabric_version, bool):
        raise ConfigError(f"driver.fabric_info_version: want 2 or 3, got {fabric_version!r}")
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
        fabric_info_version=fabric_version,
    )


def load(path: Path, known_functions: frozenset[str]) -> Scenario:
    return load_yaml(path, lambda data: build(data, known_functions))
