#!/usr/bin/env python3
"""A full scrape of the reference node (reference_node.py) over HTTP, beside node_exporter.

    .venv/bin/python benchmarks/reference_scrape.py [--scrapes 500]

Three servers are scraped in turn with gzip, each over one kept-alive connection, as Prometheus
2.42 does (every scrape of a target on one connection: observed with Debian's prometheus, 11 scrapes
from one client port), then again with a new connection for each scrape:

- ours: every default collector over the reference node (8 simulated GPUs, 4 NFSv4.2 mounts
  with nconnect=8, 4 RDMA NICs, 2,000 processes);
- node_exporter: its default collectors on this machine (what a node's node_exporter costs);
- dcgm-sized: node_exporter's textfile collector alone, serving as many GPU series as
  dcgm-exporter's default field list gives for 8 GPUs (the cost of serving that much text).

Target: ours under 5 ms at the median over a kept-alive connection. Results:
benchmarks/results/reference_scrape.json.
"""

from __future__ import annotations

import argparse
import gzip
import http.client
import json
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ServerProcess, free_port, git_commit, percentile
from reference_node import hold_kmsg_open, write_reference_node

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "reference_scrape.json"
TARGET_P50_SECONDS = 0.005
# dcgm-exporter's default counters (etc/default-counters.csv): about 40 per GPU with its labels.
DCGM_FIELDS_PER_GPU, GPUS = 40, 8


def _dcgm_sized(directory: Path) -> None:
    lines = []
    for field in range(DCGM_FIELDS_PER_GPU):
        name = f"DCGM_FI_DEV_FIELD_{field}"
        lines.append(f"# HELP {name} A dcgm-exporter-sized field.\n# TYPE {name} gauge\n")
        for gpu in range(GPUS):
            lines.append(f'{name}{{gpu="{gpu}",UUID="GPU-7c22a9e1-8f1b-4c2a-9e7d-0b6f3a2c1d0{gpu}",'
                         f'pci_bus_id="00000000:{0x1b + gpu:02X}:00.0",device="nvidia{gpu}",'
                         f'modelName="NVIDIA H100 80GB HBM3",Hostname="gpu071"}} {field * 1.5 + gpu}\n')
    (directory / "dcgm.prom").write_text("".join(lines))


def _get(conn: http.client.HTTPConnection, path: str, close: bool) -> tuple[float, int]:
    """One scrape, timed from sending the request to the last byte of the (gzip) body, as Prometheus'
    own client reads it; no decompression or decoding in the timer."""
    headers = {"Accept-Encoding": "gzip", "Accept": "text/plain;version=0.0.4"}
    if close:
        headers["Connection"] = "close"
    start = time.perf_counter()
    conn.request("GET", path, headers=headers)
    resp = conn.getresponse()
    body = resp.read()
    seconds = time.perf_counter() - start
    if resp.status != 200:
        raise http.client.HTTPException(f"{path}: HTTP {resp.status}")
    if resp.getheader("Content-Encoding") == "gzip":
        body = gzip.decompress(body)
    return seconds, sum(1 for line in body.splitlines() if line and line[:1] != b"#")


def _scrape(url: str) -> tuple[float, int]:
    """One scrape on a new connection, timed from connecting."""
    parts = urlsplit(url)
    start = time.perf_counter()
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    try:
        _, series = _get(conn, parts.path, close=True)
        return time.perf_counter() - start, series
    finally:
        conn.close()


def _keep_alive(url: str) -> tuple[http.client.HTTPConnection, str]:
    parts = urlsplit(url)
    return http.client.HTTPConnection(parts.hostname, parts.port, timeout=30), parts.path


def _stats(times: list[float]) -> dict[str, float]:
    return {"p50_seconds": percentile(times, 0.5), "p90_seconds": percentile(times, 0.9),
            "p99_seconds": percentile(times, 0.99)}


def _measure(servers: list[ServerProcess], scrapes: int) -> tuple[dict[str, list[float]], dict[str, list[float]],
                                                                  dict[str, int]]:
    """Kept-alive scrapes of each server in turn, then as many on a new connection each."""
    for server in servers:
        deadline = time.monotonic() + 30
        while True:
            server.check_running()
            try:
                _scrape(server.url)
                break
            except ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
    for _ in range(20):  # warm up: the first scrapes check every process for GPU use
        for server in servers:
            _scrape(server.url)
    conns = {s.key: _keep_alive(s.url) for s in servers}
    times: dict[str, list[float]] = {s.key: [] for s in servers}
    fresh: dict[str, list[float]] = {s.key: [] for s in servers}
    series: dict[str, int] = {}
    for _ in range(scrapes):
        for server in servers:  # in turn, so a busy moment of the machine costs each alike
            seconds, series[server.key] = _get(*conns[server.key], close=False)
            times[server.key].append(seconds)
    for _ in range(scrapes):
        for server in servers:
            fresh[server.key].append(_scrape(server.url)[0])
    for conn, _ in conns.values():
        conn.close()
    return times, fresh, series


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scrapes", type=int, default=500)
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        tmpdir = Path(tmp)
        flags = write_reference_node(tmpdir / "node")
        (tmpdir / "textfile").mkdir()
        _dcgm_sized(tmpdir / "textfile")
        ports = [free_port() for _ in range(3)]
        servers = [
            ServerProcess(key="ours", label="gpunode-exporter (reference node)", port=ports[0], log=tmpdir / "ours.log",
                          argv=[sys.executable, "-m", "exporter", *flags,
                                "--web.listen-address", f"127.0.0.1:{ports[0]}"]),
            ServerProcess(key="node", label="node_exporter (defaults, this machine)", port=ports[1],
                          log=tmpdir / "node.log",
                          argv=["prometheus-node-exporter", f"--web.listen-address=127.0.0.1:{ports[1]}"]),
            ServerProcess(key="dcgm_sized", label="dcgm-exporter-sized text (node_exporter textfile)",
                          port=ports[2], log=tmpdir / "dcgm.log",
                          argv=["prometheus-node-exporter", "--collector.disable-defaults", "--collector.textfile",
                                f"--collector.textfile.directory={tmpdir / 'textfile'}",
                                f"--web.listen-address=127.0.0.1:{ports[2]}"]),
        ]
        with hold_kmsg_open(tmpdir / "node"):
            for server in servers:
                server.start()
            try:
                times, fresh, series = _measure(servers, args.scrapes)
            finally:
                for server in servers:
                    server.stop()
    result = {
        "scrapes": args.scrapes, "target_p50_seconds": TARGET_P50_SECONDS, "git": git_commit(ROOT),
        "servers": {s.key: {"label": s.label, "series": series[s.key], **_stats(times[s.key]),
                            "new_connection": _stats(fresh[s.key])} for s in servers},
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    for how in ("kept-alive connection", "new connection each"):
        print(f"{how}:")
        for r in result["servers"].values():
            t = r if how.startswith("kept") else r["new_connection"]
            print(f"  {r['label']:<52} {r['series']:>6} series  p50 {t['p50_seconds'] * 1000:6.2f} ms  "
                  f"p90 {t['p90_seconds'] * 1000:6.2f} ms  p99 {t['p99_seconds'] * 1000:6.2f} ms")
    ours = result["servers"]["ours"]["p50_seconds"]
    print(f"target: ours p50 < {TARGET_P50_SECONDS * 1000:.0f} ms: {'PASS' if ours < TARGET_P50_SECONDS else 'FAIL'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
