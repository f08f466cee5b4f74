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
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import datetime
import gc
import gzip
import json
import os
import platform
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests
from common import (  # benchmarks/ is on sys.path when run as a script
    BenchError,
    ServerProcess,
    cpu_model,
    cpu_times,
    finish,
    machine_load,
    percentile,
    ratio,
    source_fingerprint,
    summarize,
)
from scrape_latency import find_ours, free_port, samples, scrape  # benchmarks/ is on sys.path when run as a script

from exporter.collector.base import Context
from exporter.collector.gpu_processes import GPUProcessesCollector
from exporter.config import Config, GPUProcessesConfig
from exporter.exposition import Renderer
from exporter.scrape import Scraper

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "gpu_processes.json"
PEER = "prometheus-process-exporter"
TIMEOUT = 5.0  # the collector budget, as the server's default collector_timeout_seconds
STARTUP_TIMEOUT = 60.0
P99_TARGET_MS = 20.0
SETTLE_TIMEOUT = 120.0  # for a fresh collector, scraped back to back, to check every process
SETTLED_WINDOW = 0.001  # rescan_young_seconds for "settled": every fleet process is older than this
PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)


def die_with_parent() -> None:
    """preexec_fn: the child gets SIGKILL when this process dies, however it dies."""
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


# --- the fleet -------------------------------------------------------------------------------

# Runs as `python -c FLEET CONFIG_JSON` in a new session. Forks the plain processes, starts the
# GPU holders, then obeys "churn K" (kill and reap the K oldest plain processes, fork K new ones,
# answer when they hold their fds) and "quit" on stdin.
FLEET = r'''
import ctypes, json, os, random, signal, socket, subprocess, sys
libc = ctypes.CDLL(None, use_errno=True)
def die_with_parent():
    libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
die_with_parent()
cfg = json.loads(sys.argv[1])
if os.getppid() != cfg["parent"]:
    sys.exit("fleet: parent already gone")
me = os.getpid()
rng = random.Random(cfg["seed"])
tmp = cfg["tmp"]

pool = [os.open(os.path.join(tmp, f"shard-{i:02d}.bin"), os.O_RDWR | os.O_CREAT, 0o600) for i in range(12)]
pool += [os.open(p, os.O_RDONLY) for p in ("/etc/hostname", "/etc/passwd", "/proc/self/status")]
for _ in range(4):
    a, b = socket.socketpair()
    pool += [a.detach(), b.detach()]
for _ in range(2):
    pool += list(os.pipe())
tcp = socket.socket()
tcp.bind(("127.0.0.1", 0))
tcp.listen()
udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
pool += [tcp.detach(), udp.detach(), os.open("/dev/null", os.O_RDWR), os.open("/dev/urandom", os.O_RDONLY),
         os.eventfd(0)]
ready_r, ready_w = os.pipe()
COMMS = ["pt_data_worker", "python3", "sshd", "bash", "containerd-shim", "runc", "node_exporter", "dcgm",
         "nv-hostengine", "slurmstepd", "srun", "torchrun", "ray::IDLE", "raylet", "gcs_server", "nscd",
         "rsyslogd", "cron", "dbus-daemon", "systemd-journal", "chronyd", "sleep", "tail", "tmux: server",
         "jupyter-lab", "tensorboard", "wandb-service", "fluent-bit", "kubelet", "pause"]

def fds_wanted():
    x = rng.random()
    if x < 0.5:
        return rng.randint(8, 30)
    if x < 0.85:
        return rng.randint(50, 120)
    return rng.randint(120, 200)

def spawn(n):
    pids = []
    for _ in range(n):
        want, comm = fds_wanted(), rng.choice(COMMS)
        pid = os.fork()
        if pid == 0:
            try:
                die_with_parent()
                if os.getppid() != me:
                    os._exit(0)
                with open("/proc/self/comm", "w") as f:
                    f.write(comm)
                inherited = [int(n) for n in os.listdir("/proc/self/fd")]
                keep = {0, 1, 2, ready_w}
                keep.update(os.dup(pool[i % len(pool)]) for i in range(want - len(keep)))
                for fd in inherited:  # the rest of the pool and the supervisor's pipes
                    if fd not in keep:
                        try:
                            os.close(fd)
                        except OSError:
                            pass
                os.write(ready_w, b".")
                while True:
                    signal.pause()
            finally:
                os._exit(0)
        pids.append(pid)
    got = 0
    while got < n:
        got += len(os.read(ready_r, n - got))
    return pids

data = os.path.join(tmp, "dataset.bin")
with open(data, "wb") as f:
    f.write(b"\1" * (1 << 20))
holders = []
for i in range(cfg["gpu"]):
    holders.append(subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", cfg["private_dev"], cfg["holder"], data,
         str(rng.randint(40, 120))],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, preexec_fn=die_with_parent))
for h in holders:
    if h.stdout.readline().strip() != b"ready":
        sys.exit("fleet: a GPU holder did not start")
plain = spawn(cfg["plain"])
print(json.dumps({"gpu": [h.pid for h in holders], "plain": len(plain)}), flush=True)

def reap(pids):
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    for pid in pids:
        os.waitpid(pid, 0)

for line in sys.stdin:
    cmd = line.split()
    if cmd and cmd[0] == "churn":
        k = int(cmd[1])
        reap(plain[:k])
        plain = plain[k:] + spawn(k)
        print("ok", flush=True)
    else:
        break
reap(plain)
for h in holders:
    h.kill()
    h.wait()
'''

# The private /dev: tmpfs with null and nvidia0 (the null device's numbers), then python. Seen from
# outside, the holder's fd points to /dev/nvidia0, as on a GPU node.
PRIVATE_DEV = ('mount -t tmpfs tmpfs /dev && mknod /dev/null c 1 3 && mknod /dev/nvidia0 c 1 3 && '
               'exec {python} -c "$0" "$@"')
# A GPU process: the device, a data file, some more fds; reads 64 KiB and writes 64 KiB every 100 ms.
HOLDER = r'''
import os, sys, time
gpu = os.open("/dev/nvidia0", os.O_RDWR)
data = os.open(sys.argv[1], os.O_RDONLY)
for _ in range(int(sys.argv[2])):
    os.dup(data)
print("ready", flush=True)
block = b"\0" * 65536
while True:
    os.pread(data, 65536, 0)
    os.write(gpu, block)
    time.sleep(0.1)
'''


class Fleet:
    """The benchmark's processes, in a session of their own: one killpg ends them all."""

    def __init__(self, processes: int, gpu: int, seed: int, tmp: Path) -> None:
        cfg = {"parent": os.getpid(), "seed": seed, "tmp": str(tmp), "gpu": gpu, "plain": processes - gpu,
               "private_dev": PRIVATE_DEV.format(python=sys.executable), "holder": HOLDER}
        self.proc = subprocess.Popen([sys.executable, "-c", FLEET, json.dumps(cfg)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, start_new_session=True,
                                     preexec_fn=die_with_parent)
        self.pgid = self.proc.pid
        self.started = time.monotonic()
        self.startup_timeout = STARTUP_TIMEOUT + processes / 50
        self.gpu_pids: list[int] = []

    def age(self) -> float:
        """Seconds since the fleet started: its oldest processes are younger than that."""
        return time.monotonic() - self.started

    def wait_started(self) -> None:
        self.gpu_pids = json.loads(self._reply(self.startup_timeout))["gpu"]

    def _reply(self, timeout: float) -> str:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            raise BenchError(f"the process fleet did not answer within {timeout:.0f}s "
                             f"(exit status {self.proc.poll()})")
        return line

    def churn(self, k: int) -> None:
        """k of the oldest plain processes exit (reaped), k new ones start and open their fds."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"churn {k}\n")
        self.proc.stdin.flush()
        if self._reply(30).strip() != "ok":
            raise BenchError("the process fleet failed to churn")

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(OSError):
                assert self.proc.stdin is not None
                self.proc.stdin.write("quit\n")
                self.proc.stdin.flush()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=20)  # it kills and reaps its own
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pgid, signal.SIGKILL)  # whatever is left of the group
        self.proc.wait()


# --- /proc census ----------------------------------------------------------------------------


def pids() -> list[int]:
    return [int(n) for n in os.listdir("/proc") if n.isdigit()]


def exe_of(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return ""


def fd_census() -> dict[str, Any]:
    """How many processes there are and how many fds they hold (what a first scrape readlinks)."""
    counts = []
    for pid in pids():
        try:
            counts.append(len(os.listdir(f"/proc/{pid}/fd")))
        except OSError:
            counts.append(0)  # kernel thread (no fd table) or gone
    return {"processes": len(counts), "fds": sum(counts),
            "fds_per_process": {"p50": percentile(counts, 0.5), "p90": percentile(counts, 0.9), "max": max(counts)},
            "processes_with_50_to_200_fds": sum(1 for c in counts if 50 <= c <= 200)}


# --- ours, in-process ------------------------------------------------------------------------

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


def rounded(seconds: list[float]) -> list[float]:
    return [round(x * 1000, 3) for x in seconds]


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
        return {**out, "latencies_ms": rounded(self.seconds)}

    def settling(self, **extra: Any) -> dict[str, Any]:
        """For a run until checks_pending is 0: how many scrapes, how long, when every GPU process was found."""
        return {**self.summary(**extra), "wall_s": round(self.wall, 3), "first_scrape_ms": self.seconds[0] * 1000,
                "first_pending": self.pending[0], "scrape_all_gpu_found": self.found.index(max(self.found)) + 1,
                "pending_each_scrape": self.pending, "fd_checks_each_scrape": self.checks}


def run_scrapes(ours: Ours | Server, gpu: int, n: int | None, before: Callable[[], None] | None = None) -> Scrapes:
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


# --- over HTTP -------------------------------------------------------------------------------


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
                                  "latencies_ms": rounded(lat)}
                           for name, lat in s.latencies.items()}}
    finally:
        for s in servers:
            s.stop()
    return out


# --- report ----------------------------------------------------------------------------------


def machine_info() -> dict[str, Any]:
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "python_version": platform.python_version(),
        "nproc": os.cpu_count(),
        "nproc_usable": len(os.sched_getaffinity(0)),
        "cpu_model": cpu_model(),
        "kernel": platform.release(),
        "requests_version": requests.__version__,
        "process_exporter_version": peer_version(),
        "gc_enabled": gc.isenabled(),
        "loadavg_start": os.getloadavg(),
    }


def settle_table(r: dict[str, Any]) -> Iterator[str]:
    st = r["in_process"]["settle"]
    runs = st["runs"]
    yield (f"| settling, in-process: fresh collectors, default settings (budget "
           f"{r['in_process']['check_budget_seconds'] * 1000:g} ms) | "
           + " | ".join(f"run {i + 1}" for i in range(len(runs))) + " |")
    yield "|---|" + "---:|" * len(runs)
    for label, get in (
            ("processes in /proc", lambda x: f"{x['processes_in_proc']:,}"),
            ("pending after the first scrape", lambda x: f"{x['first_pending']:,}"),
            ("scrapes until checks_pending is 0", lambda x: f"{x['scrapes']}"),
            ("wall time of those scrapes, back to back (s)", lambda x: f"{x['wall_s']:.2f}"),
            ("first scrape (ms)", lambda x: f"{x['first_scrape_ms']:.1f}"),
            ("scrape latency p50 / max (ms)", lambda x: f"{x['p50_ms']:.1f} / {x['max_ms']:.1f}"),
            ("fd checks per scrape, mean", lambda x: f"{x['fd_checks_per_scrape']['mean']:.0f}"),
            (f"scrape that found all {r['gpu']} GPU processes", lambda x: f"{x['scrape_all_gpu_found']}")):
        yield f"| {label} | " + " | ".join(get(x) for x in runs) + " |"


def tables(r: dict[str, Any]) -> Iterator[str]:
    yield from settle_table(r)
    yield ""
    p = r["in_process"]
    yield (f"| ours in-process (Scraper + Renderer), {r['census_fleet']['processes']:,} processes in /proc, "
           f"{r['gpu']} with /dev/nvidia0 | p50 (ms) | p99 (ms) | mean (ms) | max (ms) | fd checks per scrape |")
    yield "|---|---:|---:|---:|---:|---:|"
    st, c, y = p["settle"], p["steady_settled_churn"], p["steady_young"]
    rows = ((f"settling: every scrape until checks_pending is 0 ({sum(x['scrapes'] for x in st['runs'])} scrapes, "
             f"{st['repetitions']} fresh collectors)", st["all_settle_scrapes"], ""),
            (f"steady, settled ({p['steady_settled']['scrapes']} scrapes)", p["steady_settled"], None),
            (f"steady, settled, {c['churn_per_scrape']} exit + {c['churn_per_scrape']} start per scrape "
             f"({c['scrapes']} scrapes)", c, None),
            (f"steady, young: default {y['rescan_young_seconds']:g} s window, whole fleet younger "
             f"({y['scrapes']} scrapes)", y, None))
    for label, d, checks in rows:
        if checks is None:
            checks = f"{d['fd_checks_per_scrape']['mean']:.1f} (max {d['fd_checks_per_scrape']['max']})"
        yield (f"| {label} | {d['p50_ms']:.2f} | {d['p99_ms']:.2f} | {d['mean_ms']:.2f} | {d['max_ms']:.2f} "
               f"| {checks} |")
    yield ""
    srv = r["http"]["servers"]
    o, q = srv["ours"], srv["peer"]
    yield (f"| over HTTP, alternating, {o['rounds']['steady']['scrapes']} scrapes each per round | gpunode-exporter "
           "| process-exporter | ours/peer |")
    yield "|---|---:|---:|---:|"

    def row(label: str, a: float, b: float, fmt: str = ".2f") -> str:
        return f"| {label} | {a:{fmt}} | {b:{fmt}} | {ratio(a, b):.2f}x |"

    keys = (("p50_ms", "p50 (ms)"), ("p99_ms", "p99 (ms)"), ("mean_ms", "mean (ms)"),
            ("cpu_ms_per_scrape", "server CPU per scrape (ms)"))
    for name, what in (("steady", "steady"), ("churn", f"churn {r['churn']} per scrape")):
        for key, label in keys:
            yield row(f"{what}: {label}", o["rounds"][name][key], q["rounds"][name][key])
    yield row("start to listening (s)", o["start_to_listen_s"], q["start_to_listen_s"])
    yield row("first scrape after start (ms)", o["first_scrape_ms"], q["first_scrape_ms"])
    yield row("peak RSS, VmHWM (MiB)", o["peak_rss_mib"], q["peak_rss_mib"], ".1f")
    yield row("samples per response", o["samples"], q["samples"], "d")
    yield row("response bytes (gzip)", o["bytes_gzip"], q["bytes_gzip"], ",")
    s = o["settle"]
    yield ""
    yield (f"ours over HTTP after start: {s['scrapes']} scrapes until checks_pending was 0 ({s['wall_s']:.2f} s "
           f"back to back; p50 {s['p50_ms']:.1f} ms, max {s['max_ms']:.1f} ms; all {r['gpu']} GPU processes "
           f"found in scrape {s['scrape_all_gpu_found']})")
    if "peer_defaults" in srv:
        d = srv["peer_defaults"]
        name = "steady_vs_defaults"
        yield ""
        yield (f"| over HTTP, alternating, {d['rounds'][name]['scrapes']} scrapes each | gpunode-exporter | "
               "process-exporter, package defaults | ours/peer |")
        yield "|---|---:|---:|---:|"
        for key, label in keys:
            yield row(label, o["rounds"][name][key], d["rounds"][name][key])
        yield row("peak RSS, VmHWM (MiB)", o["peak_rss_mib"], d["peak_rss_mib"], ".1f")


def targets(r: dict[str, Any]) -> list[dict[str, Any]]:
    """The target is the first row; the others hold the same bar to harder states."""
    p = r["in_process"]
    out = []
    for key, what, value in (
            ("steady_settled", "steady state (the target)", p["steady_settled"]["p99_ms"]),
            ("steady_settled_churn", f"steady state, {r['churn']} processes exit and start per scrape",
             p["steady_settled_churn"]["p99_ms"]),
            ("steady_young", "steady state, every process younger than rescan_young_seconds",
             p["steady_young"]["p99_ms"]),
            ("settle", "a fresh collector's scrapes after the first, until checks_pending is 0",
             (p["settle"]["after_first"] or {"p99_ms": 0.0})["p99_ms"])):
        out.append({"target": f"ours p99 < {P99_TARGET_MS:g} ms after the first scrape: {what}",
                    "state": key, "value_ms": round(value, 2), "pass": value < P99_TARGET_MS})
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
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
        "machine": machine_info(), "exporter_source_sha256": source_fingerprint()}
    before = fd_census()
    results["census_before"] = before
    idle0 = cpu_times()
    time.sleep(1.0)
    results["machine"]["before_run"] = machine_load(idle0, cpu_times())
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
    results["wall_seconds"] = round(time.monotonic() - start, 1)
    results["machine"]["during_run"] = machine_load(cpu_before, cpu_times())
    results["machine"]["loadavg_end"] = os.getloadavg()
    results["exporter_source_changed_during_run"] = source_fingerprint() != results["exporter_source_sha256"]
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


if __name__ == "__main__":
    sys.exit(main())
