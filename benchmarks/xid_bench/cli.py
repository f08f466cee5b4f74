"""The command line and the run: the three measurements in turn, the targets judged, the
results written."""

from __future__ import annotations

import argparse
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
    ServerProcess,
    cpu_times,
    end_of_run,
    finish,
    git_commit,
    load_before_run,
    source_fingerprint,
)

from . import BENCHMARKS, ROOT
from .exporters import fake_procfs
from .flood import FLOOD_TICK, flood
from .floods import floods
from .floods import table as floods_table
from .latency import latency
from .records import XID_EVERY
from .report import machine, tables, targets
from .throughput import BATCH, GREP, NAIVE_PATTERN, throughput

RESULTS = BENCHMARKS / "results" / "xid.json"


def main(argv: list[str] | None = None, description: str = "") -> int:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--records", type=int, default=1_000_000, help="records in the parse stream (default 1000000)")
    p.add_argument("--repetitions", type=int, default=5, help="parse repetitions each (default 5)")
    p.add_argument("--events", type=int, default=1000, help="Xids appended per follower for the latency (default 1000)")
    p.add_argument("--scrape-only", type=int, default=200, help="scrapes with no new event, each (default 200)")
    p.add_argument("--flood-seconds", type=float, default=60.0, help="flood duration, each (default 60)")
    p.add_argument("--flood-rate", type=int, default=50_000, help="flood records per second (default 50000)")
    p.add_argument("--output", type=Path, default=RESULTS, help=f"JSON results (default {RESULTS})")
    p.add_argument("--before", type=Path, metavar="DIR",
                   help="a checkout of the earlier code with its own .venv: adds the floods by kind, this "
                        "commit's exporter beside that one's (4/4)")
    p.add_argument("--floods-only", action="store_true", help="with --before: only the floods by kind")
    args = p.parse_args(argv)
    if (not XID_EVERY <= args.records <= 10_000_000 or not 1 <= args.repetitions <= 100
            or not 1 <= args.events <= 100_000 or not 1 <= args.scrape_only <= 100_000
            or not 3 <= args.flood_seconds <= 3600 or not 100 <= args.flood_rate <= 1_000_000):
        p.error(f"--records {XID_EVERY}..10000000, --repetitions 1..100, --events and --scrape-only 1..100000, "
                "--flood-seconds 3..3600, --flood-rate 100..1000000")
    if shutil.which("grep") is None:
        p.error("grep not found")
    if args.floods_only and args.before is None:
        p.error("--floods-only needs --before")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the finally blocks below

    results: dict[str, Any] = {
        "records": args.records, "repetitions": args.repetitions, "events": args.events,
        "flood_seconds": args.flood_seconds, "flood_rate": args.flood_rate,
        "what": {
            "stream": f"real-other.kmsg's records cycled, seq renumbered 0..N-1, every {XID_EVERY}th one of the "
                      "98 Xid records of real-xid.kmsg (cycled)",
            "ours": f"XidTracker._handle(batch) over batches of {BATCH} raw records, a fresh tracker per repetition "
                    "(never started: no reader thread, no state file)",
            "naive_regex": f"re.compile({NAIVE_PATTERN!r}).search(line.decode(errors='replace')) on every line, "
                           "matches counted per (bus, code)",
            "grep": f"LC_ALL=C {' '.join(GREP)} FILE, wall time of the process, the file in the page cache",
            "latency": "two exporters (--collector.xid), one following a regular file, one a FIFO; per event one "
                       "Xid appended with one write(2), then GET /metrics until the counter total rises; events "
                       "alternate between the two; round keepalive: one requests.Session per exporter, round "
                       "new_connection: Connection: close on every GET",
            "flood": f"a writer thread appends {FLOOD_TICK * 1000:g} ms batches, the same bytes to two files, each "
                     "followed by an exporter: --collector.xid and (the peer) --collector.staging only; RSS, CPU and "
                     "the counts sampled every second (one GET /metrics on a new connection each)"},
        "machine": machine(), "commit": git_commit(ROOT), "exporter_source_sha256": source_fingerprint()}
    results["machine"]["before_run"] = load_before_run()
    if results["machine"]["before_run"]["busy_pct"] > 20:
        print(f"WARNING: before the run the CPUs were {results['machine']['before_run']['busy_pct']}% busy: "
              "the figures will be noisy.\n", flush=True)
    running: list[ServerProcess] = []
    start_t, cpu_before = time.monotonic(), cpu_times()
    try:
        with tempfile.TemporaryDirectory(prefix="xid-bench-") as tmp_name:
            tmp = Path(tmp_name)
            proc = fake_procfs(tmp)
            if not args.floods_only:
                print("1/4 parse throughput ...", flush=True)
                results["throughput"] = throughput(args, tmp, proc)
                print("2/4 append -> /metrics latency, regular file and FIFO ...", flush=True)
                results["latency"] = latency(args, tmp, proc, running)
                print(f"3/4 flood, {args.flood_seconds:g} s ...", flush=True)
                results["flood"] = flood(args, tmp, proc, running)
            if args.before is not None:
                print(f"4/4 floods by kind, before and after, {args.flood_seconds:g} s each ...", flush=True)
                results["floods"] = floods(args, tmp, proc, running)
    except (BenchError, requests.RequestException) as err:
        sys.stderr.write(f"xid: FAILED: {err}\n")
        return 1
    finally:
        for server in running:
            server.stop()
    end_of_run(results, start_t, cpu_before, ROOT)
    results["targets"] = targets(results) if "flood" in results else []
    results["target_pass"] = all(t["pass"] for t in results["targets"])
    print()
    for line in (tables(results) if "flood" in results else []) + (floods_table(results["floods"])
                                                                  if "floods" in results else []):
        print(line)
    m = results["machine"]
    c = results["commit"]
    return finish(results, args.output,
                  f"{m['nproc']} CPUs ({m['cpu_model']}), kernel {m['kernel']}, Python {m['python_version']}, "
                  f"{m['grep_version']}; commit {c['head'][:12]}{' + local changes' if c['dirty'] else ''}")
