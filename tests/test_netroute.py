"""Route lookups over real netlink, inside a namespace the test makes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from exporter.netroute import CachedLookup
from tests.netns import STORAGE_DEVICE, storage_netns

ROOT = Path(__file__).parent.parent
PROBE = ("import json, sys; from exporter.netroute import route_device; "
         "print(json.dumps({a: route_device(a) for a in sys.argv[1:]}))")


def test_route_device_in_a_namespace() -> None:
    addresses = ["10.20.0.5", "10.20.255.1", "192.0.2.1", "127.0.0.1", "nfs.example", "fd00::1"]
    with storage_netns() as ns:
        out = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", PROBE, *addresses],
                             check=True, capture_output=True, text=True, cwd=ROOT)
    got = json.loads(out.stdout)
    assert got == {"10.20.0.5": STORAGE_DEVICE, "10.20.255.1": STORAGE_DEVICE, "192.0.2.1": None,
                   "127.0.0.1": "lo", "nfs.example": None, "fd00::1": None}


def test_cached_lookup_asks_once_per_ttl(monkeypatch) -> None:
    calls: list[str] = []
    now = [1000.0]
    monkeypatch.setattr("exporter.netroute.time.monotonic", lambda: now[0])
    lookup = CachedLookup(lambda a: calls.append(a) or "eth9", ttl=60)
    assert lookup("10.0.0.1") == lookup("10.0.0.1") == "eth9"
    now[0] += 61
    lookup("10.0.0.1")
    assert calls == ["10.0.0.1", "10.0.0.1"]
