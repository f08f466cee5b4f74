"""What the benchmarks share: statistics, machine facts and load, a fingerprint of the code under
test, and the exporter processes they start."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


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


def git_commit(root: Path) -> dict[str, Any]:
    """HEAD of the repository at root, and whether its tree has changes (tracked or new files)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                              check=True).stdout.strip()
    try:
        changed = git("status", "--porcelain").splitlines()
        return {"head": git("rev-parse", "HEAD"), "dirty": bool(changed), "changed": changed[:50]}
    except (OSError, subprocess.CalledProcessError) as err:
        return {"head": "", "dirty": None, "error": str(err)}


def cpu_model() -> str:
    """The first "model name" of /proc/cpuinfo, or "" where there is none (some arm64 kernels)."""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return ""


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


def slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of ys over xs (0.0 with fewer than two distinct xs)."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx else 0.0


def ratio(a: float, b: float) -> float:
    return a / b if b else float("inf")


@dataclass
class ServerProcess:
    """One exporter process under test, listening on 127.0.0.1:port, its output in `log`."""

    key: str  # short name in the results ("ours", "node", "peer", ...)
    label: str
    argv: list[str]
    port: int
    log: Path
    proc: subprocess.Popen[bytes] | None = field(default=None, init=False)
    started: float = field(default=0.0, init=False)  # time.monotonic() at start()
    latencies: dict[str, list[float]] = field(default_factory=dict, init=False)  # round -> seconds
    cpu: dict[str, float] = field(default_factory=dict, init=False)  # round -> CPU seconds per scrape

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"

    def start(self, preexec_fn: Callable[[], None] | None = None) -> None:
        self.started = time.monotonic()
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, preexec_fn=preexec_fn)

    def check_running(self) -> None:
        """BenchError with the end of its log if it has exited."""
        if self.proc is not None and self.proc.poll() is not None:
            raise BenchError(f"{self.label} exited with {self.proc.returncode} at startup:\n"
                             f"{self.log.read_text(errors='replace')[-2000:]}")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def cpu_seconds(self) -> float:
        """utime + stime of the whole process (all threads, exited ones included)."""
        stat = Path(f"/proc/{self.pid}/stat").read_text()
        fields = stat[stat.rindex(")") + 2 :].split()  # comm may contain spaces
        utime, stime = int(fields[11]), int(fields[12])  # fields 14 and 15 of proc(5)
        return (utime + stime) / os.sysconf("SC_CLK_TCK")

    def memory_kib(self) -> dict[str, int]:
        """VmHWM (peak RSS) and VmRSS in KiB."""
        out = {}
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmHWM", "VmRSS"):
                out[key] = int(value.split()[0])
        return out

    def exe(self) -> str:
        return os.readlink(f"/proc/{self.pid}/exe")


def finish(results: dict[str, Any], output: Path, machine: str) -> int:
    """How every benchmark ends: a warning if exporter/ changed during the run, the machine line
    (`machine` names the CPUs and versions), and the JSON results."""
    if results["exporter_source_changed_during_run"]:
        print("\nWARNING: exporter/ sources changed during the run; the figures are for the code as "
              "it was at the start. Re-run for a clean result.")
    load = results["machine"]["during_run"]
    print(f"\nmachine: {machine}; all CPUs {load['busy_pct']}% busy, {load['steal_pct']}% stolen; "
          f"{results['wall_seconds']} s")
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(results, indent=2) + "\n")
    print(f"results: {output}")
    return 0


def free_port() -> int:
    """A currently free loopback port (tiny race with the server's bind; fine here)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
