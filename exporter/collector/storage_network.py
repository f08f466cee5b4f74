"""The network under the checkpoint path and the GPUs' fabric: storage interfaces' link speed, RDMA ports
(which netdev and PCI function each is, how many should be up), RoCE congestion, PFC pauses."""

from __future__ import annotations

import logging
from collections.abc import Iterator

from gpunode_exporter.collector.base import Collector, Context, Family, MetricSpec, register
from gpunode_exporter.collector.nfs import read_own_or_init
from gpunode_exporter.ethtool import Ethtool, pfc_pause_frames
from gpunode_exporter.problems import Problems
from gpunode_exporter.procfs import mountinfo
from gpunode_exporter.sysfs import net

log = logging.getLogger(__name__)

_PORT = ("device", "port")

LINK_SPEED = MetricSpec("gpunode_network_link_speed_bytes", "gauge",
                        "Link speed of an interface that carries storage traffic, in bytes per second "
                        "(absent while the link is down or the driver does not say).", ("device",))
STORAGE_INTERFACE = MetricSpec("gpunode_storage_interface_info", "gauge",
                               "An interface that carries storage traffic: it routes to an NFS server "
                               "(source=nfs_route) or is named in storage.interfaces (source=config).",
                               ("device", "source"))
PFC_PAUSE = MetricSpec("gpunode_network_pfc_pause_frames_total", "counter",
                       "PFC pause (XOFF) frames per priority, received (rx: the peer asked us to stop) or "
                       "sent (tx: we asked the peer to stop), from the driver's ethtool statistics.",
                       ("device", "direction", "priority"))
RDMA_PORT_INFO = MetricSpec("gpunode_rdma_port_info", "gauge",
                            "An RDMA port, its link layer, its netdev (RoCE: the Ethernet one; InfiniBand: IPoIB; "
                            "'' unknown) and its PCI function ('' unknown).",
                            (*_PORT, "netdev", "link_layer", "pci_address"))
PORTS_EXPECTED = MetricSpec("gpunode_fabric_ports_expected", "gauge",
                            "RDMA ports that should be ACTIVE on this node (fabric.ports_expected in --config.file).")
RDMA_COUNTERS = {name: MetricSpec(f"gpunode_rdma_{spec.suffix}_total", "counter", f"{spec.help} ({name})", _PORT)
                 for name, spec in net.RDMA_COUNTERS.items()}

PARSE_ERRORS = MetricSpec("gpunode_storage_network_parse_errors_total", "counter",
                          "RDMA hw_counters files holding no number the kernel prints (a sign, '_', a value past "
                          "64 bits), counted on every read that saw one; that counter alone is left out.")


def storage_interfaces(ctx: Context) -> dict[str, str]:
    """{device: source}: interfaces routing to NFS servers, then those configured."""
    found: dict[str, str] = {}
    try:
        _, text = read_own_or_init(ctx.procfs, "mountinfo")
    except OSError as err:
        log.debug("no mountinfo: %s", err)
        text = ""
    for address in sorted(set(mountinfo.nfs_server_addresses(text).values())):
        device = ctx.route_lookup(address)
        if device:
            found.setdefault(device, "nfs_route")
    for device in ctx.config.storage.interfaces:
        found.setdefault(device, "config")
    return found


@register
class StorageNetworkCollector(Collector):
    name = "storage_network"
    description = ("Storage interfaces (routes to NFS servers): link speed, RoCE ECN/CNP counters, PFC pauses; "
                   "and RDMA ports.")
    metrics = (STORAGE_INTERFACE, LINK_SPEED, PFC_PAUSE, RDMA_PORT_INFO, PORTS_EXPECTED, *RDMA_COUNTERS.values(),
               PARSE_ERRORS)

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self._ethtool = Ethtool()
        self._problems = Problems()  # ethtool errors per device
        self._parse_errors = 0

    def collect(self) -> Iterator[Family]:
        storage = storage_interfaces(self.ctx)
        ports = net.rdma_ports(self.ctx.sysfs, RDMA_COUNTERS)
        interfaces, speed = STORAGE_INTERFACE.family(), LINK_SPEED.family()
        for device, source in storage.items():
            interfaces.add((device, source), 1)
            bytes_per_second = net.link_speed_bytes(self.ctx.sysfs, device)
            if bytes_per_second is not None:
                speed.add((device,), bytes_per_second)
        yield from (interfaces, speed)
        # PFC on the storage interfaces and on every RoCE port's netdev (GPU traffic shares the fabric);
        # InfiniBand has credit-based flow control, no pause frames.
        pfc = PFC_PAUSE.family()
        for device in sorted(set(storage) | {p.netdev for p in ports if p.netdev and p.link_layer == "Ethernet"}):
            for (direction, priority), frames in sorted(self._pfc(device).items()):
                pfc.add((device, direction, priority), frames)
        yield pfc
        info = RDMA_PORT_INFO.family()
        counters = {name: spec.family() for name, spec in RDMA_COUNTERS.items()}
        for port in ports:
            info.add((port.device, port.port, port.netdev, port.link_layer, port.pci_address), 1)
            for name, value in port.hw_counters.items():
                if name in counters:
                    counters[name].add((port.device, port.port), value)
        yield info
        expected = PORTS_EXPECTED.family()
        if self.ctx.config.fabric.ports_expected is not None:
            expected.add((), self.ctx.config.fabric.ports_expected)
        yield expected
        yield from counters.values()
        self._parse_errors += sum(port.malformed for port in ports)
        errors = PARSE_ERRORS.family()
        errors.add((), self._parse_errors)
        yield errors

    def _pfc(self, device: str) -> dict[tuple[str, str], int]:
        try:
            frames = pfc_pause_frames(self._ethtool.stats(device))
        except OSError as err:
            # EOPNOTSUPP (no driver statistics), ENODEV (gone): no PFC series for it.
            if self._problems.new(device, err.strerror or str(err)):
                log.info("ethtool statistics of %s: %s (no PFC series for it)", device, err.strerror)
            return {}
        self._problems.solved(device)
        return frames
