"""The storage_network collector: which interfaces, their speed, RDMA counters and PFC, on fixtures."""

from __future__ import annotations

import errno
import logging
from pathlib import Path

import pytest

from gpunode_exporter.collector.base import Context
from gpunode_exporter.collector.storage_network import StorageNetworkCollector
from gpunode_exporter.config import Config, FabricConfig, StorageConfig
from tests.helpers import collect_samples, ethtool_fixture

FIXTURES = Path(__file__).parent / "fixtures"
ROUTES = {"10.20.0.5": "stor0", "10.20.0.6": "stor0"}  # edge mountinfo's servers; 192.0.2.10: no route


class FixtureEthtool:
    """Driver statistics from `ethtool -S` text (ConnectX with PFC on priority 3); others have none."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def stats(self, device: str) -> dict[str, int]:
        self.asked.append(device)
        if device == "stor0":
            return ethtool_fixture("mlx5-pfc-prio3-grep-CONSTRUCTED.txt")
        raise OSError(errno.EOPNOTSUPP, "Operation not supported")


def collector(interfaces: tuple[str, ...] = (), ports_expected: int | None = None) -> StorageNetworkCollector:
    cfg = Config(storage=StorageConfig(interfaces=interfaces), fabric=FabricConfig(ports_expected=ports_expected))
    c = StorageNetworkCollector(Context(procfs=FIXTURES / "procfs" / "datapath", sysfs=FIXTURES / "sysfs" / "dgx-h100",
                                        config=cfg, route_lookup=ROUTES.get))
    c._ethtool = FixtureEthtool()  # type: ignore[assignment]
    return c


def test_interfaces_speed_rdma_and_pfc(caplog: pytest.LogCaptureFixture) -> None:
    c = collector(interfaces=("enp64s0np0", "stor0"))
    with caplog.at_level(logging.INFO):
        s = collect_samples(c)
        collect_samples(c)
    assert s["gpunode_storage_interface_info"] == {
        (("device", "stor0"), ("source", "nfs_route")): 1, (("device", "enp64s0np0"), ("source", "config")): 1}
    assert s["gpunode_network_link_speed_bytes"][(("device", "stor0"),)] == 400_000 * 1_000_000 / 8
    pfc = {(dict(k)["device"], dict(k)["direction"], dict(k)["priority"]): v
           for k, v in s["gpunode_network_pfc_pause_frames_total"].items()}
    expected = ethtool_fixture("mlx5-pfc-prio3-grep-CONSTRUCTED.txt")
    assert pfc[("stor0", "rx", "3")] == expected["rx_prio3_pause"]
    assert pfc[("stor0", "tx", "3")] == expected["tx_prio3_pause"]
    assert {device for device, _, _ in pfc} == {"stor0"}
    # storage interfaces and RoCE netdevs; not the InfiniBand port's IPoIB netdev (no pause frames on IB)
    assert set(c._ethtool.asked) == {"stor0", "enp64s0np0"}
    assert {tuple(v for _, v in k) for k in s["gpunode_rdma_port_info"]} == {
        ("mlx5_0", "Ethernet", "stor0", "0000:18:00.0", "1"),
        ("mlx5_1", "Ethernet", "enp64s0np0", "0000:40:00.0", "1"),
        ("mlx5_2", "InfiniBand", "ibp79s0", "0000:4f:00.0", "1")}
    assert "gpunode_fabric_ports_expected" not in s  # fabric.ports_expected unset
    assert s["gpunode_rdma_cnp_handled_total"][(("device", "mlx5_0"), ("port", "1"))] == 95113
    logged = [r.message for r in caplog.records if "ethtool" in r.message]
    assert logged == ["ethtool statistics of enp64s0np0: Operation not supported (no PFC series for it)"]


def test_fabric_ports_expected() -> None:
    s = collect_samples(collector(ports_expected=8))
    assert s["gpunode_fabric_ports_expected"] == {(): 8}


def test_no_route_no_interface() -> None:
    c = StorageNetworkCollector(Context(procfs=FIXTURES / "procfs" / "datapath", sysfs=FIXTURES / "sysfs" / "edge",
                                        config=Config(), route_lookup=lambda _a: None))
    c._ethtool = FixtureEthtool()  # type: ignore[assignment]
    s = collect_samples(c)
    assert "gpunode_storage_interface_info" not in s and "gpunode_rdma_port_info" not in s
