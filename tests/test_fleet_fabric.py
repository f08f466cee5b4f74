"""The fabric on a simulated fleet (fleet/fabric.py, fleet/scenarios/fabric-selftest.yaml): the ports as
Debian's node_exporter serves them from sysfs, flaps no scrape sees, and on a real backend each family found
by its alert while the distractors (a port never cabled, a saturated link_downed, a planned reboot) raise
nothing; a job a port fault broke requeued without its node."""

from __future__ import annotations

import itertools
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from fleet import fabric, harness, jobcluster, jobreplay, scenario, score
from fleet.simulate import Fleet, node_name
from gpunode_exporter.collector import gpu, storage_network
from tests.helpers import free_port, parse_exposition, skip_without_fleet_tools, wait_for_port

pytestmark = pytest.mark.xdist_group("replay")  # a rule replay runs one vmalert per CPU

SELFTEST = scenario.load("fabric-selftest")
FAMILIES = {"port_down", "port_flapping", "port_degraded", "fabric_not_ready"}
NODE_EXPORTER = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
STATES = {1: "DOWN", 2: "INIT", 3: "ARMED", 4: "ACTIVE"}
PHYS = {2: "Polling", 3: "Disabled", 5: "LinkUp"}
# The exporter's fabric metrics: the simulator's label names must be theirs.
EXPORTER = {spec.name: set(spec.labels) for spec in (
    storage_network.RDMA_PORT_INFO, storage_network.PORTS_EXPECTED, gpu.FABRIC_STATE, gpu.FABRIC_HEALTHY,
    gpu.NVSWITCHES_VISIBLE, gpu.NVSWITCHES_EXPECTED)}


def _fleet() -> Fleet:
    return Fleet(SELFTEST, (time.time() // 3600) * 3600 - SELFTEST.duration - 3600)


def _node(fleet: Fleet, n: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], np.ndarray]:
    """The node's series by name and labels (instance and job left out)."""
    return {(s.name, tuple((k, v) for k, v in s.labels if k not in ("instance", "job"))): s.values
            for s in fleet.series(range(n, n + 1))}


def _sysfs(root: Path, series: dict[tuple[str, tuple[tuple[str, str], ...]], np.ndarray], k: int) -> None:
    """The sysfs files node_exporter reads, as the simulated node had them at sample k."""
    def at(name: str, **labels: str) -> float:
        return float(series[(name, tuple(sorted(labels.items())))][k])

    for port in fabric.PORTS:
        dev = root / "class" / "infiniband" / port.device
        (dev / "ports" / "1" / "counters").mkdir(parents=True)
        for name, value in (("board_id", port.board_id), ("fw_ver", port.firmware), ("hca_type", port.hca_type)):
            (dev / name).write_text(value + "\n")
        p = {"device": port.device, "port": "1"}
        state, phys = int(at("node_infiniband_state_id", **p)), int(at("node_infiniband_physical_state_id", **p))
        gbps = at("node_infiniband_rate_bytes_per_second", **p) * 8 / 1e9
        (dev / "ports" / "1" / "state").write_text(f"{state}: {STATES[state]}\n")
        (dev / "ports" / "1" / "phys_state").write_text(f"{phys}: {PHYS[phys]}\n")
        (dev / "ports" / "1" / "rate").write_text(f"{gbps:g} Gb/sec (4X)\n")
        (dev / "ports" / "1" / "counters" / "link_downed").write_text(
            f"{at('node_infiniband_link_downed_total', **p):.0f}\n")
        net = root / "class" / "net" / port.netdev
        net.mkdir(parents=True)
        d = {"device": port.netdev}
        up, down = at("node_network_carrier_up_changes_total", **d), at("node_network_carrier_down_changes_total", **d)
        carrier = at("node_network_carrier", **d)
        for name, value in (("carrier", carrier), ("carrier_up_count", up), ("carrier_down_count", down),
                            ("carrier_changes", up + down)):
            (net / name).write_text(f"{value:.0f}\n")
        (net / "operstate").write_text("up\n" if carrier else "down\n")


@pytest.mark.skipif(NODE_EXPORTER is None, reason="node_exporter not installed (scripts/install-deps.sh)")
@pytest.mark.parametrize(("node", "hour"), [(1, 2.0), (2, 2.0), (5, 3.0), (3, 0.5)],
                         ids=["port-down", "flapping-saturated", "degraded", "never-cabled"])
def test_the_ports_are_what_node_exporter_serves_from_sysfs(node: int, hour: float, tmp_path: Path) -> None:
    """Every node_infiniband_* and netclass series of the fabric, names, labels and values, as Debian's
    node_exporter 1.5 serves them from the sysfs files the simulated node would have."""
    fleet = _fleet()
    series = _node(fleet, node)
    k = int(hour * 3600 / SELFTEST.step)
    _sysfs(tmp_path, series, k)
    port = free_port()
    assert NODE_EXPORTER is not None
    proc = subprocess.Popen([NODE_EXPORTER, "--collector.disable-defaults", "--collector.infiniband",
                             "--collector.netclass", f"--path.sysfs={tmp_path}",
                             f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port, alive=lambda: proc.poll() is None)
        served = parse_exposition(urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10)
                                  .read().decode())
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    fabric_names = {name for name, _labels in series if name.startswith(("node_infiniband_", "node_network_"))
                    and not name.endswith(("_bytes_total", "_wait_total", "_error_total", "_recovery_total"))}
    assert fabric_names <= set(served), fabric_names - set(served)
    for name in sorted(fabric_names):
        ours = {labels: float(values[k]) for (n, labels), values in series.items() if n == name}
        assert ours == served[name], name


def test_flaps_show_in_the_counters_while_every_scrape_reads_active() -> None:
    fleet = _fleet()
    flapping = next(f for f in SELFTEST.faults if f.kind == "port_flapping")
    port = fabric.PORTS[int(flapping.param("port", 0))]
    series = _node(fleet, flapping.node)
    p = (("device", port.device), ("port", "1"))
    during = (fleet.t >= flapping.at) & (fleet.t < flapping.at + flapping.duration("lasts", 0))
    assert (series[("node_infiniband_state_id", p)] == 4).all()  # no scrape sees a flap
    # Its link_downed stood at 255 before: it counts none of them; the carrier and the kernel count each.
    assert (series[("node_infiniband_link_downed_total", p)] == 255).all()
    down = series[("node_network_carrier_down_changes_total", (("device", port.netdev),))]
    lines = (("device", port.netdev), ("kind", "nic_link_down"))
    kernel = np.nan_to_num(series[("gpunode_kernel_events_total", lines)])
    hour = int(3600 / SELFTEST.step)
    for counted in (down, kernel):
        assert counted[during][hour] - counted[during][0] >= 3  # the alert's threshold within its first hour
    # The exporter's label names; the IPoIB netdev of each InfiniBand port on its PCI function.
    names = set()
    for (name, labels), _values in _node(fleet, 0).items():
        if name in EXPORTER:
            assert {k for k, _v in labels} == EXPORTER[name], name
            names.add(name)
    assert names == set(EXPORTER)
    info = {dict(labels)["device"]: dict(labels) for (name, labels) in series if name == "gpunode_rdma_port_info"}
    assert info["mlx5_0"]["netdev"] == "ibp24s0" and info["mlx5_0"]["pci_address"] == "0000:18:00.0"
    assert info["mlx5_4"]["link_layer"] == "Ethernet"


def test_a_planned_reboot_takes_the_targets_down_and_brings_the_ports_up_within_a_minute_and_a_half() -> None:
    fleet = _fleet()
    reboot = next(d for d in SELFTEST.distractors if d.kind == "reboot")
    series = _node(fleet, reboot.node)
    t = fleet.t
    gone = (t >= reboot.at) & (t < reboot.at + fabric.REBOOT_DOWN)
    assert (series[("up", ())][gone] == 0).all() and (series[("up", ())][~gone] == 1).all()
    back = reboot.at + fabric.REBOOT_DOWN
    for port in fabric.PORTS:
        state = series[("node_infiniband_state_id", (("device", port.device), ("port", "1")))]
        assert np.isnan(state[gone]).all()
        assert (state[(t >= back + 90)] == 4).all() and (state[(t >= back) & (t < back + 90)] >= 2).all()
    fabric_state = series[("gpunode_gpu_fabric_state", (("gpu", "0"), ("uuid", f"GPU-{reboot.node:08x}-0000-0000"
                                                                                 "-0000-000000000000")))]
    assert (fabric_state[t >= back + 90] == 3).all()


@pytest.mark.parametrize("backend", harness.BACKENDS)
def test_every_family_is_found_and_the_distractors_raise_nothing(backend: str, tmp_path: Path) -> None:
    skip_without_fleet_tools()
    fleet = _fleet()
    run = harness.run(backend, fleet, tmp_path, free_port())
    s = score.score(run.firing, fleet.truth(), [node_name(n) for n in range(SELFTEST.nodes)], SELFTEST.duration)
    assert {c.kind for c in s.classes} == FAMILIES
    assert [(c.kind, c.recall, c.precision) for c in s.classes] == [(c.kind, 1.0, 1.0) for c in s.classes]
    assert [(f.alertname, f.labels.get("instance")) for f in s.false_alerts] == []
    # The distractors' nodes raise nothing at all: a port never cabled, a link_downed at 255 holding still, a
    # planned reboot (its ports INIT or ARMED for up to 90 s, its fabric in progress up to 80 s).
    quiet = {node_name(d.node) for d in SELFTEST.distractors}
    assert [f for f in run.firing if f.labels.get("instance") in quiet] == []
    # The flapping port is found by its carrier and kernel lines (its link_downed is saturated); the
    # fabric that did not start by its cause.
    flapping = next(f for f in SELFTEST.faults if f.kind == "port_flapping")
    flaps = [f for f in run.firing if f.alertname == "GpuNodeFabricPortFlapping"]
    assert {(f.labels["instance"], f.labels["device"]) for f in flaps} == {
        (node_name(flapping.node), fabric.PORTS[int(flapping.param("port", 0))].device)}
    assert {f.labels["cause"] for f in run.firing if f.alertname == "GpuFabricNotReady"} == {"not_started"}
    # The port that went down by its own alert (device and port), not only by the node's count.
    down = next(f for f in SELFTEST.faults if f.kind == "port_down")
    assert {(f.labels["instance"], f.labels.get("device", "")) for f in run.firing
            if f.alertname == "GpuNodeFabricPortDown"} == {
        (node_name(down.node), fabric.PORTS[int(down.param("port", 0))].device)}


def test_a_job_a_port_fault_ended_is_requeued_without_its_node() -> None:
    """fleet/scenarios/jobs-fabric-port.yaml through gpunode-remediate's job recovery: the node whose port
    went down is taken out (GpuNodeFabricPortDown: hold) and the job's next attempt runs without it; the
    fixed retry puts it back on the node, where it fails again until the cable is replaced."""
    sc = jobcluster.load("jobs-fabric-port")
    results = jobreplay.replay(sc)
    fault = next(f for f in sc.faults if f.kind == "port")
    for policy, result in results.items():
        ended = [a for a in result.attempts if a.cause == "port"]
        assert ended and ended[0].end == pytest.approx(jobcluster.T0 + fault.at + fault.fails_after), policy
    ours = results["ours"]
    assert set(ours.taken) == {fault.node} and ours.holds == {}
    chain = [a for a in ours.attempts if a.job == "a-8"]
    assert [a.cause for a in chain[:-1]] == ["port"] and chain[-1].outcome == "completed"
    assert all(fault.node not in a.nodes for a in chain[1:])
    assert ours.branches[("a-8", 1)] in ("node_fault", "backoff")
    fixed = [a for a in results["fixed"].attempts if a.job == "a-8"]
    assert sum(a.cause == "port" for a in fixed) > 10  # back on the node every 10 minutes for 4 hours
    assert all(fault.node in a.nodes for a in fixed)
    assert all(a.start >= jobcluster.T0 + fault.at + fault.lasts for a in fixed if a.outcome == "completed")
    assert jobreplay.healthy_excluded(ours) == set()
    assert [a for a, b in itertools.pairwise(chain) if b.start < a.end] == []
    docs = (Path(__file__).resolve().parent.parent / "docs" / "remediation.md").read_text()
    assert jobreplay.table(sc, results) in docs, "docs/remediation.md: jobs-fabric-port's table is stale"
