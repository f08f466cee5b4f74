"""Both exporters over HTTP, alternating in one loop: ours, first scraped until settled, and
process-exporter doing the comparable job, so that a scrape costs what Prometheus would see."""

from __future__ import annotations

import argparse
import contextlib
import gzip
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchlib import (  # benchmarks/ is on sys.path when run as a script
    BenchError,
    ServerProcess,
    die_with_parent,
    find_ours,
    free_port,
    latencies_ms,
    summarize,
)
from scrape_latency import samples, scrape  # benchmarks/ is on sys.path when run as a script

from .in_process import SETTLED_WINDOW, check_ours, run_scrapes
from .processes import STARTUP_TIMEOUT, Fleet

PEER = "prometheus-process-exporter"


@dataclass
class Server(ServerProcess):
    """An exporter under test, started so that it dies with us."""

    first_scrape_ms: float = field(default=0.0, init=False)
    start_to_listen: float = field(default=0.0, init=False)

    def start(self, preexec_fn: Callable[[], None] | None = die_with_parent) -> None:
        super().start(preexec_fn)

    def wait_listening(self) -> None:
        """Until the port accepts a connection: no scrape, so the first one can be timed."""
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while time.monotonic() < deadline:
            self.check_running()
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=1):
                self.start_to_listen = round(time.monotonic() - self.started, 2)
                return
            time.sleep(0.05)
        raise BenchError(f"{self.label} did not listen on port {self.port} within {STARTUP_TIMEOUT:.0f}s")

    def timed(self) -> tuple[float, bytes]:
        """One scrape as in scrape_latency.py: (seconds, the body uncompressed)."""
        elapsed, raw, enc = scrape(self.url, "gzip")
        return elapsed, body_text(raw, enc).encode()


def body_text(raw: bytes, encoding: str) -> str:
    return (gzip.decompress(raw) if encoding == "gzip" else raw).decode()


def check_http(server: Server, args: argparse.Namespace) -> dict[str, Any]:
    """One response of each: ours must count the GPU processes; the peer must see the fleet."""
    _, raw, enc = scrape(server.url, "gzip")
    text = body_text(raw, enc)
    lines = samples(text)
    info: dict[str, Any] = {"samples": len(lines), "bytes_gzip": len(raw), "bytes_identity": len(text.encode())}
    if server.key == "ours":
        check_ours(text.encode(), args.gpu)
    else:
        counts = [float(s.rsplit(" ", 1)[1]) for s in lines if s.startswith("namedprocess_namegroup_num_procs")]
        # The kernel threads (no cmdline) are not matched; the fleet and the machine's processes are.
        if sum(counts) < args.processes:
            raise BenchError(f"{server.label} counts {sum(counts):.0f} processes, want at least {args.processes}")
        info.update({"processes_counted": int(sum(counts)), "groups": len(counts)})
    return info


def http_round(servers: list[Server], name: str, n: int, before: Callable[[], None] | None = None) -> None:
    """n scrapes of each, rotating who goes first; `before` runs ahead of each round, untimed."""
    cpu0 = {s.key: s.cpu_seconds() for s in servers}
    for s in servers:
        s.latencies[name] = []
    for i in range(n):
        if before is not None:
            before()
        k = i % len(servers)
        for s in servers[k:] + servers[:k]:
            elapsed, _, _ = scrape(s.url, "gzip")
            s.latencies[name].append(elapsed)
    for s in servers:
        s.cpu[name] = (s.cpu_seconds() - cpu0[s.key]) / n


def peer_version() -> str:
    out = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", PEER], capture_output=True, text=True, timeout=10)
    return out.stdout.strip() or "unknown"


def run_http(args: argparse.Namespace, fleet: Fleet, tmp: Path) -> dict[str, Any]:
    ours_cfg = tmp / "ours.yaml"
    ours_cfg.write_text(f"gpu_processes:\n  rescan_young_seconds: {SETTLED_WINDOW}\n"
                        f"  check_budget_seconds: {args.budget}\n")
    peer_cfg = tmp / "process-exporter.yaml"
    peer_cfg.write_text("process_names:\n  - name: '{{.Comm}}'\n    cmdline:\n    - '.*'\n")
    port = {key: free_port() for key in ("ours", "peer", "peer_defaults")}
    ours = Server("ours", "gpunode-exporter",
                  [find_ours(), "--collector.disable-defaults", "--collector.gpu_processes",
                   "--config.file", str(ours_cfg), "--web.listen-address", f"127.0.0.1:{port['ours']}"],
                  port["ours"], tmp / "ours.log")
    peer = Server("peer", "process-exporter",
                  [PEER, "-procfs", "/proc", "-config.path", str(peer_cfg), "-threads=false", "-gather-smaps=false",
                   "-web.listen-address", f"127.0.0.1:{port['peer']}"], port["peer"], tmp / "peer.log")
    servers = [ours, peer]
    if args.peer_defaults_scrapes:  # as the package runs it: per-thread series and smaps_rollup too
        servers.append(Server("peer_defaults", "process-exporter, package defaults",
                              [PEER, "-procfs", "/proc", "-config.path", str(peer_cfg),
                               "-web.listen-address", f"127.0.0.1:{port['peer_defaults']}"],
                              port["peer_defaults"], tmp / "peer_defaults.log"))
    out: dict[str, Any] = {"connection": "new TCP connection per scrape (Connection: close), Accept-Encoding: gzip"}
    try:
        for s in servers:
            s.start()
        for s in servers:
            s.wait_listening()  # process-exporter reads every process once before it listens
        settle = run_scrapes(ours, args.gpu, None)  # its first scrapes, until no check is pending
        ours.first_scrape_ms = settle.seconds[0] * 1000
        for s in servers[1:]:
            s.first_scrape_ms = scrape(s.url, "gzip")[0] * 1000
        info = {s.key: check_http(s, args) for s in servers}
        info["ours"]["settle"] = settle.settling()
        for i in range(min(args.warmup, 4)):  # the peer takes about a second a scrape
            for s in servers[:2] if i % 2 == 0 else servers[1::-1]:
                scrape(s.url, "gzip")
        http_round([ours, peer], "steady", args.http_scrapes)
        http_round([ours, peer], "churn", args.http_scrapes, lambda: fleet.churn(args.churn))
        if args.peer_defaults_scrapes:
            http_round([ours, servers[2]], "steady_vs_defaults", args.peer_defaults_scrapes)
        for s in servers:
            info[s.key].update(check_http(s, args))  # still healthy at the end
        out["servers"] = {}
        for s in servers:
            mem = s.memory_kib()
            out["servers"][s.key] = {
                "label": s.label, "argv": s.argv, "exe": s.exe(), **info[s.key],
                "start_to_listen_s": s.start_to_listen, "first_scrape_ms": s.first_scrape_ms,
                "peak_rss_mib": mem["VmHWM"] / 1024, "rss_end_mib": mem["VmRSS"] / 1024,
                "rounds": {name: {"scrapes": len(lat), **summarize(lat), "cpu_ms_per_scrape": s.cpu[name] * 1000,
                                  "latencies_ms": latencies_ms(lat)}
                           for name, lat in s.latencies.items()}}
    finally:
        for s in servers:
            s.stop()
    return out

