"""gpu_straggler's nvmlDeviceGetFieldValues: the fast path through pynvml's private names, and the public
wrapper it falls back to when an nvidia-ml-py lacks them (the same rows, against the simulated driver)."""

from __future__ import annotations

import inspect
import logging
import re
import types
from collections import Counter
from pathlib import Path
from typing import Any

import pynvml
import pytest

from gpunode_exporter import nvmlsim
from gpunode_exporter.collector import gpu_straggler
from gpunode_exporter.collector.base import Context
from gpunode_exporter.collector.gpu import GPUCollector
from gpunode_exporter.config import Config, GPUConfig
from tests.helpers import SimClock, render, simulated_nvml

FIXTURES = Path(__file__).parent / "fixtures"
UUID = "GPU-00000000-8f1b-4c2a-9e7d-0b6f3a2c1d{:02x}"


def collector(per_link: bool = False) -> GPUCollector:
    cfg = Config(collector_timeout_seconds=5.0, gpu=GPUConfig(nvlink_per_link=per_link))
    return GPUCollector(Context(procfs=FIXTURES / "procfs" / "edge", sysfs=FIXTURES / "sysfs" / "dgx-h100",
                                config=cfg, route_lookup=lambda _a: None))


def faulty_h100s() -> dict[str, Any]:
    """Two H100s, the second with what takes the decoding paths: a field failing inside the call, fields
    NOT_SUPPORTED, links down, errors on links, replays; and lost at 20 minutes."""
    errors = [{"function": "nvmlDeviceGetFieldValues", "field": 162, "link": 4, "error": "UNKNOWN", "until": "2m"},
              {"function": "nvmlDeviceGetFieldValues", "field": 270, "error": "NOT_SUPPORTED"},
              {"function": "nvmlDeviceGetFieldValues", "field": 94, "error": "NOT_SUPPORTED"}]
    gpu1 = {"uuid": UUID.format(1), "pci_bus_id": "00000000:43:00.0", "errors": errors, "lost_at": "20m",
            "pcie": {"replays": {"rate": [[0, 0.5]]}}, "violations": {"thermal": {"rate": [[60, 0.25]]}},
            "clock_events": {"seconds": {"hw_power_brake_slowdown": {"rate": [[60, 0.1]]}}},
            "nvlink": {"state": {3: "inactive", 4: "sleep"},
                       "errors": {4: {"recovery": [[0, 0], ["90s", 3]], "replay": 7}, 5: {"crc": 2}}}}
    return {"gpus": [{"uuid": UUID.format(0), "pci_bus_id": "00000000:1B:00.0"}, gpu1]}


SCENARIOS = {  # name: (scenario, simulated minutes scraped at, per-link NVLink series)
    "thermal-straggler-b200": (nvmlsim.example("thermal-straggler-b200"), (0, 9, 11, 21, 29, 31), False),
    "faulty-h100s": (faulty_h100s(), (0, 1, 2, 5, 19, 21), False),
    "faulty-h100s-per-link": (faulty_h100s(), (0, 1, 2, 5, 19, 21), True),
}


def scrapes(scenario: dict[str, Any] | Path, minutes: tuple[int, ...], per_link: bool,
            ) -> tuple[list[str], Counter[str]]:
    """The collector's whole output at each time, and the NVML calls the simulated driver answered."""
    clock = SimClock()
    out = []
    with simulated_nvml(scenario, clock) as nvml:
        c = collector(per_link)
        for minute in minutes:
            clock.t = minute * 60
            out.append(render(c.collect()))
        return out, Counter(nvml.calls)


class PublicWrapper:
    """pynvml.nvmlDeviceGetFieldValues, counting the fields asked per call."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn
        self.__name__ = fn.__name__  # the name errors are counted under
        self.calls: list[int] = []

    def __call__(self, handle: Any, field_ids: Any) -> Any:
        self.calls.append(len(field_ids))
        return self.fn(handle, field_ids)


@pytest.fixture
def public_wrapper(monkeypatch: pytest.MonkeyPatch) -> PublicWrapper:
    """The wrapper counted, and gpu_straggler's path decided anew on its next call (and after the test)."""
    wrapper = PublicWrapper(pynvml.nvmlDeviceGetFieldValues)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetFieldValues", wrapper)
    monkeypatch.setattr(gpu_straggler, "_fast", None)
    return wrapper


class WithoutPrivateNames(types.ModuleType):
    """pynvml as gpu_straggler sees a release without PRIVATE_NAMES (one that renamed them, say): the rest is
    pynvml's. (Deleting them from pynvml itself would break all of pynvml: its public functions call them.)"""

    def __getattr__(self, name: str) -> Any:
        if name in gpu_straggler.PRIVATE_NAMES:
            raise AttributeError(f"module 'pynvml' has no attribute {name!r}")
        return getattr(pynvml, name)


def hide_private_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpu_straggler, "pynvml", WithoutPrivateNames("pynvml"))
    for name in gpu_straggler.PRIVATE_NAMES:
        assert not hasattr(gpu_straggler.pynvml, name)


@pytest.mark.parametrize("name", SCENARIOS)
def test_public_wrapper_fallback_serves_the_same_rows(name: str, public_wrapper: PublicWrapper,
                                                      monkeypatch: pytest.MonkeyPatch,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    scenario, minutes, per_link = SCENARIOS[name]
    with caplog.at_level(logging.DEBUG, logger=gpu_straggler.__name__):
        fast, fast_calls = scrapes(scenario, minutes, per_link)
        assert gpu_straggler._fast is True
        link_counts = len(public_wrapper.calls)  # the fast path leaves the wrapper the link count alone
        assert set(public_wrapper.calls) == {1}

        with monkeypatch.context() as hidden:
            hide_private_names(hidden)
            hidden.setattr(gpu_straggler, "_fast", None)
            slow, slow_calls = scrapes(scenario, minutes, per_link)
            assert gpu_straggler._fast is False
    assert gpu_straggler.pynvml is pynvml  # back for the next tests

    assert slow == fast  # every family, every sample, at every time
    assert slow_calls == fast_calls
    # Without the private names every nvmlDeviceGetFieldValues goes through the wrapper, the plans too.
    assert len(public_wrapper.calls) == link_counts + slow_calls["nvmlDeviceGetFieldValues"]
    assert max(public_wrapper.calls) > 1  # the plans went through the wrapper
    assert "gpunode_gpu_nvlink_errors_total{" in fast[-1] and "gpunode_gpu_clock_violation_seconds_total{" in fast[-1]
    messages = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == gpu_straggler.__name__]
    assert len(messages) == 2, messages  # once per decision
    assert messages[0][0] == logging.DEBUG and "_nvmlGetFunctionPointer" in messages[0][1]
    assert messages[1][0] == logging.INFO and "public wrapper" in messages[1][1]


def test_installed_nvidia_ml_py_has_the_private_names_of_the_fast_path() -> None:
    missing = [name for name in gpu_straggler.PRIVATE_NAMES if not callable(getattr(pynvml, name, None))]
    assert not missing, (
        f"the installed nvidia-ml-py lacks pynvml.{', pynvml.'.join(missing)}, which "
        "exporter/collector/gpu_straggler.py's _field_values calls for nvmlDeviceGetFieldValues. The exporter "
        "still works, through pynvml's public wrapper, but every scrape of an 8-GPU B200 node costs about twice "
        "as much (0.95 ms instead of 0.43 ms). Find what the new release calls them (in pynvml.py, its "
        "nvmlDeviceGetFieldValues uses them) and update _field_values and PRIVATE_NAMES, or pin nvidia-ml-py "
        "below this release.")


def test_private_names_lists_every_private_name_used() -> None:
    """PRIVATE_NAMES is what the fallback checks and the test above asserts: it must be all the fast path uses."""
    used = set(re.findall(r"\bpynvml\.(_\w+)", inspect.getsource(gpu_straggler)))
    assert used == set(gpu_straggler.PRIVATE_NAMES)
