"""A simulated node's network namespace: its storage network, and a link to the host.

Inside: lo, and stor0 (10.20.0.2/16, a veth whose peer is also inside) so that route
lookups to the NFS server name stor0, the storage interface of the sysfs fixture; and
`host`, a veth to the host (10.99.N.2/30; host side 10.99.N.1) over which Prometheus
scrapes the node's exporters.
"""

from __future__ import annotations

import contextlib
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class Namespace:
    name: str
    address: str  # the node's address on its link to the host


def _ip(*args: str) -> None:
    out = subprocess.run(["ip", *args], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {out.stderr.strip()}")


@contextlib.contextmanager
def node_namespace(index: int) -> Iterator[Namespace]:
    tag = uuid.uuid4().hex[:6]
    name, host_end = f"gpunode-demo-{index}-{tag}", f"gpd{index}{tag}"
    host_ip, node_ip = f"10.99.{index}.1", f"10.99.{index}.2"
    _ip("netns", "add", name)
    try:
        _ip("-n", name, "link", "set", "lo", "up")
        _ip("-n", name, "link", "add", "stor0", "type", "veth", "peer", "name", "peer0")
        _ip("-n", name, "addr", "add", "10.20.0.2/16", "dev", "stor0")
        for dev in ("peer0", "stor0"):
            _ip("-n", name, "link", "set", dev, "up")
        _ip("link", "add", host_end, "type", "veth", "peer", "name", "host", "netns", name)
        _ip("addr", "add", f"{host_ip}/30", "dev", host_end)
        _ip("-n", name, "addr", "add", f"{node_ip}/30", "dev", "host")
        _ip("link", "set", host_end, "up")
        _ip("-n", name, "link", "set", "host", "up")
        yield Namespace(name, node_ip)
    finally:
        # Deleting the namespace deletes its veths, and with them their host ends.
        subprocess.run(["ip", "netns", "del", name], check=False, capture_output=True)
