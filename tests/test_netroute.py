"""Route lookups over real netlink, inside a namespace the test makes, checked
against two independent clients: pyroute2 and iproute2's `ip route get`."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gpunode_exporter.netroute import CachedLookup, parse_reply
from tests.netns import STORAGE_DEVICE, storage_netns

ROOT = Path(__file__).parent.parent
ADDRESSES = ["10.20.0.5", "10.20.255.1", "192.0.2.1", "127.0.0.1", "fd20::9", "fd00::1", "::1"]
PROBE = """
import json, sys
from pyroute2 import IPRoute
from gpunode_exporter.netroute import route_device

def pyroute2_device(address):
    try:
        with IPRoute() as ipr:
            oif = ipr.route("get", dst=address)[0].get_attr("RTA_OIF")
            return ipr.get_links(oif)[0].get_attr("IFLA_IFNAME")
    except Exception:
        return None

print(json.dumps({a: [route_device(a), pyroute2_device(a)] for a in sys.argv[1:]}))
"""


def ip_route_get(netns: str, address: str) -> str | None:
    out = subprocess.run(["ip", "-n", netns, "route", "get", address], capture_output=True, text=True)
    match = re.search(r"\bdev (\S+)", out.stdout)
    return match.group(1) if out.returncode == 0 and match else None


def test_route_device_agrees_with_pyroute2_and_iproute2() -> None:
    with storage_netns() as ns:
        out = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", PROBE, *ADDRESSES, "nfs.example"],
                             check=True, capture_output=True, text=True, cwd=ROOT)
        iproute2 = {a: ip_route_get(ns, a) for a in ADDRESSES}
    got = json.loads(out.stdout)
    ours = {a: pair[0] for a, pair in got.items()}
    assert ours == {"10.20.0.5": STORAGE_DEVICE, "10.20.255.1": STORAGE_DEVICE, "192.0.2.1": None,
                    "127.0.0.1": "lo", "fd20::9": STORAGE_DEVICE, "fd00::1": None, "::1": "lo",
                    "nfs.example": None}
    for address in ADDRESSES:
        assert ours[address] == got[address][1] == iproute2[address], address


@pytest.mark.parametrize("reply", [b"", b"\x00" * 7, b"\xff" * 64, b"\x10\x00\x00\x00" + b"\x00" * 12])
def test_garbage_replies_mean_no_route(reply: bytes) -> None:
    assert parse_reply(reply, seq=1) is None


def test_cached_lookup_asks_once_per_ttl(monkeypatch) -> None:
    calls: list[str] = []
    now = [1000.0]
    monkeypatch.setattr("gpunode_exporter.netroute.time.monotonic", lambda: now[0])
    lookup = CachedLookup(lambda a: calls.append(a) or "eth9", ttl=60)
    assert lookup("10.0.0.1") == lookup("10.0.0.1") == "eth9"
    now[0] += 59
    lookup("10.0.0.1")
    assert calls == ["10.0.0.1"]
    now[0] += 32  # past ttl plus the largest jitter
    lookup("10.0.0.1")
    assert calls == ["10.0.0.1", "10.0.0.1"]
