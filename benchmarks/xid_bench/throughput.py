"""1. Parse throughput: the tracker's own parser over a mixed stream, beside a regex per line
and grep over the same records, so that the figure has a floor and a ceiling."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

from benchlib import BenchError, cpu_times, machine_load, percentile  # benchmarks/ is on sys.path when run as a script

from gpunode_exporter.nvml import Session
from gpunode_exporter.xid.gpus import GpuDirectory
from gpunode_exporter.xid.tracker import XidTracker

from .records import DGX_SYSFS, mixed_stream

BATCH = 4096  # records per XidTracker._handle call: KmsgReader.read()'s max_records
NAIVE_PATTERN = r"NVRM: Xid \(PCI:([0-9a-f:.]+)\): (\d+)"
GREP = ["grep", "-c", "NVRM: Xid"]


def tracker(proc: Path) -> XidTracker:
    """A tracker that is never started: _handle is called directly, as its reader thread would."""
    session = Session()
    return XidTracker(Path("/nonexistent-kmsg"), state_dir=None, persist=False, procfs=proc,
                      directory=GpuDirectory(session, DGX_SYSFS, proc), session=session)


def run_ours(batches: list[list[bytes]], proc: Path) -> tuple[float, dict[str, int]]:
    t = tracker(proc)
    start = time.perf_counter()
    for batch in batches:
        t._handle(batch)
    elapsed = time.perf_counter() - start
    return elapsed, {"xids": sum(c.value for c in t.state.counts.values()), "lost": t.state.records_lost,
                     "malformed": t.malformed, "last_seq": t.state.kmsg_seq or 0}


def run_naive(records: list[bytes]) -> tuple[float, dict[str, int]]:
    """A log monitor's loop: decode the line, search it, count what matched per GPU and code."""
    pattern = re.compile(NAIVE_PATTERN)
    counts: Counter[tuple[str, str]] = Counter()
    start = time.perf_counter()
    for line in records:
        m = pattern.search(line.decode(errors="replace"))
        if m is not None:
            counts[(m[1], m[2])] += 1
    elapsed = time.perf_counter() - start
    return elapsed, {"xids": sum(counts.values())}


def run_grep(path: Path) -> tuple[float, dict[str, int]]:
    env = {**os.environ, "LC_ALL": "C"}
    start = time.perf_counter()
    out = subprocess.run([*GREP, str(path)], capture_output=True, env=env, check=False)
    elapsed = time.perf_counter() - start
    if out.returncode not in (0, 1):
        raise BenchError(f"grep failed: {out.stderr.decode(errors='replace')}")
    return elapsed, {"xids": int(out.stdout)}


def throughput(args: argparse.Namespace, tmp: Path, proc: Path) -> dict[str, Any]:
    build = time.perf_counter()
    records, injected = mixed_stream(args.records)
    batches = [records[i:i + BATCH] for i in range(0, len(records), BATCH)]
    path = tmp / "mixed.kmsg"
    path.write_bytes(b"\n".join(records) + b"\n")
    build = time.perf_counter() - build
    runs: dict[str, Any] = {"ours": lambda: run_ours(batches, proc), "naive_regex": lambda: run_naive(records),
                            "grep": lambda: run_grep(path)}
    seconds: dict[str, list[float]] = {k: [] for k in runs}
    found: dict[str, list[dict[str, int]]] = {k: [] for k in runs}
    keys = list(runs)
    load0 = cpu_times()
    for rep in range(args.repetitions):
        for key in keys[rep % len(keys):] + keys[:rep % len(keys)]:  # each goes first in turn
            elapsed, what = runs[key]()
            seconds[key].append(elapsed)
            found[key].append(what)
    load = machine_load(load0, cpu_times())
    for what in found["ours"]:
        if what != {"xids": injected, "lost": 0, "malformed": 0, "last_seq": args.records - 1}:
            raise BenchError(f"ours counted {what}; {injected} Xids were injected, none lost or malformed")
    if any(w["xids"] != injected for w in found["grep"]):
        raise BenchError(f"grep counted {found['grep']}, {injected} Xids were injected")
    out: dict[str, Any] = {"records": args.records, "xids_injected": injected, "batch": BATCH,
                           "bytes": path.stat().st_size, "build_seconds": round(build, 2),
                           "machine_during": load, "peers": {}}
    for key in keys:
        rates = [args.records / s for s in seconds[key]]
        out["peers"][key] = {"records_per_s_best": max(rates), "records_per_s_median": percentile(rates, 0.5),
                             "seconds": seconds[key], "xids_found": found[key][0]["xids"], "counts": found[key][0]}
    path.unlink()
    return out

