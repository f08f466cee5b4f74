"""The demo's processes: per node the exporter and node_exporter in the node's namespace; on
the host Prometheus (the rule pack rendered from demo/spec.yaml), Alertmanager (the example
config, receivers pointed at the webhook, its remediation route at the service), the webhook
receiver, and a real Slurm cluster (the demo's nodes and spares) that gpunode-remediate drains."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import requests
import yaml

from demo.netns import Forwarder, Namespace, node_namespace
from demo.node import SimulatedNode
from demo.scenario import Scenario
from demo.slurm import SlurmCluster
from demo.webhook import Received, Receiver
from gpunode_common.http import free_port
from gpunode_rulepack import load_spec, render

REPO = Path(__file__).parent.parent
DEMO_SPEC = Path(__file__).parent / "spec.yaml"
ALERTMANAGER_EXAMPLE = REPO / "alertmanager" / "alertmanager.yml"
SCRAPE_INTERVAL = "5s"  # demo/spec.yaml's intervals.default
TOOLS = {"prometheus": "prometheus", "prometheus-alertmanager": "prometheus-alertmanager",
         "prometheus-node-exporter": "prometheus-node-exporter", "ip": "iproute2", "slurmctld": "slurmctld",
         "slurmd": "slurmd", "scontrol": "slurm-client", "munged": "munge"}
SLURM_NODES = 8  # the demo's nodes and spares: one drain is the service's whole budget (5 %, at least 1)
EXPORTER_PORT, NODE_EXPORTER_PORT = 19835, 9100  # on 127.0.0.1 inside each node's namespace


@dataclass(frozen=True)
class Ports:
    """Where the demo's servers listen on the host's 127.0.0.1: free ports, so that demos (and a demo
    and the tests) run side by side."""

    prometheus: int = field(default_factory=free_port)
    alertmanager: int = field(default_factory=free_port)
    webhook: int = field(default_factory=free_port)


def missing_tools() -> list[str]:
    """Debian packages whose programs are not installed."""
    return sorted({package for tool, package in TOOLS.items() if shutil.which(tool) is None})


class Stack:
    """Everything running; leave the `with` block to stop it all and remove the namespaces."""

    def __init__(self, scenarios: list[Scenario], workdir: Path, ports: Ports | None = None,
                 on_alert: Callable[[Received], None] = lambda _r: None,
                 say: Callable[[str], None] = lambda _s: None) -> None:
        self.scenarios, self.workdir, self.ports, self.say = scenarios, workdir, ports or Ports(), say
        self.webhook = Receiver(("127.0.0.1", self.ports.webhook), on_alert)
        self.forwarded: dict[tuple[str, int], int] = {}  # (node, port inside) -> port on the host
        self.nodes: list[SimulatedNode] = []
        self.cluster: SlurmCluster | None = None
        self.remediate_port = free_port()
        self._exit = contextlib.ExitStack()
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._stop = threading.Event()
        self.started = 0.0

    @property
    def prometheus_url(self) -> str:
        return f"http://127.0.0.1:{self.ports.prometheus}"

    def exporter_url(self, node: str) -> str:
        """A node's gpunode-exporter, as the host reaches it (through its Forwarder)."""
        return f"http://127.0.0.1:{self.forwarded[(node, EXPORTER_PORT)]}"

    @property
    def alertmanager_url(self) -> str:
        return f"http://127.0.0.1:{self.ports.alertmanager}"

    def __enter__(self) -> Stack:
        try:
            self._start()
        except BaseException:
            self._exit.close()
            raise
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._exit.close()

    def _start(self) -> None:
        if os.geteuid() != 0:
            raise SystemExit("demo: needs root (it creates network namespaces and mounts a tmpfs): sudo make demo")
        if missing := missing_tools():
            raise SystemExit(f"demo: not installed: {', '.join(missing)} "
                             "(scripts/install-deps.sh --demo installs them)")
        self._exit.enter_context(self.webhook)
        namespaces: list[Namespace] = []
        for index, scenario in enumerate(self.scenarios, start=1):
            ns = self._exit.enter_context(node_namespace(index))
            name = f"node-{scenario.name}"
            taken = sum(n.scenario.name == scenario.name for n in self.nodes)
            name += f"-{taken + 1}" if taken else ""
            node = SimulatedNode(name, scenario, self.workdir / name)
            node.root.mkdir(parents=True)
            node.prepare()
            self._exit.callback(node.close)
            self.nodes.append(node)
            namespaces.append(ns)
            for port in (EXPORTER_PORT, NODE_EXPORTER_PORT):
                self.forwarded[(name, port)] = self._exit.enter_context(Forwarder(ns.name, port)).port
        names = [node.name for node in self.nodes]
        spares = [f"node-spare-{n}" for n in range(1, SLURM_NODES - len(names) + 1)]
        self.cluster = self._exit.enter_context(SlurmCluster(self.workdir / "slurm", [*names, *spares]))
        self._write_configs()
        self._spawn("gpunode-remediate", [sys.executable, "-m", "gpunode_remediate", "serve", "--config.file",
                                          str(self.workdir / "remediate.yml"), "--web.listen-address",
                                          f"127.0.0.1:{self.remediate_port}"], env=self.cluster.env)
        self.started = time.monotonic()
        for node, ns in zip(self.nodes, namespaces, strict=True):
            self._spawn(f"{node.name}-exporter", self._exporter_command(node, ns))
            self._spawn(f"{node.name}-node_exporter", [
                "ip", "netns", "exec", ns.name, shutil.which("prometheus-node-exporter") or "",
                f"--web.listen-address=127.0.0.1:{NODE_EXPORTER_PORT}",
                "--no-collector.systemd"])  # the node's own; and a container may have no systemd
        ticker = threading.Thread(target=self._tick, daemon=True)
        ticker.start()
        self._exit.callback(self._stop_ticker, ticker)  # before the files it writes go
        self._spawn("alertmanager", [
            "prometheus-alertmanager", f"--config.file={self.workdir / 'alertmanager.yml'}",
            f"--storage.path={self.workdir / 'alertmanager'}",
            f"--web.listen-address=127.0.0.1:{self.ports.alertmanager}", "--cluster.listen-address="])
        self._spawn("prometheus", [
            "prometheus", f"--config.file={self.workdir / 'prometheus.yml'}",
            f"--storage.tsdb.path={self.workdir / 'prometheus'}",
            f"--web.listen-address=127.0.0.1:{self.ports.prometheus}"])
        for name, url in (("alertmanager", f"{self.alertmanager_url}/-/ready"),
                          ("prometheus", f"{self.prometheus_url}/-/ready"),
                          ("gpunode-remediate", f"http://127.0.0.1:{self.remediate_port}/-/ready"),
                          *((f"{n.name}-exporter", f"{self.exporter_url(n.name)}/metrics") for n in self.nodes)):
            self._wait_ready(name, url)

    def _exporter_command(self, node: SimulatedNode, ns: Namespace) -> list[str]:
        config = node.root / "exporter.yml"
        # The node's sysfs is the DGX H100 fixture's: four NVSwitches on its baseboard.
        config.write_text(yaml.safe_dump({"gpu": {"expected_count": len(node.scenario.nvml["gpus"]),
                                                  "nvswitches_expected": 4},
                                          "staging": {"paths": [str(node.staging)]}}))
        return ["ip", "netns", "exec", ns.name, sys.executable, "-m", "gpunode_exporter",
                "--path.procfs", str(node.procfs), "--path.sysfs", str(node.sysfs), "--path.kmsg", str(node.kmsg),
                "--path.state", str(node.root / "state"), "--config.file", str(config),
                "--nvml.simulate", str(node.scenario.nvml_file(node.root)),
                "--web.listen-address", f"127.0.0.1:{EXPORTER_PORT}"]

    def _write_configs(self) -> None:
        rules = self.workdir / "rules"
        rules.mkdir()
        for name, text in render(load_spec(DEMO_SPEC), "prometheus").items():
            (rules / name).write_text(text)

        def targets(port: int) -> list[dict[str, Any]]:
            # The rule pack joins the exporters of one node on `instance` (spec labels.node): give
            # both the node's name. On a real cluster, relabel host:port to host (docs/install.md).
            return [{"targets": [f"127.0.0.1:{self.forwarded[(node.name, port)]}"], "labels": {"instance": node.name}}
                    for node in self.nodes]

        prometheus = {
            "global": {"scrape_interval": SCRAPE_INTERVAL, "evaluation_interval": SCRAPE_INTERVAL},
            "rule_files": [str(rules / "*.yml")],
            "alerting": {"alertmanagers": [
                {"static_configs": [{"targets": [f"127.0.0.1:{self.ports.alertmanager}"]}]}]},
            "scrape_configs": [{"job_name": "gpunode", "static_configs": targets(EXPORTER_PORT)},
                               {"job_name": "node", "static_configs": targets(NODE_EXPORTER_PORT)},
                               {"job_name": "gpunode-remediate",
                                "static_configs": [{"targets": [f"127.0.0.1:{self.remediate_port}"]}]}],
        }
        (self.workdir / "prometheus.yml").write_text(yaml.safe_dump(prometheus, sort_keys=False))
        # The example's routes and inhibitions as shipped; only the receivers' URLs change: people's
        # receivers print, the remediation route reaches the service.
        am = yaml.safe_load(ALERTMANAGER_EXAMPLE.read_text())
        for receiver in am["receivers"]:
            for hook in receiver.get("webhook_configs", []):
                service = receiver["name"] == "gpunode-remediate"
                hook["url"] = (f"http://127.0.0.1:{self.remediate_port}/alerts" if service
                               else f"http://127.0.0.1:{self.ports.webhook}/{receiver['name']}")
        (self.workdir / "alertmanager.yml").write_text(yaml.safe_dump(am, sort_keys=False))
        # Enforcing, on the demo's own cluster; a GPU "reset" is a line in resets.log. No health check: the demo
        # ends once the node is out of service, and its exporter is in a namespace the node name does not name.
        resets = self.workdir / "resets.log"
        remediate = {"mode": "enforce", "state_path": str(self.workdir / "remediate.db"), "interval": "2s",
                     "scheduler": {"kind": "slurm", "scontrol": self.cluster.scontrol_path},
                     "reset_command": ["sh", "-c", f'echo "GPU reset: $0 GPU $1" >> {resets}', "{node}", "{gpu}"],
                     "health_check": {"enabled": False}}
        (self.workdir / "remediate.yml").write_text(yaml.safe_dump(remediate, sort_keys=False))

    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        logs = self.workdir / "logs"
        logs.mkdir(exist_ok=True)
        log: IO[bytes] = self._exit.enter_context((logs / f"{name}.log").open("wb"))
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True,
                                env=env)
        self._procs[name] = proc
        self._exit.callback(_stop_process, proc)

    def _wait_ready(self, name: str, url: str, seconds: float = 60) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self._procs[name].poll() is not None:
                raise RuntimeError(f"{name} exited ({self._procs[name].returncode}); {self.log_tail(name)}")
            with contextlib.suppress(requests.RequestException):
                if requests.get(url, timeout=2).ok:
                    return
            time.sleep(0.2)
        raise RuntimeError(f"{name} not ready after {seconds:.0f} s; {self.log_tail(name)}")

    def log_tail(self, name: str, lines: int = 10) -> str:
        """The end of a process's log, to print: the demo's directory may be gone when it is read."""
        log = self.workdir / "logs" / f"{name}.log"
        tail = log.read_text(errors="replace").splitlines()[-lines:] if log.exists() else []
        return f"the end of {log}:\n    " + "\n    ".join(tail) if tail else f"{log} is empty"

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def _tick(self) -> None:
        """Advance every node's files once a second; say what happens as it happens."""
        last = 0.0
        while not self._stop.wait(1.0 - (self.elapsed() % 1.0)):
            t = self.elapsed()
            for node in self.nodes:
                for event in node.events(last, t):
                    self.say(f"{t:5.0f} s  {node.name}: {event}")
                node.tick(t, t - last)
            last = t

    def _stop_ticker(self, ticker: threading.Thread) -> None:
        self._stop.set()
        ticker.join()

    def failed(self) -> list[str]:
        """Processes that exited."""
        return [name for name, proc in self._procs.items() if proc.poll() is not None]

    def drained(self) -> dict[str, str]:
        """Nodes gpunode-remediate took out of service in the demo's slurmctld: node -> reason."""
        if self.cluster is None:
            return {}
        return {n["NodeName"]: n["Reason"] for n in self.cluster.all_nodes()
                if n.get("Reason", "").startswith("gpunode:")}

    def resets(self) -> list[str]:
        """The GPU resets gpunode-remediate ran (the demo's reset command writes a line each)."""
        log = self.workdir / "resets.log"
        return log.read_text().splitlines() if log.exists() else []

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query against the demo's Prometheus."""
        reply = requests.get(f"{self.prometheus_url}/api/v1/query", params={"query": expr}, timeout=10)
        reply.raise_for_status()
        return reply.json()["data"]["result"]


def _stop_process(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 15)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()

