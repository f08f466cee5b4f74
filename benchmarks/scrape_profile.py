#!/usr/bin/env python3
"""Where a full scrape of the reference node goes: each collector, the scraper around them, the
exporter's own process metrics, rendering the text, gzip, and HTTP; beside node_exporter.

    .venv/bin/python benchmarks/scrape_profile.py [--scrapes 300]

Two measurements in one run, in turn, so that a busy moment of the machine costs each alike:
- over HTTP, as reference_scrape.py: our exporter and node_exporter (its defaults, this machine),
  each scraped with gzip over a kept-alive connection, from request to the body's last byte, and
  each server's CPU (user + system, all threads) per scrape;
- in this process, the same code the server runs on the same reference node (reference_node.py),
  stage by stage: Scraper.collect() with each collector's own duration (the exporter's
  gpunode_scrape_collector_duration_seconds), the time spent inside the simulated NVML (which
  stands in for the driver's), process metrics, Renderer.chunks() and the gzip of the body.
"HTTP and the rest" is the HTTP scrape's median less the in-process stages' medians summed.
Then each collector alone, as many times: its user and kernel CPU per collection.

Results: benchmarks/results/scrape_profile.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import zlib
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchlib import ServerProcess, free_port, git_commit, machine_info
from reference_node import hold_kmsg_open, write_reference_node
from reference_scrape import Target, _get, wait_scrapable

from gpunode_common.exposition import Renderer
from gpunode_exporter import cli, collectors, config, nvmlsim, process
from gpunode_exporter.nvmlsim.library import SimulatedNVML
from gpunode_exporter.scrape import DURATION, Scraper

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "scrape_profile.json"
WARMUP = 20  # the first scrapes check every process for GPU use


class _NvmlClock:
    """Seconds spent inside the simulated NVML's functions, added up."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def install(self) -> None:
        entry = SimulatedNVML._entry
        clock = self

        def timed_entry(library: SimulatedNVML, name: str, impl: Callable[..., None]) -> Callable[..., int]:
            call = entry(library, name, impl)

            def timed(*args: Any) -> int:
                start = time.perf_counter()
                try:
                    return call(*args)
                finally:
                    clock.seconds += time.perf_counter() - start
            return timed

        SimulatedNVML._entry = timed_entry  # type: ignore[method-assign]


class InProcess:
    """The server's scrape, stage by stage, on the same reference node."""

    def __init__(self, flags: list[str]) -> None:
        _, args = cli.parse_args(["serve", *flags])
        cfg = config.load(args.config_file)
        self.nvml = _NvmlClock()
        self.nvml.install()
        nvmlsim.install(nvmlsim.load(args.nvml_simulate))
        self.scraper = Scraper(collectors.enabled(args, collectors.context(args, cfg)), cfg.collector_timeout_seconds,
                               simulated=True)
        self.renderer = Renderer()
        self.stages: dict[str, list[float]] = defaultdict(list)

    def scrape(self, keep: bool) -> None:
        nvml_before = self.nvml.seconds
        t0 = time.perf_counter()
        families = list(self.scraper.collect())
        t1 = time.perf_counter()
        families += process.collect()
        t2 = time.perf_counter()
        text = b"".join(self.renderer.chunks(families))
        t3 = time.perf_counter()
        gz = zlib.compressobj(1, zlib.DEFLATED, 31)  # as common/http.py
        gz.compress(text)
        gz.flush()
        t4 = time.perf_counter()
        if not keep:
            return
        own = {}
        for family in families:
            if family.spec.name == DURATION.name:
                own = {values[0]: seconds for values, seconds in family.rows}
        for name, seconds in own.items():
            self.stages[f"collector {name}"].append(seconds)
        self.stages["inside the simulated NVML"].append(self.nvml.seconds - nvml_before)
        self.stages["scraper around the collectors"].append((t1 - t0) - sum(own.values()))
        self.stages["process metrics"].append(t2 - t1)
        self.stages["render"].append(t3 - t2)
        self.stages["gzip"].append(t4 - t3)
        self.stages["in-process total"].append(t4 - t0)

    def cpu_split(self, rounds: int) -> dict[str, dict[str, float]]:
        """Each collector alone, `rounds` times: its user and kernel (system) CPU per collection, ms.
        Kernel time (listing /proc, opening sysfs files) is what no Python code can cut."""
        split = {}
        for collector in self.scraper.collectors:
            before = os.times()
            for _ in range(rounds):
                list(collector.collect())
            after = os.times()
            split[collector.name] = {"user_ms": (after.user - before.user) / rounds * 1000,
                                     "system_ms": (after.system - before.system) / rounds * 1000}
        return split

    def close(self) -> None:
        self.scraper.close(wait=True)


def _median_ms(values: list[float]) -> float:
    return statistics.median(values) * 1000


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scrapes", type=int, default=300)
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        node = Path(tmp) / "node"
        flags = write_reference_node(node)
        ports = [free_port(), free_port()]
        servers = [
            ServerProcess(key="ours", label="gpunode-exporter (reference node)", port=ports[0],
                          log=Path(tmp) / "ours.log",
                          argv=[sys.executable, "-m", "gpunode_exporter", *flags, "--web.listen-address",
                                f"127.0.0.1:{ports[0]}"]),
            ServerProcess(key="node", label="node_exporter (defaults, this machine)", port=ports[1],
                          log=Path(tmp) / "node.log",
                          argv=["prometheus-node-exporter", f"--web.listen-address=127.0.0.1:{ports[1]}"]),
        ]
        targets = {s.key: Target(s.url) for s in servers}
        http: dict[str, list[float]] = {s.key: [] for s in servers}
        with hold_kmsg_open(node):
            inproc = InProcess(flags)
            for server in servers:
                server.start()
            try:
                wait_scrapable(servers, targets)
                conns = {s.key: targets[s.key].connect() for s in servers}
                cpu: dict[str, float] = {}
                for i in range(WARMUP + args.scrapes):
                    if i == WARMUP:
                        cpu = {s.key: s.cpu_seconds() for s in servers}
                    for server in servers:
                        seconds, _ = _get(conns[server.key], targets[server.key], close=False)
                        if i >= WARMUP:
                            http[server.key].append(seconds)
                    inproc.scrape(keep=i >= WARMUP)
                cpu = {s.key: (s.cpu_seconds() - cpu[s.key]) / args.scrapes * 1000 for s in servers}
                for conn in conns.values():
                    conn.close()
                split = inproc.cpu_split(args.scrapes)
            finally:
                inproc.close()
                for server in servers:
                    server.stop()
    stages = {name: _median_ms(values) for name, values in inproc.stages.items()}
    ours, node_exporter = _median_ms(http["ours"]), _median_ms(http["node"])
    summed = stages["in-process total"]
    rows = {**{k: v for k, v in stages.items() if k != "in-process total"},
            "HTTP and the rest": ours - summed}
    result = {"scrapes": args.scrapes, "git": git_commit(ROOT), "machine": machine_info(),
              "http_p50_ms": {"ours": ours, "node_exporter": node_exporter},
              "ratio_to_node_exporter": ours / node_exporter,
              "cpu_per_scrape_ms": cpu, "cpu_ratio_to_node_exporter": cpu["ours"] / cpu["node"],
              "in_process_total_p50_ms": summed, "stages_p50_ms": rows, "collector_cpu_ms": split}
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"full gzip scrape over a kept-alive connection, p50 of {args.scrapes}:")
    print(f"  gpunode-exporter  {ours:6.2f} ms")
    print(f"  node_exporter     {node_exporter:6.2f} ms   ours / node_exporter = {ours / node_exporter:.2f}x")
    print("CPU per scrape (user + system, all threads):")
    print(f"  gpunode-exporter  {cpu['ours']:6.2f} ms")
    print(f"  node_exporter     {cpu['node']:6.2f} ms   ours / node_exporter = {cpu['ours'] / cpu['node']:.2f}x")
    print(f"ours, stage by stage (medians; in-process total {summed:.2f} ms):")
    for name, ms in rows.items():
        share = ms / ours * 100
        note = "  (part of collector gpu)" if name == "inside the simulated NVML" else ""
        print(f"  {name:<32} {ms:6.3f} ms  {share:5.1f} %{note}")
    print(f"each collector alone, CPU per collection (mean of {args.scrapes}):")
    for name, times in split.items():
        print(f"  {name:<18} user {times['user_ms']:6.3f} ms   system {times['system_ms']:6.3f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
