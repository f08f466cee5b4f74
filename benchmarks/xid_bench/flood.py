"""3. Flood: records appended at a set rate for a while, the exporter's counts, RSS and CPU
sampled every second beside an exporter without the Xid thread, so that what the thread costs
and whether it keeps up are seen together."""

from __future__ import annotations

import argparse
import itertools
import os
import resource
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from benchlib import (  # benchmarks/ is on sys.path when run as a script
    BenchError,
    ServerProcess,
    cpu_times,
    machine_load,
    percentile,
    slope,
)

from .exporters import check_series, exporter, get_new_connection, start, xid_counts
from .records import XID_EVERY, Stream, real_others, templates, write_all

CATCH_UP_TIMEOUT = 60.0
FLOOD_TICK = 0.010  # the writer appends one batch every 10 ms
RSS_WINDOW = 40.0  # seconds at the end of the flood the RSS slope is fitted over


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


def sample_each_second(writer: Writer, keys: Iterable[str], sample: Callable[[str, float], Any], t0: float) -> None:
    """sample(key, seconds since t0) for every key once a second, on the second, while the writer runs."""
    i = 1
    while writer.is_alive():
        delay = t0 + i - time.monotonic()
        if delay > 0:
            writer.join(delay)
        if not writer.is_alive():
            break
        for key in keys:
            sample(key, time.monotonic() - t0)
        i += 1


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
        sample_each_second(writer, labels, sample, t0)
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

