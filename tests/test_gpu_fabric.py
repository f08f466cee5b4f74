"""The NVLink fabric: gpunode_gpu_fabric_state / _healthy from the simulated driver's
nvmlDeviceGetGpuFabricInfoV (or the old call), and NVSwitches on the PCI bus.

Every case is made in the scenario (the driver's side): never by patching our code.
"""

from __future__ import annotations

import ctypes
import shutil
from pathlib import Path
from typing import Any

import pynvml
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpunode_common.config import ConfigError
from gpunode_exporter import config, nvml
from gpunode_exporter.collector.base import Context
from gpunode_exporter.collector.gpu import GPUCollector
from gpunode_exporter.config import Config, GPUConfig
from gpunode_exporter.nvmlsim import library
from gpunode_exporter.nvmlsim import scenario as simscenario
from gpunode_exporter.nvmlsim.library import FUNCTIONS
from gpunode_exporter.nvmlsim.scenario import build
from gpunode_exporter.sysfs import pci
from tests.helpers import SimClock, simulated_nvml
from tests.test_gpu_collector import DGX, FIXTURES, collector, example, node, scrape, value

V, OLD = "nvmlDeviceGetGpuFabricInfoV", "nvmlDeviceGetGpuFabricInfo"
STATE, HEALTHY = "gpunode_gpu_fabric_state", "gpunode_gpu_fabric_healthy"


def fabric(series: dict, gpu: str) -> tuple[float | None, float | None]:
    return value(series, STATE, gpu=gpu), value(series, HEALTHY, gpu=gpu)


def errors(series: dict) -> dict[tuple, float]:
    return series.get("gpunode_nvml_errors_total", {})


def test_hgx_h100_fabric_completed_and_healthy() -> None:
    with simulated_nvml(example("healthy-h100"), SimClock()) as sim:
        c = collector()
        s = scrape(c)
        scrape(c)
    assert {dict(k)["gpu"]: v for k, v in s[STATE].items()} == {str(i): 3 for i in range(8)}
    assert set(s[HEALTHY].values()) == {1}
    assert set(s[STATE]) == set(s[HEALTHY])  # same {gpu, uuid}
    assert sim.calls[V] == 16 and sim.calls[OLD] == 0  # the V call, once per GPU and scrape
    assert not errors(s)


def test_fabric_comes_up_over_time() -> None:
    """Not started, in progress, completed: healthy only once completed (nvml.h: the status
    "must be checked only if Probe state returns complete")."""
    clock = SimClock()
    state = {"state": [[0, "not_started"], ["40s", "in_progress"], ["90s", "completed"]]}
    with simulated_nvml(node(fabric=state), clock):
        c = collector()
        seen = []
        for t in (0, 39, 40, 89, 90, 3600):
            clock.t = t
            seen.append(fabric(scrape(c), "1"))
    assert seen == [(1, 0), (1, 0), (2, 0), (2, 0), (3, 1), (3, 1)]


@pytest.mark.parametrize("problem", [*simscenario.FABRIC_FLAGS, "insufficient_nvlinks", "incorrect_sysguid"])
def test_a_health_mask_problem_makes_the_gpu_unhealthy(problem: str) -> None:
    with simulated_nvml(node(fabric={"health": [problem]}), SimClock()):
        s = scrape(collector())
    assert fabric(s, "1") == (3, 0)
    assert fabric(s, "0") == (3, 1)


def test_partition_and_fabric_manager_fields_are_not_judged() -> None:
    """partition_assigned FALSE (2 << 12) and gfm_state DISCONNECTED (2 << 14) are set beside a clean mask."""
    mask = simscenario.fabric_mask([]) | 2 << 12 | 2 << 14
    with simulated_nvml(node(fabric={"health": [[0, mask]]}), SimClock()):
        assert fabric(scrape(collector()), "1") == (3, 1)


def test_shipped_unhealthy_scenario() -> None:
    clock = SimClock()
    with simulated_nvml(example("fabric-unhealthy"), clock):
        c = collector()
        before = scrape(c)
        clock.t = 600
        after = scrape(c)
    assert set(before[HEALTHY].values()) == {1}
    assert {dict(k)["gpu"] for k, v in after[HEALTHY].items() if v == 0} == {"3"}
    assert set(after[STATE].values()) == {3}


def test_shipped_not_ready_scenario_never_completes() -> None:
    clock = SimClock()
    with simulated_nvml(example("fabric-not-ready"), clock):
        c = collector()
        states = []
        for t in (0, 60, 86400):
            clock.t = t
            s = scrape(c)
            states.append(set(s[STATE].values()))
            assert set(s[HEALTHY].values()) == {0}
    assert states == [{1}, {2}, {2}]


def test_probe_status_error_is_unhealthy() -> None:
    with simulated_nvml(node(fabric={"status": [[0, "SUCCESS"], ["1m", "UNKNOWN"]]}), SimClock(60)):
        s = scrape(collector())
    assert fabric(s, "1") == (3, 0)
    assert not errors(s)  # the probe's status is a value, not a failed call


def test_driver_with_v2_struct_only_is_asked_once_more_then_remembered() -> None:
    data = {**node(fabric={"health": ["route_recovery"]}), "driver": {"fabric_info_version": 2}}
    with simulated_nvml(data, SimClock()) as sim:
        c = collector()
        s = scrape(c)
        assert sim.calls[V] == 4  # v3: ARGUMENT_VERSION_MISMATCH, then v2, per GPU
        scrape(c)
        assert sim.calls[V] == 6  # v2 straight away
    assert fabric(s, "1") == (3, 0)  # the v2 struct carries the health mask
    assert fabric(s, "0") == (3, 1)
    assert not errors(s)


def test_driver_without_the_v_call_falls_back_to_the_old_one() -> None:
    """The old struct has no health mask: healthy follows state and status alone."""
    gpu = {"fabric": {"health": ["route_unhealthy"], "status": [[0, "SUCCESS"], ["1m", "TIMEOUT"]]}}
    clock = SimClock()
    with simulated_nvml({**node(**gpu), "driver": {"missing_functions": [V]}}, clock) as sim:
        c = collector()
        s = scrape(c)
        clock.t = 60
        later = scrape(c)
        assert sim.calls[OLD] == 4 and sim.calls[V] == 0
    assert fabric(s, "1") == (3, 1)
    assert fabric(later, "1") == (3, 0)
    assert not errors(s)


def test_driver_without_any_fabric_call() -> None:
    data = {**node(), "driver": {"missing_functions": [V, OLD]}}
    with simulated_nvml(data, SimClock()):
        c = collector()
        first, second = scrape(c), scrape(c)
    for s in (first, second):
        assert STATE not in s and HEALTHY not in s
        assert not errors(s)
    assert value(first, "gpunode_gpu_up", gpu="1") == 1


@pytest.mark.parametrize("gpu", [{"model": "l40s"}, {"fabric": "none"}])
def test_gpu_without_fabric_is_absent_and_not_asked_again(gpu: dict[str, Any]) -> None:
    with simulated_nvml(node(**gpu), SimClock()) as sim:
        c = collector()
        s = scrape(c)
        for _ in range(3):
            scrape(c)
        # GPU 0: V each scrape; GPU 1: V and the old call once each, both NOT_SUPPORTED and remembered
        assert sim.calls[V] == 4 + 1 and sim.calls[OLD] == 1
    assert fabric(s, "1") == (None, None)
    assert fabric(s, "0") == (3, 1)
    assert not errors(s)


def test_state_not_supported_is_absent() -> None:
    with simulated_nvml(node(fabric={"state": "not_supported"}), SimClock()):
        s = scrape(collector())
    assert fabric(s, "1") == (None, None)
    assert fabric(s, "0") == (3, 1)


def test_failed_call_is_counted_and_leaves_the_gpu_without_fabric_series() -> None:
    gpu = {"errors": [{"function": V, "error": "UNKNOWN", "until": "1m"}]}
    clock = SimClock()
    with simulated_nvml(node(**gpu), clock) as sim:
        c = collector()
        s = scrape(c)
        clock.t = 60
        later = scrape(c)
        assert sim.calls[OLD] == 0  # a failure is not a missing function
    assert fabric(s, "1") == (None, None)
    assert value(s, "gpunode_nvml_errors_total", gpu="1", function=V, error="UNKNOWN") == 1
    assert fabric(later, "1") == (3, 1)


def test_lost_gpu_has_no_fabric_series() -> None:
    clock = SimClock()
    with simulated_nvml(node(lost_at="2m"), clock):
        c = collector()
        before = scrape(c)
        clock.t = 120
        after = scrape(c)
    assert fabric(before, "1") == (3, 1)
    assert fabric(after, "1") == (None, None)
    assert value(after, "gpunode_gpu_up", gpu="1") == 0
    assert fabric(after, "0") == (3, 1)


# --- the simulated driver's side ------------------------------------------------------------------

def test_fabric_structs_are_nvml_h_and_pynvml_agrees() -> None:
    """Offsets of nvml.h's structs (state is an unsigned char there, a uint in pynvml: same offset)."""
    old = [("clusterUuid", 0), ("status", 16), ("cliqueId", 20), ("state", 24)]
    v2 = [("version", 0), ("clusterUuid", 4), ("status", 20), ("cliqueId", 24), ("state", 28), ("healthMask", 32)]
    for ours, theirs, fields, size in ((library._FabricInfo, pynvml.c_nvmlGpuFabricInfo_t, old, 28),
                                       (library._FabricInfoV2, pynvml.c_nvmlGpuFabricInfo_v2_t, v2, 36),
                                       (library._FabricInfoV3, pynvml.c_nvmlGpuFabricInfo_v3_t,
                                        [*v2, ("healthSummary", 36)], 40)):
        for struct_type in (ours, theirs):
            assert [(n, getattr(struct_type, n).offset) for n, _ in fields] == fields
            assert ctypes.sizeof(struct_type) == size
    assert sorted(library._FABRIC_VERSIONS) == [pynvml.nvmlGpuFabricInfo_v2, pynvml.nvmlGpuFabricInfo_v3]


def test_v_call_checks_the_version_field_as_the_driver_does() -> None:
    data = {**node(fabric={"health": ["degraded_bandwidth"], "clique_id": 7}), "driver": {"fabric_info_version": 2}}
    with simulated_nvml(data, SimClock()):
        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(1)
            for version in (0, pynvml.nvmlGpuFabricInfo_v3, pynvml.nvmlGpuFabricInfo_v2 + 1):
                info = pynvml.c_nvmlGpuFabricInfo_v3_t()
                info.version = version
                with pytest.raises(pynvml.NVMLError) as err:
                    pynvml.nvmlDeviceGetGpuFabricInfoV(handle, ctypes.byref(info))
                assert err.value.value == pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
            info2 = pynvml.c_nvmlGpuFabricInfo_v2_t()
            pynvml.nvmlDeviceGetGpuFabricInfoV(handle, ctypes.byref(info2))
            assert (info2.state, info2.status, info2.cliqueId) == (3, 0, 7)
            assert nvml.health_problems(info2.healthMask) == ["degraded_bandwidth"]
        finally:
            pynvml.nvmlShutdown()


def test_v3_reports_the_health_summary() -> None:
    gpu = {"fabric": {"health": [[0, []], ["1m", ["degraded_bandwidth"]], ["2m", ["route_unhealthy"]]]}}
    clock = SimClock()
    with simulated_nvml(node(**gpu), clock):
        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(1)
            summaries = []
            for t in (0, 60, 120):
                clock.t = t
                info = pynvml.c_nvmlGpuFabricInfo_v3_t()
                pynvml.nvmlDeviceGetGpuFabricInfoV(handle, ctypes.byref(info))
                summaries.append(info.healthSummary)
        finally:
            pynvml.nvmlShutdown()
    assert summaries == [pynvml.NVML_GPU_FABRIC_HEALTH_SUMMARY_HEALTHY,
                         pynvml.NVML_GPU_FABRIC_HEALTH_SUMMARY_LIMITED_CAPACITY,
                         pynvml.NVML_GPU_FABRIC_HEALTH_SUMMARY_UNHEALTHY]


@pytest.mark.parametrize(("fabric_data", "message"), [
    ({"state": "done"}, "gpus[1].fabric.state: want one of not_supported, not_started, in_progress, completed"),
    ({"status": "BROKEN"}, "gpus[1].fabric.status: unknown NVML error 'BROKEN'"),
    ({"health": ["slow"]}, "gpus[1].fabric.health: unknown fabric health 'slow'"),
    ({"health": ["no_partition", "invalid_location"]}, "at most one incorrect configuration"),
    ({"health": [[0, -1]]}, r"gpus[1].fabric.health[0]: want a list of health problems or a 32-bit mask"),
    ({"speed": 1}, "gpus[1].fabric: unknown key 'speed'"),
])
def test_fabric_scenario_errors_name_the_key(fabric_data: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        build(node(fabric=fabric_data), FUNCTIONS)
    with pytest.raises(ConfigError, match=r"driver\.fabric_info_version: want 2 or 3"):
        build({**node(), "driver": {"fabric_info_version": 4}}, FUNCTIONS)


# --- the health mask: our decoding (pynvml's constants) against the simulation's (nvml.h written out) ---

_FIELD = st.integers(0, 3)


@given(degraded=_FIELD, recovery=_FIELD, unhealthy=_FIELD, timeout=_FIELD, configuration=st.integers(0, 15),
       rest=st.integers(0, 0xFFFF))
def test_health_problems_decodes_each_field(degraded: int, recovery: int, unhealthy: int, timeout: int,
                                            configuration: int, rest: int) -> None:
    mask = degraded | recovery << 2 | unhealthy << 4 | timeout << 6 | configuration << 8 | rest << 16
    want = [name for name, field in (("degraded_bandwidth", degraded), ("route_recovery", recovery),
                                     ("route_unhealthy", unhealthy), ("access_timeout_recovery", timeout))
            if field == 1]
    if configuration not in (0, 1):
        want.append("incorrect_configuration")
    assert nvml.health_problems(mask) == want
    info = nvml.FabricInfo(pynvml.NVML_GPU_FABRIC_STATE_COMPLETED, pynvml.NVML_SUCCESS, mask)
    assert nvml.fabric_healthy(info) is (not want)
    assert nvml.fabric_healthy(nvml.FabricInfo(info.state, info.status, None))


@given(st.lists(st.sampled_from(list(simscenario.FABRIC_FLAGS)), unique=True),
       st.sampled_from([None, *simscenario.FABRIC_CONFIGURATIONS]))
def test_simulated_mask_round_trips(flags: list[str], configuration: str | None) -> None:
    names = flags + ([configuration] if configuration else [])
    want = [f for f in simscenario.FABRIC_FLAGS if f in flags] + (["incorrect_configuration"] if configuration else [])
    assert nvml.health_problems(simscenario.fabric_mask(names)) == want


# --- NVSwitches on the PCI bus ---------------------------------------------------------------------

def test_nvswitches_visible_and_expected() -> None:
    configured = GPUCollector(Context(procfs=FIXTURES / "procfs" / "edge", sysfs=DGX, route_lookup=lambda _a: None,
                                      config=Config(gpu=GPUConfig(nvswitches_expected=4))))
    with simulated_nvml(example("healthy-h100"), SimClock()):
        unset, s = scrape(collector()), scrape(configured)
    assert value(s, "gpunode_nvswitches_visible", source="pci") == 4
    assert value(s, "gpunode_nvswitches_expected") == 4
    assert "gpunode_nvswitches_expected" not in unset


def test_nvswitches_expected_is_checked_like_expected_count(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("gpu:\n  nvswitches_expected: 4\nfabric:\n  ports_expected: 8\n")
    cfg = config.load(path)
    assert (cfg.gpu.nvswitches_expected, cfg.fabric.ports_expected) == (4, 8)
    for bad in ("-1", "2.5", "true", "four"):
        path.write_text(f"gpu:\n  nvswitches_expected: {bad}\n")
        with pytest.raises(ConfigError, match=r"key 'gpu\.nvswitches_expected': want a whole number >= 0"):
            config.load(path)


def test_nvswitch_gone_from_the_bus(tmp_path: Path) -> None:
    sysfs = tmp_path / "sysfs"
    shutil.copytree(DGX, sysfs, symlinks=True)
    (sysfs / "bus" / "pci" / "devices" / "0000:08:00.0").unlink()
    scanner = pci.BusScanner(sysfs)
    assert len(scanner.scan()) == 8 and scanner.nvswitches == 3
    with simulated_nvml(example("healthy-h100"), SimClock()):
        s = scrape(collector(sysfs))
    assert value(s, "gpunode_nvswitches_visible", source="pci") == 3
    assert value(s, "gpunode_gpus_visible", source="pci") == 8


def test_no_pci_bus_no_nvswitch_series(tmp_path: Path) -> None:
    with simulated_nvml(example("healthy-h100"), SimClock()):
        s = scrape(collector(tmp_path))
    assert "gpunode_nvswitches_visible" not in s
