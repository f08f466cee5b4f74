"""The two tiers on real Prometheus servers, scaled down: the same faults raise the same alerts.

Six nodes, each with a node_exporter-like and a gpunode-exporter-like endpoint on its own
loopback address; one node's interrupts and running processes fall away from its peers' (a
precursor, compared across nodes: the fleet tier), another has a row remap pending (per node:
the local tier). Four Prometheus servers:

- single: scrapes every node, runs the whole pack (`rules render`);
- shard0, shard1: each keeps half of the nodes (hashmod of the node label, so a node's two
  endpoints land together) and runs `rules render --tier local`;
- global: federates the shards' recordings and the fleet tier's named inputs and runs
  `rules render --tier fleet`.

The spec is shortened (2 s evaluations, 8 s rate windows, seconds-long `for`) so that the
alerts fire within a minute. The alerts firing on single must be those firing on the shards
and global together (docs/scaling.md shows the same configuration at full size).
"""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import requests
import yaml

from gpunode_exporter.cli import main
from tests.helpers import free_port, serve_text, wait_for_port

NODES = [f"127.0.0.{11 + i}" for i in range(6)]
PRECURSOR, REMAP = NODES[2], NODES[5]
SPEC = {"intervals": {"default": 2, "rates": 2, "hardware": 2}, "precursor": {"continuity": 6, "rate_window": 8},
        "peers": {"workload_fresh": 10, "kubernetes_owner": False}, "remap": {"pending_for": 4}}
FEDERATE = ['{__name__=~"gpunode:.+"}', '{__name__="gpunode_node_workload_info"}', '{__name__="node_out_of_service"}']
EXPECTED = {("GpuNodePrecursorMultiSignal", PRECURSOR), ("GpuRowRemapPending", REMAP)}
T0 = time.time()


def _node_text(i: int, host: str) -> str:
    elapsed = time.time() - T0
    interrupts, procs = (2_000, 0) if host == PRECURSOR else (10_000 + 50 * i, 60 + i)
    return (f"node_intr_total {interrupts * elapsed:.0f}\nnode_procs_running {procs}\n"
            f"node_vmstat_pgpgout {500 * elapsed:.0f}\nnode_out_of_service 0\n")


def _gpunode_text(_i: int, host: str) -> str:
    return ('gpunode_node_workload_info{source="slurm",workload="4242"} 1\n'
            f'gpunode_gpu_row_remap_pending{{gpu="0",uuid="GPU-0"}} {1 if host == REMAP else 0}\n')


def _serve(host: str, port: int, text) -> ThreadingHTTPServer:  # type: ignore[no-untyped-def]
    i = NODES.index(host)
    return serve_text(lambda _path: text(i, host), host, port)


def _jobs(ports: dict[str, int], shard: int | None) -> list[dict]:
    keep = [] if shard is None else [
        {"source_labels": ["instance"], "modulus": 2, "target_label": "__tmp_shard", "action": "hashmod"},
        {"source_labels": ["__tmp_shard"], "regex": str(shard), "action": "keep"}]
    return [{"job_name": job, "static_configs": [{"targets": [f"{host}:{port}" for host in NODES]}],
             "relabel_configs": [{"source_labels": ["__address__"], "regex": r"([^:]+)(?::\d+)?",
                                  "target_label": "instance", "replacement": "$1"}, *keep]}
            for job, port in ports.items()]


def _firing(url: str) -> set[tuple[str, str]]:
    """(alertname, instance) of the alerts firing, from Prometheus' or vmalert's /api/v1/alerts
    (vmalert: null when none, the name beside the labels)."""
    alerts = requests.get(f"{url}/api/v1/alerts", timeout=5).json()["data"]["alerts"] or []
    return {(a["labels"].get("alertname", a.get("name")), a["labels"].get("instance", ""))
            for a in alerts if a["state"] == "firing"}


class _Prometheus:
    def __init__(self, name: str, workdir: Path, rules: Path, scrape_configs: list[dict]) -> None:
        self.port = free_port()
        config = {"global": {"scrape_interval": "2s", "evaluation_interval": "2s"},
                  "rule_files": [str(rules / "*.yml")], "scrape_configs": scrape_configs}
        (workdir / f"{name}.yml").write_text(yaml.safe_dump(config))
        self.log = (workdir / f"{name}.log").open("wb")
        self.proc = subprocess.Popen(
            [shutil.which("prometheus") or "prometheus", f"--config.file={workdir / f'{name}.yml'}",
             f"--storage.tsdb.path={workdir / name}", f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=self.log, stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{self.port}"

    def firing(self) -> set[tuple[str, str]]:
        return _firing(self.url)

    def instances(self) -> set[str]:
        result = requests.get(f"{self.url}/api/v1/query", params={"query": "up"}, timeout=5).json()["data"]["result"]
        return {r["metric"]["instance"] for r in result}

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self.log.close()


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, _Prometheus]]:
    if shutil.which("prometheus") is None:
        pytest.fail("prometheus not installed: scripts/install-deps.sh --test")
    workdir = tmp_path_factory.mktemp("sharded")
    (workdir / "spec.yml").write_text(yaml.safe_dump(SPEC))
    for tier in ("all", "local", "fleet"):
        assert main(["rules", "render", "--spec", str(workdir / "spec.yml"), "--tier", tier,
                     "--out", str(workdir / tier)]) == 0
    ports = {"node": free_port(), "gpunode": free_port()}
    endpoints = [_serve(host, ports[job], text) for host in NODES
                 for job, text in (("node", _node_text), ("gpunode", _gpunode_text))]
    running: dict[str, _Prometheus] = {}
    try:
        running["single"] = _Prometheus("single", workdir, workdir / "all", _jobs(ports, None))
        for shard in (0, 1):
            running[f"shard{shard}"] = _Prometheus(f"shard{shard}", workdir, workdir / "local", _jobs(ports, shard))
        federate = [{"job_name": "federate", "honor_labels": True, "metrics_path": "/federate",
                     "params": {"match[]": FEDERATE},
                     "static_configs": [{"targets": [f"127.0.0.1:{running[s].port}" for s in ("shard0", "shard1")]}]}]
        running["global"] = _Prometheus("global", workdir, workdir / "fleet", federate)
        for server in running.values():
            wait_for_port(server.port, alive=lambda s=server: s.proc.poll() is None)
            deadline = time.monotonic() + 30
            while requests.get(f"{server.url}/-/ready", timeout=5).status_code != 200:  # the TSDB opens
                assert time.monotonic() < deadline, "Prometheus not ready within 30 s"
                time.sleep(0.2)
        yield running
    finally:
        for server in running.values():
            server.stop()
        for endpoint in endpoints:
            endpoint.shutdown()


def test_each_shard_scrapes_some_nodes_and_together_all(servers: dict[str, _Prometheus]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        shards = [servers[s].instances() for s in ("shard0", "shard1")]
        if shards[0] | shards[1] == set(NODES):
            break
        time.sleep(1)
    assert shards[0] and shards[1] and not shards[0] & shards[1] and shards[0] | shards[1] == set(NODES)


def test_the_sharded_servers_raise_the_alerts_one_server_raises(servers: dict[str, _Prometheus]) -> None:
    deadline = time.monotonic() + 150
    single: set[tuple[str, str]] = set()
    sharded: set[tuple[str, str]] = set()
    while time.monotonic() < deadline:
        single = servers["single"].firing()
        sharded = servers["shard0"].firing() | servers["shard1"].firing() | servers["global"].firing()
        if single >= EXPECTED and sharded == single:
            break
        time.sleep(2)
    assert single >= EXPECTED, f"one server: {sorted(single)}"
    assert sharded == single, f"one server {sorted(single)}, sharded {sorted(sharded)}"
    # The comparison of nodes ran on the global server; the per-node alert on a shard.
    assert ("GpuNodePrecursorMultiSignal", PRECURSOR) in servers["global"].firing()
    assert ("GpuRowRemapPending", REMAP) in servers["shard0"].firing() | servers["shard1"].firing()


class _Process:
    """A VictoriaMetrics component on a free loopback port."""

    def __init__(self, name: str, workdir: Path, argv: list[str]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = (workdir / f"{name}.log").open("wb")
        self.proc = subprocess.Popen([*argv, f"-httpListenAddr=127.0.0.1:{self.port}"], stdout=self.log,
                                     stderr=subprocess.STDOUT)

    def firing(self) -> set[tuple[str, str]]:
        return _firing(self.url)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self.log.close()


class _Sink(BaseHTTPRequestHandler):
    """Where vmalert sends its notifications (this test reads its API instead)."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *_args: object) -> None:
        pass


@pytest.fixture(scope="module")
def victoria(servers: dict[str, _Prometheus],
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, _Process]]:
    """vmagent's own scrape sharding (two members) into one VictoriaMetrics; one vmalert per tier."""
    for tool in ("victoria-metrics", "vmagent", "vmalert"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} not installed: scripts/install-deps.sh --test")
    workdir = tmp_path_factory.mktemp("victoria")
    (workdir / "spec.yml").write_text(yaml.safe_dump(SPEC))
    for tier in ("local", "fleet"):
        assert main(["rules", "render", "--spec", str(workdir / "spec.yml"), "--target", "vmalert", "--tier", tier,
                     "--out", str(workdir / tier)]) == 0
    # The same targets as the Prometheus servers scrape (their endpoints live as long as `servers`).
    single = yaml.safe_load((Path(servers["single"].log.name).parent / "single.yml").read_text())
    (workdir / "scrape.yml").write_text(yaml.safe_dump({"global": {"scrape_interval": "2s"},
                                                         "scrape_configs": single["scrape_configs"]}))
    sink = ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    running: dict[str, _Process] = {}
    try:
        vm = running["vm"] = _Process("vm", workdir, ["victoria-metrics", f"-storageDataPath={workdir / 'vm'}",
                                                      "-search.latencyOffset=1s", "-search.cacheTimestampOffset=1s"])
        wait_for_port(vm.port, alive=lambda: vm.proc.poll() is None)
        for member in (0, 1):
            running[f"vmagent{member}"] = _Process(f"vmagent{member}", workdir, [
                "vmagent", f"-promscrape.config={workdir / 'scrape.yml'}", f"-remoteWrite.url={vm.url}/api/v1/write",
                "-promscrape.cluster.membersCount=2", f"-promscrape.cluster.memberNum={member}",
                f"-remoteWrite.tmpDataPath={workdir / f'vmagent{member}'}", "-remoteWrite.flushInterval=1s"])
        for tier in ("local", "fleet"):
            running[tier] = _Process(tier, workdir, [
                "vmalert", f"-rule={workdir / tier}/*.yml", f"-datasource.url={vm.url}", f"-remoteWrite.url={vm.url}",
                f"-notifier.url=http://127.0.0.1:{sink.server_address[1]}", "-evaluationInterval=2s",
                "-remoteWrite.flushInterval=1s"])
        for process in running.values():
            wait_for_port(process.port, alive=lambda p=process: p.proc.poll() is None)
        yield running
    finally:
        for process in running.values():
            process.stop()
        sink.shutdown()


def test_vmagent_shards_and_vmalert_tiers_raise_the_alerts_one_server_raises(
        servers: dict[str, _Prometheus], victoria: dict[str, _Process]) -> None:
    deadline = time.monotonic() + 150
    tiers: set[tuple[str, str]] = set()
    single = servers["single"].firing()
    while time.monotonic() < deadline:
        single = servers["single"].firing()
        tiers = victoria["local"].firing() | victoria["fleet"].firing()
        if single >= EXPECTED and tiers == single:
            break
        time.sleep(2)
    assert tiers == single, f"one Prometheus {sorted(single)}, vmalert tiers {sorted(tiers)}"
    # Each vmagent scraped a share of the targets, and together all of them.
    shares = [{t["scrapeUrl"] for t in requests.get(f"{victoria[f'vmagent{m}'].url}/api/v1/targets", timeout=5)
               .json()["data"]["activeTargets"]} for m in (0, 1)]
    assert shares[0] and shares[1] and not shares[0] & shares[1] and len(shares[0] | shares[1]) == 2 * len(NODES)
    assert ("GpuNodePrecursorMultiSignal", PRECURSOR) in victoria["fleet"].firing()
