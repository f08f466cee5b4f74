"""The simulated NVML, exercised only through pynvml, as the exporter uses it."""

from __future__ import annotations

import ctypes
import time
from collections.abc import Iterator
from pathlib import Path

import pynvml
import pytest
import yaml

from exporter import nvmlsim
from exporter.config import ConfigError
from exporter.nvmlsim.library import FUNCTIONS
from exporter.nvmlsim.scenario import build
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
])
def test_scenario_errors_name_the_key(change: dict, message: str) -> None:
    data = node()
    data["gpus"][1].update(change)
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        build(data, FUNCTIONS)


def test_shipped_scenarios_load() -> None:
    names = sorted(p.stem for p in Path(nvmlsim.example("healthy-h100")).parent.glob("*.yaml"))
    assert names == ["fell-off-bus", "gpu122-uncorrectable-steps", "gpu124-correctable-acceleration",
                     "healthy-h100"]
    for name in names:
        scenario = nvmlsim.load(nvmlsim.example(name))
        assert len(scenario.gpus) == 8
        assert yaml.safe_load(nvmlsim.example(name).read_text())["description"]
