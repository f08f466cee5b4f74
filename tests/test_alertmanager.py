"""The example Alertmanager config: amtool accepts it; it sends gpunode-remediate the alerts of its
policy's rules and no others, people every alert by severity; a real Alertmanager (Debian's)
inhibits what it should, and delivers to a real `gpunode-remediate serve` (firing, resolved, with
the bearer token of the commented example)."""

from __future__ import annotations

import json
import re
import shutil
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import requests
import yaml

from gpunode_remediate.cli import DEFAULT_LISTEN
from gpunode_remediate.policy import DEFAULT_RULES
from gpunode_remediate.server import WEBHOOK_PATH
from tests.helpers import free_port, wait_for_port

ROOT = Path(__file__).parent.parent
CONFIG = ROOT / "alertmanager" / "alertmanager.yml"
RULES = ROOT / "rules" / "prometheus"
SERVICE = "gpunode-remediate"
SERVICE_ALERTS = sorted({rule.alertname for rule in DEFAULT_RULES})


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} not installed (scripts/install-deps.sh --test installs it)")
    return path


def test_amtool_check_config() -> None:
    out = subprocess.run([_tool("amtool"), "check-config", str(CONFIG)], capture_output=True, text=True)
    assert out.returncode == 0 and "SUCCESS" in out.stdout, out.stdout + out.stderr


def _routes(labels: dict[str, str], config: Path = CONFIG) -> str:
    out = subprocess.run([_tool("amtool"), "config", "routes", "test", f"--config.file={config}",
                          *(f"{k}={v}" for k, v in labels.items())], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.mark.parametrize(("labels", "receivers"), [
    ({"severity": "critical", "action": "RESTART_BM", "alertname": "GpuXidHardwareFault"}, f"{SERVICE},pager"),
    ({"severity": "critical", "alertname": "GpuRowRemapFailure"}, f"{SERVICE},pager"),
    # The driver's recovery actions 5-7 (Xid 154) all reach the service, which reboots, resets or
    # (RECOVER_IMEX_DOMAIN, which spans nodes) drains; people are paged in every case.
    ({"severity": "critical", "action": "BUS_RESET", "alertname": "GpuRecoveryActionRequired"}, f"{SERVICE},pager"),
    ({"severity": "critical", "action": "SYSTEM_REBOOT", "alertname": "GpuRecoveryActionRequired"},
     f"{SERVICE},pager"),
    ({"severity": "critical", "action": "RECOVER_IMEX_DOMAIN", "alertname": "GpuRecoveryActionRequired"},
     f"{SERVICE},pager"),
    ({"severity": "warning", "action": "RESTART_APP", "alertname": "GpuXidApplicationFault"}, f"{SERVICE},chat"),
    ({"severity": "warning", "alertname": "GpuNodeClockThrottled"}, f"{SERVICE},chat"),
    # Not the service's: storage, checkpoints, the exporter itself, an unnamed alert.
    ({"severity": "warning", "alertname": "NfsSlotWaitDominates"}, "chat"),
    ({"severity": "info", "alertname": "CheckpointIntervalTooLong"}, "tickets"),
    ({"severity": "critical", "alertname": "GpuNodeExporterDown"}, "pager"),
    # An `action` label alone does not route to the service (the old action-based route did).
    ({"severity": "warning", "action": "RESTART_BM", "alertname": "GpuNodeGpuVisibilityMismatch"}, "chat"),
    # The precursors the service acts on before the loss.
    ({"severity": "warning", "alertname": "GpuXidRepeatedHardwareFaults"}, f"{SERVICE},chat"),
    ({"severity": "warning", "alertname": "GpuRowRemapCorrectableAcceleration"}, f"{SERVICE},chat"),
    # Beyond the GPU: the host's faults, and storage for job recovery (NfsServerNotResponding names no node).
    ({"severity": "critical", "alertname": "GpuNodeDiskErrors", "instance": "gpu001:19835"}, f"{SERVICE},pager"),
    ({"severity": "info", "alertname": "GpuNodeOomKills", "instance": "gpu001:19835"}, f"{SERVICE},tickets"),
    ({"severity": "critical", "alertname": "NfsServerNotResponding", "server": "nfs01"}, f"{SERVICE},pager"),
    # Alertmanager anchors the regex: a name that merely contains one of the service's is not one.
    ({"severity": "critical", "alertname": "GpuDownstream"}, "pager"),
    ({"alertname": "Unlabelled"}, "tickets"),
])
def test_routes(labels: dict[str, str], receivers: str) -> None:
    assert _routes(labels) == receivers


def _shipped_alerts() -> dict[str, dict[str, str]]:
    """alertname -> its static labels, from the rendered rule pack."""
    found = {}
    for path in sorted(RULES.glob("*.rules.yml")):
        for group in yaml.safe_load(path.read_text())["groups"]:
            found |= {r["alert"]: r.get("labels", {}) for r in group["rules"] if "alert" in r}
    return found


def test_the_service_gets_its_policys_alerts_and_no_others() -> None:
    """Every alert of the shipped rule pack: the service's route takes exactly the alert names of
    DEFAULT_RULES (each one in the pack), and people's severity routes still take every alert."""
    shipped = _shipped_alerts()
    assert set(SERVICE_ALERTS) <= set(shipped), "DEFAULT_RULES names alerts the rule pack does not have"
    people = {"critical": "pager", "warning": "chat", "info": "tickets"}
    for name, labels in sorted(shipped.items()):
        want = ([SERVICE] if name in SERVICE_ALERTS else []) + [people[labels["severity"]]]
        assert _routes({"alertname": name, **labels}).split(",") == want, name


def _service_route_and_receiver(config: dict) -> tuple[dict, dict]:
    (route,) = [r for r in config["route"]["routes"] if r["receiver"] == SERVICE]
    (receiver,) = [r for r in config["receivers"] if r["name"] == SERVICE]
    return route, receiver


def test_the_service_route_and_receiver() -> None:
    config = yaml.safe_load(CONFIG.read_text())
    route, receiver = _service_route_and_receiver(config)
    assert config["route"]["routes"][0] is route, "the service's route must come first: later ones may not continue"
    (matcher,) = route["matchers"]
    names = re.fullmatch(r'alertname=~"([A-Za-z|]+)"', matcher)
    assert names and sorted(names.group(1).split("|")) == SERVICE_ALERTS, "the regex is not DEFAULT_RULES' names"
    assert route["continue"] is True and route["group_by"] == ["..."]  # a group per alert
    (hook,) = receiver["webhook_configs"]
    url = urlsplit(hook["url"])
    assert (url.path, f":{url.port}") == (WEBHOOK_PATH, DEFAULT_LISTEN), "not where `gpunode-remediate serve` listens"
    assert hook["send_resolved"] is True and hook["max_alerts"] == 0


def _with_token(text: str, token_file: Path) -> str:
    """The config with the commented bearer-token example switched on, reading token_file."""
    example = re.search(r"^( +)# http_config:\n\1#   authorization:\n\1#     credentials_file: \S+\n", text, re.M)
    assert example, "the commented http_config.authorization.credentials_file example is gone"
    indent = example.group(1)
    return text.replace(example.group(0), f"{indent}http_config:\n{indent}  authorization:\n"
                                          f"{indent}    credentials_file: {token_file}\n")


def test_the_commented_bearer_token_example_is_valid(tmp_path: Path) -> None:
    config = tmp_path / "alertmanager.yml"
    config.write_text(_with_token(CONFIG.read_text(), tmp_path / "token"))
    out = subprocess.run([_tool("amtool"), "check-config", str(config)], capture_output=True, text=True)
    assert out.returncode == 0 and "SUCCESS" in out.stdout, out.stdout + out.stderr
    _, receiver = _service_route_and_receiver(yaml.safe_load(config.read_text()))
    http_config = receiver["webhook_configs"][0]["http_config"]
    assert http_config == {"authorization": {"credentials_file": str(tmp_path / "token")}}


@pytest.fixture(scope="module")
def alertmanager(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    binary = _tool("prometheus-alertmanager")
    port = free_port()
    proc = subprocess.Popen([binary, f"--config.file={CONFIG}", f"--web.listen-address=127.0.0.1:{port}",
                             f"--storage.path={tmp_path_factory.mktemp('am')}", "--cluster.listen-address="],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port, alive=lambda: proc.poll() is None)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _post(url: str, *alerts: dict[str, str]) -> None:
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    body = [{"labels": labels, "startsAt": now} for labels in alerts]
    requests.post(f"{url}/api/v2/alerts", json=body, timeout=5).raise_for_status()


def _inhibited(url: str, node: str, seconds: float = 10) -> dict[str, bool]:
    """alertname(/gpu or /op) -> inhibited, for the node's alerts, once Alertmanager has processed them."""
    deadline = time.monotonic() + seconds
    while True:
        alerts = requests.get(f"{url}/api/v2/alerts", params={"filter": f'instance="{node}"'}, timeout=5).json()
        got = {"/".join(filter(None, (a["labels"]["alertname"], a["labels"].get("gpu") or a["labels"].get("op")))):
               bool(a["status"]["inhibitedBy"]) for a in alerts}
        if any(got.values()) or time.monotonic() > deadline:
            return got
        time.sleep(0.2)


def test_exporter_down_silences_the_nodes_other_alerts(alertmanager: str) -> None:
    _post(alertmanager,
          {"alertname": "GpuNodeExporterDown", "instance": "gpu071", "severity": "critical"},
          {"alertname": "GpuRowRemapPending", "instance": "gpu071", "gpu": "1", "severity": "warning"},
          {"alertname": "GpuRowRemapPending", "instance": "gpu072", "gpu": "1", "severity": "warning"})
    assert _inhibited(alertmanager, "gpu071") == {"GpuNodeExporterDown": False, "GpuRowRemapPending/1": True}
    assert _inhibited(alertmanager, "gpu072", seconds=1) == {"GpuRowRemapPending/1": False}


def test_lost_gpu_silences_its_other_alerts_only(alertmanager: str) -> None:
    _post(alertmanager,
          {"alertname": "GpuDown", "instance": "gpu116", "gpu": "5", "severity": "critical", "action": "RESTART_BM"},
          {"alertname": "GpuPcieLinkDegraded", "instance": "gpu116", "gpu": "5", "severity": "warning"},
          {"alertname": "GpuRowRemapBanksExhausted", "instance": "gpu116", "gpu": "2", "severity": "warning"})
    assert _inhibited(alertmanager, "gpu116") == {
        "GpuDown/5": False, "GpuPcieLinkDegraded/5": True, "GpuRowRemapBanksExhausted/2": False}


def test_reboot_silences_reset_class_actions_on_the_node(alertmanager: str) -> None:
    _post(alertmanager,
          {"alertname": "GpuXidHardwareFault", "instance": "gpu085", "gpu": "0", "xid": "79",
           "severity": "critical", "action": "RESTART_BM"},
          {"alertname": "GpuRecoveryActionRequired", "instance": "gpu085", "gpu": "3", "severity": "critical",
           "action": "RESET_GPU"})
    assert _inhibited(alertmanager, "gpu085") == {"GpuXidHardwareFault/0": False, "GpuRecoveryActionRequired/3": True}


def test_bandwidth_paradox_silences_slot_wait_on_the_same_mount_and_op(alertmanager: str) -> None:
    common = {"instance": "gpu096", "mountpoint": "/mnt/ckpt", "severity": "info"}
    _post(alertmanager,
          {**common, "alertname": "NfsBandwidthParadox", "op": "WRITE", "device": "ens1f0"},
          {**common, "alertname": "NfsSlotWaitDominates", "op": "WRITE"},
          {**common, "alertname": "NfsSlotWaitDominates", "op": "READ"})
    assert _inhibited(alertmanager, "gpu096") == {
        "NfsBandwidthParadox/WRITE": False, "NfsSlotWaitDominates/WRITE": True, "NfsSlotWaitDominates/READ": False}


# --- a real Alertmanager delivering to a real gpunode-remediate ---------------------------------

POLICY = """\
mode: dry-run
state_path: {state}
scheduler:
  kind: commands
  commands:
    nodes: [cat, {nodes}]
    drain: ["true"]
    resume: ["true"]
    reboot: ["true"]
health_check: {{enabled: false}}
"""


class Delivery:
    def __init__(self, alertmanager: str, service: str, token: str, state: Path) -> None:
        self.alertmanager, self.service, self.token, self.state = alertmanager, service, token, state

    def received(self, seconds: float, until: object) -> dict[str, str]:
        """alertname -> status, as the service stored them, once until(that) holds (or the time is up)."""
        deadline = time.monotonic() + seconds
        while True:
            got = {}
            if self.state.exists():
                with sqlite3.connect(f"file:{self.state}?mode=ro", uri=True) as db:
                    with_table = db.execute("SELECT 1 FROM sqlite_master WHERE name = 'alerts'").fetchone()
                    got = dict(db.execute("SELECT alertname, status FROM alerts")) if with_table else {}
            if until(got) or time.monotonic() > deadline:
                return got
            time.sleep(0.5)


def _spawn(argv: list[str], port: int, log: Path) -> subprocess.Popen:
    with log.open("w") as err:
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err)
    wait_for_port(port, alive=lambda: proc.poll() is None)
    return proc


@pytest.fixture(scope="module")
def delivery(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Delivery]:
    binary = _tool("prometheus-alertmanager")
    work = tmp_path_factory.mktemp("delivery")
    token = "s3cret-token"
    (work / "token").write_text(token + "\n")
    (work / "nodes.json").write_text(json.dumps([{"name": "gpu071", "state": "idle"}]))
    (work / "policy.yml").write_text(POLICY.format(state=work / "state.db", nodes=work / "nodes.json"))
    service_port, am_port, nobody_port = free_port(), free_port(), free_port()
    # The shipped config, its token example switched on; only where each receiver is changes: the
    # service's to the port it listens on here (same path), people's to a port nobody listens on.
    config = yaml.safe_load(_with_token(CONFIG.read_text(), work / "token"))
    for receiver in config["receivers"]:
        for hook in receiver["webhook_configs"]:
            url = urlsplit(hook["url"])
            port = service_port if receiver["name"] == SERVICE else nobody_port
            hook["url"] = url._replace(netloc=f"127.0.0.1:{port}").geturl()
    (work / "alertmanager.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    procs = []
    try:
        procs.append(_spawn([sys.executable, "-m", "gpunode_remediate", "serve", f"--config.file={work / 'policy.yml'}",
                             f"--web.listen-address=127.0.0.1:{service_port}",
                             f"--web.bearer-token-file={work / 'token'}"], service_port, work / "service.log"))
        procs.append(_spawn([binary, f"--config.file={work / 'alertmanager.yml'}",
                             f"--web.listen-address=127.0.0.1:{am_port}", f"--storage.path={work / 'am'}",
                             "--cluster.listen-address="], am_port, work / "alertmanager.log"))
        yield Delivery(f"http://127.0.0.1:{am_port}", f"http://127.0.0.1:{service_port}", token, work / "state.db")
    finally:
        for proc in reversed(procs):
            proc.terminate()
            proc.wait(timeout=10)


def test_alertmanager_delivers_the_services_alerts_firing_then_resolved(delivery: Delivery) -> None:
    """Through the shipped route and receiver: the Xid (and not the NFS alert, which people get) within
    group_wait; a second alert of the same node as soon (a group per alert: with [instance] it would
    wait for the node's group's next interval, a minute); the Xid's resolution at its group's next
    interval (send_resolved). Each POST carried the bearer token: without it the service refuses."""
    def post(*alerts: dict) -> None:
        requests.post(f"{delivery.alertmanager}/api/v2/alerts", json=list(alerts), timeout=5).raise_for_status()

    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    xid = {"alertname": "GpuXidHardwareFault", "instance": "gpu071", "gpu": "0", "xid": "79",
           "severity": "critical", "action": "RESTART_BM"}
    nfs = {"alertname": "NfsSlotWaitDominates", "instance": "gpu071", "mountpoint": "/mnt/ckpt", "op": "WRITE",
           "severity": "warning"}
    remap = {"alertname": "GpuRowRemapPending", "instance": "gpu071", "gpu": "5", "severity": "warning"}
    post({"labels": xid, "startsAt": now}, {"labels": nfs, "startsAt": now})
    assert delivery.received(30, bool) == {"GpuXidHardwareFault": "firing"}
    post({"labels": remap, "startsAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    second = delivery.received(25, lambda got: "GpuRowRemapPending" in got)
    assert second == {"GpuXidHardwareFault": "firing", "GpuRowRemapPending": "firing"}
    post({"labels": xid, "startsAt": now, "endsAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    resolved = delivery.received(90, lambda got: got.get("GpuXidHardwareFault") == "resolved")
    assert resolved == {"GpuXidHardwareFault": "resolved", "GpuRowRemapPending": "firing"}
    metrics = requests.get(f"{delivery.service}/metrics", timeout=5,
                           headers={"Authorization": f"Bearer {delivery.token}"}).text
    assert 'gpunode_remediate_webhook_errors_total{reason="unauthorized"} 0' in metrics
    assert requests.post(f"{delivery.service}{WEBHOOK_PATH}", data=b"{}", timeout=5).status_code == 401


def test_a_server_not_responding_silences_its_nodes_reports_of_it_only(alertmanager: str) -> None:
    on_node = {"alertname": "NfsServerNotRespondingOnNode", "severity": "warning"}
    _post(alertmanager,
          {"alertname": "NfsServerNotResponding", "server": "stor-a", "severity": "critical"},
          {**on_node, "instance": "gpu201", "server": "stor-a"},
          {**on_node, "instance": "gpu202", "server": "stor-b"})
    assert _inhibited(alertmanager, "gpu201") == {"NfsServerNotRespondingOnNode": True}
    assert _inhibited(alertmanager, "gpu202", seconds=1) == {"NfsServerNotRespondingOnNode": False}
