"""The GPU collector against the simulated driver: values over time and every error path.

Errors are injected in the scenario (the driver's side), never by patching our code.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pynvml
import pytest
import requests
import yaml

from gpunode_exporter import nvmlsim
from gpunode_exporter.collector import gpu_straggler
from gpunode_exporter.collector.base import Context
from gpunode_exporter.collector.gpu import GPUCollector
from gpunode_exporter.config import Config, GPUConfig
from gpunode_exporter.nvmlsim import scenario as simscenario
from gpunode_exporter.scrape import Scraper
from tests.helpers import Series, SimClock, free_port, parse_exposition, render, simulated_nvml, wait_for_port

FIXTURES = Path(__file__).parent / "fixtures"
DGX = FIXTURES / "sysfs" / "dgx-h100"
EDGE = FIXTURES / "sysfs" / "edge"
SCENARIO = "GPU-{}-8f1b-4c2a-9e7d-0b6f3a2c1d{:02x}"


def collector(sysfs: Path = DGX, expected: int | None = None, timeout: float = 5.0,
              per_link: bool = False) -> GPUCollector:
    cfg = Config(collector_timeout_seconds=timeout, gpu=GPUConfig(expected_count=expected, nvlink_per_link=per_link))
    return GPUCollector(Context(procfs=FIXTURES / "procfs" / "edge", sysfs=sysfs, config=cfg,
                                route_lookup=lambda _a: None))


def scrape(c: GPUCollector) -> Series:
    return parse_exposition(render(c.collect()))


def value(series: Series, name: str, **labels: str) -> float | None:
    """The one sample of `name` whose labels include `labels`; None if there is none."""
    found = [v for key, v in series.get(name, {}).items() if set(labels.items()) <= set(key)]
    assert len(found) <= 1, (name, labels, found)
    return found[0] if found else None


def gpus_with(series: Series, name: str) -> set[str]:
    return {dict(key)["gpu"] for key in series.get(name, {})}


def example(name: str) -> Path:
    return nvmlsim.example(name)


def node(**gpu1: Any) -> dict[str, Any]:
    """Two GPUs at the first two DGX H100 GPU bus ids; keywords go to GPU 1."""
    return {"gpus": [{"uuid": SCENARIO.format("00000000", 0), "pci_bus_id": "00000000:1B:00.0"},
                     {"uuid": SCENARIO.format("00000000", 1), "pci_bus_id": "00000000:43:00.0", **gpu1}]}


def test_healthy_node_every_metric() -> None:
    with simulated_nvml(example("healthy-h100"), SimClock()):
        s = scrape(collector(expected=8))
    assert value(s, "gpunode_gpus_visible", source="nvml") == 8
    assert value(s, "gpunode_gpus_visible", source="pci") == 8  # NVSwitches and the BMC's VGA not counted
    assert value(s, "gpunode_gpus_expected") == 8
    assert gpus_with(s, "gpunode_gpu_up") == {str(i) for i in range(8)}
    assert set(s["gpunode_gpu_up"].values()) == {1}
    uuid = SCENARIO.format("5a1e0c3d", 3)
    info = dict(next(k for k in s["gpunode_gpu_info"] if dict(k)["gpu"] == "3"))
    assert info == {"gpu": "3", "uuid": uuid, "pci_bus_id": "00000000:61:00.0", "name": "NVIDIA H100 80GB HBM3",
                    "serial": "1654922000103", "driver_version": "550.54.15"}
    assert value(s, "gpunode_gpu_remapped_rows_total", gpu="3", cause="correctable") == 0
    assert value(s, "gpunode_gpu_remap_banks", gpu="3", availability="max") == 2560
    assert value(s, "gpunode_gpu_remap_banks", gpu="3", availability="none") == 0
    assert value(s, "gpunode_gpu_pcie_link_generation", gpu="3", kind="max") == 5
    assert value(s, "gpunode_gpu_pcie_link_width", gpu="3", kind="current") == 16
    assert "gpunode_nvml_errors_total" not in s


def test_expected_absent_unless_configured() -> None:
    with simulated_nvml(example("healthy-h100"), SimClock()):
        assert "gpunode_gpus_expected" not in scrape(collector())


def test_gpu122_uncorrectable_steps() -> None:
    clock = SimClock()
    with simulated_nvml(example("gpu122-uncorrectable-steps"), clock):
        c = collector()
        seen = []
        for t in (0, 37 * 60, 38 * 60, 2 * 3600, 4 * 3600 + 42 * 60):
            clock.t = t
            s = scrape(c)
            seen.append((value(s, "gpunode_gpu_remapped_rows_total", gpu="1", cause="uncorrectable"),
                         value(s, "gpunode_gpu_row_remap_pending", gpu="1"),
                         value(s, "gpunode_gpu_remap_banks", gpu="1", availability="high")))
        assert value(s, "gpunode_gpu_remapped_rows_total", gpu="0", cause="uncorrectable") == 0
    assert seen == [(0, 0, 0), (0, 0, 0), (1, 1, 1), (2, 1, 2), (5, 1, 5)]


def test_gpu124_acceleration_then_lost() -> None:
    clock = SimClock()
    day = 86400
    with simulated_nvml(example("gpu124-correctable-acceleration"), clock):
        c = collector()
        rows = {}
        for d in (0, 27, 31, 34, 38, 46):
            clock.t = d * day
            rows[d] = value(scrape(c), "gpunode_gpu_remapped_rows_total", gpu="2", cause="correctable")
        assert rows == {0: 6, 27: 38, 31: 150, 34: 212, 38: 254, 46: 254}
        # The last week gained 5x the rows of the four weeks before it: the trend is the signal.
        assert rows[34] - rows[27] > 5 * (rows[27] - rows[0])
        clock.t = 47 * day
        s = scrape(c)
    uuid = SCENARIO.format("3b124f70", 2)
    assert s["gpunode_gpu_up"][(("gpu", "2"), ("uuid", uuid))] == 0
    for name in ("gpunode_gpu_info", "gpunode_gpu_remapped_rows_total", "gpunode_gpu_row_remap_pending",
                 "gpunode_gpu_remap_banks", "gpunode_gpu_pcie_link_width"):
        assert gpus_with(s, name) == {"0", "1", "3", "4", "5", "6", "7"}, name
    assert value(s, "gpunode_gpus_visible", source="nvml") == 8  # the driver still enumerates it


def test_lost_before_the_exporter_started() -> None:
    clock = SimClock(3600)
    with simulated_nvml(node(lost_at="10m"), clock):
        s = scrape(collector())
    assert s["gpunode_gpu_up"] == {(("gpu", "0"), ("uuid", SCENARIO.format("00000000", 0))): 1,
                                   (("gpu", "1"), ("uuid", "")): 0}  # never seen alive: no uuid
    assert gpus_with(s, "gpunode_gpu_info") == {"0"}


def test_not_supported_means_absent_not_zero() -> None:
    errors = [{"function": "nvmlDeviceGetRowRemapperHistogram", "error": "NOT_SUPPORTED"},
              {"function": "nvmlDeviceGetMaxPcieLinkGeneration", "error": "NOT_SUPPORTED"},
              {"function": "nvmlDeviceGetSerial", "error": "NOT_SUPPORTED"}]
    with simulated_nvml(node(errors=errors), SimClock()):
        s = scrape(collector())
    assert gpus_with(s, "gpunode_gpu_remap_banks") == {"0"}
    assert value(s, "gpunode_gpu_pcie_link_generation", gpu="1", kind="max") is None
    assert value(s, "gpunode_gpu_pcie_link_generation", gpu="1", kind="current") == 5
    assert value(s, "gpunode_gpu_info", gpu="1", serial="") == 1
    assert value(s, "gpunode_gpu_up", gpu="1") == 1
    assert "gpunode_nvml_errors_total" not in s  # unsupported is not an error


def test_other_errors_counted_and_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    clock = SimClock()
    errors = [{"function": "nvmlDeviceGetRemappedRows", "error": "UNKNOWN", "from": "1m", "until": "5m"}]
    with simulated_nvml(node(errors=errors), clock), caplog.at_level(logging.WARNING):
        c = collector()
        assert value(scrape(c), "gpunode_gpu_row_remap_pending", gpu="1") == 0
        clock.t = 60
        for _ in range(3):
            s = scrape(c)
        clock.t = 300
        after = scrape(c)
    assert value(s, "gpunode_gpu_row_remap_pending", gpu="1") is None
    assert value(s, "gpunode_gpu_up", gpu="1") == 1
    assert value(s, "gpunode_nvml_errors_total", gpu="1", function="nvmlDeviceGetRemappedRows",
                 error="UNKNOWN") == 3
    assert value(after, "gpunode_gpu_row_remap_pending", gpu="1") == 0  # recovered
    assert sum("nvmlDeviceGetRemappedRows failed: UNKNOWN" in r.message for r in caplog.records) == 1


def test_rev_ff_on_the_bus_means_down_even_if_nvml_answers() -> None:
    # In the edge tree, 0000:52:00.0 (GPU 2) reads all-ones; 0000:9d:00.0 is runtime-suspended (unknown: up).
    with simulated_nvml(example("healthy-h100"), SimClock()):
        s = scrape(collector(sysfs=EDGE))
    down = {dict(k)["gpu"] for k, v in s["gpunode_gpu_up"].items() if v == 0}
    assert down == {"2"}
    assert value(s, "gpunode_gpu_remapped_rows_total", gpu="2", cause="correctable") == 0  # NVML still answers


def test_only_dynamic_values_are_fetched_per_scrape() -> None:
    with simulated_nvml(example("healthy-h100"), SimClock()) as nvml:
        c = collector()
        scrape(c)
        first = sum(nvml.calls.values())
        scrape(c)
        second = sum(nvml.calls.values()) - first
        per_gpu = {name: n for name, n in nvml.calls.items() if n == 16}
        plan = c.ctx.nvml.devices()[0].learned["fields"]
    # init, driver version, count; per GPU: handle, 7 facts, the reasons it reports, its NVLink count,
    # 4 remap and PCIe values, the fabric, clocks event reasons, one FieldValues (PCIe replays among its fields)
    assert first == 1 + 1 + 1 + 8 * (1 + 7 + 2 + 4 + 1 + 2)
    assert second == 1 + 8 * (4 + 1 + 2)
    assert set(per_gpu) == {"nvmlDeviceGetRemappedRows", "nvmlDeviceGetRowRemapperHistogram",
                            "nvmlDeviceGetCurrPcieLinkGeneration", "nvmlDeviceGetCurrPcieLinkWidth",
                            "nvmlDeviceGetGpuFabricInfoV", "nvmlDeviceGetCurrentClocksEventReasons"}
    assert nvml.calls["nvmlDeviceGetFieldValues"] == 8 * 3  # the link count once, then one a scrape
    assert "nvmlDeviceGetPcieReplayCounter" not in nvml.calls
    # After the first answer: 6 policies, 3 slowdown times, PCIe replays and, per link, state, replay,
    # recovery and CRC; the NVLink 5 recovery field an H100 answers NOT_SUPPORTED is not asked again.
    assert len(plan.ids) == 6 + 3 + 1 + 18 * 4
    assert pynvml.NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_EVENTS not in {fid for fid, _ in plan.ids}


def scraper_run(c: GPUCollector, times: int = 1) -> tuple[Series, Scraper]:
    scraper = Scraper([c], c.ctx.config.collector_timeout_seconds)
    try:
        for _ in range(times):
            s = parse_exposition(render(scraper.collect()))
    finally:
        scraper.close()
    return s, scraper


def test_no_driver_fails_once_and_serves_pci(caplog: pytest.LogCaptureFixture) -> None:
    with simulated_nvml({**node(), "driver": {"init_error": "DRIVER_NOT_LOADED"}}, SimClock()), \
            caplog.at_level(logging.INFO):
        s, _ = scraper_run(collector(expected=8), times=3)
    assert s["gpunode_scrape_collector_success"] == {(("collector", "gpu"),): 0}
    assert value(s, "gpunode_gpus_visible", source="pci") == 8
    assert value(s, "gpunode_gpus_expected") == 8
    assert value(s, "gpunode_gpus_visible", source="nvml") is None
    failures = [r.message for r in caplog.records if "collector gpu" in r.message]
    assert failures == ["collector gpu failed: NVMLError_DriverNotLoaded: Driver Not Loaded"]


def test_no_library_on_this_machine(caplog: pytest.LogCaptureFixture) -> None:
    """No simulation: the real pynvml looks for libnvidia-ml.so.1, which this machine lacks."""
    nvmlsim.uninstall()
    with caplog.at_level(logging.ERROR):
        s, _ = scraper_run(collector(), times=2)
    assert s["gpunode_scrape_collector_success"] == {(("collector", "gpu"),): 0}
    assert value(s, "gpunode_gpus_visible", source="pci") == 8
    assert [r.message for r in caplog.records] == [
        "collector gpu failed: NVMLError_LibraryNotFound: NVML Shared Library Not Found"]


def test_driver_gone_then_back_reinitialises() -> None:
    clock = SimClock()
    errors = [{"function": "nvmlDeviceGetCount_v2", "error": "DRIVER_NOT_LOADED", "from": "1m", "until": "2m"}]
    with simulated_nvml({**node(), "errors": errors}, clock) as nvml:
        c = collector()
        assert scraper_run(c)[0]["gpunode_scrape_collector_success"][(("collector", "gpu"),)] == 1
        clock.t = 60
        assert scraper_run(c)[0]["gpunode_scrape_collector_success"][(("collector", "gpu"),)] == 0
        clock.t = 120
        s, _ = scraper_run(c)
        assert nvml.calls["nvmlInitWithFlags"] == 2  # a new session after the driver came back
    assert s["gpunode_scrape_collector_success"][(("collector", "gpu"),)] == 1
    assert value(s, "gpunode_gpus_visible", source="nvml") == 2


@pytest.mark.alone  # times a scrape
def test_hanging_call_is_bounded_by_the_budget() -> None:
    errors = [{"function": "nvmlDeviceGetRemappedRows", "hang_seconds": 1.0}]
    with simulated_nvml(node(errors=errors), SimClock()):
        scraper = Scraper([collector()], timeout=0.2)
        try:
            started = time.monotonic()
            s = parse_exposition(render(scraper.collect()))
            took = time.monotonic() - started
            again = parse_exposition(render(scraper.collect()))  # joins the hung call, starts none
        finally:
            scraper.close(wait=True)  # let the hung call end before the simulation goes
    assert took < 0.6
    assert s["gpunode_scrape_collector_success"] == {(("collector", "gpu"),): 0}
    assert again["gpunode_scrape_collector_success"] == {(("collector", "gpu"),): 0}


def test_served_with_the_real_clock_and_speedup(tmp_path: Path) -> None:
    """The exporter's own clock: at 30x, a GPU lost at simulated minute 1 is down 2 s in."""
    scenario = tmp_path / "s.yaml"
    scenario.write_text(yaml.safe_dump({**node(lost_at="1m"), "speedup": 30}))
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "gpunode_exporter", "--no-collector.nfs", "--nvml.simulate",
                               str(scenario), "--web.listen-address", f"127.0.0.1:{port}",
                               "--path.state", str(tmp_path / "state")],
                              cwd=Path(__file__).parent.parent, stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port, alive=lambda: server.poll() is None)
        up = []
        for _ in range(2):
            s = parse_exposition(requests.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text)
            up.append((value(s, "gpunode_gpu_up", gpu="1"), value(s, "gpunode_nvml_simulated")))
            time.sleep(2.5)
    finally:
        server.terminate()
        server.wait(timeout=10)
    assert up == [(1, 1), (0, 1)]


# --- what names the cause of a straggler: clocks, violations, NVLink, PCIe replays -----------

# The names and labels are a contract: rules and their tests elsewhere use them.
STRAGGLER_FAMILIES = ("gpunode_gpu_clock_event_active", "gpunode_gpu_clock_event_seconds_total",
                      "gpunode_gpu_clock_violation_seconds_total",
                      "gpunode_gpu_nvlink_errors_total", "gpunode_gpu_nvlink_links_up",
                      "gpunode_gpu_pcie_replays_total")


def test_the_contract() -> None:
    assert {spec.name: spec.labels for spec in gpu_straggler.SPECS} == dict(zip(STRAGGLER_FAMILIES, [
        ("gpu", "uuid", "reason"), ("gpu", "uuid", "reason"), ("gpu", "uuid", "policy"),
        ("gpu", "uuid", "link", "type"), ("gpu", "uuid"), ("gpu", "uuid")], strict=True))
    assert [spec.kind for spec in gpu_straggler.SPECS] == ["gauge", "counter", "counter", "counter", "gauge", "counter"]


def labels_of(series: Series, name: str, label: str, **where: str) -> dict[str, float]:
    """{value of `label`: sample} over the samples of `name` whose labels include `where`."""
    return {dict(key)[label]: v for key, v in series.get(name, {}).items() if set(where.items()) <= set(key)}


def test_exporter_and_simulation_agree_on_nvml_h_constants() -> None:
    # Written out independently on each side (the simulation's from nvml.h, ours from pynvml).
    assert dict(gpu_straggler.REASONS) == simscenario.CLOCK_REASONS
    assert [name for name, _ in gpu_straggler.POLICIES] == list(simscenario.POLICIES)
    assert [fid for _, fid in gpu_straggler.POLICIES] == list(range(74, 80))
    # Ours are pynvml's, or nvml.h's numbers where older pynvml lacks the name.
    assert gpu_straggler.LINK_COUNTERS == ((pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY, "replay"),
                                           (pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY, "recovery"),
                                           (pynvml.NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_EVENTS, "recovery"),
                                           (pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_CRC, "crc_flit"))
    assert gpu_straggler.decode(pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT, 0x7_0005) == 5


def test_each_clock_event_reason_is_its_own_bit() -> None:
    reasons = list(simscenario.CLOCK_REASONS)
    steps = [[n, 1 << n] for n in range(len(reasons))]  # at t = n, bit n alone
    clock = SimClock()
    with simulated_nvml(node(clock_events={"active": steps}), clock):
        c = collector()
        for n, reason in enumerate(reasons):
            clock.t = n
            active = labels_of(scrape(c), "gpunode_gpu_clock_event_active", "reason", gpu="1")
            assert active == {r: (1 if r == reason else 0) for r in reasons}, reason


def test_unsupported_reasons_absent_and_several_at_once() -> None:
    gpu = {"clock_events": {"supported": ["gpu_idle", "sw_power_cap", "hw_slowdown", "sw_thermal_slowdown",
                                          "hw_thermal_slowdown"],
                            "active": ["hw_slowdown", "hw_thermal_slowdown", "display_clock_setting"]}}
    with simulated_nvml(node(**gpu), SimClock()):
        s = scrape(collector())
    # display_clock_setting is active in the scenario but not a reason this GPU reports: absent, not 1
    assert labels_of(s, "gpunode_gpu_clock_event_active", "reason", gpu="1") == {
        "gpu_idle": 0, "sw_power_cap": 0, "hw_slowdown": 1, "sw_thermal_slowdown": 0, "hw_thermal_slowdown": 1}
    assert len(labels_of(s, "gpunode_gpu_clock_event_active", "reason", gpu="0")) == 9


def test_violation_time_per_policy_in_seconds() -> None:
    seconds = {"power": 1.5, "thermal": 2.25, "sync_boost": 3.0, "board_limit": 4.125, "low_utilization": 0.5,
               "reliability": 6.0}
    clock = SimClock()
    with simulated_nvml(node(violations={**seconds, "thermal": {"rate": [[60, 0.25]]}}), clock):
        c = collector()
        before = labels_of(scrape(c), "gpunode_gpu_clock_violation_seconds_total", "policy", gpu="1")
        clock.t = 60 + 9
        after = labels_of(scrape(c), "gpunode_gpu_clock_violation_seconds_total", "policy", gpu="1")
    assert before == {**seconds, "thermal": 0.0}
    assert after == {**seconds, "thermal": 2.25}  # 9 s at 0.25: NVML's nanoseconds as seconds


def test_time_in_each_slowdown_in_seconds_and_absent_where_the_driver_counts_none() -> None:
    """The thermal and power brake slowdowns' own time counters (fields 269-271): a brake in short
    episodes, which a scrape's reason catches only now and then, counted whole."""
    clock = SimClock()
    gpu = {"clock_events": {"seconds": {"hw_power_brake_slowdown": {"rate": [[60, 0.1]]}, "sw_thermal_slowdown": 7.5}}}
    with simulated_nvml(node(**gpu, errors=[{"function": "nvmlDeviceGetFieldValues", "field": 270,
                                              "error": "NOT_SUPPORTED"}]), clock):
        c = collector()
        before = labels_of(scrape(c), "gpunode_gpu_clock_event_seconds_total", "reason", gpu="1")
        clock.t = 60 + 30
        after = labels_of(scrape(c), "gpunode_gpu_clock_event_seconds_total", "reason", gpu="1")
        other = labels_of(scrape(c), "gpunode_gpu_clock_event_seconds_total", "reason", gpu="0")
    # hw_thermal_slowdown: this driver answers NOT_SUPPORTED for its field, so it is absent, not 0
    assert before == {"sw_thermal_slowdown": 7.5, "hw_power_brake_slowdown": 0}
    assert after == {"sw_thermal_slowdown": 7.5, "hw_power_brake_slowdown": 3.0}  # 30 s braked 10 % of the time
    assert other == {"sw_thermal_slowdown": 0, "hw_thermal_slowdown": 0, "hw_power_brake_slowdown": 0}


def test_thermal_straggler_on_b200s() -> None:
    clock = SimClock()
    with simulated_nvml(example("thermal-straggler-b200"), clock):
        c = collector()
        seen = {}
        for minute in (0, 9, 11, 21, 29, 31):
            clock.t = minute * 60
            s = scrape(c)
            seen[minute] = (
                labels_of(s, "gpunode_gpu_clock_event_active", "reason", gpu="3"),
                value(s, "gpunode_gpu_clock_violation_seconds_total", gpu="3", policy="thermal"),
                value(s, "gpunode_gpu_nvlink_errors_total", gpu="5", link="all", type="recovery"),
                value(s, "gpunode_gpu_nvlink_links_up", gpu="5"))
        throttled = {r: 0 for r in simscenario.CLOCK_REASONS} | {"sw_thermal_slowdown": 1, "hw_thermal_slowdown": 1}
        assert [(reasons == throttled, thermal, recovery, up) for reasons, thermal, recovery, up in seen.values()] == [
            (False, 0, 0, 18), (False, 0, 0, 18), (True, 36, 0, 18), (True, 396, 1, 18), (True, 684, 12, 18),
            (True, 756, 13, 17)]
        assert set(seen[0][0].values()) == {0}
        # Blackwell counts link recovery events only: no replay or CRC series, not zeros.
        assert {dict(k)["type"] for k in s["gpunode_gpu_nvlink_errors_total"]} == {"recovery"}
        assert value(s, "gpunode_gpu_clock_violation_seconds_total", gpu="2", policy="thermal") == 0
        assert labels_of(s, "gpunode_gpu_info", "name", gpu="5") == {"NVIDIA B200": 1}
        assert "gpunode_nvml_errors_total" not in s


def test_nvlink_per_link() -> None:
    gpu = {"nvlink": {"state": {3: "inactive", 4: "sleep"},
                      "errors": {3: {"recovery": 4, "replay": 120, "crc": 9}, 17: {"replay": 2}}}}
    with simulated_nvml(node(**gpu), SimClock()):
        s = scrape(collector(per_link=True))
        summed = scrape(collector())
    errors = {(dict(k)["link"], dict(k)["type"]): v for k, v in s["gpunode_gpu_nvlink_errors_total"].items()
              if dict(k)["gpu"] == "1"}
    assert set(errors) == {(str(link), kind) for link in range(18) for kind in ("replay", "recovery", "crc_flit")}
    assert {k: v for k, v in errors.items() if v} == {("3", "recovery"): 4, ("3", "replay"): 120,
                                                      ("3", "crc_flit"): 9, ("17", "replay"): 2}
    assert value(s, "gpunode_gpu_nvlink_links_up", gpu="1") == 16  # inactive and asleep are not active
    assert labels_of(summed, "gpunode_gpu_nvlink_errors_total", "type", gpu="1") == {
        "replay": 122, "recovery": 4, "crc_flit": 9}
    assert {dict(k)["link"] for k in summed["gpunode_gpu_nvlink_errors_total"]} == {"all"}


def test_no_nvlink_and_unsupported_calls_are_absent_not_zero() -> None:
    errors = [{"function": "nvmlDeviceGetPcieReplayCounter", "error": "NOT_SUPPORTED"},
              {"function": "nvmlDeviceGetFieldValues", "field": 94, "error": "NOT_SUPPORTED"},
              {"function": "nvmlDeviceGetCurrentClocksEventReasons", "error": "NOT_SUPPORTED"},
              {"function": "nvmlDeviceGetCurrentClocksThrottleReasons", "error": "NOT_SUPPORTED"},
              {"function": "nvmlDeviceGetFieldValues", "field": 77, "error": "NOT_SUPPORTED"},  # board_limit
              *({"function": "nvmlDeviceGetFieldValues", "field": f, "error": "NOT_SUPPORTED"}  # slowdown times
                for f in (269, 270, 271))]
    with simulated_nvml(node(nvlink={"links": 0}, errors=errors), SimClock()) as nvml:
        c = collector()
        for _ in range(3):
            s = scrape(c)
        calls = dict(nvml.calls)
    for name in STRAGGLER_FAMILIES:
        assert "1" not in gpus_with(s, name) or name == "gpunode_gpu_clock_violation_seconds_total", name
        assert "0" in gpus_with(s, name), name
    assert set(labels_of(s, "gpunode_gpu_clock_violation_seconds_total", "policy", gpu="1")) == {
        "power", "thermal", "sync_boost", "low_utilization", "reliability"}
    assert "gpunode_nvml_errors_total" not in s
    # What a GPU does not support is asked once, not every scrape (GPU 0 answers three times). Without
    # the replay counter's field, GPU 1 is asked nvmlDeviceGetPcieReplayCounter, once: NOT_SUPPORTED.
    assert calls["nvmlDeviceGetPcieReplayCounter"] == 1
    assert calls["nvmlDeviceGetCurrentClocksEventReasons"] == 3 + 1


def test_a_field_failing_inside_a_successful_call() -> None:
    errors = [{"function": "nvmlDeviceGetFieldValues", "field": 162, "link": 4, "error": "UNKNOWN", "until": "2m"}]
    clock = SimClock()
    with simulated_nvml(node(nvlink={"errors": {4: {"recovery": 3}, 5: {"recovery": 1}}}, errors=errors), clock):
        per_link, summed = collector(per_link=True), collector()
        s, t = scrape(per_link), scrape(summed)
        clock.t = 120
        after = scrape(summed)
    assert labels_of(s, "gpunode_gpu_nvlink_errors_total", "link", gpu="1", type="recovery") == {
        str(link): (1 if link == 5 else 0) for link in range(18) if link != 4}
    # Summed without link 4 the counter would drop by 3: no sample rather than a false reset.
    assert labels_of(t, "gpunode_gpu_nvlink_errors_total", "type", gpu="1") == {"replay": 0, "crc_flit": 0}
    assert value(t, "gpunode_nvml_errors_total", gpu="1", function="nvmlDeviceGetFieldValues", error="UNKNOWN") == 1
    assert value(t, "gpunode_gpu_nvlink_links_up", gpu="1") == 18  # the rest of the answer is served
    assert value(after, "gpunode_gpu_nvlink_errors_total", gpu="1", type="recovery") == 4


def test_an_older_driver(caplog: pytest.LogCaptureFixture) -> None:
    """R5xx before R535: the clocks event functions under their old names. And one without
    nvmlDeviceGetFieldValues or the PCIe replay counter: those series absent, nothing logged."""
    old = ["nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetSupportedClocksEventReasons"]
    older = [*old, "nvmlDeviceGetFieldValues", "nvmlDeviceGetPcieReplayCounter"]
    gpu = {"clock_events": {"active": ["sw_power_cap"], "supported": ["sw_power_cap", "gpu_idle"]}}
    results = []
    with caplog.at_level(logging.INFO):
        for missing in (old, older):
            with simulated_nvml({**node(**gpu), "driver": {"missing_functions": missing}}, SimClock()) as nvml:
                c = collector()
                for _ in range(2):
                    s = scrape(c)
                results.append((s, dict(nvml.calls)))
    (s, calls), (s_older, _) = results
    assert labels_of(s, "gpunode_gpu_clock_event_active", "reason", gpu="1") == {"sw_power_cap": 1, "gpu_idle": 0}
    assert calls["nvmlDeviceGetCurrentClocksThrottleReasons"] == 2 * 2
    assert value(s, "gpunode_gpu_nvlink_links_up", gpu="1") == 18
    assert labels_of(s_older, "gpunode_gpu_clock_event_active", "reason", gpu="1") == {"sw_power_cap": 1, "gpu_idle": 0}
    for name in ("gpunode_gpu_clock_violation_seconds_total", "gpunode_gpu_nvlink_errors_total",
                 "gpunode_gpu_nvlink_links_up", "gpunode_gpu_pcie_replays_total", "gpunode_nvml_errors_total"):
        assert name not in s_older, name
    assert value(s_older, "gpunode_gpu_up", gpu="1") == 1
    assert caplog.records == []


def test_lost_gpu_has_none_of_the_new_series() -> None:
    clock = SimClock()
    with simulated_nvml(node(lost_at="10m", pcie={"replays": 5}), clock):
        c = collector()
        assert all("1" in gpus_with(scrape(c), name) for name in STRAGGLER_FAMILIES)
        clock.t = 600
        s = scrape(c)
    assert value(s, "gpunode_gpu_up", gpu="1") == 0
    for name in STRAGGLER_FAMILIES:
        assert gpus_with(s, name) == {"0"}, name


def test_pcie_replays_by_field_or_by_function() -> None:
    clock = SimClock()
    no_field = [{"function": "nvmlDeviceGetFieldValues", "field": 94, "error": "NOT_SUPPORTED"}]
    gpu0 = {"pcie": {"replays": 3}, "errors": no_field}  # a driver that does not answer the field
    data = node(pcie={"replays": [[0, 0], ["1h", 12]], "width": {"current": 8}})
    data["gpus"][0].update(gpu0)
    with simulated_nvml(data, clock) as nvml:
        c = collector()
        before = value(scrape(c), "gpunode_gpu_pcie_replays_total", gpu="1")
        clock.t = 3600
        s = scrape(c)
        calls = nvml.calls["nvmlDeviceGetPcieReplayCounter"]
    assert (before, value(s, "gpunode_gpu_pcie_replays_total", gpu="1")) == (0, 12)
    assert value(s, "gpunode_gpu_pcie_replays_total", gpu="0") == 3
    assert calls == 2  # GPU 0's, each scrape
