"""The gpu collector's reads that name the cause of a straggler: clocks event (throttle) reasons
and the time spent in the slowdowns among them, clock violation time per policy, NVLink state and
errors, PCIe replays. A helper of gpu.py.

Per GPU and scrape: nvmlDeviceGetCurrentClocksEventReasons, and one nvmlDeviceGetFieldValues for
the violation times, the slowdown times, the PCIe replay counter (nvmlDeviceGetPcieReplayCounter's, which is asked
instead where the field is not answered) and every NVLink's state and error counters.
What a GPU never supports is learned once and kept on its Device: the reasons it reports, its
link count, the fields it answers (a field answering NOT_SUPPORTED on the first scrape is not
asked again). Which NVLink counters exist differs by generation (docs/nvml-simulation.md):
before Blackwell the DL counters (replay, recovery, CRC) per link; on Blackwell (NVLink 5) the
driver answers those NOT_SUPPORTED and counts link recovery events instead.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import logging
import math
import struct
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import pynvml

from gpunode_exporter.collector.base import Family, MetricSpec
from gpunode_exporter.nvml import Device, GPULostError, Session, code_name

log = logging.getLogger(__name__)

_GPU = ("gpu", "uuid")

CLOCK_EVENT = MetricSpec("gpunode_gpu_clock_event_active", "gauge",
                         "1 while NVML reports this clocks event (throttle) reason, else 0; absent for reasons "
                         "the GPU does not report.", (*_GPU, "reason"))
CLOCK_VIOLATION = MetricSpec("gpunode_gpu_clock_violation_seconds_total", "counter",
                             "Time a performance policy held the GPU's clocks below the requested clocks "
                             "(NVML's violation time), per policy.", (*_GPU, "policy"))
CLOCK_EVENT_TIME = MetricSpec("gpunode_gpu_clock_event_seconds_total", "counter",
                              "Time the GPU spent in this clocks event reason since the driver loaded: the thermal "
                              "and power brake slowdowns, which a scrape's reason catches only while they hold "
                              "(SW power cap and sync boost: the violation times of those policies).",
                              (*_GPU, "reason"))
NVLINK_ERRORS = MetricSpec("gpunode_gpu_nvlink_errors_total", "counter",
                           "NVLink errors by type, per link (link=\"all\": the GPU's links summed, unless "
                           "gpu.nvlink_per_link). Only the types the GPU counts: Blackwell counts recovery only.",
                           (*_GPU, "link", "type"))
NVLINK_UP = MetricSpec("gpunode_gpu_nvlink_links_up", "gauge",
                       "The GPU's NVLink links whose state is active; absent without NVLink.", _GPU)
PCIE_REPLAYS = MetricSpec("gpunode_gpu_pcie_replays_total", "counter",
                          "PCIe replays: packets the GPU's PCIe link had to retransmit (a marginal link).", _GPU)
SPECS = (CLOCK_EVENT, CLOCK_EVENT_TIME, CLOCK_VIOLATION, NVLINK_ERRORS, NVLINK_UP, PCIE_REPLAYS)

# nvml.h's nvmlClocksEventReason* bits 0x1..0x100 (pynvml's nvmlClocksThrottleReason* are the same).
REASONS = (("gpu_idle", pynvml.nvmlClocksEventReasonGpuIdle),
           ("applications_clocks_setting", pynvml.nvmlClocksEventReasonApplicationsClocksSetting),
           ("sw_power_cap", pynvml.nvmlClocksEventReasonSwPowerCap),
           ("hw_slowdown", pynvml.nvmlClocksEventReasonHwSlowdown),
           ("sync_boost", pynvml.nvmlClocksEventReasonSyncBoost),
           ("sw_thermal_slowdown", pynvml.nvmlClocksEventReasonSwThermalSlowdown),
           ("hw_thermal_slowdown", pynvml.nvmlClocksEventReasonHwThermalSlowdown),
           ("hw_power_brake_slowdown", pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown),
           ("display_clock_setting", pynvml.nvmlClocksEventReasonDisplayClockSetting))
_ALL_REASONS = sum(bit for _, bit in REASONS)
# Violation time per nvmlPerfPolicyType_t, as the fields nvml.h names nvmlDeviceGetViolationStatus's
# replacement with (one FieldValues call instead of six calls per GPU). The values are nanoseconds.
POLICIES = (("power", pynvml.NVML_FI_DEV_PERF_POLICY_POWER), ("thermal", pynvml.NVML_FI_DEV_PERF_POLICY_THERMAL),
            ("sync_boost", pynvml.NVML_FI_DEV_PERF_POLICY_SYNC_BOOST),
            ("board_limit", pynvml.NVML_FI_DEV_PERF_POLICY_BOARD_LIMIT),
            ("low_utilization", pynvml.NVML_FI_DEV_PERF_POLICY_LOW_UTILIZATION),
            ("reliability", pynvml.NVML_FI_DEV_PERF_POLICY_RELIABILITY))
# Time in a slowdown, per reason (ns), where NVML counts it in a field of its own (drivers of NVML 12.8 on;
# older ones answer NOT_SUPPORTED and the series is absent).
EVENT_TIMES = (("sw_thermal_slowdown", getattr(pynvml, "NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN", 269)),
               ("hw_thermal_slowdown", getattr(pynvml, "NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN", 270)),
               ("hw_power_brake_slowdown",
                getattr(pynvml, "NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN", 271)))
# Per link (scopeId = link): error counters by the `type` they are exported as, in order of preference
# for a type. NVML_FI_DEV_NVLINK_ERROR_DL_CRC is read as the flit CRC, the CRC counter nvidia-smi nvlink -e
# shows on Hopper; no per-link data CRC field covers 18 links, so crc_data is never served. Link recovery
# events (NVLink 5) count what the DL recovery counter counted, the link leaving Up for recovery; nvml.h
# names them as the DL counters' replacement on Blackwell. (Why so: docs/nvml-simulation.md.)
LINK_COUNTERS = ((pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY, "replay"),
                 (pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY, "recovery"),
                 (getattr(pynvml, "NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_EVENTS", 215), "recovery"),
                 (pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_CRC, "crc_flit"))
# (Names nvidia-ml-py 12.535, the oldest we take, lacks are given as nvml.h numbers them.)
_STATE, _ACTIVE = pynvml.NVML_FI_DEV_NVLINK_GET_STATE, getattr(pynvml, "NVML_NVLINK_STATE_ACTIVE", 1)
_REPLAYS = pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER  # "PCIe replay counter": one call less per GPU

_OK, _LOST, _NOT_SUPPORTED = pynvml.NVML_SUCCESS, pynvml.NVML_ERROR_GPU_IS_LOST, pynvml.NVML_ERROR_NOT_SUPPORTED
# Per-field answers on the first scrape meaning "this GPU has no such field": not asked again. INVALID_ARGUMENT
# too: drivers answer it for a link index past the GPU's links, and for some fields older GPUs lack.
_ABSENT = frozenset({_NOT_SUPPORTED, pynvml.NVML_ERROR_INVALID_ARGUMENT})
_UINT, _ULL = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
_NOT_AVAILABLE = {"Q": 2 ** 64 - 1, "I": 2 ** 32 - 1}  # NVML_VALUE_NOT_AVAILABLE as unsigned long long / int
# nvmlFieldValue_t: fieldId, scopeId, timestamp, latencyUsec, valueType, nvmlReturn, value (an 8-byte union).
# An answer is read through strided views of the array as pynvml's structure lays it out, not field by field.
FIELD_FORMAT = "IIqqiiQ"
_FV = pynvml.c_nvmlFieldValue_t
_INTS, _WORDS = ctypes.sizeof(_FV) // 4, ctypes.sizeof(_FV) // 8
_TYPE_AT, _RETURN_AT, _VALUE_AT = _FV.valueType.offset // 4, _FV.nvmlReturn.offset // 4, _FV.value.offset // 8
_UINT_AT = _FV.value.offset // 4  # the union's uiVal: its first 4 bytes, whatever the byte order
_PAIR_AT = _FV.valueType.offset // 8  # valueType and nvmlReturn, side by side in one 8-byte word
assert _FV.nvmlReturn.offset == _FV.valueType.offset + 4 and _FV.valueType.offset % 8 == 0
_VALUE_TYPE = {_UINT: "I", pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "Q", _ULL: "Q",
               pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "q", pynvml.NVML_VALUE_TYPE_SIGNED_INT: "i",
               getattr(pynvml, "NVML_VALUE_TYPE_UNSIGNED_SHORT", 6): "H", pynvml.NVML_VALUE_TYPE_DOUBLE: "d"}


def decode(value_type: int, raw: int) -> int | float | None:
    """The nvmlValue_t union (its 8 bytes read as one unsigned number) as valueType says; None when it
    is no count: negative, not finite, NVML_VALUE_NOT_AVAILABLE, or of a type nvml.h does not name."""
    code = _VALUE_TYPE.get(value_type)
    if code is None:
        return None
    value = raw if code == "Q" else struct.unpack_from("=" + code, raw.to_bytes(8, sys.byteorder))[0]
    if value == _NOT_AVAILABLE.get(code) or value < 0 or not math.isfinite(value):
        return None
    return value


def _seconds(nanoseconds: int | float) -> int | float:
    """NVML's violation time in seconds; a whole number stays one (cheaper to render: idle GPUs have 0)."""
    whole, rest = divmod(nanoseconds, 1_000_000_000)
    return int(whole) if not rest else nanoseconds / 1e9


def _values(types: list[int], codes: list[int], raws: list[int]) -> list[int | float | None]:
    """A span's values, None where absent; whole spans of plain counters without a per-field loop."""
    if not any(codes):
        n = len(raws)
        if types.count(_ULL) == n and _NOT_AVAILABLE["Q"] not in raws:
            return list(raws)
        if types.count(_UINT) == n and sys.byteorder == "little":  # the union's first 4 bytes
            values = [raw & 0xFFFFFFFF for raw in raws]
            if _NOT_AVAILABLE["I"] not in values:
                return values  # type: ignore[return-value]
    return [decode(t, raw) if code == _OK else None for t, code, raw in zip(types, codes, raws, strict=True)]


@dataclass
class Fields:
    """One GPU's nvmlDeviceGetFieldValues request and what each answer means. Fields come in spans
    of one kind and label: ("policy", ""), ("event", ""), ("replays", ""), ("state", ""), ("errors", type); each
    field of a span has a key: its policy, or its link."""

    slots: list[tuple[str, str, str]]  # (kind, label, key) per field
    ids: list[tuple[int, int]]  # (fieldId, scopeId) per field
    settled: bool = False  # pruned after the first answer to what the GPU has
    source: list[int] = field(default_factory=list)  # settled: each field's position in the plan before
    spans: list[tuple[str, str, int, int, tuple[str, ...]]] = field(init=False)  # (kind, label, start, stop, keys)
    array: Any = field(init=False)
    template: bytes = field(init=False)
    request: Any = field(init=False)  # the array each call fills: one collection at a time uses it
    words: memoryview = field(init=False)  # the request's memory as unsigned long longs, ints, unsigned ints
    ints: memoryview = field(init=False)
    uints: memoryview = field(init=False)
    types: list[int] = field(init=False)  # the value types answers usually come in
    usual: bytes = field(init=False)  # (valueType, nvmlReturn NVML_SUCCESS) per field, as an answer holds them
    replays: bool = field(init=False)  # asks for the PCIe replay counter

    def __post_init__(self) -> None:
        # The request is built once: pynvml's wrapper builds it in Python on every call (~1 us a field).
        self.array = pynvml.c_nvmlFieldValue_t * len(self.ids)
        entry = f"=II{ctypes.sizeof(_FV) - 8}x"  # fieldId, scopeId, the rest 0
        self.template = b"".join(struct.pack(entry, field_id, scope) for field_id, scope in self.ids)
        self.request = request = self.array.from_buffer_copy(self.template)
        self.ints = memoryview(request).cast("B").cast("i")
        self.uints = memoryview(request).cast("B").cast("I")
        self.words = memoryview(request).cast("B").cast("Q")
        self.types = [_UINT if kind in ("state", "replays") else _ULL for kind, _, _ in self.slots]
        self.usual = struct.pack("=" + "ii" * len(self.types), *(n for t in self.types for n in (t, _OK)))
        self.replays = any(kind == "replays" for kind, _, _ in self.slots)
        self.spans = []
        for i, (kind, label, key) in enumerate(self.slots):
            if self.spans and self.spans[-1][:2] == (kind, label):
                k, lab, a, _, keys = self.spans[-1]
                self.spans[-1] = (k, lab, a, i + 1, (*keys, key))
            else:
                self.spans.append((kind, label, i, i + 1, (key,)))

    @classmethod
    def plan(cls, links: int) -> Fields:
        """Everything a GPU of this many links might answer, before the first scrape prunes it."""
        slots = [("policy", "", name) for name, _ in POLICIES] + [("event", "", name) for name, _ in EVENT_TIMES]
        slots += [("replays", "", "")] + [("state", "", str(n)) for n in range(links)]
        ids = [(fid, 0) for _, fid in (*POLICIES, *EVENT_TIMES)] + [(_REPLAYS, 0)] + [(_STATE, n) for n in range(links)]
        for fid, kind in LINK_COUNTERS:
            slots += [("errors", kind, str(n)) for n in range(links)]
            ids += [(fid, n) for n in range(links)]
        return cls(slots, ids)

    def settle(self, absent: set[int]) -> Fields:
        """The plan less the fields at these positions, and less a second counter for a link's type."""
        have: set[tuple[str, str, str]] = set()
        keep = []
        for i, slot in enumerate(self.slots):
            if i not in absent and slot not in have:
                have.add(slot)
                keep.append(i)
        return Fields([self.slots[i] for i in keep], [self.ids[i] for i in keep], settled=True, source=keep)


class Reading:
    """One GPU's rows for the families in SPECS, (label values, value) each, and the reasons read. All
    are read before any is added, so a GPU lost halfway adds none."""

    __slots__ = ("errors", "event_times", "events", "replays", "up", "violations")

    def __init__(self) -> None:
        self.events: list[tuple[tuple[str, ...], int]] = []
        self.event_times: list[tuple[tuple[str, ...], int | float]] = []
        self.violations: list[tuple[tuple[str, ...], int | float]] = []
        self.errors: list[tuple[tuple[str, ...], int | float]] = []
        self.up: list[tuple[tuple[str, ...], int]] = []
        self.replays: list[tuple[tuple[str, ...], int | float]] = []


class _Labels:
    """A GPU's label values, built once and reused by every scrape (fewer objects, less garbage)."""

    def __init__(self, ids: tuple[str, str]) -> None:
        self.ids = ids
        self.reasons = [(bit, ((*ids, name), 0), ((*ids, name), 1)) for name, bit in REASONS]  # rows as 0 / 1
        self.policies = {name: (*ids, name) for name, _ in (*POLICIES, *EVENT_TIMES)}  # policies and reasons
        self.links: dict[tuple[str, str], tuple[str, ...]] = {}  # (link, type)

    def link(self, link: str, kind: str) -> tuple[str, ...]:
        labels = self.links.get((link, kind))
        if labels is None:
            labels = self.links[(link, kind)] = (*self.ids, link, kind)
        return labels


# pynvml's private names _field_values's fast path calls. tests/test_gpu_straggler.py fails when the installed
# nvidia-ml-py lacks one; the exporter then takes pynvml's public wrapper, slower but the same answer.
PRIVATE_NAMES = ("_nvmlGetFunctionPointer", "_nvmlCheckReturn")
_fast: bool | None = None  # _field_values's path, decided on its first call (None: not yet)


def _fast_path_available() -> bool:
    """Whether this pynvml has PRIVATE_NAMES; logs, once a process, which path nvmlDeviceGetFieldValues takes."""
    missing = [name for name in PRIVATE_NAMES if not callable(getattr(pynvml, name, None))]
    if missing:
        log.info("pynvml %s lacks %s: nvmlDeviceGetFieldValues goes through pynvml's public wrapper (slower)",
                 _pynvml_version(), ", ".join(missing))
    else:
        log.debug("nvmlDeviceGetFieldValues on prepared arrays, through pynvml's %s", ", ".join(PRIVATE_NAMES))
    return not missing


def _pynvml_version() -> str:
    try:
        return importlib.metadata.version("nvidia-ml-py")
    except importlib.metadata.PackageNotFoundError:
        return "(version unknown)"


def _field_values(handle: Any, request: Any) -> Any:
    """nvmlDeviceGetFieldValues on a prepared array, answered in place.

    Why not simply pynvml.nvmlDeviceGetFieldValues: it builds the array anew in Python on every call (~1 us a
    field). Measured on the simulated B200 (100 fields a GPU before pruning, 8 GPUs): 0.43 ms a scrape this way,
    0.95 ms through the wrapper. The price is pynvml's private PRIVATE_NAMES; where a release lacks one, the
    wrapper asks for the same (fieldId, scopeId)s and its answer is copied into the array."""
    global _fast
    if _fast is None:
        _fast = _fast_path_available()
    if _fast:
        fn = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetFieldValues")
        pynvml._nvmlCheckReturn(fn(handle, ctypes.c_int(len(request)), ctypes.byref(request)))
        return request
    answer = pynvml.nvmlDeviceGetFieldValues(handle, [(value.fieldId, value.scopeId) for value in request])
    ctypes.memmove(request, answer, ctypes.sizeof(request))
    return request


_field_values.__name__ = "nvmlDeviceGetFieldValues"  # the name errors are counted under


class StragglerReads:
    """Reads and adds the families in SPECS for the gpu collector."""

    def __init__(self, session: Session, per_link: bool) -> None:
        self.session = session
        self.per_link = per_link
        self._labels: dict[tuple[str, str], _Labels] = {}

    def read(self, device: Device, ids: tuple[str, str]) -> Reading:
        """Raises GPULostError as Session.read does."""
        session, out = self.session, Reading()
        labels = self._labels.get(ids)
        if labels is None:
            if len(self._labels) > 4096:  # GPUs come and go (new UUIDs): start afresh now and then
                self._labels.clear()
            labels = self._labels[ids] = _Labels(ids)
        reasons = None
        if "nvmlDeviceGetCurrentClocksEventReasons" not in device.unsupported:
            reasons = session.read(device, pynvml.nvmlDeviceGetCurrentClocksEventReasons, sticky=True)
        if reasons is None and "nvmlDeviceGetCurrentClocksEventReasons" in device.unsupported:
            # Drivers before R535 have the same function under its old name.
            reasons = session.read(device, pynvml.nvmlDeviceGetCurrentClocksThrottleReasons, sticky=True)
        if reasons is not None:
            supported = self._supported_reasons(device)
            out.events = [active if reasons & bit else idle for bit, idle, active in labels.reasons if supported & bit]
        fields = self._fields(device)
        if fields is not None:
            fields = self._read_fields(device, fields, labels, out)
        if fields is None or not fields.replays:
            replays = session.read(device, pynvml.nvmlDeviceGetPcieReplayCounter, sticky=True)
            if replays is not None:
                out.replays.append((ids, replays))
        return out

    def add(self, reading: Reading, fams: dict[MetricSpec, Family]) -> None:
        for spec, rows in zip(SPECS, (reading.events, reading.event_times, reading.violations, reading.errors,
                                      reading.up, reading.replays), strict=True):
            if rows:
                fams[spec].rows += rows  # (label values, value), as Family.add appends them

    # --- static facts, learned once per device ------------------------------------------

    def _supported_reasons(self, device: Device) -> int:
        """The reasons the GPU reports; all when it does not say."""
        known = device.learned.get("clock_reasons")
        if known is None:
            failures = self.session.errors.total()
            known = (self.session.read(device, pynvml.nvmlDeviceGetSupportedClocksEventReasons, sticky=True)
                     or self.session.read(device, pynvml.nvmlDeviceGetSupportedClocksThrottleReasons, sticky=True))
            if self.session.errors.total() != failures:
                return _ALL_REASONS  # ask again next scrape
            known = device.learned["clock_reasons"] = known or _ALL_REASONS
        return known

    def _fields(self, device: Device) -> Fields | None:
        """The device's field plan; None without nvmlDeviceGetFieldValues. Its link count
        (NVML_FI_DEV_NVLINK_LINK_COUNT) is read once; on a failure, this scrape goes without links."""
        plan = device.learned.get("fields")
        if plan is not None or "nvmlDeviceGetFieldValues" in device.unsupported:
            return plan
        answer = self.session.read(device, pynvml.nvmlDeviceGetFieldValues, [pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT],
                                   sticky=True)
        if answer is None:
            return None
        count = answer[0]
        if count.nvmlReturn == _LOST:
            device.lost = True
            raise GPULostError()
        if count.nvmlReturn not in (_OK, *_ABSENT):
            self._count_failures(device, [count.nvmlReturn])
            return Fields.plan(0)  # violation times only, this scrape
        links = int(decode(count.valueType, count.value.ullVal) or 0) if count.nvmlReturn == _OK else 0
        plan = device.learned["fields"] = Fields.plan(links)
        return plan

    # --- one scrape's field values --------------------------------------------------------

    def _read_fields(self, device: Device, plan: Fields, labels: _Labels, out: Reading) -> Fields:
        """Fills `out` from one call; returns the plan (pruned after the first answer)."""
        ctypes.memmove(plan.request, plan.template, len(plan.template))  # fieldId and scopeId, the rest 0
        if self.session.read(device, _field_values, plan.request) is None:
            return plan
        words, uints = plan.words, plan.uints
        raws = words[_VALUE_AT::_WORDS].tolist()
        if plan.settled and words[_PAIR_AT::_WORDS].tobytes() == plan.usual and _NOT_AVAILABLE["Q"] not in raws:
            self._usual(plan, raws, uints, labels, out)  # every field answered as usual: no decoding
            return plan
        types, returns = plan.ints[_TYPE_AT::_INTS].tolist(), plan.ints[_RETURN_AT::_INTS].tolist()
        if _LOST in returns:
            device.lost = True
            raise GPULostError()
        if not plan.settled:  # the first answer says what the GPU has; read it as the pruned plan
            kept = device.learned.get("fields") is plan  # not a stand-in while the link count is unknown
            plan = plan.settle({i for i, code in enumerate(returns) if code in _ABSENT})
            if kept:
                device.learned["fields"] = plan
            types, returns, raws = ([seq[i] for i in plan.source] for seq in (types, returns, raws))
        if any(returns):
            self._count_failures(device, [code for code in returns if code not in (_OK, _NOT_SUPPORTED)])
        self._add_spans(plan, (_values(types[a:b], returns[a:b], raws[a:b]) for _, _, a, b, _ in plan.spans),
                        labels, out)
        return plan

    def _usual(self, plan: Fields, raws: list[int], uints: memoryview, labels: _Labels, out: Reading) -> None:
        """_read_fields for an answer of plain counters, what almost every scrape gets: the values as
        they lie, unsigned long longs, and unsigned ints for link states and replays, with no decoding."""
        def span(kind: str, a: int, b: int) -> list[int | float | None]:
            if kind == "state":
                return uints[_UINT_AT + a * _INTS:_UINT_AT + b * _INTS:_INTS].tolist()
            if kind == "replays":
                replays = uints[_UINT_AT + a * _INTS]
                return [None if replays == _NOT_AVAILABLE["I"] else replays]
            return raws[a:b]  # type: ignore[return-value]

        self._add_spans(plan, (span(kind, a, b) for kind, _, a, b, _ in plan.spans), labels, out)

    def _add_spans(self, plan: Fields, values_per_span: Iterable[list[int | float | None]], labels: _Labels,
                   out: Reading) -> None:
        """Each span's values (None: absent) as rows of `out`."""
        sums: dict[str, int | float | None] = {}
        for (kind, label, _, _, keys), values in zip(plan.spans, values_per_span, strict=True):
            complete = None not in values
            if kind in ("policy", "event"):
                policies = labels.policies
                rows = [(policies[key], _seconds(v)) for key, v in zip(keys, values, strict=True) if v is not None]
                if kind == "policy":
                    out.violations = rows
                else:
                    out.event_times = rows
            elif kind == "replays":
                if values[0] is not None:
                    out.replays.append((labels.ids, values[0]))
            elif kind == "state":
                if complete:  # a partial count would look like a link down
                    out.up.append((labels.ids, values.count(_ACTIVE)))
            elif self.per_link:
                out.errors += [(labels.link(key, label), v) for key, v in zip(keys, values, strict=True)
                               if v is not None]
            else:
                total = sums.get(label, 0)  # a sum without a link would look like a counter reset: none
                sums[label] = total + sum(values) if complete and total is not None else None  # type: ignore[arg-type]
        out.errors += [(labels.link("all", label), total) for label, total in sums.items() if total is not None]

    def _count_failures(self, device: Device, codes: Iterable[int]) -> None:
        for code in codes:
            self.session.errors[(device.index, "nvmlDeviceGetFieldValues", code_name(code))] += 1
