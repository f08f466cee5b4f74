"""A simulated libnvidia-ml: C-callable functions that pynvml calls as if it were the driver's library.

Each function is a ctypes callback with the C signature from nvml.h, so pynvml's own
argument marshalling, structs, return-code checks and error classes run for real.
Results are written through the pointers pynvml passes, laid out as nvml.h declares
them (our own structures, not pynvml's, so a layout mismatch would show). The
behaviour follows the driver's: calls before nvmlInit return UNINITIALIZED, bad
handles and short buffers INVALID_ARGUMENT / INSUFFICIENT_SIZE, a lost GPU
GPU_IS_LOST on every call, functions a driver lacks are simply not there.
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections import Counter
from collections.abc import Callable
from ctypes import (
    c_char,
    c_double,
    c_int,
    c_longlong,
    c_ubyte,
    c_uint,
    c_ulong,
    c_ulonglong,
    c_ushort,
    c_void_p,
)
from typing import Any

import pynvml

from gpunode_exporter.nvmlsim.scenario import EVENT_TIMES, GPU, NVLINK_COUNTERS, POLICIES, Scenario

SUCCESS = pynvml.NVML_SUCCESS
E = pynvml  # error codes: E.NVML_ERROR_*


class _PciInfo(ctypes.Structure):  # nvmlPciInfo_t (nvml.h, v3)
    _fields_ = (("busIdLegacy", c_char * 16), ("domain", c_uint), ("bus", c_uint), ("device", c_uint),
                ("pciDeviceId", c_uint), ("pciSubSystemId", c_uint), ("busId", c_char * 32))


class _Histogram(ctypes.Structure):  # nvmlRowRemapperHistogramValues_t
    _fields_ = (("max", c_uint), ("high", c_uint), ("partial", c_uint), ("low", c_uint), ("none", c_uint))


class _Value(ctypes.Union):  # nvmlValue_t
    _fields_ = (("dVal", c_double), ("siVal", c_int), ("uiVal", c_uint), ("ulVal", c_ulong),
                ("ullVal", c_ulonglong), ("sllVal", c_longlong), ("usVal", c_ushort))


class _FieldValue(ctypes.Structure):  # nvmlFieldValue_t; the two enums (valueType, nvmlReturn) are ints
    _fields_ = (("fieldId", c_uint), ("scopeId", c_uint), ("timestamp", c_longlong), ("latencyUsec", c_longlong),
                ("valueType", c_int), ("nvmlReturn", c_int), ("value", _Value))


class _ViolationTime(ctypes.Structure):  # nvmlViolationTime_t
    _fields_ = (("referenceTime", c_ulonglong), ("violationTime", c_ulonglong))


class _EventData(ctypes.Structure):  # nvmlEventData_t
    _fields_ = (("device", c_void_p), ("eventType", c_ulonglong), ("eventData", c_ulonglong),
                ("gpuInstanceId", c_uint), ("computeInstanceId", c_uint))


class _FabricInfo(ctypes.Structure):  # nvmlGpuFabricInfo_t; nvmlGpuFabricState_t is an unsigned char
    _fields_ = (("clusterUuid", c_ubyte * 16), ("status", c_int), ("cliqueId", c_uint), ("state", c_ubyte))


class _FabricInfoV2(ctypes.Structure):  # nvmlGpuFabricInfo_v2_t
    _fields_ = (("version", c_uint), ("clusterUuid", c_ubyte * 16), ("status", c_int), ("cliqueId", c_uint),
                ("state", c_ubyte), ("healthMask", c_uint))


class _FabricInfoV3(ctypes.Structure):  # nvmlGpuFabricInfo_v3_t
    _fields_ = (*_FabricInfoV2._fields_, ("healthSummary", c_ubyte))


def _struct_version(struct: type[ctypes.Structure], version: int) -> int:
    """nvml.h's NVML_STRUCT_VERSION: sizeof(struct) | version << 24."""
    return ctypes.sizeof(struct) | version << 24


def _fill_fabric(info: Any, fabric: Any, t: float) -> Any:
    """The fields every version of the fabric struct has, at simulated time t; the struct back."""
    info.clusterUuid[:] = fabric.cluster_uuid
    info.status, info.cliqueId, info.state = fabric.status.at(t), fabric.clique_id, fabric.state.at(t)
    return info


# nvmlGpuFabricInfo_v2 (0x02000024), nvmlGpuFabricInfo_v3 (0x03000028) -> (struct, version number)
_FABRIC_VERSIONS = {_struct_version(_FabricInfoV2, 2): (_FabricInfoV2, 2),
                    _struct_version(_FabricInfoV3, 3): (_FabricInfoV3, 3)}


_P, _U = c_void_p, c_uint
# Argument types per function, from nvml.h. Handles and out-pointers are void*.
SIGNATURES: dict[str, tuple[Any, ...]] = {
    "nvmlInitWithFlags": (_U,),
    "nvmlInit_v2": (),
    "nvmlShutdown": (),
    "nvmlSystemGetDriverVersion": (_P, _U),
    "nvmlDeviceGetCount_v2": (_P,),
    "nvmlDeviceGetHandleByIndex_v2": (_U, _P),
    "nvmlDeviceGetUUID": (_P, _P, _U),
    "nvmlDeviceGetName": (_P, _P, _U),
    "nvmlDeviceGetSerial": (_P, _P, _U),
    "nvmlDeviceGetPciInfo_v3": (_P, _P),
    "nvmlDeviceGetMinorNumber": (_P, _P),
    "nvmlDeviceGetRemappedRows": (_P, _P, _P, _P, _P),
    "nvmlDeviceGetRowRemapperHistogram": (_P, _P),
    "nvmlDeviceGetCurrPcieLinkGeneration": (_P, _P),
    "nvmlDeviceGetMaxPcieLinkGeneration": (_P, _P),
    "nvmlDeviceGetCurrPcieLinkWidth": (_P, _P),
    "nvmlDeviceGetMaxPcieLinkWidth": (_P, _P),
    "nvmlDeviceGetCurrentClocksEventReasons": (_P, _P),
    "nvmlDeviceGetCurrentClocksThrottleReasons": (_P, _P),  # its name before driver R535, same values
    "nvmlDeviceGetSupportedClocksEventReasons": (_P, _P),
    "nvmlDeviceGetSupportedClocksThrottleReasons": (_P, _P),
    "nvmlDeviceGetViolationStatus": (_P, _U, _P),
    "nvmlDeviceGetFieldValues": (_P, c_int, _P),
    "nvmlDeviceGetPcieReplayCounter": (_P, _P),
    "nvmlDeviceGetGpuFabricInfo": (_P, _P),
    "nvmlDeviceGetGpuFabricInfoV": (_P, _P),
    "nvmlDeviceGetSupportedEventTypes": (_P, _P),
    "nvmlEventSetCreate": (_P,),
    "nvmlDeviceRegisterEvents": (_P, c_ulonglong, _P),
    "nvmlEventSetWait_v2": (_P, _P, _U),
    "nvmlEventSetFree": (_P,),
}
FUNCTIONS = frozenset(SIGNATURES)
_SUPPORTED_EVENTS = pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeGpuRecoveryAction

# nvmlDeviceGetFieldValues: the field ids simulated (nvml.h's NVML_FI_DEV_*, numbers as there), and
# nvmlValueType_t. Any other field id answers NOT_SUPPORTED in its own nvmlReturn.
_FI_PERF_POLICY = 74  # + nvmlPerfPolicyType_t (0 power .. 5 reliability): violation time in ns
_FI_EVENT_TIME = 269  # + EVENT_TIMES' index: time in SW thermal, HW thermal, HW power brake slowdown, in ns
_FI_NVLINK_LINK_COUNT, _FI_PCIE_REPLAY_COUNTER, _FI_NVLINK_GET_STATE = 91, 94, 165
# Per link (scopeId): the DL counters, which Blackwell answers NOT_SUPPORTED, and NVLink 5's replacement.
_FI_NVLINK_COUNTER = {161: ("legacy", "replay"), 162: ("legacy", "recovery"), 163: ("legacy", "crc"),
                      215: ("nvlink5", "recovery")}  # 215: NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_EVENTS
_UINT, _ULL = 1, 3  # NVML_VALUE_TYPE_UNSIGNED_INT, _UNSIGNED_LONG_LONG
_VALUE_MEMBER = {_UINT: "uiVal", _ULL: "ullVal"}
assert all(counter in NVLINK_COUNTERS[kind] for kind, counter in _FI_NVLINK_COUNTER.values())


class _NVMLReturn(Exception):  # noqa: N818 - a return code, not an error of ours
    """Raised inside a simulated call to return an NVML error code."""

    def __init__(self, code: int) -> None:
        self.code = code


class _EventSet:
    def __init__(self) -> None:
        self.registered: dict[int, int] = {}  # gpu index -> event type mask
        self.delivered: set[tuple[int, int, int]] = set()  # (gpu index, event type, event number)


class SimulatedNVML:
    """Stands in for the loaded libnvidia-ml.so.1 (pynvml's nvmlLib)."""

    def __init__(self, scenario: Scenario, clock: Callable[[], float] | None = None) -> None:
        self.scenario = scenario
        if clock is None:
            origin = time.monotonic()
            clock = lambda: scenario.start + (time.monotonic() - origin) * scenario.speedup  # noqa: E731
        self.clock = clock
        self.calls: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._init_count = 0
        # Opaque handles are real addresses, as the driver's are.
        self._handle_memory = [ctypes.create_string_buffer(8) for _ in scenario.gpus]
        self._handles = {ctypes.addressof(b): i for i, b in enumerate(self._handle_memory)}
        # Per GPU, the last nvmlDeviceGetFieldValues answer: (t, request, answer). The same request at
        # the same simulated time gets the same answer, computed once (a clock standing still, as in
        # the benchmark, costs a copy, not the Python that builds it).
        self._field_answers: dict[int, tuple[float, bytes, bytes]] = {}
        self._event_sets: dict[int, _EventSet] = {}
        self._event_memory: dict[int, Any] = {}
        self._callbacks = {}
        for name, argtypes in SIGNATURES.items():
            if name in scenario.missing_functions:
                continue  # an older driver: pynvml gets AttributeError -> FUNCTION_NOT_FOUND
            callback = ctypes.CFUNCTYPE(c_int, *argtypes)(self._entry(name, getattr(self, "_" + name)))
            self._callbacks[name] = callback
            setattr(self, name, callback)

    def now(self) -> float:
        return self.clock()

    def _entry(self, name: str, impl: Callable[..., None]) -> Callable[..., int]:
        node_faults = self.scenario.faults

        def call(*args: Any) -> int:
            self.calls[name] += 1
            try:
                if name not in ("nvmlInitWithFlags", "nvmlInit_v2") and self._init_count == 0:
                    return E.NVML_ERROR_UNINITIALIZED
                t = self.now()
                for fault in node_faults:
                    _apply(fault, name, t)
                impl(t, *args)
            except _NVMLReturn as fail:
                return fail.code
            return SUCCESS
        return call

    # --- helpers -------------------------------------------------------------

    def _gpu(self, handle: int | None, name: str, t: float) -> tuple[int, GPU]:
        index = self._handles.get(handle or 0)
        if index is None:
            raise _NVMLReturn(E.NVML_ERROR_INVALID_ARGUMENT)
        gpu = self.scenario.gpus[index]
        if gpu.lost(t):
            raise _NVMLReturn(E.NVML_ERROR_GPU_IS_LOST)
        for fault in gpu.faults:
            _apply(fault, name, t)
        return index, gpu

    # --- init -----------------------------------------------------------------

    def _nvmlInitWithFlags(self, t: float, flags: int) -> None:  # noqa: N802 - C names
        if self.scenario.init_error is not None:
            raise _NVMLReturn(self.scenario.init_error)
        with self._lock:
            self._init_count += 1

    def _nvmlInit_v2(self, t: float) -> None:  # noqa: N802
        self._nvmlInitWithFlags(t, 0)

    def _nvmlShutdown(self, t: float) -> None:  # noqa: N802
        with self._lock:
            self._init_count -= 1

    # --- system and enumeration ---------------------------------------------

    def _nvmlSystemGetDriverVersion(self, t: float, buf: int | None, length: int) -> None:  # noqa: N802
        _put_string(buf, length, self.scenario.driver_version)

    def _nvmlDeviceGetCount_v2(self, t: float, out: int | None) -> None:  # noqa: N802
        _put_uint(out, len(self.scenario.gpus))

    def _nvmlDeviceGetHandleByIndex_v2(self, t: float, index: int, out: int | None) -> None:  # noqa: N802
        if index >= len(self.scenario.gpus) or not out:
            raise _NVMLReturn(E.NVML_ERROR_INVALID_ARGUMENT)
        gpu = self.scenario.gpus[index]
        if gpu.lost(t):
            raise _NVMLReturn(E.NVML_ERROR_GPU_IS_LOST)
        for fault in gpu.faults:
            _apply(fault, "nvmlDeviceGetHandleByIndex_v2", t)
        c_void_p.from_address(out).value = ctypes.addressof(self._handle_memory[index])

    # --- static facts ---------------------------------------------------------

    def _nvmlDeviceGetUUID(self, t: float, handle: int | None, buf: int | None, length: int) -> None:  # noqa: N802
        _put_string(buf, length, self._gpu(handle, "nvmlDeviceGetUUID", t)[1].uuid)

    def _nvmlDeviceGetName(self, t: float, handle: int | None, buf: int | None, length: int) -> None:  # noqa: N802
        _put_string(buf, length, self._gpu(handle, "nvmlDeviceGetName", t)[1].name)

    def _nvmlDeviceGetSerial(self, t: float, handle: int | None, buf: int | None, length: int) -> None:  # noqa: N802
        _put_string(buf, length, self._gpu(handle, "nvmlDeviceGetSerial", t)[1].serial)

    def _nvmlDeviceGetPciInfo_v3(self, t: float, handle: int | None, out: int | None) -> None:  # noqa: N802
        gpu = self._gpu(handle, "nvmlDeviceGetPciInfo_v3", t)[1]
        info = _PciInfo.from_address(_pointer(out))
        domain, bus, rest = gpu.pci_bus_id.split(":")
        info.domain, info.bus, info.device = int(domain, 16), int(bus, 16), int(rest.split(".")[0], 16)
        info.pciDeviceId, info.pciSubSystemId = gpu.pci_device_id, gpu.pci_subsystem_id
        info.busId = gpu.pci_bus_id.encode()
        info.busIdLegacy = gpu.pci_bus_id[4:].encode()  # the legacy 16-byte field has a 4-digit domain

    def _nvmlDeviceGetMinorNumber(self, t: float, handle: int | None, out: int | None) -> None:  # noqa: N802
        _put_uint(out, self._gpu(handle, "nvmlDeviceGetMinorNumber", t)[1].minor)

    # --- dynamic values -------------------------------------------------------

    def _nvmlDeviceGetRemappedRows(self, t: float, handle: int | None, corr: int | None,  # noqa: N802
                                   unc: int | None, pending: int | None, failure: int | None) -> None:
        gpu = self._gpu(handle, "nvmlDeviceGetRemappedRows", t)[1]
        c, u = gpu.remapped(t)
        values = (c, u, gpu.remap_pending(t), int(gpu.failure.at(t)))
        for out, value in zip((corr, unc, pending, failure), values, strict=True):
            _put_uint(out, value)

    def _nvmlDeviceGetRowRemapperHistogram(self, t: float, handle: int | None, out: int | None) -> None:  # noqa: N802
        gpu = self._gpu(handle, "nvmlDeviceGetRowRemapperHistogram", t)[1]
        hist = _Histogram.from_address(_pointer(out))
        hist.max, hist.high, hist.partial, hist.low, hist.none = gpu.remap_histogram(t)

    def _pcie(self, name: str, t: float, handle: int | None, out: int | None, pick: Callable[[GPU], Any]) -> None:
        gpu = self._gpu(handle, name, t)[1]
        _put_uint(out, int(pick(gpu).at(t)))

    def _nvmlDeviceGetCurrPcieLinkGeneration(self, t: float, h: int | None, out: int | None) -> None:  # noqa: N802
        self._pcie("nvmlDeviceGetCurrPcieLinkGeneration", t, h, out, lambda g: g.pcie_generation[0])

    def _nvmlDeviceGetMaxPcieLinkGeneration(self, t: float, h: int | None, out: int | None) -> None:  # noqa: N802
        self._pcie("nvmlDeviceGetMaxPcieLinkGeneration", t, h, out, lambda g: g.pcie_generation[1])

    def _nvmlDeviceGetCurrPcieLinkWidth(self, t: float, h: int | None, out: int | None) -> None:  # noqa: N802
        self._pcie("nvmlDeviceGetCurrPcieLinkWidth", t, h, out, lambda g: g.pcie_width[0])

    def _nvmlDeviceGetMaxPcieLinkWidth(self, t: float, h: int | None, out: int | None) -> None:  # noqa: N802
        self._pcie("nvmlDeviceGetMaxPcieLinkWidth", t, h, out, lambda g: g.pcie_width[1])

    def _nvmlDeviceGetPcieReplayCounter(self, t: float, handle: int | None, out: int | None) -> None:  # noqa: N802
        _put_uint(out, int(self._gpu(handle, "nvmlDeviceGetPcieReplayCounter", t)[1].pcie_replays.at(t)))

    # --- clocks ---------------------------------------------------------------

    def _reasons(self, name: str, t: float, handle: int | None, out: int | None, supported: bool) -> None:
        gpu = self._gpu(handle, name, t)[1]
        mask = gpu.clock_supported if supported else gpu.clock_active.at(t) & gpu.clock_supported
        c_ulonglong.from_address(_pointer(out)).value = mask

    def _nvmlDeviceGetCurrentClocksEventReasons(self, t: float, h: int | None, out: int | None) -> None:  # noqa: N802
        self._reasons("nvmlDeviceGetCurrentClocksEventReasons", t, h, out, supported=False)

    def _nvmlDeviceGetCurrentClocksThrottleReasons(self, t: float, h: int | None, out: int | None) -> None:  # noqa: N802
        self._reasons("nvmlDeviceGetCurrentClocksThrottleReasons", t, h, out, supported=False)

    def _nvmlDeviceGetSupportedClocksEventReasons(self, t: float, h: int | None, out: int | None) -> None:  # noqa: N802
        self._reasons("nvmlDeviceGetSupportedClocksEventReasons", t, h, out, supported=True)

    def _nvmlDeviceGetSupportedClocksThrottleReasons(self, t: float, h: int | None, out: int | None) -> None:  # noqa: N802
        self._reasons("nvmlDeviceGetSupportedClocksThrottleReasons", t, h, out, supported=True)

    def _nvmlDeviceGetViolationStatus(self, t: float, handle: int | None, policy: int,  # noqa: N802
                                      out: int | None) -> None:
        gpu = self._gpu(handle, "nvmlDeviceGetViolationStatus", t)[1]
        if policy >= len(POLICIES):  # TOTAL_APP_CLOCKS (10) and TOTAL_BASE_CLOCKS (11) are not simulated
            raise _NVMLReturn(E.NVML_ERROR_NOT_SUPPORTED if policy in (10, 11) else E.NVML_ERROR_INVALID_ARGUMENT)
        violation = _ViolationTime.from_address(_pointer(out))
        violation.referenceTime = time.time_ns() // 1000
        violation.violationTime = gpu.violation_ns(POLICIES[policy], t)

    # --- field values ---------------------------------------------------------

    def _nvmlDeviceGetFieldValues(self, t: float, handle: int | None, count: int,  # noqa: N802
                                  values: int | None) -> None:
        """Every field gets its own nvmlReturn; the call itself succeeds (as the driver's does)."""
        index, gpu = self._gpu(handle, "nvmlDeviceGetFieldValues", t)
        if count < 0:
            raise _NVMLReturn(E.NVML_ERROR_INVALID_ARGUMENT)
        size = count * ctypes.sizeof(_FieldValue)
        request = ctypes.string_at(_pointer(values), size)
        last = self._field_answers.get(index)
        if last is not None and last[0] == t and last[1] == request:
            ctypes.memmove(values, last[2], size)
            return
        stamp = time.time_ns() // 1000
        for entry in (_FieldValue * count).from_address(values):
            code, value_type, value = self._field(gpu, entry.fieldId, entry.scopeId, t)
            entry.timestamp, entry.latencyUsec, entry.nvmlReturn = stamp, 0, code
            if code == SUCCESS:
                entry.valueType = value_type
                setattr(entry.value, _VALUE_MEMBER[value_type], value)
        self._field_answers[index] = (t, request, ctypes.string_at(values, size))

    def _field(self, gpu: GPU, field_id: int, scope: int, t: float) -> tuple[int, int, int]:
        """(nvmlReturn, valueType, value) of one field."""
        for fault in gpu.faults:
            if fault.hits_field(field_id, scope, t):
                return fault.error or 0, 0, 0
        if _FI_PERF_POLICY <= field_id < _FI_PERF_POLICY + len(POLICIES):
            return SUCCESS, _ULL, gpu.violation_ns(POLICIES[field_id - _FI_PERF_POLICY], t)
        if _FI_EVENT_TIME <= field_id < _FI_EVENT_TIME + len(EVENT_TIMES):
            return SUCCESS, _ULL, gpu.event_ns(EVENT_TIMES[field_id - _FI_EVENT_TIME], t)
        if field_id == _FI_PCIE_REPLAY_COUNTER:
            return SUCCESS, _UINT, int(gpu.pcie_replays.at(t))
        links = gpu.nvlink_links
        if field_id == _FI_NVLINK_LINK_COUNT:
            return (SUCCESS, _UINT, links) if links else (E.NVML_ERROR_NOT_SUPPORTED, 0, 0)
        if field_id != _FI_NVLINK_GET_STATE and field_id not in _FI_NVLINK_COUNTER:
            return E.NVML_ERROR_NOT_SUPPORTED, 0, 0
        if not links:
            return E.NVML_ERROR_NOT_SUPPORTED, 0, 0
        if scope >= links:  # as the driver answers a link index past the GPU's links
            return E.NVML_ERROR_INVALID_ARGUMENT, 0, 0
        if field_id == _FI_NVLINK_GET_STATE:
            return SUCCESS, _UINT, gpu.link_state(scope, t)
        kind, counter = _FI_NVLINK_COUNTER[field_id]
        if kind != gpu.nvlink_counters:
            return E.NVML_ERROR_NOT_SUPPORTED, 0, 0
        return SUCCESS, _ULL, gpu.link_errors(scope, counter, t)

    # --- the NVLink fabric -----------------------------------------------------

    def _fabric_of(self, name: str, t: float, handle: int | None) -> Any:
        fabric = self._gpu(handle, name, t)[1].fabric
        if fabric is None:
            raise _NVMLReturn(E.NVML_ERROR_NOT_SUPPORTED)
        return fabric

    def _nvmlDeviceGetGpuFabricInfo(self, t: float, handle: int | None, out: int | None) -> None:  # noqa: N802
        fabric = self._fabric_of("nvmlDeviceGetGpuFabricInfo", t, handle)
        _fill_fabric(_FabricInfo.from_address(_pointer(out)), fabric, t)

    def _nvmlDeviceGetGpuFabricInfoV(self, t: float, handle: int | None, out: int | None) -> None:  # noqa: N802
        """The version field picks the struct; one newer than the driver knows is a mismatch, as NVML answers."""
        fabric = self._fabric_of("nvmlDeviceGetGpuFabricInfoV", t, handle)
        known = _FABRIC_VERSIONS.get(c_uint.from_address(_pointer(out)).value)
        if known is None or known[1] > self.scenario.fabric_info_version:
            raise _NVMLReturn(E.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        struct, version = known
        info = _fill_fabric(struct.from_address(out), fabric, t)
        info.healthMask = fabric.health.at(t)
        if version >= 3:
            info.healthSummary = fabric.health_summary(t)

    # --- events (Xid) ---------------------------------------------------------

    def _nvmlDeviceGetSupportedEventTypes(self, t: float, handle: int | None, out: int | None) -> None:  # noqa: N802
        self._gpu(handle, "nvmlDeviceGetSupportedEventTypes", t)
        c_ulonglong.from_address(_pointer(out)).value = _SUPPORTED_EVENTS

    def _nvmlEventSetCreate(self, t: float, out: int | None) -> None:  # noqa: N802
        memory = ctypes.create_string_buffer(8)
        with self._lock:
            self._event_sets[ctypes.addressof(memory)] = _EventSet()
            self._event_memory[ctypes.addressof(memory)] = memory
        c_void_p.from_address(_pointer(out)).value = ctypes.addressof(memory)

    def _event_set(self, handle: int | None) -> _EventSet:
        event_set = self._event_sets.get(handle or 0)
        if event_set is None:
            raise _NVMLReturn(E.NVML_ERROR_INVALID_ARGUMENT)
        return event_set

    def _nvmlDeviceRegisterEvents(self, t: float, handle: int | None, types: int,  # noqa: N802
                                  event_set: int | None) -> None:
        index, _ = self._gpu(handle, "nvmlDeviceRegisterEvents", t)
        if types & ~_SUPPORTED_EVENTS:
            raise _NVMLReturn(E.NVML_ERROR_NOT_SUPPORTED)
        with self._lock:
            registered = self._event_set(event_set).registered
            registered[index] = registered.get(index, 0) | types

    def _nvmlEventSetWait_v2(self, t: float, event_set: int | None, out: int | None,  # noqa: N802
                             timeout_ms: int) -> None:
        """Returns the oldest undelivered event (Xid, recovery action) whose time has come; waits (real
        time) up to timeout_ms."""
        es = self._event_set(event_set)
        data = _EventData.from_address(_pointer(out))
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            now = self.now()
            with self._lock:
                due = []
                for index, mask in es.registered.items():
                    gpu = self.scenario.gpus[index]
                    kinds = ((pynvml.nvmlEventTypeXidCriticalError, [(e.at, e.xid) for e in gpu.xids]),
                             (pynvml.nvmlEventTypeGpuRecoveryAction,
                              [(e.at, e.action) for e in gpu.recovery_actions]))
                    for kind, events in kinds:
                        if mask & kind:
                            due += [(at, index, kind, n, value) for n, (at, value) in enumerate(events)
                                    if at <= now and (index, kind, n) not in es.delivered]
                if due:
                    _, index, kind, n, value = min(due)
                    es.delivered.add((index, kind, n))
                    data.device = ctypes.addressof(self._handle_memory[index])
                    data.eventType = kind
                    data.eventData = value
                    data.gpuInstanceId = data.computeInstanceId = 0xFFFFFFFF
                    return
            if time.monotonic() >= deadline:
                raise _NVMLReturn(E.NVML_ERROR_TIMEOUT)
            time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))

    def _nvmlEventSetFree(self, t: float, event_set: int | None) -> None:  # noqa: N802
        with self._lock:
            self._event_set(event_set)
            self._event_sets.pop(event_set or 0)
            self._event_memory.pop(event_set or 0)


def _apply(fault: Any, function: str, t: float) -> None:
    if not fault.active(function, t):
        return
    if fault.hang_seconds:
        time.sleep(fault.hang_seconds)
    if fault.error is not None:
        raise _NVMLReturn(fault.error)


def _pointer(address: int | None) -> int:
    if not address:
        raise _NVMLReturn(E.NVML_ERROR_INVALID_ARGUMENT)
    return address


def _put_uint(address: int | None, value: int) -> None:
    c_uint.from_address(_pointer(address)).value = value


def _put_string(address: int | None, length: int, value: str) -> None:
    data = value.encode() + b"\0"
    if len(data) > length:
        raise _NVMLReturn(E.NVML_ERROR_INSUFFICIENT_SIZE)
    ctypes.memmove(_pointer(address), data, len(data))
