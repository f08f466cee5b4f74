"""What the benchmarks share: statistics, machine facts and load, a fingerprint of the code under
test, and the exporter processes they start."""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository, for fleet/
from gpunode_common.http import free_port  # noqa: F401  (one copy of it: the benchmarks take it from here)
from gpunode_remediate.command import die_with_parent  # noqa: F401  (likewise)


class BenchError(RuntimeError):
    """The benchmark cannot produce a meaningful result; the message says why."""


def source_fingerprint() -> str:
    """sha256 of the exporter package's sources: the code under test, which another
    engineer may be editing while we run."""
    import gpunode_exporter  # the installed (editable) package gpunode-exporter runs

    digest = hashlib.sha256()
    root = Path(gpunode_exporter.__file__).resolve().parent
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


def machine_info(**extra: Any) -> dict[str, Any]:
    """The machine a result was measured on; `extra` adds what else it depends on (peers' versions)."""
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "python_version": platform.python_version(),
        "nproc": os.cpu_count(),
        "nproc_usable": len(os.sched_getaffinity(0)),
        "cpu_model": cpu_model(),
        "kernel": platform.release(),
        **extra,
        "loadavg_start": os.getloadavg(),
    }


def cpu_times() -> list[int]:
    """Machine-wide jiffies from /proc/stat: user nice system idle iowait irq softirq steal."""
    return [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]


def machine_load(before: list[int], after: list[int]) -> dict[str, float]:
    """Share of all CPUs busy and stolen by the hypervisor between two cpu_times()."""
    delta = [b - a for a, b in zip(before, after, strict=True)]
    total = sum(delta) or 1
    return {"busy_pct": round(100 * (total - delta[3] - delta[4]) / total, 1),
            "steal_pct": round(100 * delta[7] / total, 1)}


def load_before_run() -> dict[str, float]:
    """machine_load() over one second before the run: busy CPUs then mean noisy figures."""
    idle0 = cpu_times()
    time.sleep(1.0)
    return machine_load(idle0, cpu_times())


def end_of_run(results: dict[str, Any], started: float, cpu_before: list[int], root: Path | None = None) -> None:
    """What every run records at its end: wall time (from time.monotonic() `started`), the load
    since cpu_before, the commit again (with `root`) and whether exporter/ changed meanwhile."""
    results["wall_seconds"] = round(time.monotonic() - started, 1)
    results["machine"]["during_run"] = machine_load(cpu_before, cpu_times())
    results["machine"]["loadavg_end"] = os.getloadavg()
    if root is not None:
        results["commit_end"] = git_commit(root)
    results["exporter_source_changed_during_run"] = source_fingerprint() != results["exporter_source_sha256"]


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


def latencies_ms(seconds: list[float]) -> list[float]:
    """Every latency kept in the results: milliseconds to the microsecond."""
    return [round(x * 1000, 3) for x in seconds]


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
    cwd: Path | None = None  # where it starts: `python -m exporter` there runs that checkout's code
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
                                         stderr=subprocess.STDOUT, preexec_fn=preexec_fn, cwd=self.cwd)

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


def find_ours() -> str:
    """The gpunode-exporter console script of this Python, not a pyenv shim, so that the
    process we start is the exporter itself (its CPU and memory are what we read)."""
    script = Path(sysconfig.get_path("scripts")) / "gpunode-exporter"
    if script.is_file():
        return str(script)
    found = shutil.which("gpunode-exporter")
    if found is None:
        raise BenchError("gpunode-exporter not found: pip install -e . first")
    return found


def wait_ready(server: ServerProcess, url: str | None = None, timeout: float = 30.0, pause: float = 0.1) -> None:
    """Until GET url (default the server's /metrics) answers 2xx, a new connection each time;
    BenchError if the server exits first or does not answer within timeout seconds."""
    url = url or server.url
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        server.check_running()
        with contextlib.suppress(requests.RequestException):
            if requests.get(url, headers={"Connection": "close"}, timeout=2).ok:
                return
        time.sleep(pause)
    raise BenchError(f"{server.label} did not answer on {url} within {timeout:.0f}s")
