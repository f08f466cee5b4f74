"""Network links and RDMA ports from sysfs: a netdev's link speed, and each RDMA port's
link layer, netdev, PCI function and hardware counters.

What the kernel exposes, and where (drivers/infiniband/core/sysfs.c, net/core/net-sysfs.c):

- <sysfs>/class/net/DEV/speed: speed_show() prints the ethtool link speed in Mb/s
  with "%d", so SPEED_UNKNOWN (0xffffffff) reads "-1" (kernels that printed it
  unsigned gave "4294967295"). It *fails* with EINVAL when the interface is down
  (not netif_running) or the driver has no get_link_ksettings (lo, ifb): a
  failing read, not a value, is how sysfs says "no speed".
- <sysfs>/class/infiniband/IBDEV/ports/N/hw_counters/NAME: one file per counter
  the driver registered (mlx5: drivers/infiniband/hw/mlx5/counters.c), each
  "%llu\\n", plus `lifespan`, the writable cache lifetime in ms (not a counter).
  Reads are served from a cache refreshed at most every `lifespan` ms (10 by
  default), so reading all files in a row costs one firmware query. Optional
  counters (IB_STAT_FLAG_OPTIONAL: mlx5's cc_rx_ce_pkts, rdma_tx_bytes, ...)
  are never in sysfs; only RDMA netlink shows them. hw_counters is only on the
  device of the network namespace that owns it: in a container with the default
  shared RDMA namespace mode the port directory exists without it.
- The netdev behind a RoCE port: ports/N/gid_attrs/ndevs/I prints the name of the
  netdev of GID table entry I (print_ndev()), EINVAL for an empty entry. Entries 0
  and 1 are the port's default GIDs (RoCE v1 and v2, derived from the netdev's
  MAC), added when the netdev registers and removed only when it unregisters or
  changes address (drivers/infiniband/core/roce_gid_mgmt.c), so they are there
  even while the link is down, and they name the bond, not the slave, under RoCE
  LAG. That is what rdma_ports() reads first. The fallback is the PCI function's
  own netdevs, IBDEV/device/net/*: right for one netdev per function (mlx5) or,
  with several, the one whose dev_port is N-1 (mlx4's two ports on one
  function); ambiguous otherwise (switchdev representors), and then unknown.
- The PCI function of an RDMA device: class/infiniband/IBDEV links to
  devices/.../FUNCTION/infiniband/IBDEV (ib_register_device() makes the device's
  parent the PCI function), and IBDEV/device links to FUNCTION as well. A software
  device (rxe, siw) lives under devices/virtual and has no PCI function.
- An InfiniBand port's netdev is its IPoIB interface (ib0, ibp24s0), a child of the
  same PCI function: found by the function's-netdevs rule above, so that carrier
  changes and the kernel's link lines of the interface can be put on the port.

Nothing here raises for one bad device or file: an unreadable value is None,
an unreadable counter is left out, a port whose directory vanished is skipped.
"""

from __future__ import annotations

import os
import re
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from gpunode_exporter.numbers import KernelNumberError, s64, u64
from gpunode_exporter.sysfs import read_line
from gpunode_exporter.sysfs.pci import canonical_bus_id

# SPEED_UNKNOWN (include/uapi/linux/ethtool.h: (__u32)-1) as "%d" and as "%u".
_UNKNOWN_SPEEDS = frozenset({-1, 0xFFFFFFFF})
_BITS_PER_MBIT = 1_000_000


def _valid_name(name: str) -> bool:
    # dev_valid_name() in net/core/dev.c: no "/", ":" or whitespace, not "." or "..".
    # Checking it keeps a caller-supplied name from walking out of class/net.
    return (0 < len(name) < 16 and name not in (".", "..")
            and not any(c == "/" or c == ":" or c.isspace() for c in name))


def link_speed_bytes(sysfs: Path, device: str) -> float | None:
    """<sysfs>/class/net/DEV/speed (Mb/s) as bytes/s; None when unknown: file missing, -1/4294967295 (unknown),
    or reading fails with EINVAL (link down: the kernel returns an error for speed then)."""
    if not _valid_name(device):
        return None
    text = read_line(sysfs / "class" / "net" / device / "speed")
    if text is None:
        return None
    try:
        mbps = s64(text)  # ethtool's speed is printed %d; -1 is unknown
    except KernelNumberError:
        return None
    if mbps in _UNKNOWN_SPEEDS or mbps <= 0:  # some drivers report 0 without a link
        return None
    return mbps * _BITS_PER_MBIT / 8


class CounterSpec(NamedTuple):
    """How an RDMA hw_counters file becomes a metric: gpunode_rdma_<suffix>_total{device,port}."""

    suffix: str
    help: str


# The hw_counters that say a RoCE/InfiniBand fabric is congested or losing packets,
# by their sysfs names (mlx5: drivers/infiniband/hw/mlx5/counters.c, arrays cong_cnts,
# out_of_seq_q_cnts, retrans_q_cnts, basic_q_cnts, extended_err_cnts, roce_accl_cnts,
# ext_ppcnt_cnts). NP = notification point (the receiver that sees ECN marks and sends
# CNPs), RP = reaction point (the sender that slows down on a CNP). The help texts
# follow NVIDIA's "Understanding mlx5 Linux Counters and Status Parameters".
RDMA_COUNTERS: dict[str, CounterSpec] = {
    # DCQCN congestion control (cong_cnts; present when the firmware allows cc queries)
    "np_ecn_marked_roce_packets": CounterSpec(
        "ecn_marked_packets", "RoCEv2 packets received with ECN Congestion Experienced set (congestion on the path "
        "to this port)."),
    "np_cnp_sent": CounterSpec(
        "cnp_sent", "Congestion notification packets this port sent back to senders of ECN-marked packets."),
    "rp_cnp_handled": CounterSpec(
        "cnp_handled", "Congestion notification packets this port received and acted on by lowering its send rate."),
    "rp_cnp_ignored": CounterSpec(
        "cnp_ignored", "Congestion notification packets this port received and ignored (congestion control off or "
        "not enabled for the flow)."),
    # Loss and retransmission (out_of_seq_q_cnts, retrans_q_cnts)
    "out_of_sequence": CounterSpec(
        "out_of_sequence_packets", "Packets received out of sequence: an earlier packet of the flow was lost."),
    "packet_seq_err": CounterSpec(
        "packet_sequence_errors", "Sequence-error NAKs received: the peer saw a gap and asked for a retransmission."),
    "implied_nak_seq_err": CounterSpec(
        "implied_nak_sequence_errors", "Times an ACK with a PSN past the expected read response implied a lost "
        "packet and forced a retransmission."),
    "local_ack_timeout_err": CounterSpec(
        "local_ack_timeouts", "Times a sending queue pair's ACK timer expired before the peer answered; it "
        "retransmits."),
    "duplicate_request": CounterSpec(
        "duplicate_requests", "Requests received that had already been executed (the sender retransmitted them)."),
    "rnr_nak_retry_err": CounterSpec(
        "rnr_naks_received", "Receiver-not-ready NAKs received: the peer had no receive buffer posted."),
    "out_of_buffer": CounterSpec(
        "out_of_buffer_drops", "Packets dropped because no receive work request was posted for their queue pair."),
    # Errors that end a queue pair (the last two of extended_err_cnts; newer kernels only)
    "req_transport_retries_exceeded": CounterSpec(
        "transport_retries_exceeded", "Queue pairs that used up their transport retries and went to error."),
    "req_rnr_retries_exceeded": CounterSpec(
        "rnr_retries_exceeded", "Queue pairs that used up their receiver-not-ready retries and went to error."),
    # Adaptive retransmission (roce_accl_cnts) and corrupt packets (ext_ppcnt_cnts)
    "roce_adp_retrans": CounterSpec(
        "adaptive_retransmissions", "Adaptive retransmissions of RoCE traffic."),
    "roce_adp_retrans_to": CounterSpec(
        "adaptive_retransmission_timeouts", "Times RoCE traffic hit a timeout under adaptive retransmission."),
    "roce_slow_restart": CounterSpec(
        "slow_restarts", "Times RoCE slow restart was used after a loss."),
    "roce_slow_restart_cnps": CounterSpec(
        "slow_restart_cnps", "Congestion notification packets generated by RoCE slow restart."),
    "rx_icrc_encapsulated": CounterSpec(
        "icrc_error_packets", "RoCE packets received with an invariant CRC error."),
}

# Not counters, though they hold integers: the cache lifetime setting.
_NOT_COUNTERS = frozenset({"lifespan"})


@dataclass(frozen=True)
class RDMAPort:
    """One port of an RDMA device as sysfs shows it."""

    device: str  # mlx5_0
    port: str  # "1"
    netdev: str  # the Ethernet netdev behind a RoCE port, the IPoIB one of an InfiniBand port ("" unknown)
    link_layer: str  # "Ethernet" | "InfiniBand" | "" (ports/N/link_layer)
    hw_counters: dict[str, int]  # every file in ports/N/hw_counters that holds an integer (not lifespan)
    malformed: int = 0  # hw_counters files holding something no kernel prints ("+7", "-5", "1_000")
    pci_address: str = ""  # the device's PCI function, canonical (0000:18:00.0); "" when it has none or unknown


def _natural_key(name: str) -> tuple[tuple[int, int | str], ...]:
    # mlx5_2 before mlx5_10, as `rdma link` and ibv_devices list them.
    return tuple((0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"(\d+)", name) if part)


def _listdir(path: str | int) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:  # missing, not a directory, or removed while we looked
        return []


def _hw_counters(directory: str | Path, names: Collection[str] | None = None) -> tuple[dict[str, int], int]:
    """(counters, files that hold no kernel number), of `names` only if given (a scrape reads ~16 of ~30)."""
    counters: dict[str, int] = {}
    malformed = 0
    try:  # each file opened relative to the directory: one path component to look up, not seven
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return counters, malformed
    try:
        present = _listdir(dir_fd)
        for name in sorted(present if names is None else set(present).intersection(names)):
            if name in _NOT_COUNTERS:
                continue
            text = read_line(name, dir_fd=dir_fd)  # a driver whose query fails makes the read fail: skip it
            if text is None:
                continue
            try:
                counters[name] = u64(text)  # "%llu"; a negative or odd number is no counter
            except KernelNumberError:
                malformed += 1
    finally:
        os.close(dir_fd)
    return counters, malformed


def _function_of(ibdev: str) -> str:
    """The directory of the RDMA device's PCI function (or whatever its parent is: check the name)."""
    parent = os.path.dirname(os.path.realpath(ibdev))
    if os.path.basename(parent) == "infiniband":  # devices/.../FUNCTION/infiniband/IBDEV
        return os.path.dirname(parent)
    return os.path.realpath(os.path.join(ibdev, "device"))


def pci_address(function: str) -> str:
    """The canonical PCI address a function directory is named by, "" for anything else (devices/virtual)."""
    try:
        return canonical_bus_id(os.path.basename(function))
    except ValueError:
        return ""


def _netdev_of_function(function: str, port: str) -> str:
    """The netdev of the RDMA device's own PCI function: its only one, or the one for this port."""
    net = os.path.join(function, "net")
    names = [name for name in _listdir(net) if _valid_name(name)]
    if len(names) == 1:
        return names[0]
    # Several netdevs on one function: the one for this port. dev_port counts from 0
    # (mlx4_en sets it to port - 1); representors and others won't match.
    matches = [name for name in names if read_line(os.path.join(net, name, "dev_port")) == str(int(port) - 1)]
    return matches[0] if len(matches) == 1 else ""


def _roce_netdev(ibdev: str, function: str, port: str) -> str:
    """The netdev the RDMA core uses for a RoCE port, "" if it cannot tell."""
    ndevs = os.path.join(ibdev, "ports", port, "gid_attrs", "ndevs")
    for index in ("0", "1"):  # the default GIDs; "1" covers a device with only RoCE v2 there
        name = read_line(os.path.join(ndevs, index))
        if name and _valid_name(name):
            return name
    return _netdev_of_function(function, port)


def rdma_ports(sysfs: Path, counters: Collection[str] | None = None) -> list[RDMAPort]:
    """<sysfs>/class/infiniband/*/ports/*, sorted by device (mlx5_2 before mlx5_10) then port number.
    [] if there is no class/infiniband (no RDMA drivers loaded). counters: the hw_counters to read
    (default every one)."""
    root = os.path.join(sysfs, "class", "infiniband")  # string paths: a Path per file costs as much as its read
    found: list[RDMAPort] = []
    for device in sorted(_listdir(root), key=_natural_key):
        ibdev = os.path.join(root, device)
        function = _function_of(ibdev)
        address = pci_address(function)
        for port in sorted((p for p in _listdir(os.path.join(ibdev, "ports")) if p.isdigit()), key=int):
            port_dir = os.path.join(ibdev, "ports", port)
            if not os.path.isdir(port_dir):
                continue
            link_layer = read_line(os.path.join(port_dir, "link_layer")) or ""
            if link_layer not in ("Ethernet", "InfiniBand"):
                link_layer = ""  # "Unknown" (iWARP and others), or unreadable
            if link_layer == "Ethernet":
                netdev = _roce_netdev(ibdev, function, port)
            elif link_layer == "InfiniBand" and address:
                netdev = _netdev_of_function(function, port)  # IPoIB
            else:
                netdev = ""
            hw_counters = _hw_counters(os.path.join(port_dir, "hw_counters"), counters)
            found.append(RDMAPort(device, port, netdev, link_layer, *hw_counters, pci_address=address))
    return found
