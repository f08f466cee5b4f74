"""Ours in-process: the collector as the server runs it, timed without HTTP, its fd checks
counted, through settling, a young fleet, a settled one and churn, so that the collector's own
cost is seen apart from the server's."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from benchlib import BenchError, latencies_ms, summarize  # benchmarks/ is on sys.path when run as a script

from gpunode_common.exposition import Renderer
from gpunode_exporter.collector.base import Context
from gpunode_exporter.collector.gpu_processes import GPUProcessesCollector
from gpunode_exporter.config import Config, GPUProcessesConfig
from gpunode_exporter.scrape import Scraper

from .processes import Fleet, pids

TIMEOUT = 5.0  # the collector budget, as the server's default collector_timeout_seconds
SETTLE_TIMEOUT = 120.0  # for a fresh collector, scraped back to back, to check every process
SETTLED_WINDOW = 0.001  # rescan_young_seconds for "settled": every fleet process is older than this

FOUND = "gpunode_gpu_processes"
PENDING = "gpunode_gpu_process_checks_pending"
SUCCESS = 'gpunode_scrape_collector_success{collector="gpu_processes"}'
IO_TOTALS = ("gpunode_gpu_process_read_bytes_total", "gpunode_gpu_process_write_bytes_total",
             "gpunode_gpu_process_read_syscalls_total", "gpunode_gpu_process_write_syscalls_total")


def values(body: bytes) -> dict[str, float]:
    """Sample name{labels} -> value, for the few series we check."""
    out = {}
    for line in body.decode().splitlines():
        if line.startswith("gpunode_"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def check_ours(body: bytes, gpu: int, settled: bool = True) -> dict[str, float]:
    """The collector succeeded, read every process, and found the `gpu` GPU processes: all of them
    when `settled` or once no check is pending, and never more."""
    v = values(body)
    if v.get(SUCCESS) != 1:
        raise BenchError(f"our gpu_processes collector failed: {body.decode()[-600:]}")
    if PENDING not in v:
        raise BenchError(f"no {PENDING} in our response: an exporter without the check budget?")
    found = v.get(FOUND, -1)
    if ((settled or v[PENDING] == 0) and found != gpu) or not 0 <= found <= gpu:
        raise BenchError(f"{FOUND} is {found} with {v[PENDING]:.0f} checks pending, want {gpu}"
                         f"{'' if settled else ' once none is pending, at most that before'}")
    unreadable = {k: x for k, x in v.items() if k.startswith("gpunode_gpu_process_unreadable") and x}
    if unreadable:
        raise BenchError(f"processes we may not read: {unreadable}")
    return v


class Scrapable(Protocol):
    """An exporter over HTTP (over_http.Server): one timed scrape, the body uncompressed."""

    def timed(self) -> tuple[float, bytes]: ...


class Ours:
    """One collector as the server runs it, on the real /proc.

    `checks` counts fd checks (ProcessTracker._classify: list a process's fds and readlink them),
    by wrapping that private method: a call more per check, next to a ~0.5 ms check."""

    def __init__(self, rescan_young_seconds: float, check_budget_seconds: float) -> None:
        config = Config(gpu_processes=GPUProcessesConfig(rescan_young_seconds=rescan_young_seconds,
                                                         check_budget_seconds=check_budget_seconds))
        ctx = Context(procfs=Path("/proc"), sysfs=Path("/sys"), config=config, route_lookup=lambda _a: None)
        collector = GPUProcessesCollector(ctx)
        self.scraper = Scraper([collector], TIMEOUT)
        self.renderer = Renderer()
        self.checks = 0
        tracker = collector._tracker
        self.stat_counts_fds = tracker._stat_counts_fds
        classify = tracker._classify

        def counted(pid: int, proc: Any) -> None:
            self.checks += 1
            classify(pid, proc)

        tracker._classify = counted  # type: ignore[method-assign]

    def timed(self) -> tuple[float, bytes]:
        start = time.perf_counter()
        body = self.renderer.render(self.scraper.collect())
        return time.perf_counter() - start, body

    def close(self) -> None:
        self.scraper.close(wait=True)


@dataclass
class Scrapes:
    """A run of timed scrapes of ours: latency, fd checks, and what each scrape reported."""

    seconds: list[float] = field(default_factory=list)
    checks: list[int] = field(default_factory=list)  # in-process only
    pending: list[int] = field(default_factory=list)
    found: list[int] = field(default_factory=list)
    first: dict[str, float] = field(default_factory=dict)
    last: dict[str, float] = field(default_factory=dict)
    wall: float = 0.0  # first scrape's start to last one's end, `before` included

    def summary(self, **extra: Any) -> dict[str, Any]:
        out = {"scrapes": len(self.seconds), **extra, **summarize(self.seconds),
               "max_checks_pending": max(self.pending)}
        if self.checks:
            out["fd_checks_per_scrape"] = {"mean": sum(self.checks) / len(self.checks), "max": max(self.checks)}
        return {**out, "latencies_ms": latencies_ms(self.seconds)}

    def settling(self, **extra: Any) -> dict[str, Any]:
        """For a run until checks_pending is 0: how many scrapes, how long, when every GPU process was found."""
        return {**self.summary(**extra), "wall_s": round(self.wall, 3), "first_scrape_ms": self.seconds[0] * 1000,
                "first_pending": self.pending[0], "scrape_all_gpu_found": self.found.index(max(self.found)) + 1,
                "pending_each_scrape": self.pending, "fd_checks_each_scrape": self.checks}


def run_scrapes(ours: Ours | Scrapable, gpu: int, n: int | None, before: Callable[[], None] | None = None) -> Scrapes:
    """n scrapes of ours, in-process or over HTTP; with n None, scrapes until checks_pending is 0
    (until then each may find fewer than `gpu` GPU processes). `before` runs ahead of each, untimed."""
    out = Scrapes()
    start = time.perf_counter()
    while n is None or len(out.seconds) < n:
        if before is not None:
            before()
        checks = ours.checks if isinstance(ours, Ours) else 0
        elapsed, body = ours.timed()
        v = check_ours(body, gpu, settled=n is not None)
        out.seconds.append(elapsed)
        if isinstance(ours, Ours):
            out.checks.append(ours.checks - checks)
        out.pending.append(int(v[PENDING]))
        out.found.append(int(v[FOUND]))
        out.first = out.first or v
        out.last = v
        if n is None and not out.pending[-1]:
            break
        if n is None and time.perf_counter() - start > SETTLE_TIMEOUT:
            raise BenchError(f"{out.pending[-1]} checks still pending after {len(out.seconds)} scrapes "
                             f"in {SETTLE_TIMEOUT:.0f} s")
    out.wall = time.perf_counter() - start
    return out


def run_in_process(args: argparse.Namespace, fleet: Fleet) -> dict[str, Any]:
    window = GPUProcessesConfig().rescan_young_seconds
    out: dict[str, Any] = {"check_budget_seconds": args.budget}
    # Settling: fresh collectors with the default settings, scraped until no check is pending.
    runs = []
    for i in range(args.cold):
        ours = Ours(window, args.budget)
        procs = len(pids())
        s = run_scrapes(ours, args.gpu, None)
        runs.append(s.settling(processes_in_proc=procs))
        if i < args.cold - 1:
            ours.close()
    every = [x / 1000 for r in runs for x in r["latencies_ms"]]
    after_first = [x / 1000 for r in runs for x in r["latencies_ms"][1:]]
    out["settle"] = {"repetitions": args.cold, "rescan_young_seconds": window,
                     "stat_counts_fds": ours.stat_counts_fds,
                     "all_settle_scrapes": summarize(every),
                     "after_first": summarize(after_first) if after_first else None,
                     "runs": runs}

    # Young: the last of them, on with the default window, the whole fleet younger than it. A young
    # process is checked again only when its fd count changes; here none does.
    for _ in range(args.warmup):
        ours.timed()
    young = run_scrapes(ours, args.gpu, args.young_scrapes)
    ours.close()
    if fleet.age() >= window:
        raise BenchError(f"the fleet is {fleet.age():.0f} s old, no longer younger than {window:g} s")
    out["steady_young"] = young.summary(rescan_young_seconds=window, fleet_age_s=round(fleet.age(), 1))

    # Settled: nothing young; new PIDs are checked once. Then the same with churn.
    ours = Ours(SETTLED_WINDOW, args.budget)
    settle = run_scrapes(ours, args.gpu, None)
    for _ in range(args.warmup):
        ours.timed()
    steady = run_scrapes(ours, args.gpu, args.scrapes)
    churn = run_scrapes(ours, args.gpu, args.scrapes, lambda: fleet.churn(args.churn))
    ours.close()
    out["steady_settled"] = steady.summary(rescan_young_seconds=SETTLED_WINDOW,
                                           settle_scrapes=len(settle.seconds))
    out["steady_settled_churn"] = churn.summary(churn_per_scrape=args.churn, rescan_young_seconds=SETTLED_WINDOW)
    grew = {name: [steady.first[name], churn.last[name]] for name in IO_TOTALS}
    if not all(b > a for a, b in grew.values()):
        raise BenchError(f"the GPU processes' I/O totals did not grow: {grew}")
    out["gpu_io_totals_first_last"] = grew
    return out

