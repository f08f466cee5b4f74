"""The command line and the run: the fleet started, ours in-process, both over HTTP, the
targets judged, the results written; the fleet ended however the run ends."""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import requests
from benchlib import (  # benchmarks/ is on sys.path when run as a script
    BenchError,
    cpu_times,
    end_of_run,
    finish,
    load_before_run,
    source_fingerprint,
)

from gpunode_exporter.config import GPUProcessesConfig

from . import BENCHMARKS
from .in_process import SETTLED_WINDOW, TIMEOUT, run_in_process
from .over_http import PEER, run_http
from .processes import Fleet, exe_of, fd_census, pids
from .report import machine, tables, targets

RESULTS = BENCHMARKS / "results" / "gpu_processes.json"


def main(argv: list[str] | None = None, description: str = "") -> int:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--processes", type=int, default=2000, help="processes to start, GPU ones included (2000)")
    p.add_argument("--gpu", type=int, default=16, help="of which hold /dev/nvidia0 (16)")
    p.add_argument("--scrapes", type=int, default=300, help="in-process steady scrapes, settled and churn (300)")
    p.add_argument("--young-scrapes", type=int, default=300, help="in-process scrapes with the fleet young (300)")
    p.add_argument("--cold", type=int, default=3,
                   help="fresh collectors, each scraped until no check is pending (3)")
    p.add_argument("--budget", type=float, default=GPUProcessesConfig().check_budget_seconds,
                   help="gpu_processes.check_budget_seconds, in-process and over HTTP "
                        f"(default {GPUProcessesConfig().check_budget_seconds:g}, the exporter's)")
    p.add_argument("--http-scrapes", type=int, default=50, help="HTTP scrapes per server and round (50)")
    p.add_argument("--peer-defaults-scrapes", type=int, default=8,
                   help="HTTP scrapes of process-exporter with the package's defaults, alternating with ours; "
                        "0: skip (8)")
    p.add_argument("--churn", type=int, default=20, help="processes that exit and start between scrapes (20)")
    p.add_argument("--warmup", type=int, default=10, help="warm-up scrapes (10)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--output", type=Path, default=RESULTS, help=f"JSON results (default {RESULTS})")
    args = p.parse_args(argv)
    if not 1 <= args.gpu < args.processes <= 20_000 or not 0 < args.churn < args.processes - args.gpu:
        p.error("want 1 <= --gpu < --processes <= 20000 and 0 < --churn < plain processes")
    if min(args.scrapes, args.young_scrapes, args.cold, args.http_scrapes) < 1 or \
            min(args.warmup, args.peer_defaults_scrapes) < 0:
        p.error("scrape counts must be >= 1")
    if not 0 <= args.budget <= TIMEOUT:
        p.error(f"--budget must be 0..{TIMEOUT:g} s")
    if os.geteuid() != 0:
        p.error("needs root: a private /dev (mount namespace) gives the GPU processes /dev/nvidia0")
    for tool in ("unshare", PEER):
        if shutil.which(tool) is None:
            p.error(f"{tool} not found (apt-get install {'util-linux' if tool == 'unshare' else PEER})")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the finally blocks below

    results: dict[str, Any] = {
        "processes": args.processes, "gpu": args.gpu, "churn": args.churn, "check_budget_seconds": args.budget,
        "what": {"ours": "Scraper([GPUProcessesCollector(ctx)], 5.0) + Renderer().render(scraper.collect()), "
                         "procfs /proc",
                 "ours_http": "gpunode-exporter --collector.disable-defaults --collector.gpu_processes "
                              f"(rescan_young_seconds {SETTLED_WINDOW}, check_budget_seconds {args.budget:g})",
                 "peer_http": f"{PEER} -threads=false -gather-smaps=false, every process in a group named by comm",
                 "settle": "fresh collectors with the default rescan_young_seconds, scraped back to back until "
                           "gpunode_gpu_process_checks_pending is 0",
                 "settled": f"rescan_young_seconds {SETTLED_WINDOW}: every fleet process counts as old",
                 "young": "the default rescan_young_seconds with every fleet process younger than it",
                 "fd_checks": "ProcessTracker._classify calls (list a process's fds, readlink them)"},
        "machine": machine(), "exporter_source_sha256": source_fingerprint()}
    before = fd_census()
    results["census_before"] = before
    results["machine"]["before_run"] = load_before_run()
    others = [pid for pid in pids() if exe_of(pid) == shutil.which(PEER)]
    results["machine"]["other_process_exporters"] = len(others)
    if results["machine"]["before_run"]["busy_pct"] > 20 or others:
        print(f"WARNING: before the run the CPUs were {results['machine']['before_run']['busy_pct']}% busy and "
              f"{len(others)} {PEER} already ran (its systemd service?): the figures will be noisy.\n",
              flush=True)
    start, cpu_before = time.monotonic(), cpu_times()
    try:
        with tempfile.TemporaryDirectory(prefix="gpu-processes-bench-") as tmp:
            fleet = Fleet(args.processes, args.gpu, args.seed, Path(tmp))
            try:
                fleet.wait_started()
                results["fleet_start_seconds"] = round(time.monotonic() - start, 1)
                results["census_fleet"] = fd_census()
                results["in_process"] = run_in_process(args, fleet)
                results["http"] = run_http(args, fleet, Path(tmp))
                results["census_end"] = fd_census()
            finally:
                fleet.stop()
    except (BenchError, requests.RequestException) as err:
        sys.stderr.write(f"gpu_processes: FAILED: {err}\n")
        return 1
    end_of_run(results, start, cpu_before)
    results["targets"] = targets(results)
    results["target_pass"] = results["targets"][0]["pass"]

    for line in tables(results):
        print(line)
    print("\n| target | value (ms) | result |\n|---|---:|---|")
    for t in results["targets"]:
        print(f"| {t['target']} | {t['value_ms']} | {'PASS' if t['pass'] else 'MISS'} |")
    f, b = results["census_fleet"], results["census_before"]
    print(f"\n/proc: {b['processes']} processes before the fleet ({b['fds']:,} fds), {f['processes']} with it "
          f"({f['fds']:,} fds; per process p50 {f['fds_per_process']['p50']:.0f}, max "
          f"{f['fds_per_process']['max']}; {f['processes_with_50_to_200_fds']} hold 50-200)")
    m = results["machine"]
    return finish(results, args.output,
                  f"{m['nproc']} CPUs ({m['cpu_model']}), kernel {m['kernel']}, "
                   f"Python {m['python_version']}, process-exporter {m['process_exporter_version']}")
