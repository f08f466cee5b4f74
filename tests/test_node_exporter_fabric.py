"""The fabric join against a real peer: Debian's node_exporter 1.5 infiniband and netclass collectors.

The rule pack reads a port's state, rate and link-down count from node_exporter
(node_infiniband_*{device,port}) and puts carrier changes and kernel link lines of its
netdev on it through our gpunode_rdma_port_info{device,port,netdev}. Both exporters read
the same sysfs tree here; every port we name must be one node_exporter serves, with the
same device and port labels, and every netdev we name one whose carrier it counts.
"""

from __future__ import annotations

import shutil
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpunode_exporter.collector.base import Context
from gpunode_exporter.collector.storage_network import StorageNetworkCollector
from gpunode_exporter.config import Config
from tests.helpers import add_device_links, collect_samples, free_port, parse_exposition, wait_for_port

NODE_EXPORTER = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
DGX = Path(__file__).parent / "fixtures" / "sysfs" / "dgx-h100"
PORT_SERIES = ("node_infiniband_state_id", "node_infiniband_physical_state_id",
               "node_infiniband_rate_bytes_per_second", "node_infiniband_link_downed_total")

pytestmark = pytest.mark.skipif(NODE_EXPORTER is None,
                                reason="node_exporter not installed (scripts/install-deps.sh)")


@pytest.fixture(scope="module")
def both(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict, dict]]:
    """(node_exporter's series, ours) from one copy of the DGX tree."""
    sysfs = tmp_path_factory.mktemp("fabric") / "sysfs"
    shutil.copytree(DGX, sysfs, symlinks=True)
    add_device_links(sysfs)
    port = free_port()
    proc = subprocess.Popen(
        [NODE_EXPORTER, "--collector.disable-defaults", "--collector.infiniband", "--collector.netclass",
         f"--path.sysfs={sysfs}", f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port, alive=lambda: proc.poll() is None)
        url = f"http://127.0.0.1:{port}/metrics"
        theirs = parse_exposition(urllib.request.urlopen(url, timeout=10).read().decode())
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    ours = collect_samples(StorageNetworkCollector(Context(
        procfs=Path("/nonexistent"), sysfs=sysfs, config=Config(), route_lookup=lambda _a: None)))
    yield theirs, ours


def test_collectors_succeed(both: tuple[dict, dict]) -> None:
    theirs, _ = both
    assert theirs["node_scrape_collector_success"] == {(("collector", "infiniband"),): 1,
                                                       (("collector", "netclass"),): 1}


def test_every_port_we_name_node_exporter_serves(both: tuple[dict, dict]) -> None:
    theirs, ours = both
    info = [dict(k) for k in ours["gpunode_rdma_port_info"]]
    assert {(p["device"], p["port"], p["link_layer"]) for p in info} == {
        ("mlx5_0", "1", "Ethernet"), ("mlx5_1", "1", "Ethernet"), ("mlx5_2", "1", "InfiniBand")}
    for name in PORT_SERIES:
        assert {(dict(k)["device"], dict(k)["port"]) for k in theirs[name]} == {(p["device"], p["port"]) for p in info}
    for p in info:
        key = (("device", p["device"]), ("port", p["port"]))
        assert theirs["node_infiniband_state_id"][key] == 4  # "4: ACTIVE"
        assert theirs["node_infiniband_physical_state_id"][key] == 5  # "5: LinkUp"
        assert theirs["node_infiniband_rate_bytes_per_second"][key] == 400e9 / 8
    link_downed = {dict(k)["device"]: v for k, v in theirs["node_infiniband_link_downed_total"].items()}
    assert link_downed == {"mlx5_0": 0, "mlx5_1": 0, "mlx5_2": 2}


def test_adapter_info_joins_on_device(both: tuple[dict, dict]) -> None:
    theirs, ours = both
    adapters = {dict(k)["device"]: dict(k) for k in theirs["node_infiniband_info"]}
    for p in ours["gpunode_rdma_port_info"]:
        adapter = adapters[dict(p)["device"]]
        assert (adapter["hca_type"], adapter["board_id"]) == ("MT4129", "MT_0000000838")


def test_every_netdev_we_name_has_carrier_counts(both: tuple[dict, dict]) -> None:
    theirs, ours = both
    netdevs = {dict(k)["device"]: dict(k)["netdev"] for k in ours["gpunode_rdma_port_info"]}
    assert netdevs == {"mlx5_0": "stor0", "mlx5_1": "enp64s0np0", "mlx5_2": "ibp79s0"}
    downs = {dict(k)["device"]: v for k, v in theirs["node_network_carrier_down_changes_total"].items()}
    ups = {dict(k)["device"]: v for k, v in theirs["node_network_carrier_up_changes_total"].items()}
    assert {netdev: downs[netdev] for netdev in netdevs.values()} == {"stor0": 0, "enp64s0np0": 0, "ibp79s0": 2}
    assert ups["ibp79s0"] == 3
    assert {dict(k)["device"] for k, v in theirs["node_network_up"].items() if v == 1} >= set(netdevs.values())
