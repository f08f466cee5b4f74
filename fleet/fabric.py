"""The fabric of a simulated node: its RDMA ports as node_exporter and gpunode-exporter serve them, and its
NVLink fabric as NVML reports it (docs/fleet.md, "The fabric").

Per port (four InfiniBand HCAs and one RoCE NIC, as in PORTS):
- node_exporter's infiniband collector: `node_infiniband_state_id` (1 DOWN, 2 INIT, 3 ARMED, 4 ACTIVE),
  `node_infiniband_physical_state_id` (2 Polling, 3 Disabled, 5 LinkUp), `node_infiniband_rate_bytes_per_second`,
  `node_infiniband_link_downed_total` (the port's 8-bit PMA counter: it stops at 255) and
  `node_infiniband_info{board_id,device,firmware_version,hca_type}`;
- its netclass collector for the port's netdev (the IPoIB netdev of an InfiniBand port, the RoCE NIC's own):
  `node_network_up`, `node_network_carrier`, `node_network_carrier_changes_total` and its up and down parts;
- gpunode-exporter: `gpunode_rdma_port_info{device,port,netdev,link_layer,pci_address}`,
  `gpunode_fabric_ports_expected`, and the kernel's link lines (`nic_link_down`, `nic_link_up` of the netdev,
  through fleet/kernel.py's event series).
Per GPU `gpunode_gpu_fabric_state` (1 not started, 2 in progress, 3 completed) and `gpunode_gpu_fabric_healthy`;
per node `gpunode_nvswitches_visible{source="pci"}` and `gpunode_nvswitches_expected` (an HGX H100's four).

What each fault and distractor does:
- port_down: the cable pulled (or a transceiver dead): DOWN with Polling (`phys: 2`) or Disabled (3) from `at`
  for `lasts` (default: to the end), the trained rate gone (10 Gb/s, as sysfs reads a port without a link),
  one link_downed, the carrier off (one down change), a kernel `Link down`; back ACTIVE after;
- port_flapping: the link drops and retrains within a second or two, `per_hour` times (6) for `lasts` (3 h),
  the first at `at`: no scrape reads it down, but link_downed, the carrier's down and up changes and the
  kernel's link lines count each flap; with `saturated: true` link_downed stood at 255 before (the port
  flapped for months) and only the carrier and the kernel show the flaps;
- port_degraded: a reseat at `at` (down `down` seconds, 40) that trains the link at `rate` Gb/s (200) and
  stays ACTIVE there;
- fabric_not_ready: the node reboots at `at` (gone `down`, 4 minutes) and its NVLink fabric does not come
  up (`cause`): `not_started` (every GPU 1: the fabric manager did not start), `in_progress` (every GPU
  stuck at 2), `nvswitch_missing` (one of the four switches gone from the bus); or, without a reboot,
  `unhealthy` (the GPU `gpu` completed but unhealthy: its bandwidth degraded) from `at`; for `lasts`
  (default: to the end);
- distractors: `never_cabled` (a port DOWN, Polling, from the start: the node's `gpunode_fabric_ports_expected`
  counts the cabled ones), `link_downed_saturated` (a port's link_downed at 255 from the start, holding
  still), `reboot` (a planned reboot: the node's targets down `down`, 4 minutes, its counters reset,
  each port INIT or ARMED 30-90 s after boot, the fabric in progress 40-80 s, then all up).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from fleet.causes import GPUS, IB_RATE
from fleet.scenario import Event

REBOOT_DOWN = 240.0  # seconds a reboot keeps the node's targets down: shorter than GpuNodeDown's 5 minutes
NO_LINK_RATE = 1.25e9  # bytes/s: sysfs `rate` of a port without a link ("10 Gb/sec (4X SDR)")
NVSWITCHES = 4  # an HGX H100 baseboard's
LINK_DOWNED_MAX = 255.0  # the PMA's PortCounters LinkDownedCounter is 8 bits and saturates


@dataclass(frozen=True)
class Port:
    device: str
    netdev: str
    pci_address: str
    link_layer: str
    rate: float  # bytes/s when trained as it should be
    board_id: str
    hca_type: str = "MT4129"  # ConnectX-7
    firmware: str = "28.39.1002"


# As a DGX H100 names its compute HCAs (ibpBUSs0 after the PCI bus), and a RoCE NIC at 200 Gb/s for storage.
PORTS = (*(Port(f"mlx5_{k}", f"ibp{bus}s0", f"0000:{bus:02x}:00.0", "InfiniBand", IB_RATE, "MT_0000000838")
            for k, bus in enumerate((0x18, 0x40, 0x5e, 0x9a))),
         Port("mlx5_4", "eth1", "0000:c0:00.0", "Ethernet", 2.5e10, "MT_0000000834"))


@dataclass
class NodeFabric:
    """One node's fabric per sample, and the kernel's link lines: (kind, netdev) -> times."""

    ports: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)  # device -> series name -> values
    gpu_state: np.ndarray = field(default_factory=lambda: np.zeros(0))  # (GPUS, samples)
    gpu_healthy: np.ndarray = field(default_factory=lambda: np.zeros(0))
    nvswitches: np.ndarray = field(default_factory=lambda: np.zeros(0))
    expected_ports: float = float(len(PORTS))
    link_events: dict[tuple[str, str], list[float]] = field(default_factory=dict)


def reboots(events: list[Event]) -> list[tuple[float, float]]:
    """(down from, back at) of each reboot among a node's faults and distractors, seconds from the start."""
    out = []
    for e in events:
        if e.kind == "reboot" or (e.kind == "fabric_not_ready" and e.param("cause", "not_started") != "unhealthy"):
            out.append((e.at, e.at + e.duration("down", REBOOT_DOWN)))
    return sorted(out)


def onset(f: Event) -> float:
    """The fault's reference time: a fabric that should have come up when the node is back; else `at`."""
    if f.kind == "fabric_not_ready" and f.param("cause", "not_started") != "unhealthy":
        return f.at + f.duration("down", REBOOT_DOWN)
    return f.at


def _flaps(rng: np.random.Generator, f: Event) -> list[float]:
    per_second = float(f.param("per_hour", 6)) / 3600
    span = f.duration("lasts", 3 * 3600)
    gaps = rng.exponential(1 / per_second, int(span * per_second * 2) + 16)
    return [f.at] + [float(x) for x in f.at + np.cumsum(gaps) if x < f.at + span]


def build(t: np.ndarray, step: float, node: int, seed: int, faults: list[Event],
          distractors: list[Event]) -> NodeFabric:
    rng = np.random.default_rng((seed, node, 0x4642))
    end = float(t[-1]) + step
    out = NodeFabric()
    boots = reboots([*faults, *distractors])
    events: dict[tuple[str, str], list[float]] = {}

    def log(kind: str, netdev: str, at: float) -> None:
        if at < end:
            events.setdefault((kind, netdev), []).append(at)

    for k, port in enumerate(PORTS):
        mine = [e for e in [*faults, *distractors] if int(e.param("port", 0)) == k and e.kind in (
            "port_down", "port_flapping", "port_degraded", "never_cabled", "link_downed_saturated")]
        state, phys = np.full(t.size, 4.0), np.full(t.size, 5.0)
        rate = np.full(t.size, port.rate)
        downs: list[float] = []  # link_downed counts: each time the link went down
        ups: list[float] = []  # the carrier came back
        saturated = any(e.kind == "link_downed_saturated" or (e.kind == "port_flapping" and e.param("saturated", False))
                        for e in mine)
        for e in mine:
            if e.kind == "never_cabled":
                state[:], phys[:], rate[:] = 1.0, 2.0, NO_LINK_RATE
                out.expected_ports -= 1
            elif e.kind == "port_down":
                gone = (t >= e.at) & (t < e.at + e.duration("lasts", end))
                state[gone], phys[gone], rate[gone] = 1.0, float(e.param("phys", 2)), NO_LINK_RATE
                downs.append(e.at)
                if e.at + e.duration("lasts", end) < end:
                    ups.append(e.at + e.duration("lasts", end))
            elif e.kind == "port_flapping":
                for at in _flaps(rng, e):
                    downs.append(at)
                    ups.append(at + rng.uniform(0.5, 2.0))  # back before any scrape can read it down
            elif e.kind == "port_degraded":  # the reseat's down seen by a scrape or not: one flap either way
                back = e.at + e.duration("down", 40)
                reseat = (t >= e.at) & (t < back)
                state[reseat], phys[reseat], rate[reseat] = 1.0, 2.0, NO_LINK_RATE
                rate[t >= back] = float(e.param("rate", 200)) * 1e9 / 8
                downs.append(e.at)
                ups.append(back)
        for at in downs:
            log("nic_link_down", port.netdev, at)
        for at in ups:
            log("nic_link_up", port.netdev, at)
        never = any(e.kind == "never_cabled" for e in mine)
        since = 0.0  # the last boot: node_exporter's counters and the HCA's PMA counters start again there
        link_downed, down_changes, up_changes = np.zeros(t.size), np.zeros(t.size), np.zeros(t.size)
        for gone, back in [*boots, (end, end)]:
            window = (t >= since) & (t < gone)
            counted = np.searchsorted(np.sort([d for d in downs if since <= d < gone]), t[window], side="right")
            base = LINK_DOWNED_MAX if saturated and since == 0.0 else 0.0
            link_downed[window] = np.minimum(base + counted, LINK_DOWNED_MAX)
            down_changes[window] = counted
            first = 0.0 if never or since > 0 else 1.0  # the carrier came up once when the link first trained
            up_changes[window] = first + np.searchsorted(np.sort([u for u in ups if since <= u < gone]), t[window],
                                                         side="right")
            if gone >= end:
                break
            # After the boot an InfiniBand port trains (LinkUp) and waits INIT, then ARMED, for the subnet
            # manager; a RoCE port is up as soon as its link is.
            active = back + (rng.uniform(30, 90) if port.link_layer == "InfiniBand" else 0.0)
            booting = (t >= back) & (t < active) & (state >= 4)
            state[booting] = np.where(t[booting] < (back + active) / 2, 2.0, 3.0)
            if not never:
                log("nic_link_up", port.netdev, active)
                ups.append(active)
            since = back
        carrier = np.where(state >= 4, 1.0, 0.0)
        out.ports[port.device] = {"state": state, "phys": phys, "rate": rate, "link_downed": link_downed,
                                  "carrier": carrier, "down_changes": down_changes, "up_changes": up_changes}
    out.link_events = {key: sorted(times) for key, times in events.items()}

    # The NVLink fabric: completed; after each boot in progress 40-80 s; a fault's state from the boot on.
    out.gpu_state, out.gpu_healthy = np.full((GPUS, t.size), 3.0), np.ones((GPUS, t.size))
    out.nvswitches = np.full(t.size, float(NVSWITCHES))
    for _gone, back in boots:
        out.gpu_state[:, (t >= back) & (t < back + rng.uniform(40, 80))] = 2.0
    for f in faults:
        if f.kind != "fabric_not_ready":
            continue
        cause = f.param("cause", "not_started")
        start = onset(f)
        window = (t >= start) & (t < start + f.duration("lasts", end))
        if cause == "not_started":
            out.gpu_state[:, window] = 1.0
        elif cause == "in_progress":
            out.gpu_state[:, window] = 2.0
        elif cause == "unhealthy":
            out.gpu_healthy[f.gpu, window] = 0.0
        elif cause == "nvswitch_missing":
            out.nvswitches[window] = NVSWITCHES - 1
    return out


def series(fab: NodeFabric, t: np.ndarray, emit) -> Iterator:
    """The node's fabric series, through simulate's emit (its instance and job labels, NaN while it is away)."""
    ones = np.ones(t.size)
    for port in PORTS:
        p = fab.ports[port.device]
        labels = {"device": port.device, "port": "1"}
        yield emit("node_infiniband_state_id", "node", p["state"], **labels)
        yield emit("node_infiniband_physical_state_id", "node", p["phys"], **labels)
        yield emit("node_infiniband_rate_bytes_per_second", "node", p["rate"], **labels)
        yield emit("node_infiniband_link_downed_total", "node", p["link_downed"], **labels)
        yield emit("node_infiniband_info", "node", ones, board_id=port.board_id, device=port.device,
                   firmware_version=port.firmware, hca_type=port.hca_type)
        net = {"device": port.netdev}
        yield emit("node_network_up", "node", p["carrier"], **net)  # operstate follows the carrier here
        yield emit("node_network_carrier", "node", p["carrier"], **net)
        yield emit("node_network_carrier_up_changes_total", "node", p["up_changes"], **net)
        yield emit("node_network_carrier_down_changes_total", "node", p["down_changes"], **net)
        yield emit("node_network_carrier_changes_total", "node", p["up_changes"] + p["down_changes"], **net)
        yield emit("gpunode_rdma_port_info", "gpunode", ones, netdev=port.netdev, link_layer=port.link_layer,
                   pci_address=port.pci_address, **labels)
    yield emit("gpunode_fabric_ports_expected", "gpunode", ones * fab.expected_ports)
    yield emit("gpunode_nvswitches_expected", "gpunode", ones * NVSWITCHES)
    yield emit("gpunode_nvswitches_visible", "gpunode", fab.nvswitches, source="pci")
