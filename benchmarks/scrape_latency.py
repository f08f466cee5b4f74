#!/usr/bin/env python3
"""Side-by-side scrape benchmark: gpunode-exporter's nfs collector vs node_exporter's mountstats.

    python benchmarks/scrape_latency.py [--scrapes 300] [--fixture DIR]

Both exporters read the same fake procfs (benchmarks/make_fixture.py; generated in a
temporary directory unless --fixture is given) and are scraped alternately in one
loop, so both see the same machine conditions. Each scrape is one `requests.get`
on a new connection (`Connection: close`), timed until the last body byte is read
(the body is not decompressed inside the timed region). Results: a markdown table
on stdout and benchmarks/results/scrape_latency.json.
"""

from __future__ import annotations

import argparse
import gzip
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests
from benchlib import (  # benchmarks/ is on sys.path when run as a script
    BenchError,
    ServerProcess,
    cpu_model,
    cpu_times,
    find_ours,
    finish,
    free_port,
    latencies_ms,
    machine_load,
    ratio,
    source_fingerprint,
    summarize,
    wait_ready,
)
from make_fixture import write_fixture  # benchmarks/ is on sys.path when run as a script

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "scrape_latency.json"
NODE_EXPORTER = "prometheus-node-exporter"
WARMUP = 20
SCRAPE_TIMEOUT = 30.0
# Prometheus asks for gzip; we ask both for the classic text format so they answer alike.
ACCEPT = "text/plain;version=0.0.4"
# Targets (ours / node_exporter), evaluated on the gzip round.
P50_RATIO_TARGET = 1.0
P99_RATIO_TARGET = 2.0
PEAK_RSS_TARGET_MIB = 40.0


@dataclass(kw_only=True)
class Exporter(ServerProcess):
    """One exporter process under test, and what its responses must hold."""

    nfs_metric: str  # a family that must be present in every response
    nfs_prefix: str  # prefix of all its NFS series
    success_series: str  # its own "collector succeeded" series; its value must be 1


def scrape(url: str, encoding: str) -> tuple[float, bytes, str]:
    """One scrape on a fresh connection: (seconds, raw body as sent, Content-Encoding)."""
    headers = {"Accept-Encoding": encoding, "Accept": ACCEPT, "Connection": "close"}
    start = time.perf_counter()
    with requests.get(url, headers=headers, stream=True, timeout=SCRAPE_TIMEOUT) as resp:
        resp.raise_for_status()
        body = resp.raw.read(decode_content=False)
    elapsed = time.perf_counter() - start
    return elapsed, body, resp.headers.get("Content-Encoding", "")


def samples(text: str) -> list[str]:
    return [line for line in text.splitlines() if line and not line.startswith("#")]


def family_prefixes(names: list[str], nfs_prefix: str) -> dict[str, int]:
    """Non-NFS samples grouped by their first name component (go_, process_, ...)."""
    out: dict[str, int] = {}
    for name in names:
        if not name.startswith(nfs_prefix):
            prefix = name.split("_", 1)[0] + "_*"
            out[prefix] = out.get(prefix, 0) + 1
    return dict(sorted(out.items()))


def inspect(exp: Exporter, mounts: int) -> dict[str, Any]:
    """Check one response of each encoding really holds the NFS metrics; count its series."""
    _, plain, enc = scrape(exp.url, "identity")
    if enc:
        raise BenchError(f"{exp.label} answered Content-Encoding {enc!r} to identity")
    _, zipped, enc = scrape(exp.url, "gzip")
    if enc != "gzip":
        raise BenchError(f"{exp.label} ignored Accept-Encoding: gzip (got {enc!r})")
    text = plain.decode()
    lines = samples(text)
    names = [line.split("{", 1)[0].split(" ", 1)[0] for line in lines]
    nfs = [n for n in names if n.startswith(exp.nfs_prefix)]
    if exp.nfs_metric not in names:
        raise BenchError(f"{exp.label}: no {exp.nfs_metric} in its response; log:\n"
                         f"{exp.log.read_text(errors='replace')[-2000:]}")
    success = [line.rsplit(" ", 1)[1] for line in lines if line.startswith(exp.success_series + " ")]
    if len(success) != 1 or float(success[0]) != 1:
        raise BenchError(f"{exp.label}: collector did not succeed ({exp.success_series} = {success})")
    # Every mount must show up once in the per-op requests counter's NULL op.
    null_ops = [line for line in lines if line.startswith(exp.nfs_metric)
                and ('op="NULL"' in line or 'operation="NULL"' in line)]
    if len(null_ops) != mounts:
        raise BenchError(f"{exp.label}: {len(null_ops)} mounts in {exp.nfs_metric}, want {mounts}")
    gunzipped = gzip.decompress(zipped)
    if not gunzipped.startswith(b"# HELP"):
        raise BenchError(f"{exp.label}: gzip body does not look like an exposition")
    return {
        "samples": len(lines),
        "nfs_series": len(nfs),
        "nfs_families": len(set(nfs)),
        "other_samples": family_prefixes(names, exp.nfs_prefix),
        "bytes_identity": len(plain),
        "bytes_gzip": len(zipped),
    }


def run_round(exporters: list[Exporter], encoding: str, n: int, warmup: int) -> None:
    """Warm up, then n scrapes of each, alternating who goes first; CPU delta over the n."""
    for i in range(warmup):
        for exp in exporters if i % 2 == 0 else exporters[::-1]:
            scrape(exp.url, encoding)
    cpu0 = {exp.key: exp.cpu_seconds() for exp in exporters}
    for exp in exporters:
        exp.latencies[encoding] = []
    for i in range(n):
        for exp in exporters if i % 2 == 0 else exporters[::-1]:
            elapsed, _, _ = scrape(exp.url, encoding)
            exp.latencies[encoding].append(elapsed)
    for exp in exporters:
        exp.cpu[encoding] = (exp.cpu_seconds() - cpu0[exp.key]) / n


def table(results: dict[str, Any], encoding: str, full: bool = True) -> str:
    """Markdown: latency and CPU of one round; with `full`, memory and response size too."""
    ours, node = results["exporters"]["ours"], results["exporters"]["node"]
    o, n = ours["rounds"][encoding], node["rounds"][encoding]

    def row(label: str, a: float, b: float, fmt: str) -> str:
        return f"| {label} | {a:{fmt}} | {b:{fmt}} | {ratio(a, b):.2f}x |"

    rows = [row(label, o[key], n[key], ".2f") for key, label in (
        ("p50_ms", "p50 latency (ms)"), ("p90_ms", "p90 latency (ms)"), ("p99_ms", "p99 latency (ms)"),
        ("max_ms", "max latency (ms)"), ("mean_ms", "mean latency (ms)"),
        ("cpu_ms_per_scrape", "CPU per scrape (ms)"))]
    if full:
        rows += [row(label, ours[key], node[key], ".1f") for key, label in (
            ("peak_rss_mib", "peak RSS, VmHWM (MiB)"), ("rss_end_mib", "RSS at end (MiB)"))]
        rows += [row(label, ours[key], node[key], ",") for key, label in (
            ("samples", "samples per response"), ("nfs_series", "NFS series"),
            ("bytes_identity", "response bytes (identity)"), ("bytes_gzip", "response bytes (gzip)"))]
    head = [f"| {encoding} round, {results['scrapes']} scrapes each | gpunode-exporter | "
            "node_exporter | ours/node |", "|---|---:|---:|---:|"]
    return "\n".join(head + rows)


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    g = {k: v["rounds"]["gzip"] for k, v in results["exporters"].items()}
    p50 = ratio(g["ours"]["p50_ms"], g["node"]["p50_ms"])
    p99 = ratio(g["ours"]["p99_ms"], g["node"]["p99_ms"])
    rss = results["exporters"]["ours"]["peak_rss_mib"]
    return [
        {"target": f"p50 ratio <= {P50_RATIO_TARGET} (moonshot)", "value": round(p50, 3),
         "pass": p50 <= P50_RATIO_TARGET},
        {"target": f"p99 ratio <= {P99_RATIO_TARGET}", "value": round(p99, 3),
         "pass": p99 <= P99_RATIO_TARGET},
        {"target": f"our peak RSS <= {PEAK_RSS_TARGET_MIB:.0f} MiB", "value": round(rss, 1),
         "pass": rss <= PEAK_RSS_TARGET_MIB},
    ]


def machine_info(ours_cmd: str) -> dict[str, Any]:
    node_version = subprocess.run([NODE_EXPORTER, "--version"], capture_output=True, text=True,
                                  timeout=10)
    ours_version = subprocess.run([ours_cmd, "--version"], capture_output=True, text=True, timeout=30)
    return {
        "nproc": os.cpu_count(),
        "nproc_usable": len(os.sched_getaffinity(0)),
        "cpu_model": cpu_model(),
        "kernel": platform.release(),
        "python_version": platform.python_version(),
        "requests_version": requests.__version__,
        "node_exporter_version": (node_version.stdout or node_version.stderr).splitlines()[0],
        "gpunode_exporter_version": (ours_version.stdout or ours_version.stderr).strip(),
        "loadavg_start": os.getloadavg(),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scrapes", type=int, default=300, help="measured scrapes per exporter and round")
    p.add_argument("--warmup", type=int, default=WARMUP, help=f"warm-up scrapes each (default {WARMUP})")
    p.add_argument("--fixture", type=Path, help="procfs tree from make_fixture.py (default: generate)")
    p.add_argument("--mounts", type=int, default=32, help="mounts in a generated fixture (default 32)")
    p.add_argument("--output", type=Path, default=RESULTS, help=f"JSON results (default {RESULTS})")
    args = p.parse_args(argv)
    if not 1 <= args.scrapes <= 100_000 or not 0 <= args.warmup <= 10_000:
        p.error("--scrapes must be 1..100000, --warmup 0..10000")
    if shutil.which(NODE_EXPORTER) is None:
        p.error(f"{NODE_EXPORTER} not found (apt-get install prometheus-node-exporter)")

    with tempfile.TemporaryDirectory(prefix="scrape-bench-") as tmp:
        tmpdir = Path(tmp)
        if args.fixture is None:
            fixture = write_fixture(tmpdir / "procfs", mounts=args.mounts)
            mounts = args.mounts
        else:
            fixture = args.fixture.resolve()
            mountstats = fixture / "self" / "mountstats"
            if not mountstats.is_file():
                p.error(f"{mountstats} not found")
            mounts = sum(1 for line in mountstats.read_text().splitlines()
                         if line.startswith("device ") and " fstype nfs" in line)
        try:
            results = bench(args, fixture, mounts, tmpdir)
        except (BenchError, requests.RequestException) as err:
            sys.stderr.write(f"scrape_latency: FAILED: {err}\n")
            return 1

    print(table(results, "gzip"))
    print()
    print(table(results, "identity", full=False))
    print()
    print("| target (gzip round) | value | result |\n|---|---:|---|")
    for t in results["targets"]:
        print(f"| {t['target']} | {t['value']} | {'PASS' if t['pass'] else 'MISS'} |")
    print()
    for key in ("ours", "node"):
        e = results["exporters"][key]
        print(f"{e['label']}: non-NFS samples in a response: {e['other_samples']}")
    m = results["machine"]
    return finish(results, args.output,
                  f"{m['nproc']} CPUs ({m['cpu_model']}), kernel {m['kernel']}, Python "
                  f"{m['python_version']}, {m['node_exporter_version']}")


def _every_nfs_series(tmpdir: Path) -> Path:
    config = tmpdir / "every-nfs-series.yml"
    config.write_text("nfs: {operations: all, transport_series: all, per_transport: true}\n")
    return config


def bench(args: argparse.Namespace, fixture: Path, mounts: int, tmpdir: Path) -> dict[str, Any]:
    ours_cmd = find_ours()
    ours_port, node_port = free_port(), free_port()
    ours = Exporter(
        key="ours", label="gpunode-exporter",
        # Every operation and transport series, as node_exporter serves them (by default ours sums
        # idle operations into op="OTHER": docs/series-budget.md).
        argv=[ours_cmd, "--web.listen-address", f"127.0.0.1:{ours_port}", "--path.procfs", str(fixture),
              "--config.file", str(_every_nfs_series(tmpdir))],
        port=ours_port, log=tmpdir / "ours.log", nfs_metric="gpunode_nfs_rpc_operations_total",
        nfs_prefix="gpunode_nfs_", success_series='gpunode_scrape_collector_success{collector="nfs"}')
    node = Exporter(
        key="node", label="node_exporter",
        argv=[NODE_EXPORTER, "--collector.disable-defaults", "--collector.mountstats",
              "--path.procfs", str(fixture), "--web.listen-address", f"127.0.0.1:{node_port}"],
        port=node_port, log=tmpdir / "node.log", nfs_metric="node_mountstats_nfs_operations_requests_total",
        nfs_prefix="node_mountstats_nfs_", success_series='node_scrape_collector_success{collector="mountstats"}')
    exporters = [ours, node]
    results: dict[str, Any] = {"scrapes": args.scrapes, "warmup": args.warmup, "mounts": mounts,
                               "fixture": str(fixture) if args.fixture else "generated",
                               "connection": "new TCP connection per scrape (Connection: close)",
                               "accept": ACCEPT, "machine": machine_info(ours_cmd)}
    results["exporter_source_sha256"] = source_fingerprint()
    try:
        for exp in exporters:
            exp.start()
        for exp in exporters:
            wait_ready(exp)
        info = {exp.key: inspect(exp, mounts) for exp in exporters}
        start, cpu_before = time.monotonic(), cpu_times()
        run_round(exporters, "gzip", args.scrapes, args.warmup)
        run_round(exporters, "identity", args.scrapes, min(args.warmup, 5))
        results["wall_seconds"] = round(time.monotonic() - start, 1)
        results["machine"]["during_run"] = machine_load(cpu_before, cpu_times())
        # Inspect again at the end: the servers must still be healthy.
        for exp in exporters:
            inspect(exp, mounts)
        results["machine"]["loadavg_end"] = os.getloadavg()
        results["exporters"] = {}
        for exp in exporters:
            mem = exp.memory_kib()
            results["exporters"][exp.key] = {
                "label": exp.label, "argv": exp.argv, "exe": exp.exe(), **info[exp.key],
                "peak_rss_mib": mem["VmHWM"] / 1024, "rss_end_mib": mem["VmRSS"] / 1024,
                "rounds": {enc: {**summarize(lat), "cpu_ms_per_scrape": exp.cpu[enc] * 1000,
                                 "latencies_ms": latencies_ms(lat)}
                           for enc, lat in exp.latencies.items()},
            }
    finally:
        for exp in exporters:
            exp.stop()
    results["exporter_source_changed_during_run"] = (
        source_fingerprint() != results["exporter_source_sha256"])
    results["targets"] = targets(results)
    return results


if __name__ == "__main__":
    sys.exit(main())
