"""The node's exporter, asked by the service: before a rebooted or reset node returns, does it answer
and see every GPU? And for job recovery, which NFS servers does the node mount?"""

from __future__ import annotations

import math
import re
import urllib.error
import urllib.request
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpunode_remediate.policy import Policy

MAX_BODY = 64 << 20
_SAMPLE = re.compile(r'^(gpunode_gpus_expected|gpunode_gpus_visible|gpunode_gpu_up)(\{[^}]*\})? (\S+)', re.M)
_VALUE = r'"(?:[^"\\\n]|\\.)*"'
_MOUNT = re.compile(rf'^gpunode_nfs_mount_info\{{((?:[^"}}\n]|{_VALUE})*)\}}', re.M)
_LABEL = re.compile(rf'([a-zA-Z_]\w*)=({_VALUE})')
_ESCAPES = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


def gpu_trouble(exposition: str) -> str | None:
    """What keeps the node from returning, from its exporter's metrics; None when it sees every GPU."""
    expected = visible = None
    down = 0
    for name, labels, value in _SAMPLE.findall(exposition):
        try:
            number = float(value)
        except ValueError:
            continue
        if not math.isfinite(number):
            continue  # NaN or Inf is no count
        if name == "gpunode_gpus_expected":
            expected = number
        elif name == "gpunode_gpus_visible" and 'source="nvml"' in (labels or ""):
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
        labels = {k: re.sub(r"\\[\\\"n]", lambda m: _ESCAPES[m.group(0)], v[1:-1]) for k, v in _LABEL.findall(text)}
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


def check(node: str, policy: Policy) -> str | None:
    try:
        return gpu_trouble(fetch(node, policy))
    except OSError as err:
        return str(err)


def mounted(node: str, policy: Policy) -> frozenset[str] | None:
    """The NFS servers the node mounts; None when its exporter cannot be asked (or is not to be:
    health_check.enabled false)."""
    if not policy.health_check.enabled:
        return None
    try:
        return nfs_servers(fetch(node, policy))
    except OSError:
        return None
