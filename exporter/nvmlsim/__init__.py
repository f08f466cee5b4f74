"""Simulated NVML for --nvml.simulate: tests and demos on machines without a GPU.

install() puts a SimulatedNVML where pynvml keeps its loaded library, so every
pynvml call afterwards reaches the simulation through ctypes exactly as it would
reach libnvidia-ml.so.1.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import resources
from pathlib import Path

import pynvml

from gpunode_exporter.nvmlsim import scenario
from gpunode_exporter.nvmlsim.library import FUNCTIONS, SimulatedNVML


def load(path: Path) -> scenario.Scenario:
    """Parse a scenario file; raises ConfigError naming the file and key."""
    return scenario.load(path, FUNCTIONS)


def example(name: str) -> Path:
    """A scenario shipped with the package (exporter/nvmlsim/scenarios/NAME.yaml)."""
    return Path(str(resources.files(__package__).joinpath("scenarios", f"{name}.yaml")))


def install(node: scenario.Scenario, clock: Callable[[], float] | None = None) -> SimulatedNVML:
    library = SimulatedNVML(node, clock)
    with pynvml.libLoadLock:
        pynvml.nvmlLib = library
        pynvml._nvmlGetFunctionPointer_cache.clear()
        pynvml._nvmlLib_refcount = 0
    return library


def uninstall() -> None:
    """Forget the simulation; the next nvmlInit loads the real library again."""
    with pynvml.libLoadLock:
        pynvml.nvmlLib = None
        pynvml._nvmlGetFunctionPointer_cache.clear()
        pynvml._nvmlLib_refcount = 0
