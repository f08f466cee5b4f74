"""4. Floods by kind, before and after: the same bytes appended to two files, one followed by this
commit's exporter, one by the exporter at --before (the code without SXids and kernel events), so
that what the new classes cost under a flood, and whether either falls behind, show side by side.

Kinds: `xid` (today's flood: a real Xid every XID_EVERY records among real other records),
`xid_dense` (every record the same real Xid 79 line), `sxid_dense` (every record an SXid: a real
first line with its Severity and Data lines, the same SXid over and over, as a driver floods),
`kernel_mixed` (real-kernel-events.kmsg's 130 records cycled: 54 events among look-alikes). Every
Xid, SXid and kernel event counted, or its gap counted as lost; the series stay as few as written.
"""

from __future__ import annotations

import argparse
import itertools
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from benchlib import BenchError, ServerProcess, cpu_times, git_commit, machine_load  # benchmarks/ on sys.path

from .exporters import exporter, get_new_connection, start
from .flood import Writer, sample_each_second
from .records import KMSG, Stream, fixture_records, real_others, templates

KINDS = ("xid", "xid_dense", "sxid_dense", "kernel_mixed")
_SUM = {"xid": b"gpunode_xid_errors_total{", "sxid": b"gpunode_sxid_errors_total{",
        "kernel": b"gpunode_kernel_events_total{"}
_GAUGE = re.compile(rb"^gpunode_kmsg_records_(lost|malformed)_total (\S+)$", re.M)


class Cycle(Stream):
    """Records cycled from a fixed list of (prio, text), seq contiguous; marks[i]: record i is an event."""

    def __init__(self, records: list[tuple[bytes, bytes]], marks: list[bool]) -> None:
        super().__init__([], [])
        self._records, self._marks = records, marks

    @property
    def events(self) -> int:
        full, part = divmod(self.seq, len(self._records))
        return full * sum(self._marks) + sum(self._marks[:part])

    def batch(self, n: int) -> bytes:
        out = []
        for _ in range(n):
            prio, text = self._records[self.seq % len(self._records)]
            out.append(self._record(prio, text))
        return b"".join(out)


def _cycle(kind: str) -> tuple[Stream, Callable[[Stream], int], str]:
    """(stream, events written so far, which family counts them)."""
    if kind == "xid":
        return Stream(real_others(), templates()), lambda s: s.xids, "xid"
    real = fixture_records("real-xid.kmsg")
    if kind == "xid_dense":
        line = next((p, t) for _, p, t in real if t.startswith(b"NVRM: Xid (PCI:0000:91:00): 79,"))
        return Cycle([line], [True]), lambda s: s.events, "xid"
    if kind == "sxid_dense":
        triplet = [(p, t) for seq, p, t in real if seq in (1188, 1190)]  # 20034 Fatal, then its Data line
        severity = next((p, t) for seq, p, t in real if seq == 1189)
        return Cycle([triplet[0], severity, triplet[1]], [True, False, False]), lambda s: s.events, "sxid"
    seqs = {item["seq"] for item in yaml.safe_load((KMSG / "real-kernel-events.events.yaml").read_text())["events"]
            if "kind" in item}
    records = fixture_records("real-kernel-events.kmsg")
    return Cycle([(p, t) for _, p, t in records], [seq in seqs for seq, _, _ in records]), lambda s: s.events, "kernel"


def _counts(body: bytes, family: str) -> tuple[int, int, int]:
    total = sum(int(float(line.rpartition(b" ")[2])) for line in body.split(b"\n") if line.startswith(_SUM[family]))
    gauges = {m[1]: int(float(m[2])) for m in _GAUGE.finditer(body)}
    return total, gauges.get(b"lost", 0), gauges.get(b"malformed", 0)


def floods(args: argparse.Namespace, tmp: Path, proc: Path, running: list[ServerProcess]) -> dict[str, Any]:
    before = Path(args.before) / ".venv" / "bin" / "gpunode-exporter"
    if not before.is_file():
        raise BenchError(f"{before} not found: make a checkout of the earlier code with its own .venv")
    return {"before_commit": git_commit(Path(args.before))["head"],
            **{kind: _flood(kind, args, tmp, proc, running, str(before)) for kind in KINDS}}


def _flood(kind: str, args: argparse.Namespace, tmp: Path, proc: Path, running: list[ServerProcess],
           before: str) -> dict[str, Any]:
    print(f"   {kind} ...", flush=True)
    stream, written, family = _cycle(kind)
    servers, files = {}, {}
    for key in ("after", "before"):
        directory = tmp / f"floods-{kind}-{key}"
        directory.mkdir()
        files[key] = directory / "kmsg"
        files[key].touch()
        servers[key] = exporter(key, key, "xid", files[key], directory, proc)
        if key == "before":
            servers[key].argv[0] = before
    writer = Writer(list(files.values()), stream, args.flood_rate, args.flood_seconds)
    samples: dict[str, list[dict[str, Any]]] = {k: [] for k in servers}

    def sample(key: str, t: float) -> dict[str, Any]:
        events = written(stream)
        body = get_new_connection(servers[key].url)
        counted, lost, malformed = _counts(body, family if key == "after" or family == "xid" else "xid")
        series = sum(1 for line in body.split(b"\n") if line.startswith(_SUM[family]))
        s = {"t": round(t, 3), "events_written": events, "counted": counted, "lost": lost, "malformed": malformed,
             "series": series, "rss_kib": servers[key].memory_kib()["VmRSS"], "cpu_s": servers[key].cpu_seconds()}
        samples[key].append(s)
        return s

    try:
        for server in servers.values():
            start(server, running)
        load0, t0 = cpu_times(), time.monotonic()
        for key in servers:
            sample(key, 0.0)
        writer.start()
        sample_each_second(writer, servers, sample, t0)
        if writer.error is not None:
            raise BenchError(f"the flood writer failed: {writer.error!r}")
        end = {key: sample(key, time.monotonic() - t0) for key in servers}
        load = machine_load(load0, cpu_times())
        caught0 = time.monotonic()  # until the after exporter has counted all, at most 30 s
        while end["after"]["counted"] < written(stream) and time.monotonic() - caught0 < 30:
            time.sleep(0.1)
            end["after"] = sample("after", time.monotonic() - t0)
        catch_up = time.monotonic() - caught0 if end["after"]["counted"] >= written(stream) else None
    finally:
        writer.stop.set()
        writer.join(5)
        for server in servers.values():
            server.stop()
    out: dict[str, Any] = {"records_written": writer.records, "events_written": written(stream), "family": family,
                           "rate_achieved": writer.records / writer.elapsed if writer.elapsed else 0.0,
                           "machine_during": load, "exporters": {}}
    for key in servers:
        during = [s for s in samples[key] if s["t"] <= end[key]["t"]]
        cpu = [100 * (b["cpu_s"] - a["cpu_s"]) / (b["t"] - a["t"]) for a, b in itertools.pairwise(during)
               if b["t"] - a["t"] >= 0.5]
        lag = [s["events_written"] - s["counted"] for s in during]
        out["exporters"][key] = {
            "counted": end[key]["counted"], "lost": end[key]["lost"], "malformed": end[key]["malformed"],
            "series": end[key]["series"], "lag_p50": sorted(lag)[len(lag) // 2], "lag_max": max(lag),
            "rss_mib_first": during[0]["rss_kib"] / 1024, "rss_mib_max": max(s["rss_kib"] for s in during) / 1024,
            "cpu_pct_mean": 100 * (end[key]["cpu_s"] - during[0]["cpu_s"]) / end[key]["t"],
            "cpu_pct_max_1s": max(cpu) if cpu else 0.0,
            "catch_up_seconds": catch_up if key == "after" else None, "samples": samples[key]}
    return out


def table(r: dict[str, Any]) -> list[str]:
    before = (r["before_commit"] or "--before")[:7]
    lines = ["", f"| flood (before = {before}, after = this commit) | records/s | events written | counted after "
             "(before) | series after | lag after, max | lost / malformed after | CPU % of a core after (before) | "
             "RSS max MiB after (before) |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for kind in KINDS:
        f = r[kind]
        a, b = f["exporters"]["after"], f["exporters"]["before"]
        lines.append(f"| {kind} | {f['rate_achieved']:,.0f} | {f['events_written']:,} | {a['counted']:,} "
                     f"({b['counted']:,}) | {a['series']} | {a['lag_max']:,} | {a['lost']} / {a['malformed']} | "
                     f"{a['cpu_pct_mean']:.1f} ({b['cpu_pct_mean']:.1f}) | {a['rss_mib_max']:.1f} "
                     f"({b['rss_mib_max']:.1f}) |")
    return lines
