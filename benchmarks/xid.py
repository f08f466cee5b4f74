#!/usr/bin/env python3
"""Xid collector: kernel-log parse throughput, append-to-/metrics latency, and a 50,000 records/s flood.

    .venv/bin/python benchmarks/xid.py [--records 1000000] [--repetitions 5] [--events 1000]
                                       [--flood-seconds 60] [--flood-rate 50000]

The three targets of the Xid collector, each beside a peer in the same run:

1. Parse throughput (target >= 200,000 records/s): ~1,000,000 records cycling
   the real kernel records of tests/fixtures/kmsg/real-other.kmsg (seq
   renumbered, contiguous), with every 1,000th record one of the 98 real NVRM
   Xid records of real-xid.kmsg. Ours: XidTracker._handle (parse, seq/lost
   accounting, counting under the lock) over batches of 4096 raw records, as the
   reader hands them over. Peer 1, the naive log-monitor way: one compiled regex
   searched in every decoded line. Peer 2, an upper bound in C: `grep -c 'NVRM:
   Xid'` over the same records in a file, wall time of the whole process.
2. Latency from appending one Xid record to the log to seeing the counter rise in
   /metrics (target p99 < 100 ms): two exporters side by side, one following a
   regular file, one a FIFO; events alternate between them; /metrics is polled
   on a keep-alive connection until the counter total rises. Also the duration
   of a scrape alone.
3. Flood (target: 50,000 records/s for 60 s with one Xid per 1,000 records,
   every Xid counted or every gap counted as lost, RSS stable): a writer thread
   appends paced batches to the file the exporter follows; the exporter's RSS,
   CPU and counts are sampled every second. Peer: the same flood beside the same
   exporter with only the staging collector (no Xid thread), for the RSS and CPU
   the Xid thread adds.

Results: tables on stdout and benchmarks/results/xid.json (every raw number).
"""

from __future__ import annotations

import argparse
import datetime
import fcntl
import gc
import itertools
import os
import platform
import random
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import requests
import yaml
from common import (  # benchmarks/ is on sys.path when run as a script
    BenchError,
    ServerProcess,
    cpu_model,
    cpu_times,
    finish,
    git_commit,
    machine_load,
    percentile,
    ratio,
    slope,
    source_fingerprint,
    summarize,
)
from gpu_processes import die_with_parent
from prometheus_client.parser import text_string_to_metric_families
from scrape_latency import find_ours, free_port, wait_ready

from exporter.nvml import Session
from exporter.xid.gpus import GpuDirectory
from exporter.xid.tracker import XidTracker

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results" / "xid.json"
KMSG = ROOT / "tests" / "fixtures" / "kmsg"
DGX_SYSFS = ROOT / "tests" / "fixtures" / "sysfs" / "dgx-h100"
# The 8 GPUs of the dgx-h100 sysfs fixture, in PCI order: their NVML-less index.
GPUS = {"0000:1b:00": "0", "0000:43:00": "1", "0000:52:00": "2", "0000:61:00": "3",
        "0000:9d:00": "4", "0000:c3:00": "5", "0000:d1:00": "6", "0000:df:00": "7"}
CODES = (13, 31, 48, 63, 74, 79, 94, 119)  # the codes the latency and flood Xids rotate through
XID_EVERY = 1000  # one Xid per this many records, in the mixed stream and the flood
BATCH = 4096  # records per XidTracker._handle call: KmsgReader.read()'s max_records
USEC_PER_RECORD = 20  # kernel timestamps of the generated records: seq * 20 us
NAIVE_PATTERN = r"NVRM: Xid \(PCI:([0-9a-f:.]+)\): (\d+)"
GREP = ["grep", "-c", "NVRM: Xid"]
POLL_TIMEOUT = 5.0  # seconds an appended Xid may take to show before the run fails
JITTER = 0.005  # the sleep before each appended Xid: uniform over one 5 ms poll period of the reader
CATCH_UP_TIMEOUT = 60.0
FLOOD_TICK = 0.010  # the writer appends one batch every 10 ms
RSS_WINDOW = 40.0  # seconds at the end of the flood the RSS slope is fitted over
RSS_STABLE_MIB_PER_MIN = 1.0
LATENCY_TARGET_MS = 100.0
THROUGHPUT_TARGET = 200_000
XID_ERRORS = b"gpunode_xid_errors_total{"
LOST = b"gpunode_kmsg_records_lost_total "
MALFORMED = b"gpunode_kmsg_records_malformed_total "


# --- the records -------------------------------------------------------------------------


def fixture_records(name: str) -> list[tuple[int, bytes, bytes]]:
    """(seq, prio, text) of every record of a fixture; dictionary lines (" KEY=value") left out,
    as the reader leaves them out."""
    out = []
    for line in (KMSG / name).read_bytes().split(b"\n"):
        if not line or line[:1] == b" ":
            continue
        head, _, text = line.partition(b";")
        prio, seq = head.split(b",")[:2]
        out.append((int(seq), prio, text))
    return out


def real_xids() -> list[tuple[bytes, bytes]]:
    """(prio, text) of the 98 Xid records of real-xid.kmsg: those its hand-written expectations
    list, so the set does not depend on the parser under test."""
    seqs = {item["seq"] for item in yaml.safe_load((KMSG / "real-xid.expect.yaml").read_text())["xids"]}
    found = [(prio, text) for seq, prio, text in fixture_records("real-xid.kmsg") if seq in seqs]
    if len(found) != len(seqs):
        raise BenchError(f"real-xid.kmsg: {len(found)} of the {len(seqs)} expected Xid records found")
    return found


def real_others() -> list[tuple[bytes, bytes]]:
    return [(prio, text) for _, prio, text in fixture_records("real-other.kmsg")]


def templates() -> list[tuple[bytes, int, bytes]]:
    """(prio, code, text with the bus id as {bus}) for each of CODES: the first real record of
    that code in the common form `NVRM: Xid (PCI:dddd:bb:dd): code, ...`."""
    out = []
    for code in CODES:
        pattern = re.compile(rb"^NVRM: Xid \(PCI:[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\): %d," % code)
        for prio, text in real_xids():
            if pattern.match(text):
                out.append((prio, code, re.sub(rb"\(PCI:[^)]*\)", b"(PCI:{bus})", text, count=1)))
                break
        else:
            raise BenchError(f"real-xid.kmsg has no Xid {code} in the form NVRM: Xid (PCI:...): {code},")
    return out


def mixed_stream(n: int) -> tuple[list[bytes], int]:
    """n raw records (no newline), seq 0..n-1: the real non-Xid records cycled, with every
    XID_EVERY-th one a real Xid record (cycled). Returns (records, Xids in them)."""
    others, xids = real_others(), real_xids()
    records = []
    o = x = 0
    for seq in range(n):
        if seq % XID_EVERY == XID_EVERY - 1:
            prio, text = xids[x % len(xids)]
            x += 1
        else:
            prio, text = others[o % len(others)]
            o += 1
        records.append(b"%s,%d,%d,-;%s" % (prio, seq, seq * USEC_PER_RECORD, text))
    return records, x


class Stream:
    """Records to append, seq contiguous from 0: the real non-Xid records cycled, and Xids
    rotated across the 8 GPUs and CODES. `expected` counts the Xids made, per series."""

    def __init__(self, others: list[tuple[bytes, bytes]], xid_templates: list[tuple[bytes, int, bytes]]) -> None:
        self.seq = 0
        self.xids = 0
        self.expected: Counter[tuple[str, int]] = Counter()  # (canonical bus id, code)
        self._others = others
        self._o = 0
        self._templates = xid_templates
        self._buses = list(GPUS)

    def _record(self, prio: bytes, text: bytes) -> bytes:
        raw = b"%s,%d,%d,-;%s\n" % (prio, self.seq, self.seq * USEC_PER_RECORD, text)
        self.seq += 1
        return raw

    def other(self) -> bytes:
        prio, text = self._others[self._o % len(self._others)]
        self._o += 1
        return self._record(prio, text)

    def xid(self) -> bytes:
        bus = self._buses[self.xids % len(self._buses)]
        prio, code, text = self._templates[(self.xids // len(self._buses)) % len(self._templates)]
        self.xids += 1
        self.expected[(bus + ".0", code)] += 1
        return self._record(prio, text.replace(b"{bus}", bus.encode()))

    def batch(self, n: int) -> bytes:
        """n records, every XID_EVERY-th seq an Xid."""
        return b"".join(self.xid() if self.seq % XID_EVERY == XID_EVERY - 1 else self.other()
                        for _ in range(n))


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


# --- reading /metrics --------------------------------------------------------------------


def xid_counts(body: bytes) -> tuple[int, int, int]:
    """(sum of gpunode_xid_errors_total, records lost, records malformed) of one exposition."""
    total = lost = malformed = 0
    for line in body.split(b"\n"):
        if line.startswith(XID_ERRORS):
            total += int(float(line.rpartition(b" ")[2]))
        elif line.startswith(LOST):
            lost = int(float(line[len(LOST):]))
        elif line.startswith(MALFORMED):
            malformed = int(float(line[len(MALFORMED):]))
    return total, lost, malformed


def get(http: requests.Session, url: str) -> bytes:
    resp = http.get(url, timeout=10)
    resp.raise_for_status()
    return resp.content


def get_new_connection(url: str) -> bytes:
    resp = requests.get(url, headers={"Connection": "close"}, timeout=10)
    resp.raise_for_status()
    return resp.content


def check_series(body: bytes, expected: Counter[tuple[str, int]], what: str) -> None:
    """Every Xid series as written: the count per (bus id, code), the GPU index of each bus id."""
    seen: dict[tuple[str, int], int] = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            if s.name == "gpunode_xid_errors_total":
                bus = s.labels["pci_bus_id"]
                if s.labels["gpu"] != GPUS.get(bus[:-2]):
                    raise BenchError(f"{what}: {bus} is labelled gpu={s.labels['gpu']!r}, want {GPUS.get(bus[:-2])}")
                seen[(bus, int(s.labels["xid"]))] = int(s.value)
    if seen != dict(expected):
        wrong = {k: (seen.get(k), expected.get(k)) for k in set(seen) | set(expected) if seen.get(k) != expected.get(k)}
        raise BenchError(f"{what}: Xid series differ from what was written, (seen, written): "
                         f"{dict(list(wrong.items())[:5])}")


# --- the exporter processes --------------------------------------------------------------


def fake_procfs(tmp: Path) -> Path:
    """A procfs holding only sys/kernel/random/boot_id: what the tracker keys its state by."""
    proc = tmp / "proc"
    (proc / "sys" / "kernel" / "random").mkdir(parents=True)
    (proc / "sys" / "kernel" / "random" / "boot_id").write_text(f"{uuid.uuid4()}\n")
    return proc


def exporter(key: str, label: str, collector: str, kmsg: Path, directory: Path, proc: Path) -> ServerProcess:
    port = free_port()
    argv = [find_ours(), "--collector.disable-defaults", f"--collector.{collector}", "--path.kmsg", str(kmsg),
            "--path.state", str(directory / "state"), "--path.procfs", str(proc), "--path.sysfs", str(DGX_SYSFS),
            "--web.listen-address", f"127.0.0.1:{port}"]
    return ServerProcess(key, label, argv, port, directory / "exporter.log")


def start(server: ServerProcess, running: list[ServerProcess]) -> None:
    running.append(server)
    server.start(die_with_parent)
    wait_ready(server)  # type: ignore[arg-type]  # any ServerProcess will do


def open_fifo_writer(path: Path, server: ServerProcess) -> int:
    """The FIFO's write end, once the exporter has its read end open (ENXIO until then)."""
    deadline = time.monotonic() + 10
    while True:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as err:
            server.check_running()
            if time.monotonic() > deadline:
                raise BenchError(f"{server.label} never opened {path} for reading ({err})") from None
            time.sleep(0.05)
            continue
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        return fd


# --- 1. parse throughput -----------------------------------------------------------------


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


# --- 2. latency ----------------------------------------------------------------------------


ROUNDS = {"keepalive": "one requests.Session, keep-alive (as Prometheus scrapes)",
          "new_connection": "a new connection per GET (Connection: close)"}


class Follower:
    """One exporter and the log it follows (a regular file or a FIFO), events appended one by one."""

    def __init__(self, key: str, tmp: Path, proc: Path, others: list[tuple[bytes, bytes]],
                 xid_templates: list[tuple[bytes, int, bytes]]) -> None:
        self.key = key
        self.dir = tmp / f"latency-{key}"
        self.dir.mkdir()
        self.kmsg = self.dir / "kmsg"
        self.stream = Stream(others, xid_templates)
        self.preamble = self.stream.batch(len(others))  # the machine's boot log, no Xid in it
        if key == "file":
            self.kmsg.write_bytes(self.preamble)
        else:
            os.mkfifo(self.kmsg)
        self.server = exporter(key, f"xid collector following a {'regular file' if key == 'file' else 'FIFO'}",
                               "xid", self.kmsg, self.dir, proc)
        self.fd = -1
        self.http = requests.Session()
        self.latencies: dict[str, list[float]] = {r: [] for r in ROUNDS}
        self.polls: dict[str, list[int]] = {r: [] for r in ROUNDS}
        self.scrape_only: dict[str, list[float]] = {r: [] for r in ROUNDS}
        self.total = 0

    def open(self) -> None:
        if self.key == "file":
            self.fd = os.open(self.kmsg, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        else:
            self.fd = open_fifo_writer(self.kmsg, self.server)
            write_all(self.fd, self.preamble)

    def get(self, how: str) -> bytes:
        if how == "keepalive":
            return get(self.http, self.server.url)
        return get_new_connection(self.server.url)

    def timed_scrape(self, how: str) -> None:
        start_t = time.perf_counter()
        self.get(how)
        self.scrape_only[how].append(time.perf_counter() - start_t)

    def event(self, how: str) -> None:
        """Append one Xid; poll /metrics until the counter total has risen by one."""
        write_all(self.fd, self.stream.xid())  # an unbuffered write(2): in the file or pipe on return
        t0 = time.perf_counter()
        want = self.total + 1
        polls = 0
        while True:
            body = self.get(how)
            seen = time.perf_counter()
            polls += 1
            total = xid_counts(body)[0]
            if total >= want:
                break
            if seen - t0 > POLL_TIMEOUT:
                raise BenchError(f"{self.server.label}: Xid {want} not in /metrics after {POLL_TIMEOUT:.0f} s")
        if total != want:
            raise BenchError(f"{self.server.label}: counter total {total} after {want} Xids")
        self.total = total
        self.latencies[how].append(seen - t0)
        self.polls[how].append(polls)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        self.http.close()


def latency(args: argparse.Namespace, tmp: Path, proc: Path, running: list[ServerProcess]) -> dict[str, Any]:
    others, xid_templates = real_others(), templates()
    followers = [Follower(key, tmp, proc, others, xid_templates) for key in ("file", "fifo")]
    try:
        for f in followers:
            start(f.server, running)
            f.open()
        time.sleep(0.5)  # both have read the preamble (no metric says so: it holds no Xid)
        for f in followers:
            counts = xid_counts(f.get("keepalive"))
            if counts != (0, 0, 0):
                raise BenchError(f"{f.server.label}: want no Xid, lost or malformed record before the "
                                 f"events, got {counts}")
        rng = random.Random(1)
        out: dict[str, Any] = {"events": args.events, "jitter_before_each_event_ms": [0, JITTER * 1000],
                               "scrape_only_requests": args.scrape_only, "rounds": ROUNDS, "machine_during": {},
                               "followers": {}}
        for how in ROUNDS:
            load0 = cpu_times()
            for i in range(args.scrape_only):  # a scrape with nothing new: the floor under every latency
                for f in followers[i % 2:] + followers[:i % 2]:
                    f.timed_scrape(how)
            for i in range(args.events):
                for f in followers[i % 2:] + followers[:i % 2]:
                    time.sleep(rng.uniform(0, JITTER))  # a random phase against the reader's 5 ms poll
                    f.event(how)
            out["machine_during"][how] = machine_load(load0, cpu_times())
        for f in followers:
            body = f.get("keepalive")
            _, lost, malformed = xid_counts(body)
            if lost or malformed:
                raise BenchError(f"{f.server.label}: {lost} records lost, {malformed} malformed")
            check_series(body, f.stream.expected, f.server.label)
            mem = f.server.memory_kib()
            out["followers"][f.key] = {
                "label": f.server.label, "argv": f.server.argv, "xids_counted": f.total,
                "peak_rss_mib": mem["VmHWM"] / 1024, "rounds": {
                    how: {"latency": summarize(f.latencies[how]), "scrape_only": summarize(f.scrape_only[how]),
                          "gets_per_event": {"mean": sum(f.polls[how]) / len(f.polls[how]),
                                             "max": max(f.polls[how]),
                                             "first_get_hit_pct": 100 * f.polls[how].count(1) / len(f.polls[how])},
                          "latencies_ms": [round(x * 1000, 3) for x in f.latencies[how]],
                          "scrape_only_ms": [round(x * 1000, 3) for x in f.scrape_only[how]]}
                    for how in ROUNDS}}
        return out
    finally:
        for f in followers:
            f.close()
            f.server.stop()


# --- 3. flood ------------------------------------------------------------------------------


class Writer(threading.Thread):
    """Appends `rate` records/s in batches every FLOOD_TICK to every one of `paths` (the same
    bytes to each), paced by the wall clock (a late batch is written at once, so the average rate
    holds), for `seconds`."""

    def __init__(self, paths: list[Path], stream: Stream, rate: int, seconds: float) -> None:
        super().__init__(name="flood-writer", daemon=True)
        self.paths, self.stream, self.seconds = paths, stream, seconds
        self.per_tick = max(1, round(rate * FLOOD_TICK))
        self.records = self.xids = 0  # in the files
        self.elapsed = 0.0
        self.max_late = 0.0
        self.late_batches = 0
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        fds: list[int] = []
        try:
            fds = [os.open(p, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC) for p in self.paths]
            began = time.monotonic()
            for k in range(round(self.seconds / FLOOD_TICK)):
                if self.stop.is_set():
                    break
                delay = began + k * FLOOD_TICK - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                elif delay < -FLOOD_TICK:
                    self.late_batches += 1
                    self.max_late = max(self.max_late, -delay)
                data = self.stream.batch(self.per_tick)
                for fd in fds:
                    write_all(fd, data)
                self.records, self.xids = self.stream.seq, self.stream.xids
            self.elapsed = time.monotonic() - began
        except BaseException as err:  # reported by flood()
            self.error = err
        finally:
            for fd in fds:
                os.close(fd)


def flood(args: argparse.Namespace, tmp: Path, proc: Path, running: list[ServerProcess]) -> dict[str, Any]:
    """Both exporters at once, each following its own file; the writer appends the same records to both."""
    labels = {"xid": "xid collector", "staging": "staging collector only (no Xid thread)"}
    servers: dict[str, ServerProcess] = {}
    files: dict[str, Path] = {}
    for key, label in labels.items():
        directory = tmp / f"flood-{key}"
        directory.mkdir()
        files[key] = directory / "kmsg"
        files[key].touch()
        servers[key] = exporter(key, label, key, files[key], directory, proc)
    stream = Stream(real_others(), templates())
    writer = Writer(list(files.values()), stream, args.flood_rate, args.flood_seconds)
    samples: dict[str, list[dict[str, Any]]] = {k: [] for k in labels}

    def sample(key: str, t: float) -> dict[str, Any]:
        written, xids = writer.records, writer.xids  # before the scrape: what it may have seen
        body = get_new_connection(servers[key].url)
        s = {"t": round(t, 3), "records_written": written, "xids_written": xids,
             "rss_kib": servers[key].memory_kib()["VmRSS"], "cpu_s": servers[key].cpu_seconds()}
        if key == "xid":
            s["xids_counted"], s["lost"], s["malformed"] = xid_counts(body)
        samples[key].append(s)
        return s

    try:
        for server in servers.values():
            start(server, running)
        load0, self0 = cpu_times(), resource.getrusage(resource.RUSAGE_SELF)
        t0 = time.monotonic()
        for key in labels:
            sample(key, 0.0)
        writer.start()
        i = 1
        while writer.is_alive():
            delay = t0 + i - time.monotonic()
            if delay > 0:
                writer.join(delay)
            if not writer.is_alive():
                break
            for key in labels:
                sample(key, time.monotonic() - t0)
            i += 1
        if writer.error is not None:
            raise BenchError(f"the flood writer failed: {writer.error!r}")
        end = {key: sample(key, time.monotonic() - t0) for key in labels}  # the writer has stopped
        load = machine_load(load0, cpu_times())
        self1 = resource.getrusage(resource.RUSAGE_SELF)
        # Until every Xid written is counted, or the counts stand still for 5 s.
        final = end["xid"]
        caught0 = last_change = time.monotonic()
        last = (final["xids_counted"], final["lost"])
        while (final["xids_counted"] < writer.xids and time.monotonic() - last_change < 5
               and time.monotonic() - caught0 < CATCH_UP_TIMEOUT):
            time.sleep(0.05)
            final = sample("xid", time.monotonic() - t0)
            if (final["xids_counted"], final["lost"]) != last:
                last, last_change = (final["xids_counted"], final["lost"]), time.monotonic()
        catch_up = time.monotonic() - caught0 if final["xids_counted"] >= writer.xids else None
        body = get_new_connection(servers["xid"].url)
        mem = {key: s.memory_kib() for key, s in servers.items()}
        file_bytes = files["xid"].stat().st_size
    finally:
        writer.stop.set()
        writer.join(5)
        for server in servers.values():
            server.stop()
        for path in files.values():
            path.unlink(missing_ok=True)

    out: dict[str, Any] = {
        "rate_wanted": args.flood_rate, "seconds_wanted": args.flood_seconds, "tick_ms": FLOOD_TICK * 1000,
        "records_written": writer.records, "xids_written": writer.xids, "writer_seconds": writer.elapsed,
        "rate_achieved": writer.records / writer.elapsed if writer.elapsed else 0.0,
        "writer_batches_late_over_one_tick": writer.late_batches, "writer_max_late_ms": writer.max_late * 1000,
        "file_bytes": file_bytes,
        "bench_process_cpu_pct": 100 * (self1.ru_utime + self1.ru_stime - self0.ru_utime - self0.ru_stime)
        / end["xid"]["t"],
        "machine_during": load, "exporters": {}}
    window = RSS_WINDOW if args.flood_seconds >= 1.5 * RSS_WINDOW else args.flood_seconds * 2 / 3
    for key, label in labels.items():
        during = [s for s in samples[key] if s["t"] <= end[key]["t"]]
        tail = [s for s in during if s["t"] >= end[key]["t"] - window]
        # per 1 s sample; not the short last interval (one 10 ms clock tick in 9 ms would read 111 %)
        cpu_pct = [100 * (b["cpu_s"] - a["cpu_s"]) / (b["t"] - a["t"]) for a, b in itertools.pairwise(during)
                   if b["t"] - a["t"] >= 0.5]
        rss = [s["rss_kib"] / 1024 for s in during]
        e: dict[str, Any] = {
            "label": label, "argv": servers[key].argv,
            "rss_mib": {"first": rss[0], "last": rss[-1], "max": max(rss),
                        "slope_mib_per_min": slope([s["t"] for s in tail], [s["rss_kib"] / 1024 for s in tail]) * 60,
                        "slope_window_s": window},
            "peak_rss_mib": mem[key]["VmHWM"] / 1024,
            "cpu_pct_of_one_core": {"mean": 100 * (end[key]["cpu_s"] - during[0]["cpu_s"]) / end[key]["t"],
                                    "p50_1s": percentile(cpu_pct, 0.5), "max_1s": max(cpu_pct)},
            "samples": samples[key]}
        if key == "xid":
            lag = [s["xids_written"] - s["xids_counted"] for s in during]
            e.update({"xids_counted": final["xids_counted"], "records_lost": final["lost"],
                      "records_malformed": final["malformed"], "catch_up_seconds": catch_up,
                      "lag_xids": {"p50": percentile(lag, 0.5), "max": max(lag), "at_end": lag[-1]},
                      "lag_records_approx": {"p50": percentile(lag, 0.5) * XID_EVERY, "max": max(lag) * XID_EVERY},
                      "all_counted": final["lost"] == 0 and final["xids_counted"] == writer.xids})
            if e["all_counted"]:
                check_series(body, stream.expected, label)
        out["exporters"][key] = e
    return out


# --- report --------------------------------------------------------------------------------


def machine_info() -> dict[str, Any]:
    grep = subprocess.run(["grep", "--version"], capture_output=True, text=True, check=False).stdout
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "python_version": platform.python_version(),
        "nproc": os.cpu_count(),
        "nproc_usable": len(os.sched_getaffinity(0)),
        "cpu_model": cpu_model(),
        "kernel": platform.release(),
        "grep_version": grep.splitlines()[0] if grep else "",
        "requests_version": requests.__version__,
        "gc_enabled": gc.isenabled(),
        "loadavg_start": os.getloadavg(),
    }


def targets(r: dict[str, Any]) -> list[dict[str, Any]]:
    ours = r["throughput"]["peers"]["ours"]["records_per_s_median"]
    rounds = r["latency"]["followers"]["file"]["rounds"]
    fl = r["flood"]
    f = fl["exporters"]["xid"]
    rss = f["rss_mib"]["slope_mib_per_min"]
    out = [{"target": f"parse >= {THROUGHPUT_TARGET:,} mixed records/s (ours, median)", "value": round(ours),
            "pass": ours >= THROUGHPUT_TARGET}]
    for how, what in (("keepalive", "keep-alive, as specified"), ("new_connection", "a new connection per GET")):
        p99 = rounds[how]["latency"]["p99_ms"]
        out.append({"target": f"append -> /metrics p99 < {LATENCY_TARGET_MS:g} ms (regular file, {what})",
                    "value": round(p99, 2), "pass": p99 < LATENCY_TARGET_MS})
    out += [
        {"target": f"flood: writer reached {fl['rate_wanted']:,} records/s (within 1 %)",
         "value": round(fl["rate_achieved"]), "pass": fl["rate_achieved"] >= 0.99 * fl["rate_wanted"]},
        {"target": "flood: every Xid counted (counted == written, lost 0, malformed 0)",
         "value": f"{f['xids_counted']}/{fl['xids_written']}, lost {f['records_lost']}",
         "pass": f["all_counted"] and f["records_malformed"] == 0},
        {"target": f"flood: RSS stable (|slope| <= {RSS_STABLE_MIB_PER_MIN:g} MiB/min over the last "
                   f"{f['rss_mib']['slope_window_s']:g} s)", "value": round(rss, 3),
         "pass": abs(rss) <= RSS_STABLE_MIB_PER_MIN}]
    return out


def tables(r: dict[str, Any]) -> list[str]:
    t = r["throughput"]
    p = t["peers"]
    lines = [f"| parse: {t['records']:,} mixed records ({t['xids_injected']} Xids), {r['repetitions']} "
             "repetitions | records/s, best | records/s, median | Xids found | median vs ours |",
             "|---|---:|---:|---:|---:|"]
    names = {"ours": f"ours: XidTracker._handle, batches of {t['batch']}",
             "naive_regex": "naive: Python regex on every decoded line",
             "grep": "grep -c 'NVRM: Xid' (C, whole process)"}
    for key, name in names.items():
        best, median = p[key]["records_per_s_best"], p[key]["records_per_s_median"]
        lines.append(f"| {name} | {best:,.0f} | {median:,.0f} | {p[key]['xids_found']} | "
                     f"{ratio(median, p['ours']['records_per_s_median']):.2f}x |")
    lines.append(f"\nparse: all CPUs {t['machine_during']['busy_pct']} % busy, {t['machine_during']['steal_pct']} % "
                 "stolen (this process keeps one of the two busy)")
    la = r["latency"]["followers"]
    cols = [(la[f]["rounds"][how], f"{'file' if f == 'file' else 'FIFO'}, {short}")
            for how, short in (("keepalive", "keep-alive"), ("new_connection", "new conn.")) for f in ("file", "fifo")]
    lines += ["", f"| append -> visible in /metrics, {r['latency']['events']} events each | "
              + " | ".join(name for _, name in cols) + " |", "|---|" + "---:|" * len(cols)]
    for k in ("p50_ms", "p90_ms", "p99_ms", "max_ms", "mean_ms"):
        lines.append(f"| latency {k[:-3]} (ms) | " + " | ".join(f"{c['latency'][k]:.2f}" for c, _ in cols) + " |")
    lines.append("| GETs per event, mean / max | "
                 + " | ".join(f"{c['gets_per_event']['mean']:.2f} / {c['gets_per_event']['max']}" for c, _ in cols)
                 + " |")
    for k in ("p50_ms", "p99_ms"):
        lines.append(f"| a scrape alone, no new event: {k[:-3]} (ms) | "
                     + " | ".join(f"{c['scrape_only'][k]:.2f}" for c, _ in cols) + " |")
    md = r["latency"]["machine_during"]
    lines.append("\nlatency: all CPUs " + "; ".join(f"{md[how]['busy_pct']} % busy, {md[how]['steal_pct']} % stolen "
                                                   f"in the {how} round" for how in md))
    fl = r["flood"]
    fx, fp = fl["exporters"]["xid"], fl["exporters"]["staging"]
    lines += ["", f"| flood: {fl['rate_achieved']:,.0f} records/s achieved ({fl['rate_wanted']:,} wanted) for "
              f"{fl['writer_seconds']:.1f} s; {fl['records_written']:,} records, {fl['xids_written']:,} Xids | "
              "xid collector | staging only (no Xid thread) |", "|---|---:|---:|"]

    def row(label: str, get_value: Any) -> None:
        a, b = get_value(fx), get_value(fp) if "xids_counted" in fp else None
        lines.append(f"| {label} | {a} | {b if b is not None else ''} |")

    def both(label: str, get_value: Any) -> None:
        lines.append(f"| {label} | {get_value(fx)} | {get_value(fp)} |")

    row("Xids counted", lambda d: f"{d['xids_counted']:,}")
    row("records lost / malformed", lambda d: f"{d['records_lost']} / {d['records_malformed']}")
    row("caught up after the writer stopped (s)",
        lambda d: f"{d['catch_up_seconds']:.2f}" if d["catch_up_seconds"] is not None else "never")
    row("lag at 1 s samples, Xids written - counted: p50 / max",
        lambda d: f"{d['lag_xids']['p50']:.0f} / {d['lag_xids']['max']}")
    both("RSS first / last / max (MiB)",
         lambda d: f"{d['rss_mib']['first']:.1f} / {d['rss_mib']['last']:.1f} / {d['rss_mib']['max']:.1f}")
    both(f"RSS slope over the last {fx['rss_mib']['slope_window_s']:g} s (MiB/min)",
         lambda d: f"{d['rss_mib']['slope_mib_per_min']:+.3f}")
    both("exporter CPU, % of one core: mean / p50 / max of 1 s samples",
         lambda d: f"{d['cpu_pct_of_one_core']['mean']:.1f} / {d['cpu_pct_of_one_core']['p50_1s']:.0f} / "
                   f"{d['cpu_pct_of_one_core']['max_1s']:.0f}")
    lines.append(f"\nflood: the writer and sampler (this process) used {fl['bench_process_cpu_pct']:.1f} % of one "
                 f"core; all CPUs {fl['machine_during']['busy_pct']} % busy; "
                 f"{fl['writer_batches_late_over_one_tick']} batches more than one tick late "
                 f"(max {fl['writer_max_late_ms']:.1f} ms)")
    lines += ["", "| target | value | result |", "|---|---:|---|"]
    for x in r["targets"]:
        value = x["value"] if isinstance(x["value"], str) else f"{x['value']:,}"
        lines.append(f"| {x['target']} | {value} | {'PASS' if x['pass'] else 'MISS'} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--records", type=int, default=1_000_000, help="records in the parse stream (default 1000000)")
    p.add_argument("--repetitions", type=int, default=5, help="parse repetitions each (default 5)")
    p.add_argument("--events", type=int, default=1000, help="Xids appended per follower for the latency (default 1000)")
    p.add_argument("--scrape-only", type=int, default=200, help="scrapes with no new event, each (default 200)")
    p.add_argument("--flood-seconds", type=float, default=60.0, help="flood duration, each (default 60)")
    p.add_argument("--flood-rate", type=int, default=50_000, help="flood records per second (default 50000)")
    p.add_argument("--output", type=Path, default=RESULTS, help=f"JSON results (default {RESULTS})")
    args = p.parse_args(argv)
    if (not XID_EVERY <= args.records <= 10_000_000 or not 1 <= args.repetitions <= 100
            or not 1 <= args.events <= 100_000 or not 1 <= args.scrape_only <= 100_000
            or not 3 <= args.flood_seconds <= 3600 or not 100 <= args.flood_rate <= 1_000_000):
        p.error(f"--records {XID_EVERY}..10000000, --repetitions 1..100, --events and --scrape-only 1..100000, "
                "--flood-seconds 3..3600, --flood-rate 100..1000000")
    if shutil.which("grep") is None:
        p.error("grep not found")
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
        "machine": machine_info(), "commit": git_commit(ROOT), "exporter_source_sha256": source_fingerprint()}
    idle0 = cpu_times()
    time.sleep(1.0)
    results["machine"]["before_run"] = machine_load(idle0, cpu_times())
    if results["machine"]["before_run"]["busy_pct"] > 20:
        print(f"WARNING: before the run the CPUs were {results['machine']['before_run']['busy_pct']}% busy: "
              "the figures will be noisy.\n", flush=True)
    running: list[ServerProcess] = []
    start_t, cpu_before = time.monotonic(), cpu_times()
    try:
        with tempfile.TemporaryDirectory(prefix="xid-bench-") as tmp_name:
            tmp = Path(tmp_name)
            proc = fake_procfs(tmp)
            print("1/3 parse throughput ...", flush=True)
            results["throughput"] = throughput(args, tmp, proc)
            print("2/3 append -> /metrics latency, regular file and FIFO ...", flush=True)
            results["latency"] = latency(args, tmp, proc, running)
            print(f"3/3 flood, {args.flood_seconds:g} s ...", flush=True)
            results["flood"] = flood(args, tmp, proc, running)
    except (BenchError, requests.RequestException) as err:
        sys.stderr.write(f"xid: FAILED: {err}\n")
        return 1
    finally:
        for server in running:
            server.stop()
    results["wall_seconds"] = round(time.monotonic() - start_t, 1)
    results["machine"]["during_run"] = machine_load(cpu_before, cpu_times())
    results["machine"]["loadavg_end"] = os.getloadavg()
    results["commit_end"] = git_commit(ROOT)
    results["exporter_source_changed_during_run"] = source_fingerprint() != results["exporter_source_sha256"]
    results["targets"] = targets(results)
    results["target_pass"] = all(t["pass"] for t in results["targets"])
    print()
    for line in tables(results):
        print(line)
    m = results["machine"]
    c = results["commit"]
    return finish(results, args.output,
                  f"{m['nproc']} CPUs ({m['cpu_model']}), kernel {m['kernel']}, Python {m['python_version']}, "
                  f"{m['grep_version']}; commit {c['head'][:12]}{' + local changes' if c['dirty'] else ''}")


if __name__ == "__main__":
    sys.exit(main())
