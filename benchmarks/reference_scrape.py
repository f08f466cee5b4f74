#!/usr/bin/env python3
"""A full scrape of the reference node (reference_node.py) over HTTP, beside node_exporter.

    .venv/bin/python benchmarks/reference_scrape.py [--scrapes 500]

Three servers are scraped in turn with gzip, each over one kept-alive connection, as Prometheus
2.42 does (every scrape of a target on one connection: observed with Debian's prometheus, 11 scrapes
from one client port), then again with a new connection for each scrape:

- ours: every default collector over the reference node (8 simulated GPUs, 4 NFSv4.2 mounts
  with nconnect=8, 4 RDMA NICs, 2,000 processes), over HTTP, and a second instance over HTTPS with
  basic auth (a web config as docs/install.md shows: TLS 1.2+, a bcrypt password);
- node_exporter: its default collectors on this machine (what a node's node_exporter costs);
- dcgm-sized: node_exporter's textfile collector alone, serving as many GPU series as
  dcgm-exporter's default field list gives for 8 GPUs (the cost of serving that much text).

With `--baseline DIR` (another checkout, say `git worktree add DIR COMMIT`), that checkout's
exporter serves the same reference node too, scraped in the same turns: a change measured against
what it changed, side by side.

Besides each scrape's time, each server's CPU (user + system of all its threads) per kept-alive
scrape: what a scrape costs the node, where the time is what Prometheus waits.

Targets: ours under 5 ms at the median over a kept-alive connection; ours at most 40 MiB at its peak
(VmHWM) with TLS and basic auth off and on. Results: benchmarks/results/reference_scrape.json.
"""

from __future__ import annotations

import argparse
import base64
import gzip
import http.client
import json
import ssl
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

import bcrypt

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchlib import ServerProcess, free_port, git_commit, percentile
from reference_node import hold_kmsg_open, write_reference_node

from tests import tlscerts

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "reference_scrape.json"
TARGET_P50_SECONDS = 0.005
TARGET_PEAK_MIB = 40
USER, PASSWORD = "prometheus", "a benchmark's password"
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


class Target:
    """How to reach one server: plain HTTP, or HTTPS (trusting the throwaway CA) with basic auth."""

    def __init__(self, url: str, tls: ssl.SSLContext | None = None, auth: str = "") -> None:
        parts = urlsplit(url)
        self.host, self.port, self.path = parts.hostname or "127.0.0.1", parts.port, parts.path
        self.tls, self.auth = tls, auth

    def connect(self) -> http.client.HTTPConnection:
        if self.tls is not None:
            return http.client.HTTPSConnection(self.host, self.port, timeout=30, context=self.tls)
        return http.client.HTTPConnection(self.host, self.port, timeout=30)


def _get(conn: http.client.HTTPConnection, target: Target, close: bool) -> tuple[float, int]:
    """One scrape, timed from sending the request to the last byte of the (gzip) body, as Prometheus'
    own client reads it; no decompression or decoding in the timer."""
    headers = {"Accept-Encoding": "gzip", "Accept": "text/plain;version=0.0.4"}
    if target.auth:
        headers["Authorization"] = target.auth
    if close:
        headers["Connection"] = "close"
    start = time.perf_counter()
    conn.request("GET", target.path, headers=headers)
    resp = conn.getresponse()
    body = resp.read()
    seconds = time.perf_counter() - start
    if resp.status != 200:
        raise http.client.HTTPException(f"{target.path}: HTTP {resp.status}")
    if resp.getheader("Content-Encoding") == "gzip":
        body = gzip.decompress(body)
    return seconds, sum(1 for line in body.splitlines() if line and line[:1] != b"#")


def _scrape(target: Target) -> tuple[float, int]:
    """One scrape on a new connection, timed from connecting (and the TLS handshake)."""
    start = time.perf_counter()
    conn = target.connect()
    try:
        _, series = _get(conn, target, close=True)
        return time.perf_counter() - start, series
    finally:
        conn.close()


def _stats(times: list[float]) -> dict[str, float]:
    return {"p50_seconds": percentile(times, 0.5), "p90_seconds": percentile(times, 0.9),
            "p99_seconds": percentile(times, 0.99)}


def wait_scrapable(servers: list[ServerProcess], targets: dict[str, Target]) -> None:
    """Each server answers a scrape (within 30 s of the call, or it has exited)."""
    for server in servers:
        deadline = time.monotonic() + 30
        while True:
            server.check_running()
            try:
                _scrape(targets[server.key])
                break
            except ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)


def measure(servers: list[ServerProcess], targets: dict[str, Target], scrapes: int
             ) -> tuple[dict[str, list[float]], dict[str, list[float]], dict[str, int], dict[str, float]]:
    """Kept-alive scrapes of each server in turn, then as many on a new connection each; and each
    server's CPU (user + system, all its threads) per kept-alive scrape: what a scrape costs the node,
    where the time is what Prometheus waits."""
    wait_scrapable(servers, targets)
    for _ in range(20):  # warm up: the first scrapes check every process for GPU use
        for server in servers:
            _scrape(targets[server.key])
    conns = {s.key: targets[s.key].connect() for s in servers}
    times: dict[str, list[float]] = {s.key: [] for s in servers}
    fresh: dict[str, list[float]] = {s.key: [] for s in servers}
    series: dict[str, int] = {}
    cpu = {s.key: s.cpu_seconds() for s in servers}
    for _ in range(scrapes):
        for server in servers:  # in turn, so a busy moment of the machine costs each alike
            seconds, series[server.key] = _get(conns[server.key], targets[server.key], close=False)
            times[server.key].append(seconds)
    cpu = {s.key: (s.cpu_seconds() - cpu[s.key]) / scrapes for s in servers}
    for _ in range(scrapes):
        for server in servers:
            fresh[server.key].append(_scrape(targets[server.key])[0])
    for conn in conns.values():
        conn.close()
    return times, fresh, series, cpu


def _tls_and_basic_auth(directory: Path) -> tuple[Path, Target]:
    """A web config with TLS and one bcrypt user (cost 10, htpasswd -B's default), and how to reach it."""
    tlscerts.make(directory)
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(10)).decode()
    config = directory / "web.yml"
    config.write_text(f"tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"
                      f"  min_version: TLS12\nbasic_auth_users:\n  {USER}: '{hashed}'\n")
    context = ssl.create_default_context(cafile=str(directory / "ca.crt"))
    auth = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    return config, Target("https://127.0.0.1/metrics", context, auth)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scrapes", type=int, default=500)
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--baseline", type=Path, metavar="DIR",
                   help="another checkout whose exporter serves the same node, scraped in the same turns")
    args = p.parse_args(argv)
    if args.baseline and not (args.baseline / "exporter" / "__main__.py").is_file():
        p.error(f"--baseline {args.baseline}: no exporter/__main__.py there")
    baseline_git = git_commit(args.baseline) if args.baseline else None
    with tempfile.TemporaryDirectory() as tmp:
        tmpdir = Path(tmp)
        flags = write_reference_node(tmpdir / "node")
        (tmpdir / "textfile").mkdir()
        _dcgm_sized(tmpdir / "textfile")
        ports = [free_port() for _ in range(4)]
        (tmpdir / "tls").mkdir()
        web_config, tls_target = _tls_and_basic_auth(tmpdir / "tls")
        servers = [
            ServerProcess(key="ours", label="gpunode-exporter (reference node)", port=ports[0], log=tmpdir / "ours.log",
                          argv=[sys.executable, "-m", "gpunode_exporter", *flags,
                                "--web.listen-address", f"127.0.0.1:{ports[0]}"]),
            ServerProcess(key="ours_tls", label="gpunode-exporter, TLS and basic auth", port=ports[3],
                          log=tmpdir / "ours_tls.log",
                          argv=[sys.executable, "-m", "gpunode_exporter", *flags, "--web.config.file", str(web_config),
                                "--web.listen-address", f"127.0.0.1:{ports[3]}"]),
            ServerProcess(key="node", label="node_exporter (defaults, this machine)", port=ports[1],
                          log=tmpdir / "node.log",
                          argv=["prometheus-node-exporter", f"--web.listen-address=127.0.0.1:{ports[1]}"]),
            ServerProcess(key="dcgm_sized", label="dcgm-exporter-sized text (node_exporter textfile)",
                          port=ports[2], log=tmpdir / "dcgm.log",
                          argv=["prometheus-node-exporter", "--collector.disable-defaults", "--collector.textfile",
                                f"--collector.textfile.directory={tmpdir / 'textfile'}",
                                f"--web.listen-address=127.0.0.1:{ports[2]}"]),
        ]
        if args.baseline:
            port = free_port()
            servers.insert(1, ServerProcess(
                key="baseline", label=f"the same at {baseline_git['head'][:7] or args.baseline}",
                port=port, log=tmpdir / "baseline.log", cwd=args.baseline.resolve(),
                argv=[sys.executable, "-m", "gpunode_exporter", *flags, "--web.listen-address", f"127.0.0.1:{port}"]))
        targets = {s.key: Target(s.url) for s in servers}
        tls_target.port = ports[3]
        targets["ours_tls"] = tls_target
        with hold_kmsg_open(tmpdir / "node"):
            for server in servers:
                server.start()
            try:
                times, fresh, series, cpu = measure(servers, targets, args.scrapes)
                memory = {s.key: s.memory_kib() for s in servers}
            finally:
                for server in servers:
                    server.stop()
    result = {
        "scrapes": args.scrapes, "target_p50_seconds": TARGET_P50_SECONDS, "target_peak_mib": TARGET_PEAK_MIB,
        "git": git_commit(ROOT), "baseline_git": baseline_git,
        "servers": {s.key: {"label": s.label, "series": series[s.key], **_stats(times[s.key]),
                            "cpu_seconds_per_scrape": cpu[s.key],
                            "new_connection": _stats(fresh[s.key]), "peak_rss_mib": memory[s.key]["VmHWM"] / 1024,
                            "rss_mib": memory[s.key]["VmRSS"] / 1024} for s in servers},
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    for how in ("kept-alive connection", "new connection each"):
        print(f"{how}:")
        for r in result["servers"].values():
            t = r if how.startswith("kept") else r["new_connection"]
            print(f"  {r['label']:<52} {r['series']:>6} series  p50 {t['p50_seconds'] * 1000:6.2f} ms  "
                  f"p90 {t['p90_seconds'] * 1000:6.2f} ms  p99 {t['p99_seconds'] * 1000:6.2f} ms")
    print("CPU per kept-alive scrape (user + system):")
    for r in result["servers"].values():
        print(f"  {r['label']:<52} {r['cpu_seconds_per_scrape'] * 1000:6.2f} ms")
    for r in result["servers"].values():
        print(f"  {r['label']:<52} peak RSS (VmHWM) {r['peak_rss_mib']:5.1f} MiB  at the end {r['rss_mib']:5.1f} MiB")
    node = result["servers"]["node"]
    for key in ("ours", "baseline"):
        if key in result["servers"]:
            r = result["servers"][key]
            print(f"{r['label']} / node_exporter: time (p50, kept alive) "
                  f"{r['p50_seconds'] / node['p50_seconds']:.2f}x, CPU per scrape "
                  f"{r['cpu_seconds_per_scrape'] / node['cpu_seconds_per_scrape']:.2f}x")
    ours = result["servers"]["ours"]["p50_seconds"]
    print(f"target: ours p50 < {TARGET_P50_SECONDS * 1000:.0f} ms: {'PASS' if ours < TARGET_P50_SECONDS else 'FAIL'}")
    for key in ("ours", "ours_tls"):
        peak = result["servers"][key]["peak_rss_mib"]
        print(f"target: {key} peak RSS <= {TARGET_PEAK_MIB} MiB: {'PASS' if peak <= TARGET_PEAK_MIB else 'FAIL'} "
              f"({peak:.1f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
