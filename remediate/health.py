"""Before a rebooted or reset node returns: does its exporter answer, and see every GPU?"""

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


def check(node: str, policy: Policy) -> str | None:
    url = policy.health_check.url.format_map({"node": node})
    try:
        with urllib.request.urlopen(url, timeout=policy.health_check.timeout) as response:
            body = response.read(MAX_BODY).decode(errors="replace")
    except (urllib.error.URLError, OSError, ValueError) as err:
        return f"its exporter at {url} does not answer: {getattr(err, 'reason', err)}"
    return gpu_trouble(body)
