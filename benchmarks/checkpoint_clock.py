#!/usr/bin/env python3
"""The checkpoint collector's clock (a read of mountstats every second) on the reference node,
side by side with the same exporter without it (--no-collector.checkpoint).

    .venv/bin/python benchmarks/checkpoint_clock.py [--idle 120] [--scrapes 300]

Three figures, each for both exporters in one run:
- idle: the CPU each process spends over --idle seconds with nobody scraping it (the clock's own
  cost is the difference);
- one sample: the time a read and parse of the reference node's mountstats takes in this process
  (4 NFSv4.2 mounts with nconnect=8), times 1 per second;
- scrapes: full gzip scrapes of each in turn over a kept-alive connection (reference_scrape.py's
  loop), p50 and p90.

Targets: the clock well under 1 % of a core (under 0.5 %), and no scrape slower (ours with the
clock at most 5 % above ours without it at p50, the run's noise). Results:
benchmarks/results/checkpoint_clock.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchlib import ServerProcess, free_port, git_commit, percentile
from reference_node import hold_kmsg_open, write_reference_node
from reference_scrape import Target, measure

from gpunode_exporter.collector.checkpoint import written_bytes
from gpunode_exporter.collector.nfs import read_own_or_init

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "checkpoint_clock.json"
TARGET_CORE_SHARE = 0.005
TARGET_SCRAPE_RATIO = 1.05


def _one_sample_seconds(procfs: Path, reads: int = 1000) -> float:
    """The mean time of what the clock does each second: read mountstats, sum its WRITE bytes."""
    start = time.perf_counter()
    for _ in range(reads):
        written_bytes(read_own_or_init(procfs, "mountstats")[1], [])
    return (time.perf_counter() - start) / reads


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--idle", type=float, default=120.0, help="seconds of CPU measured with no scrapes")
    p.add_argument("--scrapes", type=int, default=300)
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        node = Path(tmp) / "node"
        flags = write_reference_node(node)
        sample = _one_sample_seconds(node / "proc")
        ports = [free_port(), free_port()]
        servers = [
            ServerProcess(key="with", label="gpunode-exporter with the checkpoint clock", port=ports[0],
                          log=Path(tmp) / "with.log", argv=[sys.executable, "-m", "gpunode_exporter", *flags,
                                                            "--web.listen-address", f"127.0.0.1:{ports[0]}"]),
            ServerProcess(key="without", label="gpunode-exporter, --no-collector.checkpoint", port=ports[1],
                          log=Path(tmp) / "without.log",
                          argv=[sys.executable, "-m", "gpunode_exporter", *flags, "--no-collector.checkpoint",
                                "--web.listen-address", f"127.0.0.1:{ports[1]}"]),
        ]
        targets = {s.key: Target(s.url) for s in servers}
        with hold_kmsg_open(node):
            for server in servers:
                server.start()
            try:
                times, _fresh, series, _cpu = measure(servers, targets, args.scrapes)
                before = {s.key: s.cpu_seconds() for s in servers}
                time.sleep(args.idle)
                idle = {s.key: (s.cpu_seconds() - before[s.key]) / args.idle for s in servers}
            finally:
                for server in servers:
                    server.stop()
    result = {
        "idle_seconds": args.idle, "scrapes": args.scrapes, "git": git_commit(ROOT),
        "one_sample_seconds": sample, "one_sample_core_share": sample,  # one sample per second
        "servers": {s.key: {"label": s.label, "series": series[s.key], "idle_core_share": idle[s.key],
                            "p50_seconds": percentile(times[s.key], 0.5), "p90_seconds": percentile(times[s.key], 0.9)}
                    for s in servers},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    w, wo = result["servers"]["with"], result["servers"]["without"]
    for r in (w, wo):
        print(f"  {r['label']:<46} {r['series']:>5} series  idle {100 * r['idle_core_share']:.3f} % of a core  "
              f"scrape p50 {r['p50_seconds'] * 1000:.2f} ms  p90 {r['p90_seconds'] * 1000:.2f} ms")
    print(f"  one sample (read + parse mountstats): {sample * 1e3:.3f} ms, at 1 per second {100 * sample:.3f} % "
          f"of a core")
    clock = max(w["idle_core_share"] - wo["idle_core_share"], sample)
    ratio = w["p50_seconds"] / wo["p50_seconds"]
    print(f"target: the clock under {100 * TARGET_CORE_SHARE:.1f} % of a core: "
          f"{'PASS' if clock < TARGET_CORE_SHARE else 'FAIL'} ({100 * clock:.3f} %)")
    print(f"target: scrape p50 with the clock at most {TARGET_SCRAPE_RATIO:.2f}x without: "
          f"{'PASS' if ratio <= TARGET_SCRAPE_RATIO else 'FAIL'} ({ratio:.3f}x)")
    return 0 if clock < TARGET_CORE_SHARE and ratio <= TARGET_SCRAPE_RATIO else 1


if __name__ == "__main__":
    raise SystemExit(main())
