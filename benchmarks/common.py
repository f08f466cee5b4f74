"""What both benchmarks need: statistics, machine load, and a fingerprint of the code under test."""

from __future__ import annotations

import hashlib
from pathlib import Path


class BenchError(RuntimeError):
    """The benchmark cannot produce a meaningful result; the message says why."""


def source_fingerprint() -> str:
    """sha256 of the exporter package's sources: the code under test, which another
    engineer may be editing while we run."""
    import exporter  # the installed (editable) package gpunode-exporter runs

    digest = hashlib.sha256()
    root = Path(exporter.__file__).resolve().parent
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def cpu_times() -> list[int]:
    """Machine-wide jiffies from /proc/stat: user nice system idle iowait irq softirq steal."""
    return [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]


def machine_load(before: list[int], after: list[int]) -> dict[str, float]:
    """Share of all CPUs busy and stolen by the hypervisor between two cpu_times()."""
    delta = [b - a for a, b in zip(before, after, strict=True)]
    total = sum(delta) or 1
    return {"busy_pct": round(100 * (total - delta[3] - delta[4]) / total, 1),
            "steal_pct": round(100 * delta[7] / total, 1)}


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def summarize(seconds: list[float]) -> dict[str, float]:
    ms = [x * 1000 for x in seconds]
    return {"p50_ms": percentile(ms, 0.50), "p90_ms": percentile(ms, 0.90), "p99_ms": percentile(ms, 0.99),
            "max_ms": max(ms), "min_ms": min(ms), "mean_ms": sum(ms) / len(ms)}


def ratio(a: float, b: float) -> float:
    return a / b if b else float("inf")
