"""2. Latency from appending one Xid to seeing it in /metrics, following a regular file and a
FIFO, with and without keep-alive, so that each way a node's log is read is measured."""

from __future__ import annotations

import argparse
import os
import random
import time
from pathlib import Path
from typing import Any

import requests
from benchlib import (  # benchmarks/ is on sys.path when run as a script
    BenchError,
    ServerProcess,
    cpu_times,
    latencies_ms,
    machine_load,
    summarize,
)

from .exporters import check_series, exporter, get, get_new_connection, open_fifo_writer, start, xid_counts
from .records import Stream, real_others, templates, write_all

POLL_TIMEOUT = 5.0  # seconds an appended Xid may take to show before the run fails
JITTER = 0.005  # the sleep before each appended Xid: uniform over one 5 ms poll period of the reader


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
                          "latencies_ms": latencies_ms(f.latencies[how]),
                          "scrape_only_ms": latencies_ms(f.scrape_only[how])}
                    for how in ROUNDS}}
        return out
    finally:
        for f in followers:
            f.close()
            f.server.stop()

