#!/usr/bin/env python3
"""GPU-process collection on ~2,000 real processes (16 holding /dev/nvidia0): gpunode-exporter vs process-exporter.

    python benchmarks/gpu_processes.py [--processes 2000] [--gpu 16] [--scrapes 300] [--churn 20] [--budget S]

Real processes on the real /proc, no GPU needed (root and unshare(1) are):

* a fleet in its own process group: forked Pythons holding 8-200 fds each (dups of
  files, sockets, pipes, /dev/null, an eventfd), and `--gpu` processes that hold
  /dev/nvidia0 open through a private /dev (mount namespace; the null device's
  numbers, as in tests/test_gpu_processes.py) and read and write a little every
  100 ms, so their I/O counters move. All of it is killed at the end, on failure
  and on Ctrl-C too; each member also dies with its parent (PR_SET_PDEATHSIG).
* ours in-process: Scraper([GPUProcessesCollector(ctx)], 5.0) + Renderer().render().
  A scrape checks new processes (lists their fds, readlinks them) newest PID first
  until gpu_processes.check_budget_seconds (`--budget`, default the exporter's) is
  spent; the rest wait and are counted in gpunode_gpu_process_checks_pending. So:
  "settling": `--cold` fresh collectors with the default settings, each scraped back
  to back until no check is pending (scrapes, wall time, latency of each); "young":
  the last of them scraped on with the default 300 s rescan window while the whole
  fleet is younger than that (a young process is checked again only when its fd
  count changes); "settled": processes older than the window (set to 0.001 s: the
  fleet is seconds old, a node's processes mostly are not); "churn": settled while
  `--churn` processes exit and as many start between scrapes. fd checks per scrape
  are counted by wrapping ProcessTracker._classify.
* over HTTP, alternating in one loop: our server (`--collector.disable-defaults
  --collector.gpu_processes --config.file F`, F: settled window and the budget),
  first scraped until no check is pending, and Debian's prometheus-process-exporter
  with every process in a group named by comm, which reads each process's stat,
  status, io, limits, wchan, fd count and each thread's files on every scrape
  (per-process I/O accounting, the comparable job); then a short round against it
  with the package's defaults (smaps_rollup too). One requests.get on a new
  connection each, timed to the last body byte; server CPU per scrape, peak RSS.

Checks, failing the run: gpunode_gpu_processes equals `--gpu` once no check is
pending (never more before), no process is unreadable, the GPU I/O totals grow,
the peer sees the fleet.
Results: tables on stdout and benchmarks/results/gpu_processes.json.
The code is in benchmarks/gpu_processes_bench/, a module per concern; this file is its command line.
"""

import sys

from gpu_processes_bench.cli import main  # benchmarks/ is on sys.path when run as a script

if __name__ == "__main__":
    sys.exit(main(description=(__doc__ or "").splitlines()[0]))
