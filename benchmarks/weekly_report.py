#!/usr/bin/env python3
"""`gpunode-exporter report` over 63 nodes x 14 days, on VictoriaMetrics and Prometheus side by side.

    .venv/bin/python benchmarks/weekly_report.py [--duration 14d] [--backend victoriametrics --backend prometheus]

The fleet is fleet/scenarios/lablup.yaml (63 nodes of 8 GPUs: a 60-node training session that
fails and restarts, spares in single-node sessions, Xid 79 and 94, lost GPUs, stragglers) run for
--duration instead of its 5 days: the jobs without an end run on to the new end, the faults stay
in the first 5 days. For each backend in turn (never both at once: 2 CPUs), a server from
Debian's package with the harness' flags (fleet/harness.py: serve) is loaded with the fleet by
remote write, in time order, the fleet simulated --nodes-per-pass nodes at a time (kept on disk
until written). No rules are replayed. Once the server has settled (Prometheus' compactions,
VictoriaMetrics' merges), the report runs as its own process, the console script, over the
scenario's whole range, as an operator would run it:

    gpunode-exporter report --prometheus.url URL --from=RFC3339 --to=RFC3339 --output DIR

Measured per backend: load (simulation, spill, remote write, flush), settle, the report's wall
and CPU time and peak RSS (its VmHWM), the server's peak RSS sampled every 0.2 s during the
report and its CPU time then, its VmHWM since it started, the data directory's size on disk;
and from report.json, the time per query group (asking and parsing, chunk by chunk): where the
time goes.

Checks that fail the run (exit 1): the report scored against the simulator's truth
(fleet/report_score.py) with no failed check, but for one thing no replay can give: a straggler's
node and cause come from the rule pack's cause alerts (ALERTS), which are not replayed here, so
each straggler must be found in time (an episode of the report overlapping the true one, none
invented) and named job-wide; and both backends' reports must agree (jobs, attempts, failures,
stragglers). Results: benchmarks/results/report.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import requests
from benchlib import (  # benchmarks/ is on sys.path when run as a script; common puts the repository there
    BenchError,
    cpu_model,
    cpu_times,
    end_of_run,
    find_ours,
    finish,
    git_commit,
    machine_info,
    source_fingerprint,
)

from fleet import harness, report_score, scenario
from fleet.simulate import Fleet, Series
from gpunode_report.source import parse_time, rfc3339

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"prometheus": "prometheus", "victoriametrics": "victoria-metrics"}
SAMPLE_EVERY = 0.2  # seconds between RSS samples of the server and the report
MIB = 1 << 20


class TimedFleet(Fleet):
    """A Fleet that counts the seconds spent simulating series (inside series())."""

    generating = 0.0

    def series(self, nodes: range | None = None) -> Iterator[Series]:
        it = super().series(nodes)
        while True:
            began = time.perf_counter()
            try:
                item = next(it)
            except StopIteration:
                self.generating += time.perf_counter() - began
                return
            self.generating += time.perf_counter() - began
            yield item


def metrics(url: str) -> dict[str, float]:
    """The server's own /metrics, each name summed over its label sets."""
    out: dict[str, float] = {}
    for line in requests.get(f"{url}/metrics", timeout=30).text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_labels, _, value = line.rpartition(" ")
        name = name_labels.split("{", 1)[0]
        with contextlib.suppress(ValueError):
            out[name] = out.get(name, 0.0) + float(value)
    return out


def server_process(url: str) -> psutil.Process:
    """The backend server this process started that listens on url's port."""
    listen = url.rsplit("//", 1)[1]
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if any(listen in arg for arg in child.cmdline()):
                return child
    raise BenchError(f"no child process serves {url}")


def settle(backend: str, url: str, limit: float) -> dict[str, Any]:
    """Until the server's background work after the load is done: Prometheus' compactions (its
    head into 2-hour blocks, those into larger ones; it looks every minute), VictoriaMetrics'
    merges. A long-running server holds its data so; a report run during them would time both."""
    began = time.monotonic()
    if backend == "prometheus":
        def state() -> tuple[float, ...]:
            m = metrics(url)
            return (m.get("prometheus_tsdb_compactions_total", 0), m.get("prometheus_tsdb_blocks_loaded", 0),
                    m.get("prometheus_tsdb_compaction_populating_block", 0))
        quiet_for = 75.0  # more than one compaction cycle with nothing to do
    else:
        def state() -> tuple[float, ...]:
            return (metrics(url).get("vm_active_merges", 0),)
        quiet_for = 10.0
    last, since = state(), time.monotonic()
    while time.monotonic() - began < limit:
        time.sleep(5)
        now = state()
        busy = now[-1] > 0 if backend == "prometheus" else now[0] > 0
        if now != last or busy:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet_for:
            return {"seconds": round(time.monotonic() - began, 1), "settled": True}
    return {"seconds": round(time.monotonic() - began, 1), "settled": False}


def backend_figures(backend: str, url: str) -> dict[str, float]:
    """What the server says it holds: samples and series taken, blocks or parts."""
    m = metrics(url)
    if backend == "prometheus":
        keys = {"samples_appended": "prometheus_tsdb_head_samples_appended_total",
                "out_of_order_samples_appended": "prometheus_tsdb_head_out_of_order_samples_appended_total",
                "series_created": "prometheus_tsdb_head_series_created_total",
                "blocks_loaded": "prometheus_tsdb_blocks_loaded",
                "compactions": "prometheus_tsdb_compactions_total"}
    else:
        keys = {"rows_added": "vm_rows_added_to_storage_total", "series_created": "vm_new_timeseries_created_total",
                "parts": "vm_parts", "merges": "vm_merges_total"}
    return {k: m.get(v, 0.0) for k, v in keys.items()}


def disk_usage(path: Path) -> dict[str, int]:
    """Bytes on disk (allocated blocks) under path, in all and per top-level entry."""
    out: dict[str, int] = {}
    for top in sorted(path.iterdir()) if path.is_dir() else []:
        files = [top] if not top.is_dir() else [Path(d) / f for d, _, fs in os.walk(top) for f in fs]
        out[top.name] = sum(f.lstat().st_blocks * 512 for f in files if f.exists())
    return {"total": sum(out.values()), **out}


def status_kib(pid: int, key: str) -> int:
    """A line of /proc/PID/status in KiB (VmHWM: peak RSS, VmRSS); 0 once the process is gone."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    return next((int(line.split()[1]) for line in text.splitlines() if line.startswith(f"{key}:")), 0)


def run_report(argv: list[str], log: Path, server: psutil.Process, timeout: float) -> dict[str, Any]:
    """The report as its own process: wall and CPU time (its rusage from wait4), its peak RSS (its
    VmHWM, read every SAMPLE_EVERY s: the last reading, at most that long before it exits), and the
    server's RSS, sampled as often, and CPU time meanwhile. Not wait4's ru_maxrss: the child starts
    as a vfork of this process, and the kernel keeps the larger of its peak and ours (~1 GB after
    the simulation) as its ru_maxrss."""
    cpu0 = server.cpu_times()
    peaks = {"server": status_kib(server.pid, "VmRSS"), "report": 0}
    stop = threading.Event()
    with log.open("wb") as out:
        began = time.monotonic()
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)

        def sample() -> None:
            while not stop.wait(SAMPLE_EVERY):
                peaks["server"] = max(peaks["server"], status_kib(server.pid, "VmRSS"))
                peaks["report"] = max(peaks["report"], status_kib(proc.pid, "VmHWM"))  # 0 once it has exited
                if time.monotonic() - began > timeout:
                    proc.kill()

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        _pid, status, usage = os.wait4(proc.pid, 0)
        wall = time.monotonic() - began
        proc.returncode = os.waitstatus_to_exitcode(status)
        stop.set()
        sampler.join()
    cpu1 = server.cpu_times()
    return {"exit": proc.returncode, "seconds": round(wall, 2),
            "cpu_seconds": round(usage.ru_utime + usage.ru_stime, 2),
            "peak_rss_mib": round(peaks["report"] * 1024 / MIB, 1),
            "server_peak_rss_mib": round(peaks["server"] * 1024 / MIB, 1),
            "server_cpu_seconds": round(cpu1.user + cpu1.system - cpu0.user - cpu0.system, 2)}


def vmhwm_mib(proc: psutil.Process) -> float:
    return round(status_kib(proc.pid, "VmHWM") * 1024 / MIB, 1)


def check(fleet: Fleet, report: dict[str, Any]) -> dict[str, Any]:
    """The report scored against the truth (fleet/report_score.py). Without the rule pack's cause
    alerts, which no replay wrote here, a straggler's node and cause cannot be named: those
    checks are replaced by the same stragglers found in time and named job-wide."""
    result = report_score.score(fleet, report)
    culprit = [line for line in result.lines if line.startswith("FAIL")
               and (line.startswith("FAIL straggler ") or line.startswith("FAIL stragglers invented"))]
    other = [line for line in result.lines if line.startswith("FAIL") and line not in culprit]
    lines = []
    if culprit:
        episodes = [(parse_time(s["start"], 0), parse_time(s["end"], 0), s["node"], s["cause"])
                    for s in report["stragglers"]]
        windows = []
        for f, _attempts in report_score._stragglers(fleet):  # the true stragglers and the attempts they slow
            start = fleet.start + f.at
            windows.append((start, start + f.duration("lasts", fleet.s.duration), f"{f.kind} on node {f.node}"))
        for start, end, what in windows:
            found = any(e[0] < end and e[1] > start for e in episodes)
            lines.append(f"{'ok  ' if found else 'FAIL'} straggler {what} found in time (culprit not named)")
        invented = [e for e in episodes if not any(e[0] < end and e[1] > start for start, end, _ in windows)]
        lines.append(f"{'FAIL' if invented else 'ok  '} stragglers invented in time: {len(invented)}")
        named = [e for e in episodes if (e[2], e[3]) != ("", "job_wide")]
        lines.append(f"{'FAIL' if named else 'ok  '} stragglers named without cause alerts: {len(named)} "
                     "(a culprit needs ALERTS)")
    failed = other + [line for line in lines if line.startswith("FAIL")]
    return {"checks": len(result.lines), "failed": len(failed), "fail_lines": failed,
            "culprit_checks_replaced": culprit, "replacement_lines": lines}


def summary(report: dict[str, Any]) -> dict[str, Any]:
    """What both backends' reports must agree on, and the headline figure."""
    return {"jobs": len(report["jobs"]), "attempts": sum(j["attempts"] for j in report["jobs"]),
            "failures": len(report["failures"]), "stragglers": len(report["stragglers"]),
            "goodput": report["goodput"], "abnormal_ends": report["mtbf"]["abnormal_ends"]}


def measure(backend: str, fleet: TimedFleet, args: argparse.Namespace, ours: str) -> dict[str, Any]:
    workdir = args.workdir / backend
    out = args.workdir / f"report-{backend}"
    shutil.rmtree(out, ignore_errors=True)
    began, generated = time.monotonic(), fleet.generating
    ours_cpu = resource.getrusage(resource.RUSAGE_SELF)
    print(f"{backend}: loading {fleet.s.nodes} nodes x {fleet.s.duration / 86400:g} days ...", flush=True)
    with harness.serve(backend, fleet, workdir, nodes_per_pass=args.nodes_per_pass) as url:
        load = time.monotonic() - began
        now = resource.getrusage(resource.RUSAGE_SELF)
        server = server_process(url)
        cpu = server.cpu_times()
        row: dict[str, Any] = {
            "load_seconds": round(load, 1), "load_simulate_seconds": round(fleet.generating - generated, 1),
            # who was busy: this process (simulate, spill, encode, send) and the server (ingest)
            "load_bench_cpu_seconds": round(now.ru_utime + now.ru_stime - ours_cpu.ru_utime - ours_cpu.ru_stime, 1),
            "load_server_cpu_seconds": round(cpu.user + cpu.system, 1), "load_vmhwm_mib": vmhwm_mib(server)}
        print(f"{backend}: loaded in {load:.0f} s ({row['load_simulate_seconds']:.0f} s simulating); settling",
              flush=True)
        row["settle"] = settle(backend, url, args.settle_limit)
        row["backend"] = backend_figures(backend, url)
        since, until = rfc3339(fleet.timestamps[0]), rfc3339(fleet.timestamps[-1] + fleet.s.step)
        argv = [ours, "report", "--prometheus.url", url, f"--from={since}", f"--to={until}", "--output", str(out)]
        row["command"] = " ".join(argv)
        print(f"{backend}: settled in {row['settle']['seconds']:.0f} s; {row['command']}", flush=True)
        row["report"] = run_report(argv, workdir / "report.log", server, args.report_timeout)
        row["backend_after"] = backend_figures(backend, url)
        row["server_vmhwm_mib"] = vmhwm_mib(server)
        row["data_bytes"] = disk_usage(workdir / ("prometheus-data" if backend == "prometheus" else "vm-data"))
    if row["report"]["exit"] != 0:
        row["error"] = (workdir / "report.log").read_text(errors="replace")[-3000:]
        print(f"{backend}: the report exited {row['report']['exit']}:\n{row['error']}", flush=True)
        return row
    report = json.loads((out / "report.json").read_text())
    seconds = report["queries"]["seconds"]
    row["queries"] = {"count": report["queries"]["count"],
                      "seconds": dict(sorted(seconds.items(), key=lambda kv: -kv[1])),
                      "total_seconds": round(sum(seconds.values()), 2)}
    row["summary"] = summary(report)
    row["check"] = check(fleet, report)
    r = row["report"]
    print(f"{backend}: report in {r['seconds']:.1f} s ({row['queries']['total_seconds']:.1f} s in "
          f"{row['queries']['count']} queries), peak RSS {r['peak_rss_mib']:.0f} MiB; server peak "
          f"{r['server_peak_rss_mib']:.0f} MiB; {row['check']['failed']} of {row['check']['checks']} checks failed",
          flush=True)
    return row


def version(backend: str) -> str:
    done = subprocess.run(["dpkg-query", "-W", "-f=${Version}", PACKAGES[backend]], capture_output=True, text=True)
    return done.stdout.strip()


def table(rows: dict[str, dict[str, Any]]) -> str:
    lines = ["| backend | load s (simulating) | settle s | report s | report CPU s | report peak RSS MiB "
             "| backend peak RSS MiB (report / since start) | backend CPU s | data on disk | top 3 query groups (s) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for backend, row in rows.items():
        r = row["report"]
        top = ", ".join(f"{k} {v:.1f}" for k, v in list(row.get("queries", {}).get("seconds", {}).items())[:3])
        lines.append(f"| {backend} | {row['load_seconds']:.0f} ({row['load_simulate_seconds']:.0f}) | "
                     f"{row['settle']['seconds']:.0f} | {r['seconds']:.1f} | {r['cpu_seconds']:.1f} | "
                     f"{r['peak_rss_mib']:.0f} | {r['server_peak_rss_mib']:.0f} / {row['server_vmhwm_mib']:.0f} | "
                     f"{r['server_cpu_seconds']:.1f} | {row['data_bytes']['total'] / MIB:,.0f} MiB | {top} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenario", default="lablup", help="shipped scenario name or file (default: lablup)")
    parser.add_argument("--duration", default="14d", help="in place of the scenario's (default: 14d)")
    parser.add_argument("--backend", action="append", choices=harness.BACKENDS,
                        help="repeat for both (default: victoriametrics, then prometheus)")
    parser.add_argument("--nodes-per-pass", type=int, default=8,
                        help="nodes simulated at a time, kept on disk until written (default: 8)")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/gpunode-bench-report"),
                        help="each backend's data (BACKEND/) and report (report-BACKEND/); emptied first")
    parser.add_argument("--settle-limit", type=float, default=900.0,
                        help="seconds to wait at most for compactions or merges after the load (default: 900)")
    parser.add_argument("--report-timeout", type=float, default=3600.0, help="seconds (default: 3600)")
    parser.add_argument("--output", type=Path, default=ROOT / "benchmarks" / "results" / "report.json")
    args = parser.parse_args(argv)
    backends = args.backend or ["victoriametrics", "prometheus"]
    if tools := harness.missing_tools():
        sys.exit(f"report benchmark: not installed: {', '.join(tools)} (scripts/install-deps.sh --test)")
    ours = find_ours()
    started, cpu_before = time.monotonic(), cpu_times()
    sc = scenario.load(args.scenario, args.duration)
    start = (time.time() // 3600) * 3600 - sc.duration - 3600  # as python -m fleet: ending an hour ago
    results: dict[str, Any] = {
        "machine": machine_info(**{f"{b}_version": version(b) for b in backends}, psutil=psutil.__version__,
                                memory_gib=round(psutil.virtual_memory().total / (1 << 30), 1)),
        "exporter_source_sha256": source_fingerprint(), "commit": git_commit(ROOT),
        "scenario": {"name": sc.name, "nodes": sc.nodes, "days": sc.duration / 86400, "step": sc.step,
                     "start": rfc3339(start), "end": rfc3339(start + sc.duration)},
        "nodes_per_pass": args.nodes_per_pass, "backends": {}}
    fleet = TimedFleet(sc, start)
    began = time.monotonic()
    fleet._pace  # noqa: B018  (every node's job pace: computed once here, so each load simulates alike)
    results["scenario"]["pace_seconds"] = round(time.monotonic() - began, 1)
    rows: dict[str, dict[str, Any]] = results["backends"]
    for backend in backends:
        rows[backend] = measure(backend, fleet, args, ours)
    failed = [f"{b}: the report exited {row['report']['exit']}" for b, row in rows.items() if row["report"]["exit"]]
    for b, row in rows.items():
        if "check" in row:
            failed += [f"{b}: {line}" for line in row["check"]["fail_lines"]]
    said = {b: {k: v for k, v in row["summary"].items() if k != "goodput"}
            for b, row in rows.items() if "summary" in row}
    if len({tuple(s.items()) for s in said.values()}) > 1:
        failed.append(f"the backends' reports differ: {said}")
    results["failed"] = failed
    results["bench_peak_rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / MIB, 1)
    print()
    print(table(rows))
    for b, row in rows.items():
        if "queries" in row:
            q = row["queries"]
            print(f"\n{b}: {q['count']} queries, {q['total_seconds']:.1f} s of {row['report']['seconds']:.1f} s; "
                  "by group: " + ", ".join(f"{k} {v:.1f}" for k, v in q["seconds"].items()))
            print(f"{b}: {row['summary']}")
            for line in row["check"]["replacement_lines"]:
                print(f"{b}: {line}")
    print(f"\nthis process: peak RSS {results['bench_peak_rss_mib']:.0f} MiB")
    end_of_run(results, started, cpu_before, ROOT)
    finish(results, args.output, f"{os.cpu_count()} CPUs ({cpu_model()})")
    if failed:
        print("\nFAILED:\n" + "\n".join(failed))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
