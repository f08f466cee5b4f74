"""Which GPU a PCI bus id is: its NVML index and UUID, from NVML or, without it, sysfs and procfs.

Without NVML, the index is the GPU's place in PCI bus order (NVML's default
enumeration order) and the UUID comes from the driver's
/proc/driver/nvidia/gpus/<bus id>/information, which exists whenever the
driver that logged the Xid is loaded.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

from pynvml import NVMLError

from gpunode_exporter.nvml import Session
from gpunode_exporter.sysfs.pci import BusScanner, canonical_bus_id

log = logging.getLogger(__name__)
Identity = tuple[str, str]  # (gpu index, uuid); "" where unknown


class GpuDirectory:
    """GPUs come and go rarely: the answer is kept for max_age seconds, except that a bus id
    not in it makes lookup() ask again (a GPU the driver has only just named)."""

    def __init__(self, session: Session, sysfs: Path, procfs: Path, max_age: float = 60.0) -> None:
        self._session = session
        self._scanner = BusScanner(sysfs)
        self._procfs = procfs
        self._max_age = max_age
        self._cached: dict[str, Identity] = {}
        self._cached_at = float("-inf")
        self._lock = threading.Lock()  # the tracker's thread and scrapes both ask

    def identities(self, fresh: bool = False) -> dict[str, Identity]:
        """Canonical bus id -> identity for every GPU seen (within max_age, or now if fresh)."""
        with self._lock:
            if fresh or time.monotonic() - self._cached_at > self._max_age:
                self._cached, self._cached_at = self._read(), time.monotonic()
            return self._cached

    def lookup(self, bus: str) -> Identity:
        found = self.identities().get(bus)
        return found if found is not None else self.identities(fresh=True).get(bus, ("", ""))

    def _read(self) -> dict[str, Identity]:
        try:
            found = {canonical_bus_id(d.pci_bus_id): (str(d.index), d.uuid)
                     for d in self._session.devices() if d.pci_bus_id}
            if found:
                return found
        except (NVMLError, ValueError) as err:  # ValueError: NVML returned an odd bus id
            log.debug("NVML cannot name GPUs (%s); using sysfs", err)
        try:
            gpus = self._scanner.scan()
        except OSError:
            return {}
        return {gpu.address: (str(index), self._uuid(gpu.address)) for index, gpu in enumerate(gpus)}

    def _uuid(self, bus: str) -> str:
        try:
            text = (self._procfs / "driver" / "nvidia" / "gpus" / bus / "information").read_text()
        except (OSError, UnicodeDecodeError):
            return ""
        for line in text.splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "GPU UUID":
                return value.strip()
        return ""
