#!/usr/bin/env python3
"""Burst benchmark: many scrapes at once, gpunode-exporter vs node_exporter, in one run.

    python benchmarks/burst.py [--bursts 200 1000] [--repeat 5]

A burst opens N connections at the same moment (asyncio, one event loop) and sends one
`GET /metrics` on each (Connection: close). Each request ends answered (any HTTP status:
200, or 503 once --web.max-requests, 40 for both, are busy), refused (connection error)
or timed out (10 s). Both exporters read the same fake procfs (benchmarks/make_fixture.py,
32 NFS mounts) with their NFS collector alone; the bursts alternate between them, so both
see the same machine. Results: a markdown table and benchmarks/results/burst.json.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchlib import (  # benchmarks/ is on sys.path when run as a script
    BenchError,
    ServerProcess,
    cpu_times,
    finish,
    free_port,
    machine_load,
    percentile,
    source_fingerprint,
)
from make_fixture import write_fixture
from scrape_latency import NODE_EXPORTER, find_ours, wait_ready

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "burst.json"
TIMEOUT = 10.0
MAX_REQUESTS = 40  # both exporters' --web.max-requests default
# Targets: every request answered, within 1 s for 200 at once and 5 s for 1,000.
DEADLINES = {200: 1.0, 1000: 5.0}


async def _one(port: int, timeout: float) -> tuple[str, float]:
    """(outcome, seconds): outcome is the HTTP status, "refused" or "timeout"."""
    start = time.perf_counter()
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept-Encoding: gzip\r\n"
                         b"Connection: close\r\n\r\n")
            await writer.drain()
            head = await reader.readline()
            await reader.read()  # to the end of the body: the scrape as Prometheus sees it
            writer.close()
    except TimeoutError:
        return "timeout", time.perf_counter() - start
    except OSError:
        return "refused", time.perf_counter() - start
    parts = head.split()
    return (parts[1].decode("ascii", "replace") if len(parts) > 1 else "empty"), time.perf_counter() - start


async def _burst(port: int, n: int) -> tuple[list[tuple[str, float]], float]:
    start = time.perf_counter()
    done = await asyncio.gather(*(_one(port, TIMEOUT) for _ in range(n)))
    return list(done), time.perf_counter() - start


def burst(port: int, n: int) -> tuple[list[tuple[str, float]], float]:
    return asyncio.run(_burst(port, n))


def summary(outcomes: list[tuple[str, float]], walls: list[float], n: int) -> dict[str, Any]:
    answered = [s for outcome, s in outcomes if outcome.isdigit()]
    ms = [s * 1000 for _, s in outcomes]
    counts: dict[str, int] = {}
    for outcome, _ in outcomes:
        counts[outcome] = counts.get(outcome, 0) + 1
    return {
        "requests": len(outcomes), "outcomes": dict(sorted(counts.items())),
        "answered_share": round(len(answered) / len(outcomes), 4),
        "p50_ms": round(percentile(ms, 0.5), 1), "p99_ms": round(percentile(ms, 0.99), 1),
        "max_ms": round(max(ms), 1), "slowest_burst_s": round(max(walls), 3),
        "within_deadline": DEADLINES.get(n) is None or (
            len(answered) == len(outcomes) and max(walls) <= DEADLINES[n]),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bursts", type=int, nargs="+", default=[200, 1000], help="concurrent scrapes per burst")
    p.add_argument("--repeat", type=int, default=5, help="bursts of each size per exporter (default 5)")
    p.add_argument("--output", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    if shutil.which(NODE_EXPORTER) is None:
        p.error(f"{NODE_EXPORTER} not found (apt-get install prometheus-node-exporter)")
    if not all(1 <= n <= 5000 for n in args.bursts) or not 1 <= args.repeat <= 100:
        p.error("--bursts must be 1..5000, --repeat 1..100")
    with tempfile.TemporaryDirectory(prefix="burst-bench-") as tmp:
        try:
            results = bench(args, Path(tmp))
        except BenchError as err:
            sys.stderr.write(f"burst: FAILED: {err}\n")
            return 1
    print("| exporter | burst | answered | outcomes | p50 ms | p99 ms | max ms | slowest burst s | target |")
    print("|---|---:|---:|---|---:|---:|---:|---:|---|")
    for n in args.bursts:
        for key in ("ours", "node"):
            r = results["exporters"][key]["bursts"][str(n)]
            outcomes = ", ".join(f"{k}: {v}" for k, v in r["outcomes"].items())
            target = f"all within {DEADLINES[n]:g} s: {'PASS' if r['within_deadline'] else 'MISS'}" \
                if n in DEADLINES else ""
            print(f"| {results['exporters'][key]['label']} | {n} | {100 * r['answered_share']:.1f} % | {outcomes} "
                  f"| {r['p50_ms']} | {r['p99_ms']} | {r['max_ms']} | {r['slowest_burst_s']} | {target} |")
    m = results["machine"]
    return finish(results, args.output, f"{m['nproc']} CPUs, somaxconn {m['somaxconn']}")


def bench(args: argparse.Namespace, tmpdir: Path) -> dict[str, Any]:
    fixture = write_fixture(tmpdir / "procfs", mounts=32)
    ours_port, node_port = free_port(), free_port()
    exporters = {
        "ours": ServerProcess("ours", "gpunode-exporter", [
            find_ours(), "--collector.disable-defaults", "--collector.nfs", "--path.procfs", str(fixture),
            "--web.max-requests", str(MAX_REQUESTS), "--web.listen-address", f"127.0.0.1:{ours_port}"],
            ours_port, tmpdir / "ours.log"),
        "node": ServerProcess("node", "node_exporter", [
            NODE_EXPORTER, "--collector.disable-defaults", "--collector.mountstats", "--path.procfs", str(fixture),
            "--web.max-requests", str(MAX_REQUESTS), "--web.listen-address", f"127.0.0.1:{node_port}"],
            node_port, tmpdir / "node.log"),
    }
    results: dict[str, Any] = {
        "repeat": args.repeat, "timeout_s": TIMEOUT, "max_requests": MAX_REQUESTS,
        "machine": {"nproc": os.cpu_count(),
                    "somaxconn": int(Path("/proc/sys/net/core/somaxconn").read_text())},
        "exporter_source_sha256": source_fingerprint(),
    }
    raw: dict[str, dict[int, tuple[list, list]]] = {k: {n: ([], []) for n in args.bursts} for k in exporters}
    try:
        for exp in exporters.values():
            exp.start()
        for exp in exporters.values():
            wait_ready(exp)
        start, cpu_before = time.monotonic(), cpu_times()
        for i in range(args.repeat):
            for n in args.bursts:
                order = list(exporters) if i % 2 == 0 else list(reversed(exporters))
                for key in order:
                    outcomes, wall = burst(exporters[key].port, n)
                    raw[key][n][0].extend(outcomes)
                    raw[key][n][1].append(wall)
                    time.sleep(1)  # let the last burst's connections close
        results["wall_seconds"] = round(time.monotonic() - start, 1)
        results["machine"]["during_run"] = machine_load(cpu_before, cpu_times())
        for exp in exporters.values():
            exp.check_running()
    finally:
        for exp in exporters.values():
            exp.stop()
    results["exporters"] = {key: {"label": exporters[key].label, "argv": exporters[key].argv,
                                  "bursts": {str(n): summary(*raw[key][n], n) for n in args.bursts}}
                            for key in exporters}
    results["exporter_source_changed_during_run"] = source_fingerprint() != results["exporter_source_sha256"]
    return results


if __name__ == "__main__":
    sys.exit(main())
