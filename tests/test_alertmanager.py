"""The example Alertmanager config: amtool accepts it, routes by severity and action, and a real
Alertmanager (Debian's) inhibits what it should."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.helpers import free_port, wait_for_port

CONFIG = Path(__file__).parent.parent / "alertmanager" / "alertmanager.yml"


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} not installed (scripts/install-deps.sh --test installs it)")
    return path


def test_amtool_check_config() -> None:
    out = subprocess.run([_tool("amtool"), "check-config", str(CONFIG)], capture_output=True, text=True)
    assert out.returncode == 0 and "SUCCESS" in out.stdout, out.stdout + out.stderr


@pytest.mark.parametrize(("labels", "receivers"), [
    ({"severity": "critical", "action": "RESTART_BM", "alertname": "GpuXidHardwareFault"}, "node-automation,pager"),
    ({"severity": "critical", "alertname": "GpuRowRemapFailure"}, "pager"),
    # The driver's recovery actions 5-7 (Xid 154): a bus reset and a reboot are automatable, the
    # IMEX domain spans nodes and goes to people.
    ({"severity": "critical", "action": "BUS_RESET", "alertname": "GpuRecoveryActionRequired"},
     "node-automation,pager"),
    ({"severity": "critical", "action": "SYSTEM_REBOOT", "alertname": "GpuRecoveryActionRequired"},
     "node-automation,pager"),
    ({"severity": "critical", "action": "RECOVER_IMEX_DOMAIN", "alertname": "GpuRecoveryActionRequired"}, "pager"),
    ({"severity": "warning", "action": "RESTART_APP", "alertname": "GpuXidApplicationFault"}, "node-automation,chat"),
    ({"severity": "warning", "alertname": "NfsSlotWaitDominates"}, "chat"),
    ({"severity": "info", "alertname": "CheckpointIntervalTooLong"}, "tickets"),
    ({"alertname": "Unlabelled"}, "tickets"),
])
def test_routes(labels: dict[str, str], receivers: str) -> None:
    out = subprocess.run([_tool("amtool"), "config", "routes", "test", f"--config.file={CONFIG}",
                          *(f"{k}={v}" for k, v in labels.items())], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == receivers


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
