"""Link speed and RDMA ports from sysfs: the dgx-h100 fixture tree, copies of it
broken in the ways a live /sys can be, and the running kernel's own /sys."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpunode_exporter.sysfs import net
from gpunode_exporter.sysfs.net import RDMA_COUNTERS, RDMAPort, link_speed_bytes, rdma_ports
from gpunode_exporter.sysfs.pci import canonical_bus_id
from tests.helpers import add_device_links
from tests.netns import STORAGE_DEVICE, storage_netns

ROOT = Path(__file__).parent.parent
DGX = Path(__file__).parent / "fixtures" / "sysfs" / "dgx-h100"

# `ls hw_counters` of a real ConnectX RoCE port (tests/fixtures/sysfs/README.md), less `lifespan`.
REAL_MLX5_HW_COUNTERS = {
    "duplicate_request", "implied_nak_seq_err", "local_ack_timeout_err", "np_cnp_sent",
    "np_ecn_marked_roce_packets", "out_of_buffer", "out_of_sequence", "packet_seq_err", "req_cqe_error",
    "req_cqe_flush_error", "req_remote_access_errors", "req_remote_invalid_request", "resp_cqe_error",
    "resp_cqe_flush_error", "resp_local_length_error", "resp_remote_access_errors", "rnr_nak_retry_err",
    "roce_adp_retrans", "roce_adp_retrans_to", "roce_slow_restart", "roce_slow_restart_cnps",
    "roce_slow_restart_trans", "rp_cnp_handled", "rp_cnp_ignored", "rx_atomic_requests", "rx_dct_connect",
    "rx_icrc_encapsulated", "rx_read_requests", "rx_write_requests",
}
# extended_err_cnts in drivers/infiniband/hw/mlx5/counters.c has two more than that listing's kernel.
NEWER_MLX5_HW_COUNTERS = {"req_transport_retries_exceeded", "req_rnr_retries_exceeded"}


@pytest.fixture
def sysfs(tmp_path: Path) -> Path:
    """A writable copy of dgx-h100/ (symlinks stay relative)."""
    root = tmp_path / "sys"
    shutil.copytree(DGX, root, symlinks=True)
    add_device_links(root)
    return root


def port_dir(root: Path, device: str, port: str = "1") -> Path:
    return root / "class" / "infiniband" / device / "ports" / port


def by_device(ports: list[RDMAPort]) -> dict[str, RDMAPort]:
    return {port.device: port for port in ports}


# --- link_speed_bytes ----------------------------------------------------------------------------


def test_link_speed_of_the_fixture_nics() -> None:
    assert (DGX / "class" / "net" / "stor0" / "speed").read_text() == "400000\n"
    assert link_speed_bytes(DGX, "stor0") == 400e9 / 8
    assert link_speed_bytes(DGX, "enp64s0np0") == 50e9


@pytest.mark.parametrize(("text", "expected"), [
    ("25000\n", 25e9 / 8),
    ("100000", 12.5e9),
    ("-1\n", None),  # SPEED_UNKNOWN printed with %d
    ("4294967295\n", None),  # ... and with %u
    ("0\n", None),
    ("\n", None),
    ("fast\n", None),
    ("25000 Mb/s\n", None),
])
def test_link_speed_values(sysfs: Path, text: str, expected: float | None) -> None:
    (sysfs / "class" / "net" / "stor0" / "speed").write_text(text)
    assert link_speed_bytes(sysfs, "stor0") == expected


def test_link_speed_missing_or_unreadable(sysfs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert link_speed_bytes(sysfs, "eth9") is None  # no such device
    assert link_speed_bytes(sysfs / "nothing", "stor0") is None  # no sysfs at all
    speed = sysfs / "class" / "net" / "enp64s0np0" / "speed"
    speed.unlink()
    assert link_speed_bytes(sysfs, "enp64s0np0") is None
    speed.mkdir()  # a read that fails (EISDIR) rather than a missing file
    assert link_speed_bytes(sysfs, "enp64s0np0") is None

    # A down link: the file is there and open() works, but read() fails with EINVAL.
    read = os.read

    def einval_on_read(fd: int, size: int) -> bytes:
        if os.readlink(f"/proc/self/fd/{fd}").endswith("/stor0/speed"):
            raise OSError(errno.EINVAL, "Invalid argument")
        return read(fd, size)

    monkeypatch.setattr(net.os, "read", einval_on_read)  # for this test only
    assert link_speed_bytes(sysfs, "stor0") is None


@pytest.mark.parametrize("device", ["", ".", "..", "../net/stor0", "stor0/..", "a b", "eth:1", "x" * 16])
def test_link_speed_rejects_names_no_interface_can_have(device: str) -> None:
    assert link_speed_bytes(DGX, device) is None


def test_link_speed_of_lo_on_this_kernel() -> None:
    # lo has no get_link_ksettings: the kernel answers a read of its speed with EINVAL.
    if not Path("/sys/class/net/lo/speed").exists():
        pytest.skip("no /sys/class/net/lo/speed here")
    with pytest.raises(OSError) as raised:
        Path("/sys/class/net/lo/speed").read_text()
    assert raised.value.errno == errno.EINVAL
    assert link_speed_bytes(Path("/sys"), "lo") is None


SPEED_PROBE = """
import json, subprocess, sys
from pathlib import Path
from gpunode_exporter.sysfs.net import link_speed_bytes
dev = sys.argv[1]
down = link_speed_bytes(Path("/sys"), dev)
subprocess.run(["ip", "link", "set", "peer0", "down"], check=True)
no_carrier = link_speed_bytes(Path("/sys"), dev)
subprocess.run(["ip", "link", "set", dev, "down"], check=True)
admin_down = link_speed_bytes(Path("/sys"), dev)
print(json.dumps([down, no_carrier, admin_down]))
"""


def test_link_speed_of_a_veth_up_and_down() -> None:
    # `ip netns exec` mounts a /sys of the namespace, where stor0 is a real veth.
    with storage_netns() as ns:
        out = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", SPEED_PROBE, STORAGE_DEVICE],
                             check=True, capture_output=True, text=True, cwd=ROOT)
    up, peer_down, admin_down = json.loads(out.stdout)
    assert up == 10_000e6 / 8  # veth_get_link_ksettings(): SPEED_10000
    assert peer_down == 10_000e6 / 8  # still running, only without carrier: veth reports its speed
    assert admin_down is None  # not running: EINVAL


# --- rdma_ports: the fixture -----------------------------------------------------------------------


def test_dgx_has_two_roce_ports_and_an_infiniband_port_with_their_netdevs() -> None:
    ports = rdma_ports(DGX)  # the committed tree, without `device` links: the class link finds the function
    assert [(p.device, p.port, p.netdev, p.link_layer, p.pci_address) for p in ports] == [
        ("mlx5_0", "1", "stor0", "Ethernet", "0000:18:00.0"),
        ("mlx5_1", "1", "enp64s0np0", "Ethernet", "0000:40:00.0"),
        ("mlx5_2", "1", "ibp79s0", "InfiniBand", "0000:4f:00.0"),  # its IPoIB netdev
    ]
    # The netdev is the one on the same PCI function.
    for port in ports:
        ibdev = (DGX / "class" / "infiniband" / port.device).resolve()
        netdev = (DGX / "class" / "net" / port.netdev).resolve()
        assert ibdev.parent.parent == netdev.parent.parent


def test_dgx_hw_counters_are_the_real_mlx5_list() -> None:
    ports = by_device(rdma_ports(DGX))
    for port in ports.values():
        roce = REAL_MLX5_HW_COUNTERS if port.link_layer == "Ethernet" else {
            name for name in REAL_MLX5_HW_COUNTERS if not name.startswith(("np_", "rp_", "roce_"))}
        assert set(port.hw_counters) == roce  # lifespan left out
    storage = ports["mlx5_0"].hw_counters
    assert storage["np_ecn_marked_roce_packets"] == 184302
    assert storage["np_cnp_sent"] == 61877
    assert storage["rp_cnp_handled"] == 95113
    assert storage["rp_cnp_ignored"] == 0
    assert storage["out_of_sequence"] == 412
    assert storage["rx_read_requests"] == 1932004117
    # mlx5_1 carries the real values of the listing's `rdma statistic` line.
    assert ports["mlx5_1"].hw_counters == {name: 18747 if name == "rx_write_requests" else 0
                                           for name in REAL_MLX5_HW_COUNTERS}


def test_counter_catalog_names_real_counters_and_distinct_metrics() -> None:
    assert set(RDMA_COUNTERS) <= REAL_MLX5_HW_COUNTERS | NEWER_MLX5_HW_COUNTERS
    suffixes = [spec.suffix for spec in RDMA_COUNTERS.values()]
    assert len(set(suffixes)) == len(suffixes)
    # The contract's three, and the rest in the same style.
    assert RDMA_COUNTERS["np_ecn_marked_roce_packets"].suffix == "ecn_marked_packets"
    assert RDMA_COUNTERS["np_cnp_sent"].suffix == "cnp_sent"
    assert RDMA_COUNTERS["rp_cnp_handled"].suffix == "cnp_handled"
    for name, spec in RDMA_COUNTERS.items():
        metric = f"gpunode_rdma_{spec.suffix}_total"
        assert metric.replace("_", "").isalnum() and metric.islower(), name
        assert not spec.suffix.endswith("_total"), name
        assert spec.help and "\n" not in spec.help and spec.help.endswith("."), name
    for name in ("out_of_sequence", "packet_seq_err", "local_ack_timeout_err", "implied_nak_seq_err",
                 "duplicate_request", "rnr_nak_retry_err", "out_of_buffer", "rp_cnp_ignored"):
        assert name in RDMA_COUNTERS


# --- rdma_ports: a /sys that is not tidy ---------------------------------------------------------------


def test_no_rdma_at_all(tmp_path: Path) -> None:
    assert rdma_ports(tmp_path) == []
    (tmp_path / "class").mkdir()
    (tmp_path / "class" / "infiniband").write_text("")  # not a directory
    assert rdma_ports(tmp_path) == []


def test_bad_counter_files_are_left_out(sysfs: Path) -> None:
    hw = port_dir(sysfs, "mlx5_0") / "hw_counters"
    (hw / "np_cnp_sent").write_text("N/A\n")
    (hw / "rp_cnp_ignored").write_bytes(b"\xff\xfe\n")
    (hw / "out_of_buffer").unlink()
    (hw / "out_of_buffer").mkdir()  # reading fails
    (hw / "duplicate_request").write_text("-3\n")
    (hw / "rx_write_requests").write_text("18446744073709551615\n")  # u64 max is a value
    counters = by_device(rdma_ports(sysfs))["mlx5_0"].hw_counters
    assert set(REAL_MLX5_HW_COUNTERS) - set(counters) == {"np_cnp_sent", "rp_cnp_ignored", "out_of_buffer",
                                                           "duplicate_request"}
    assert counters["rx_write_requests"] == 2**64 - 1
    assert counters["np_ecn_marked_roce_packets"] == 184302
    assert "lifespan" not in counters


def test_port_without_hw_counters(sysfs: Path) -> None:
    # A container's view in shared RDMA namespace mode has no hw_counters directory.
    shutil.rmtree(port_dir(sysfs, "mlx5_1") / "hw_counters")
    ports = by_device(rdma_ports(sysfs))
    assert ports["mlx5_1"] == RDMAPort("mlx5_1", "1", "enp64s0np0", "Ethernet", {}, pci_address="0000:40:00.0")
    assert ports["mlx5_0"].hw_counters


def test_netdev_falls_back_to_the_pci_function(sysfs: Path) -> None:
    # GID table empty (every ndevs/N read fails: here, the files are gone): the function's netdev.
    shutil.rmtree(port_dir(sysfs, "mlx5_0") / "gid_attrs")
    (port_dir(sysfs, "mlx5_1") / "gid_attrs" / "ndevs" / "0").write_text("\n")
    ports = by_device(rdma_ports(sysfs))
    assert ports["mlx5_0"].netdev == "stor0"
    assert ports["mlx5_1"].netdev == "enp64s0np0"


def test_gid_entry_1_when_entry_0_is_empty(sysfs: Path) -> None:
    ndevs = port_dir(sysfs, "mlx5_0") / "gid_attrs" / "ndevs"
    (ndevs / "0").unlink()
    (ndevs / "1").write_text("bond0\n")  # RoCE LAG: the GIDs belong to the bond
    assert by_device(rdma_ports(sysfs))["mlx5_0"].netdev == "bond0"


def test_fallback_with_several_netdevs_on_one_function(sysfs: Path) -> None:
    shutil.rmtree(port_dir(sysfs, "mlx5_0") / "gid_attrs")
    function_net = (sysfs / "class" / "infiniband" / "mlx5_0").resolve().parent.parent / "net"
    for name, dev_port in (("eth4", "1\n"), ("eth5", "2\n")):  # mlx4-style: one function, ports 1 and 2
        (function_net / name).mkdir()
        (function_net / name / "dev_port").write_text(dev_port)
    assert by_device(rdma_ports(sysfs))["mlx5_0"].netdev == "stor0"  # dev_port 0 is port 1
    (function_net / "eth5" / "dev_port").write_text("0\n")
    assert by_device(rdma_ports(sysfs))["mlx5_0"].netdev == ""  # two claim port 1: unknown


def test_infiniband_port_netdev_is_the_functions_and_unknown_link_layers_have_none(sysfs: Path) -> None:
    (port_dir(sysfs, "mlx5_0") / "link_layer").write_text("InfiniBand\n")
    (port_dir(sysfs, "mlx5_1") / "link_layer").write_text("Unknown\n")
    # InfiniBand: the GID table is not read (an IB GID has no netdev); the function's only netdev is.
    (port_dir(sysfs, "mlx5_0") / "gid_attrs" / "ndevs" / "0").write_text("enp64s0np0\n")
    ports = by_device(rdma_ports(sysfs))
    assert (ports["mlx5_0"].link_layer, ports["mlx5_0"].netdev) == ("InfiniBand", "stor0")
    assert (ports["mlx5_1"].link_layer, ports["mlx5_1"].netdev) == ("", "")
    assert ports["mlx5_0"].hw_counters["np_cnp_sent"] == 61877  # counters are read all the same
    (port_dir(sysfs, "mlx5_0") / "link_layer").unlink()
    assert by_device(rdma_ports(sysfs))["mlx5_0"].link_layer == ""


def test_infiniband_netdev_ambiguous_is_unknown(sysfs: Path) -> None:
    """An IPoIB child interface (a P_Key, ib0.8001) on the same function and port: no guess."""
    function = (sysfs / "class" / "net" / "ibp79s0").resolve().parent.parent
    child = function / "net" / "ibp79s0.8001"
    shutil.copytree(function / "net" / "ibp79s0", child, symlinks=True)
    assert by_device(rdma_ports(sysfs))["mlx5_2"].netdev == ""
    (child / "dev_port").write_text("1\n")  # a second port's netdev: this port's is clear again
    assert by_device(rdma_ports(sysfs))["mlx5_2"].netdev == "ibp79s0"


def test_pci_address_of_a_software_device_is_unknown(sysfs: Path) -> None:
    """rxe (soft RoCE) lives under devices/virtual, its device link to the netdev's function: not itself."""
    rxe = sysfs / "devices" / "virtual" / "infiniband" / "rxe0"
    shutil.copytree(port_dir(sysfs, "mlx5_1").parent.parent, rxe, symlinks=True)
    (sysfs / "class" / "infiniband" / "rxe0").symlink_to("../../devices/virtual/infiniband/rxe0")
    ports = by_device(rdma_ports(sysfs))
    assert ports["rxe0"].pci_address == "" and ports["rxe0"].netdev == "enp64s0np0"  # its GID table's netdev
    assert ports["mlx5_1"].pci_address == "0000:40:00.0"


def test_pci_address_from_the_device_link(sysfs: Path) -> None:
    """A class entry that is not under its function (an odd kernel or a copied tree): IBDEV/device."""
    ibdev = sysfs / "class" / "infiniband" / "mlx5_1"
    function = ibdev.resolve().parent.parent
    moved = sysfs / "devices" / "elsewhere" / "mlx5_1"
    moved.parent.mkdir()
    shutil.move(str(ibdev.resolve()), moved)
    ibdev.unlink()
    ibdev.symlink_to(os.path.relpath(moved, ibdev.parent))
    (moved / "device").unlink()
    (moved / "device").symlink_to(os.path.relpath(function, moved))
    assert by_device(rdma_ports(sysfs))["mlx5_1"].pci_address == "0000:40:00.0"


def test_gid_ndev_names_are_checked(sysfs: Path) -> None:
    ndevs = port_dir(sysfs, "mlx5_0") / "gid_attrs" / "ndevs"
    (ndevs / "0").write_text("../../etc\n")
    (ndevs / "1").write_bytes(b"\xff\n")
    assert by_device(rdma_ports(sysfs))["mlx5_0"].netdev == "stor0"  # from the function instead


def test_devices_and_ports_in_numeric_order(tmp_path: Path) -> None:
    for device in ("mlx5_10", "mlx5_2", "irdma0"):
        for port in ("2", "1", "10", "lost+found"):
            (tmp_path / "class" / "infiniband" / device / "ports" / port).mkdir(parents=True)
    (tmp_path / "class" / "infiniband" / "mlx5_2" / "ports" / "3").write_text("")  # not a directory
    ports = rdma_ports(tmp_path)
    assert [(p.device, p.port) for p in ports] == [
        (d, p) for d in ("irdma0", "mlx5_2", "mlx5_10") for p in ("1", "2", "10")]
    assert all(p == RDMAPort(p.device, p.port, "", "", {}) for p in ports)


def test_a_device_without_ports_is_skipped(sysfs: Path) -> None:
    shutil.rmtree(port_dir(sysfs, "mlx5_0").parent)
    assert [p.device for p in rdma_ports(sysfs)] == ["mlx5_1", "mlx5_2"]


def test_fixture_links_are_relative_like_the_kernels(sysfs: Path) -> None:
    for cls, names in (("net", ["enp64s0np0", "ibp79s0", "stor0"]), ("infiniband", ["mlx5_0", "mlx5_1", "mlx5_2"])):
        links = sysfs / "class" / cls
        assert sorted(os.listdir(links)) == names
        for name in names:
            target = os.readlink(links / name)
            assert target.startswith("../../devices/pci0000:"), target
            assert (links / name).resolve().is_relative_to(sysfs.resolve() / "devices")
            assert os.readlink(links / name / "device").startswith("../../../0000:")


@given(st.one_of(st.text(), st.from_regex(r"[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-9]", fullmatch=True)))
def test_pci_address_is_canonical_or_empty(name: str) -> None:
    address = net.pci_address(os.path.join("/sys/devices/pci0000:15", name))
    assert address == "" or canonical_bus_id(address) == address
