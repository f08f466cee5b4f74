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

import pytest
import requests
import yaml

from exporter import nvmlsim
from exporter.collector.base import Context
from exporter.collector.gpu import GPUCollector
from exporter.config import Config, GPUConfig
from exporter.scrape import Scraper
from tests.helpers import Series, SimClock, free_port, parse_exposition, render, simulated_nvml, wait_for_port

FIXTURES = Path(__file__).parent / "fixtures"
DGX = FIXTURES / "sysfs" / "dgx-h100"
EDGE = FIXTURES / "sysfs" / "edge"
SCENARIO = "GPU-{}-8f1b-4c2a-9e7d-0b6f3a2c1d{:02x}"


def collector(sysfs: Path = DGX, expected: int | None = None, timeout: float = 5.0) -> GPUCollector:
    cfg = Config(collector_timeout_seconds=timeout, gpu=GPUConfig(expected_count=expected))
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
    assert first == 1 + 1 + 1 + 8 * (1 + 7 + 4)  # init, driver version, count; handle, 7 facts, 4 dynamic
    assert second == 1 + 8 * 4  # count, then remapped rows, histogram, current generation and width
    assert set(per_gpu) == {"nvmlDeviceGetRemappedRows", "nvmlDeviceGetRowRemapperHistogram",
                            "nvmlDeviceGetCurrPcieLinkGeneration", "nvmlDeviceGetCurrPcieLinkWidth"}


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
    server = subprocess.Popen([sys.executable, "-m", "exporter", "--no-collector.nfs", "--nvml.simulate",
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
