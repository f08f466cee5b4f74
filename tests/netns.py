"""Network namespaces the tests make, so route lookups see a known routing table."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator

import pytest

# The storage network inside the namespace: stor0 has 10.20.0.2/16 and fd20::2/64.
STORAGE_DEVICE = "stor0"
STORAGE_ADDRESS = "10.20.0.2/16"
STORAGE_ADDRESS6 = "fd20::2/64"


def netns_unavailable() -> str | None:
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed"
    return None


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@contextlib.contextmanager
def storage_netns() -> Iterator[str]:
    """A fresh namespace with lo and a storage interface; no default route."""
    reason = netns_unavailable()
    if reason:
        pytest.skip(reason)
    name = f"gpunode-test-{uuid.uuid4().hex[:8]}"
    try:
        _ip("netns", "add", name)
    except subprocess.CalledProcessError as err:
        pytest.skip(f"cannot create a network namespace here: {err.stderr.strip()}")
    try:
        _ip("-n", name, "link", "set", "lo", "up")
        # A veth pair with both ends inside: sandboxes often lack the dummy driver.
        _ip("-n", name, "link", "add", STORAGE_DEVICE, "type", "veth", "peer", "name", "peer0")
        _ip("-n", name, "addr", "add", STORAGE_ADDRESS, "dev", STORAGE_DEVICE)
        _ip("-n", name, "addr", "add", STORAGE_ADDRESS6, "dev", STORAGE_DEVICE, "nodad")
        _ip("-n", name, "link", "set", "peer0", "up")
        _ip("-n", name, "link", "set", STORAGE_DEVICE, "up")
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False, capture_output=True)
