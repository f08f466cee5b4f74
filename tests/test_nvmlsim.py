"""The simulated NVML, exercised only through pynvml, as the exporter uses it."""

from __future__ import annotations

import ctypes
import time
from collections.abc import Iterator
from pathlib import Path

import pynvml
import pytest
import yaml

from gpunode_common.config import ConfigError
from gpunode_exporter import nvmlsim
from gpunode_exporter.nvmlsim import library
from gpunode_exporter.nvmlsim.library import FUNCTIONS
from gpunode_exporter.nvmlsim.scenario import build
from tests.helpers import SimClock, simulated_nvml

UUID = "GPU-00000000-0000-0000-0000-0000000000{:02x}"


def node(**gpu: object) -> dict:
    """A two-GPU node; keyword arguments go to GPU 1."""
    return {"gpus": [{"uuid": UUID.format(0), "pci_bus_id": "00000000:18:00.0"},
                     {"uuid": UUID.format(1), "pci_bus_id": "00000000:2A:00.0", **gpu}]}


@pytest.fixture
def clock() -> SimClock:
    return SimClock()


@pytest.fixture
def nvml(clock: SimClock, request: pytest.FixtureRequest) -> Iterator[nvmlsim.SimulatedNVML]:
    """Scenario from @pytest.mark.scenario(dict), installed and initialised."""
    marker = request.node.get_closest_marker("scenario")
    data = marker.args[0] if marker else node()
    with simulated_nvml(data, clock) as library:
        pynvml.nvmlInit()
        yield library


def test_static_facts_reach_pynvml_structs(nvml: nvmlsim.SimulatedNVML) -> None:
    assert pynvml.nvmlSystemGetDriverVersion() == "550.54.15"
    assert pynvml.nvmlDeviceGetCount() == 2
    h = pynvml.nvmlDeviceGetHandleByIndex(1)
    assert pynvml.nvmlDeviceGetUUID(h) == UUID.format(1)
    assert pynvml.nvmlDeviceGetName(h) == "NVIDIA H100 80GB HBM3"
    info = pynvml.nvmlDeviceGetPciInfo(h)
    assert (info.busId, info.busIdLegacy) == ("00000000:2A:00.0", "0000:2A:00.0")
    assert (info.domain, info.bus, info.device, info.pciDeviceId) == (0, 0x2A, 0, 0x233010DE)
    # Handles are stable opaque pointers, distinct per GPU.
    assert ctypes.addressof(h.contents) == ctypes.addressof(pynvml.nvmlDeviceGetHandleByIndex(1).contents)
    assert ctypes.addressof(h.contents) != ctypes.addressof(pynvml.nvmlDeviceGetHandleByIndex(0).contents)


def test_driver_return_codes(nvml: nvmlsim.SimulatedNVML) -> None:
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetHandleByIndex(2)
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):  # not simulated: as an older driver
        pynvml.nvmlDeviceGetPowerUsage(pynvml.nvmlDeviceGetHandleByIndex(0))
    short = ctypes.create_string_buffer(8)
    fn = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetUUID")
    assert fn(pynvml.nvmlDeviceGetHandleByIndex(0), short, ctypes.c_uint(8)) == pynvml.NVML_ERROR_INSUFFICIENT_SIZE
    bogus = ctypes.cast(ctypes.create_string_buffer(8), pynvml.c_nvmlDevice_t)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetUUID(bogus)
    pynvml.nvmlShutdown()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlDeviceGetCount()


@pytest.mark.scenario(node(remapped_rows={"uncorrectable": [[0, 0], ["1h", 1], ["2h", 3]],
                                          "correctable": {"linear": [[0, 0], ["10h", 100]]}},
                           resets=["90m"], pcie={"generation": {"current": [[0, 5], ["3h", 3]]}}))
def test_timelines_step_and_ramp(nvml: nvmlsim.SimulatedNVML, clock: SimClock) -> None:
    h = pynvml.nvmlDeviceGetHandleByIndex(1)
    expected = {  # t: (correctable, uncorrectable, pending, failure), current generation
        0: ((0, 0, 0, 0), 5),
        3599: ((9, 0, 1, 0), 5),  # remaps since start: pending until the next reset
        3600: ((10, 1, 1, 0), 5),
        5400: ((15, 1, 0, 0), 5),  # the reset at 90 min applied them
        5759: ((15, 1, 0, 0), 5),
        5760: ((16, 1, 1, 0), 5),  # a correctable remap since the reset
        7200: ((20, 3, 1, 0), 5),
        3 * 3600: ((30, 3, 1, 0), 3),
    }
    for t, (rows, generation) in expected.items():
        clock.t = t
        assert pynvml.nvmlDeviceGetRemappedRows(h) == rows, t
        assert pynvml.nvmlDeviceGetCurrPcieLinkGeneration(h) == generation, t
    hist = pynvml.nvmlDeviceGetRowRemapperHistogram(h)
    # Derived: each remapped row took one spare row of its own bank (as nvidia-smi shows
    # Max 639 / High 1 on an A100 after one remap).
    assert (hist.max, hist.high, hist.partial, hist.low, hist.none) == (2560 - 33, 33, 0, 0, 0)


@pytest.mark.scenario(node(histogram=[[0, {"max": 10}], ["1h", {"max": 8, "low": 1, "none": 1}]],
                           failure=[[0, 0], ["1h", 1]], pending=1))
def test_explicit_histogram_failure_pending(nvml: nvmlsim.SimulatedNVML, clock: SimClock) -> None:
    h = pynvml.nvmlDeviceGetHandleByIndex(1)
    clock.t = 3600
    hist = pynvml.nvmlDeviceGetRowRemapperHistogram(h)
    assert (hist.max, hist.high, hist.partial, hist.low, hist.none) == (8, 0, 0, 1, 1)
    assert pynvml.nvmlDeviceGetRemappedRows(h) == (0, 0, 1, 1)


@pytest.mark.scenario(node(lost_at="10m"))
def test_lost_gpu(nvml: nvmlsim.SimulatedNVML, clock: SimClock) -> None:
    h = pynvml.nvmlDeviceGetHandleByIndex(1)
    assert pynvml.nvmlDeviceGetRemappedRows(h) == (0, 0, 0, 0)
    clock.t = 600
    for call in (pynvml.nvmlDeviceGetRemappedRows, pynvml.nvmlDeviceGetUUID, pynvml.nvmlDeviceGetMaxPcieLinkWidth):
        with pytest.raises(pynvml.NVMLError_GpuIsLost):
            call(h)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceGetHandleByIndex(1)
    assert pynvml.nvmlDeviceGetCount() == 2  # the driver still enumerates it
    assert pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(0)) == UUID.format(0)


@pytest.mark.scenario(node(errors=[
    {"function": "nvmlDeviceGetRowRemapperHistogram", "error": "NOT_SUPPORTED"},
    {"function": "nvmlDeviceGetRemappedRows", "error": "UNKNOWN", "from": "1h", "until": "2h"},
    {"function": "nvmlDeviceGetCurrPcieLinkWidth", "hang_seconds": 0.3}]))
def test_injected_errors_and_hangs(nvml: nvmlsim.SimulatedNVML, clock: SimClock) -> None:
    h = pynvml.nvmlDeviceGetHandleByIndex(1)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetRowRemapperHistogram(h)
    pynvml.nvmlDeviceGetRowRemapperHistogram(pynvml.nvmlDeviceGetHandleByIndex(0))  # other GPU fine
    pynvml.nvmlDeviceGetRemappedRows(h)
    clock.t = 3600
    with pytest.raises(pynvml.NVMLError_Unknown):
        pynvml.nvmlDeviceGetRemappedRows(h)
    clock.t = 7200
    pynvml.nvmlDeviceGetRemappedRows(h)
    started = time.monotonic()
    assert pynvml.nvmlDeviceGetCurrPcieLinkWidth(h) == 16
    assert time.monotonic() - started >= 0.3


def test_no_driver_and_old_driver(clock: SimClock) -> None:
    with simulated_nvml({**node(), "driver": {"init_error": "DRIVER_NOT_LOADED"}}, clock), \
            pytest.raises(pynvml.NVMLError_DriverNotLoaded):
        pynvml.nvmlInit()
    old = {**node(), "driver": {"missing_functions": ["nvmlDeviceGetRowRemapperHistogram"]}}
    with simulated_nvml(old, clock):
        pynvml.nvmlInit()
        with pytest.raises(pynvml.NVMLError_FunctionNotFound):
            pynvml.nvmlDeviceGetRowRemapperHistogram(pynvml.nvmlDeviceGetHandleByIndex(0))


@pytest.mark.scenario(node(xids=[{"at": "5m", "xid": 94}, {"at": "1m", "xid": 63}]))
def test_xid_events_in_order_once(nvml: nvmlsim.SimulatedNVML, clock: SimClock) -> None:
    h = pynvml.nvmlDeviceGetHandleByIndex(1)
    assert pynvml.nvmlDeviceGetSupportedEventTypes(h) & pynvml.nvmlEventTypeXidCriticalError
    events = pynvml.nvmlEventSetCreate()
    pynvml.nvmlDeviceRegisterEvents(h, pynvml.nvmlEventTypeXidCriticalError, events)
    with pytest.raises(pynvml.NVMLError_Timeout):
        pynvml.nvmlEventSetWait(events, 10)
    clock.t = 600
    got = [pynvml.nvmlEventSetWait(events, 10) for _ in range(2)]
    assert [(e.eventType, e.eventData) for e in got] == [(pynvml.nvmlEventTypeXidCriticalError, 63),
                                                         (pynvml.nvmlEventTypeXidCriticalError, 94)]
    assert pynvml.nvmlDeviceGetUUID(got[0].device) == UUID.format(1)
    with pytest.raises(pynvml.NVMLError_Timeout):
        pynvml.nvmlEventSetWait(events, 10)
    pynvml.nvmlEventSetFree(events)


@pytest.mark.parametrize(("change", "message"), [
    ({"colour": 1}, "gpus[1]: unknown key 'colour'"),
    ({"uuid": "GPU-XYZ"}, "gpus[1].uuid: want GPU-"),
    ({"pci_bus_id": "0000:2a:00.0"}, "gpus[1].pci_bus_id: want NVML's form"),
    ({"remapped_rows": {"correctable": [["2h", 1], ["1h", 2]]}}, "correctable[1]: times must increase"),
    ({"remapped_rows": {"correctable": -1}}, "want a whole number >= 0"),
    ({"lost_at": "3 days"}, "gpus[1].lost_at: want a duration"),
    ({"errors": [{"function": "nvmlFoo", "error": "UNKNOWN"}]}, "not a simulated NVML function"),
    ({"errors": [{"function": "nvmlDeviceGetUUID", "error": "OOPS"}]}, "unknown NVML error 'OOPS'"),
    ({"histogram": [[0, {"max": 10}], ["1h", {"max": 8}]]}, "every point must count the same number of banks"),
    ({"uuid": UUID.format(0)}, "two GPUs share a uuid"),
    ({"model": "h200"}, "gpus[1].model: want one of h100-sxm, b200"),
    ({"clock_events": {"active": ["hot"]}}, "gpus[1].clock_events.active: unknown clock event reason 'hot'"),
    ({"violations": {"thermal": -1}}, "gpus[1].violations.thermal: want a number >= 0"),
    ({"violations": {"heat": 1}}, "gpus[1].violations: unknown key 'heat'"),
    ({"clock_events": {"seconds": {"sw_power_cap": 1}}}, "gpus[1].clock_events.seconds: unknown key 'sw_power_cap'"),
    ({"violations": {"power": {"rate": [[0, 1]], "linear": []}}}, "a rate takes only the key 'rate'"),
    ({"nvlink": {"state": {18: "inactive"}}}, "gpus[1].nvlink.state.18: want a link number 0..17"),
    ({"nvlink": {"state": {2: "broken"}}}, "gpus[1].nvlink.state.2: want one of inactive, active, sleep"),
    ({"model": "b200", "nvlink": {"errors": {2: {"replay": 1}}}}, "gpus[1].nvlink.errors.2: unknown key 'replay'"),
    ({"nvlink": {"counters": "nvlink6"}}, "gpus[1].nvlink.counters: want one of legacy, nvlink5"),
    ({"errors": [{"function": "nvmlDeviceGetUUID", "field": 161, "error": "UNKNOWN"}]},
     "gpus[1].errors[0]: 'field'"),
])
def test_scenario_errors_name_the_key(change: dict, message: str) -> None:
    data = node()
    data["gpus"][1].update(change)
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        build(data, FUNCTIONS)


def test_shipped_scenarios_load() -> None:
    names = sorted(p.stem for p in Path(nvmlsim.example("healthy-h100")).parent.glob("*.yaml"))
    assert names == ["fabric-not-ready", "fabric-unhealthy", "fell-off-bus", "gpu122-uncorrectable-steps",
                     "gpu124-correctable-acceleration", "healthy-h100", "thermal-straggler-b200"]
    for name in names:
        scenario = nvmlsim.load(nvmlsim.example(name))
        assert len(scenario.gpus) == 8
        assert yaml.safe_load(nvmlsim.example(name).read_text())["description"]


# --- clocks, violation time, field values ------------------------------------------------------

FIELD_VALUE = [("fieldId", 0), ("scopeId", 4), ("timestamp", 8), ("latencyUsec", 16), ("valueType", 24),
               ("nvmlReturn", 28), ("value", 32)]  # nvml.h's nvmlFieldValue_t, 40 bytes


def test_field_value_layout_is_nvml_h_and_pynvml_agrees() -> None:
    for struct_type in (library._FieldValue, pynvml.c_nvmlFieldValue_t):
        assert [(name, getattr(struct_type, name).offset) for name, _ in FIELD_VALUE] == FIELD_VALUE
        assert ctypes.sizeof(struct_type) == 40
    assert ctypes.sizeof(library._ViolationTime) == ctypes.sizeof(pynvml.c_nvmlViolationTime_t) == 16


@pytest.mark.scenario(node(violations={"power": 2.5, "thermal": {"rate": [["10m", 0.5], ["20m", 0]]}},
                           clock_events={"seconds": {"hw_power_brake_slowdown": 1.25}}, pcie={"replays": 7},
                           nvlink={"state": {5: [[0, "active"], ["40m", "sleep"]]},
                                   "errors": {5: {"recovery": [[0, 0], ["30m", 3]], "crc": 2}}}))
def test_field_values_through_pynvmls_own_structures(nvml: nvmlsim.SimulatedNVML, clock: SimClock) -> None:
    h = pynvml.nvmlDeviceGetHandleByIndex(1)
    ask = [75, 74, 91, 94, (165, 5), (162, 5), (163, 5), (161, 0), (165, 17), (165, 18), (215, 5), 9999]
    clock.t = 45 * 60
    got = [(v.fieldId, v.scopeId, v.nvmlReturn, v.valueType) for v in pynvml.nvmlDeviceGetFieldValues(h, ask)]
    ok, ull, uint = pynvml.NVML_SUCCESS, pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
    unsupported, invalid = pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_INVALID_ARGUMENT
    assert got == [(75, 0, ok, ull), (74, 0, ok, ull), (91, 0, ok, uint), (94, 0, ok, uint), (165, 5, ok, uint),
                   (162, 5, ok, ull), (163, 5, ok, ull), (161, 0, ok, ull), (165, 17, ok, uint),
                   (165, 18, invalid, 0),  # past the GPU's 18 links
                   (215, 5, unsupported, 0),  # NVLink 5's counter, on an H100
                   (9999, 0, unsupported, 0)]  # a field this driver does not know
    values = pynvml.nvmlDeviceGetFieldValues(h, ask[:9])
    assert [values[i].value.ullVal for i in (0, 1, 5, 6, 7)] == [300 * 10 ** 9, 2500 * 10 ** 6, 3, 2, 0]
    assert [values[i].value.uiVal for i in (2, 3, 4, 8)] == [18, 7, pynvml.NVML_NVLINK_STATE_SLEEP,
                                                           pynvml.NVML_NVLINK_STATE_ACTIVE]
    assert all(v.timestamp > 1_600_000_000 * 10 ** 6 for v in values)  # microseconds since 1970
    # the time in each slowdown (269 SW thermal, 270 HW thermal, 271 HW power brake), in ns
    times = pynvml.nvmlDeviceGetFieldValues(h, [269, 270, 271])
    assert [(v.nvmlReturn, v.valueType, v.value.ullVal) for v in times] == [(ok, ull, 0), (ok, ull, 0),
                                                                              (ok, ull, 1_250_000_000)]
    # The same through the function nvml.h deprecates for these fields: nanoseconds in nvmlViolationTime_t.
    assert pynvml.nvmlDeviceGetViolationStatus(h, pynvml.NVML_PERF_POLICY_THERMAL).violationTime == 300 * 10 ** 9
    assert pynvml.nvmlDeviceGetViolationStatus(h, pynvml.NVML_PERF_POLICY_POWER).violationTime == 2500 * 10 ** 6
    assert pynvml.nvmlDeviceGetPcieReplayCounter(h) == 7


@pytest.mark.scenario(node(model="b200", nvlink={"errors": {3: {"recovery": 5}}},
                           errors=[{"function": "nvmlDeviceGetFieldValues", "field": 215, "link": 4,
                                    "error": "UNKNOWN", "from": "1h"}]))
def test_b200_answers_the_dl_counters_not_supported(nvml: nvmlsim.SimulatedNVML, clock: SimClock) -> None:
    h = pynvml.nvmlDeviceGetHandleByIndex(1)
    assert pynvml.nvmlDeviceGetName(h) == "NVIDIA B200"
    assert pynvml.nvmlDeviceGetPciInfo(h).pciDeviceId == 0x290110DE
    ask = [(161, 3), (162, 3), (163, 3), (215, 3), (215, 4), (91, 0)]

    def answers() -> list[tuple[int, int]]:
        return [(v.nvmlReturn, v.value.ullVal) for v in pynvml.nvmlDeviceGetFieldValues(h, ask)]

    unsupported = pynvml.NVML_ERROR_NOT_SUPPORTED
    assert answers() == [(unsupported, 0)] * 3 + [(0, 5), (0, 0), (0, 18)]
    clock.t = 3600  # a field failing while the call succeeds
    assert answers() == [(unsupported, 0)] * 3 + [(0, 5), (pynvml.NVML_ERROR_UNKNOWN, 0), (0, 18)]


@pytest.mark.scenario(node(lost_at="1m"))
def test_field_values_of_a_lost_gpu(nvml: nvmlsim.SimulatedNVML, clock: SimClock) -> None:
    h = pynvml.nvmlDeviceGetHandleByIndex(1)
    assert pynvml.nvmlDeviceGetFieldValues(h, [74])[0].nvmlReturn == pynvml.NVML_SUCCESS
    clock.t = 60
    with pytest.raises(pynvml.NVMLError_GpuIsLost):  # the whole call, as every call on a lost GPU
        pynvml.nvmlDeviceGetFieldValues(h, [74])


@pytest.mark.scenario(node(clock_events={"active": [[0, []], ["10m", ["hw_slowdown", "display_clock_setting"]],
                                                    ["20m", 0x60]],
                                         "supported": ["gpu_idle", "hw_slowdown", "sw_thermal_slowdown",
                                                       "hw_thermal_slowdown"]}))
def test_clocks_event_reasons(nvml: nvmlsim.SimulatedNVML, clock: SimClock) -> None:
    h = pynvml.nvmlDeviceGetHandleByIndex(1)
    functions = (pynvml.nvmlDeviceGetCurrentClocksEventReasons, pynvml.nvmlDeviceGetCurrentClocksThrottleReasons)
    seen = []
    for minute in (0, 10, 20):
        clock.t = minute * 60
        seen.append({fn(h) for fn in functions})
    # Only the reasons the GPU reports: display_clock_setting is not one of them.
    assert seen == [{0}, {pynvml.nvmlClocksEventReasonHwSlowdown},
                    {pynvml.nvmlClocksEventReasonSwThermalSlowdown | pynvml.nvmlClocksEventReasonHwThermalSlowdown}]
    assert pynvml.nvmlDeviceGetSupportedClocksEventReasons(h) == 0x1 | 0x8 | 0x20 | 0x40
    assert pynvml.nvmlDeviceGetSupportedClocksThrottleReasons(h) == 0x1 | 0x8 | 0x20 | 0x40
    assert pynvml.nvmlDeviceGetCurrentClocksEventReasons(pynvml.nvmlDeviceGetHandleByIndex(0)) == 0


def test_an_older_driver_has_the_old_names_only(clock: SimClock) -> None:
    old = {**node(clock_events={"active": ["sw_power_cap"]}),
           "driver": {"missing_functions": ["nvmlDeviceGetCurrentClocksEventReasons"]}}
    with simulated_nvml(old, clock):
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(1)
        with pytest.raises(pynvml.NVMLError_FunctionNotFound):
            pynvml.nvmlDeviceGetCurrentClocksEventReasons(h)
        assert pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(h) == pynvml.nvmlClocksThrottleReasonSwPowerCap


def test_counter_rates_and_a_clock_that_moves() -> None:
    data = node(violations={"thermal": {"rate": [["10m", 0.5], ["20m", 0], ["30m", 1]]}})
    thermal = build(data, FUNCTIONS).gpus[1].violations["thermal"]
    assert [thermal.at(m * 60) for m in (0, 10, 15, 20, 25, 30, 31)] == [0, 0, 150, 300, 300, 300, 360]


@pytest.mark.scenario(node(nvlink={"errors": {0: {"replay": {"linear": [[0, 0], ["1h", 3600]]}}}}))
def test_an_answer_is_reused_only_at_the_same_time(nvml: nvmlsim.SimulatedNVML, clock: SimClock) -> None:
    h = pynvml.nvmlDeviceGetHandleByIndex(1)
    replay = []
    for t in (10, 10, 20, 10):
        clock.t = t
        replay.append(pynvml.nvmlDeviceGetFieldValues(h, [(161, 0)])[0].value.ullVal)
    assert replay == [10, 10, 20, 10]
