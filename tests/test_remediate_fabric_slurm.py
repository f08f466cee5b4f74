"""The fabric gate on real parts, as tests/test_remediate_slurm.py runs them (its cluster, Alertmanager and
service): a node rebooted for GpuFabricNotReady returns only once its exporter, on the simulated NVML,
reports the NVLink fabric complete; it is held when the fabric never completes, or when the alert fires
again after the reboot."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import free_port
from tests.remediation import alert_json
from tests.slurm import SlurmCluster, flags, slurm_cluster

# Fixtures: each test starts on an idle cluster (clean), with Alertmanager as the service's sender.
from tests.test_remediate_slurm import (  # noqa: F401
    ROOT,
    Alertmanager,
    Service,
    alertmanager,
    clean,
    healthy_exporter,
    wait,
)

NODES = tuple(f"gpu{i:03d}" for i in range(21, 25))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    yield from slurm_cluster(tmp_path_factory, nodes=NODES)

SCENARIOS = ROOT / "exporter" / "nvmlsim" / "scenarios"
HGX = ("--path.sysfs", str(ROOT / "tests" / "fixtures" / "sysfs" / "dgx-h100"))  # its four NVSwitches on the bus
HGX_CONFIG = "gpu: {expected_count: 8, nvswitches_expected: 4}\n"


def fabric_not_ready(node: str, status: str = "firing", **times: float) -> dict[str, Any]:
    return alert_json("GpuFabricNotReady", node, status, cause="not_started", gpu="0", uuid="GPU-fab00e11", **times)


def rebooted_for_fabric(cluster: SlurmCluster, am: Alertmanager, node: str) -> tuple[float, dict[str, Any]]:
    """GpuFabricNotReady on `node` (begun 5 minutes ago) until the service's reboot is done: when the alert
    began, and the node as Slurm then shows it."""
    starts = time.time() - 300
    am.post(fabric_not_ready(node, starts=starts))
    return starts, cluster.wait_state(node, lambda n: "DOWN" in flags(n) and not flags(n) & {
        "REBOOT_REQUESTED", "REBOOT_ISSUED"}, timeout=60)


@contextmanager
def rebooted_not_ready(tmp_path: Path, cluster: SlurmCluster, alertmanager: Callable[..., Alertmanager],  # noqa: F811
                       node: str, fabric_wait: str) -> Iterator[tuple[Service, Alertmanager, float]]:
    """The service, its Alertmanager and when GpuFabricNotReady began, once `node` is rebooted for it; the
    node's exporter, on the shipped fabric-not-ready scenario, keeps reporting the fabric not started."""
    with healthy_exporter(tmp_path / "not-ready", *HGX, scenario=SCENARIOS / "fabric-not-ready.yaml",
                          config=HGX_CONFIG) as url:
        svc = Service(tmp_path, cluster, url, fabric_wait=fabric_wait).start()
        try:
            am = alertmanager(svc)
            starts, _ = rebooted_for_fabric(cluster, am, node)
            yield svc, am, starts
        finally:
            svc.stop()


def test_a_fabric_not_ready_reboots_and_the_node_returns_only_once_its_exporter_reports_the_fabric_complete(
        tmp_path: Path, cluster: SlurmCluster, alertmanager: Callable[..., Alertmanager]) -> None:  # noqa: F811
    """The exporter answers on the simulated NVML: first a node whose fabric manager never brings the
    fabric up (the shipped fabric-not-ready scenario), then, on the same address, a healthy HGX H100."""
    port = free_port()
    svc: Service | None = None
    try:
        with healthy_exporter(tmp_path / "not-ready", *HGX, scenario=SCENARIOS / "fabric-not-ready.yaml",
                              config=HGX_CONFIG, port=port) as url:
            svc = Service(tmp_path, cluster, url, fabric_wait="10m").start()
            am = alertmanager(svc)
            starts, down = rebooted_for_fabric(cluster, am, "gpu021")
            assert down["Reason"].startswith("gpunode: reboot GpuFabricNotReady cause=not_started gpu=0")
            am.post(fabric_not_ready("gpu021", "resolved", starts=starts, ends=time.time()))
            waiting = "not returned: fabric not complete: GPU 0,1,2,3,4,5,6,7 fabric not started"
            status = wait("the fabric wait", lambda: text if waiting in (text := svc.command("status").stdout)
                          else None)
            assert "gpu021  rebooted" in status and "if it lasts: fabric_wait 10 min" in status
            time.sleep(3)
            assert "DOWN" in flags(cluster.node("gpu021")) and cluster.reboots("gpu021") == 1
        with healthy_exporter(tmp_path / "complete", *HGX, config=HGX_CONFIG, port=port):
            cluster.wait_state("gpu021", lambda n: flags(n) == {"IDLE"}, timeout=60)
            actions = svc.metrics()["gpunode_remediate_actions_total"]
            assert actions[(("action", "reboot"), ("result", "done"))] == 1
            assert actions[(("action", "resume"), ("result", "done"))] == 1
            assert "gpu021" not in svc.command("status").stdout
    finally:
        if svc is not None:
            svc.stop()


def test_a_fabric_that_never_completes_after_the_reboot_holds_the_node_after_fabric_wait(
        tmp_path: Path, cluster: SlurmCluster, alertmanager: Callable[..., Alertmanager]) -> None:  # noqa: F811
    with rebooted_not_ready(tmp_path, cluster, alertmanager, "gpu022", fabric_wait="4s") as (svc, am, starts):
        am.post(fabric_not_ready("gpu022", "resolved", starts=starts, ends=time.time()))
        held = cluster.wait_state("gpu022", lambda n: n["Reason"].startswith("gpunode: hold"), timeout=30)
        assert held["Reason"] == "gpunode: hold fabric not complete: GPU 0,1,2,3,4,5,6,7 fabric not started"
        assert "gpu022  held" in svc.command("status").stdout
        time.sleep(3)
        assert "IDLE" not in flags(cluster.node("gpu022")) and cluster.reboots("gpu022") == 1


def test_a_fabric_alert_that_fires_again_after_the_reboot_holds_the_node_and_one_from_before_does_not(
        tmp_path: Path, cluster: SlurmCluster, alertmanager: Callable[..., Alertmanager]) -> None:  # noqa: F811
    """The exporter keeps reporting the fabric not started after the reboot. The alert from before the
    reboot, not yet resolved, keeps the node waiting; the rule pack's alert again after the boot holds it
    at once, long before fabric_wait."""
    with rebooted_not_ready(tmp_path, cluster, alertmanager, "gpu023", fabric_wait="10m") as (svc, am, starts):
        wait("the reboot seen done", lambda: "gpu023  rebooted" in svc.command("status").stdout)
        booted = cluster.node("gpu023")["SlurmdStartTime"]
        time.sleep(4)  # two quiet periods, four looks: the stale alert holds nothing
        assert cluster.node("gpu023")["Reason"].startswith("gpunode: reboot GpuFabricNotReady")
        assert "gpu023  rebooted" in svc.command("status").stdout
        # Resolved (the node gets as far as the fabric gate), then the rule pack's alert again.
        am.post(fabric_not_ready("gpu023", "resolved", starts=starts, ends=time.time()))
        wait("the fabric gate", lambda: "not returned: fabric not complete" in svc.command("status").stdout)
        am.post(fabric_not_ready("gpu023", starts=time.time()))
        held = cluster.wait_state("gpu023", lambda n: n["Reason"].startswith("gpunode: hold"), timeout=30)
        assert held["Reason"] == ("gpunode: hold GpuFabricNotReady cause=not_started gpu=0 fired again after its "
                                  "reboot: the NVLink fabric is not ready: a reboot brings it up")
        assert "gpu023  held" in svc.command("status").stdout
        time.sleep(3)
        node = cluster.node("gpu023")
        assert "IDLE" not in flags(node) and cluster.reboots("gpu023") == 1, node
        assert node["SlurmdStartTime"] == booted
