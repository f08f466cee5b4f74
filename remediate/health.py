"""The node's exporter, asked by the service: before a rebooted or reset node returns, does it answer,
see every GPU, and is its NVLink fabric complete? And for job recovery, which NFS servers does the
node mount?"""

from __future__ import annotations

import math
import re
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpunode_remediate.policy import Policy

MAX_BODY = 64 << 20
_VALUE = r'"(?:[^"\\\n]|\\.)*"'
_LABELS = rf'\{{((?:[^"}}\n]|{_VALUE})*)\}}'
_SAMPLE = re.compile(rf'^(gpunode_\w+)(?:{_LABELS})? (\S+)', re.M)
_MOUNT = re.compile(rf'^gpunode_nfs_mount_info{_LABELS}', re.M)
_LABEL = re.compile(rf'([a-zA-Z_]\w*)=({_VALUE})')
_ESCAPES = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}
# NVML's GPU fabric states (nvmlGpuFabricState_t) short of COMPLETED (3).
_FABRIC_STATES = {1: "not started", 2: "in progress"}


@dataclass(frozen=True)
class Trouble:
    """Why a node does not return yet. `bounded`: the wait for it ends after the policy's fabric_wait,
    the node then held (an NVLink fabric not complete, or an exporter that does not answer); else it
    waits as long as it lasts (an exporter that answers and sees fewer GPUs)."""

    why: str
    bounded: bool = False


def _labels(text: str) -> dict[str, str]:
    return {k: re.sub(r"\\[\\\"n]", lambda m: _ESCAPES[m.group(0)], v[1:-1]) for k, v in _LABEL.findall(text or "")}


def samples(exposition: str, names: frozenset[str]) -> Iterator[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of every sample of these metrics with a finite value (NaN or Inf is no
    count)."""
    for name, labels, value in _SAMPLE.findall(exposition):
        if name not in names:
            continue
        try:
            number = float(value)
        except ValueError:
            continue
        if math.isfinite(number):
            yield name, _labels(labels), number


_GPU_METRICS = frozenset({"gpunode_gpus_expected", "gpunode_gpus_visible", "gpunode_gpu_up"})
_FABRIC_METRICS = frozenset({"gpunode_gpu_fabric_state", "gpunode_gpu_fabric_healthy", "gpunode_nvswitches_expected",
                             "gpunode_nvswitches_visible"})


def gpu_trouble(exposition: str) -> str | None:
    """What keeps the node from returning, from its exporter's metrics; None when it sees every GPU."""
    expected = visible = None
    down = 0
    for name, labels, number in samples(exposition, _GPU_METRICS):
        if name == "gpunode_gpus_expected":
            expected = number
        elif name == "gpunode_gpus_visible" and labels.get("source") == "nvml":
            visible = number
        elif name == "gpunode_gpu_up" and number != 1:
            down += 1
    if visible is None:
        return "its exporter serves no NVML GPU count"
    if expected is not None and visible < expected:
        return f"its exporter sees {visible:g} of {expected:g} GPUs"
    if down:
        return f"{down} GPU(s) down"
    return None


def _gpus(gpus: list[str]) -> str:
    return ",".join(sorted(gpus, key=lambda g: (len(g), g)))


def fabric_trouble(exposition: str) -> str | None:
    """What of the node's NVLink fabric is not complete, from its exporter's metrics: a GPU whose
    fabric state is short of completed or whose fabric is unhealthy (a GPU short of completed is not
    called unhealthy too), fewer NVSwitches on the PCI bus than expected. None when complete, or when
    the exporter serves no fabric metric (no NVSwitch: a PCIe or NVL-bridge node; or a driver without
    the fabric calls)."""
    short: dict[float, list[str]] = {}
    unhealthy: list[str] = []
    expected = visible = None
    for name, labels, number in samples(exposition, _FABRIC_METRICS):
        if name == "gpunode_gpu_fabric_state" and number < 3:
            short.setdefault(number, []).append(labels.get("gpu", "?"))
        elif name == "gpunode_gpu_fabric_healthy" and number == 0:
            unhealthy.append(labels.get("gpu", "?"))
        elif name == "gpunode_nvswitches_expected":
            expected = number
        elif name == "gpunode_nvswitches_visible" and labels.get("source") == "pci":
            visible = number
    parts = [f"GPU {_gpus(gpus)} fabric {_FABRIC_STATES.get(int(state), f'state {state:g}')}"
             for state, gpus in sorted(short.items())]
    # A fabric not yet completed is not healthy either: said once, by its state.
    unhealthy = [gpu for gpu in unhealthy if not any(gpu in gpus for gpus in short.values())]
    if unhealthy:
        parts.append(f"GPU {_gpus(unhealthy)} fabric unhealthy")
    if expected is not None and visible is not None and visible < expected:
        parts.append(f"{visible:g} of {expected:g} NVSwitches on the PCI bus")
    return "; ".join(parts) or None


def _host(address: str) -> str:
    """The host of `host:/path`, `[v6]:/path` or a bare address, lower case."""
    if address.startswith("["):
        return address[1:].partition("]")[0].lower()
    return (address.partition(":")[0] if address.count(":") == 1 or ":/" in address else address).lower()


def nfs_servers(exposition: str) -> frozenset[str]:
    """The NFS servers the node mounts, by every name the kernel may give them: the host part of
    each gpunode_nfs_mount_info's `export` (what "nfs: server S not responding" names) and its
    `server_address`."""
    names = set()
    for text in _MOUNT.findall(exposition):
        labels = _labels(text)
        for value in (labels.get("export", ""), labels.get("server_address", "")):
            if host := _host(value):
                names.add(host)
    return frozenset(names)


def fetch(node: str, policy: Policy) -> str:
    """The node exporter's metrics (health_check.url); raises OSError when it does not answer."""
    url = policy.health_check.url.format_map({"node": node})
    try:
        with urllib.request.urlopen(url, timeout=policy.health_check.timeout) as response:
            return response.read(MAX_BODY).decode(errors="replace")
    except (urllib.error.URLError, OSError, ValueError) as err:
        raise OSError(f"its exporter at {url} does not answer: {getattr(err, 'reason', err)}") from None


def check(node: str, policy: Policy) -> Trouble | None:
    """Why the node does not return yet, or None: its exporter answers, sees every GPU, and its NVLink
    fabric is complete (fabric_trouble)."""
    try:
        exposition = fetch(node, policy)
    except OSError as err:
        return Trouble(str(err), bounded=True)
    if trouble := gpu_trouble(exposition):
        return Trouble(trouble)
    if trouble := fabric_trouble(exposition):
        return Trouble(f"fabric not complete: {trouble}", bounded=True)
    return None


def mounted(node: str, policy: Policy) -> frozenset[str] | None:
    """The NFS servers the node mounts; None when its exporter cannot be asked (or is not to be:
    health_check.enabled false)."""
    if not policy.health_check.enabled:
        return None
    try:
        return nfs_servers(fetch(node, policy))
    except OSError:
        return None
