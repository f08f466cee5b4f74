"""NVIDIA GPUs (and NVSwitches, counted) on the PCI bus, from <sysfs>/bus/pci/devices.

Two kinds of file are read, and they answer different questions:

- `vendor`, `device`, `class`, `revision` are values the kernel cached in
  struct pci_dev when it enumerated the device. They never change afterwards,
  so a GPU that has fallen off the bus still shows up here as 0x10de, rev a1.
- `config` reads the device's configuration space live. A device that no
  longer answers completes every read with all-ones, which is what lspci shows
  as "rev ff". Reading it resumes a runtime-suspended device first
  (pci_config_pm_runtime_get() in drivers/pci/pci-sysfs.c), and a device in
  D3cold would read all-ones anyway, so it is read only when the device's
  runtime PM state says it is awake.

Nothing here raises for one bad device: a device whose cached attributes
cannot be read is skipped, one whose config cannot be read is reported with
responding=None.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from gpunode_exporter.sysfs import read_attribute

NVIDIA_VENDOR_ID = 0x10DE
DISPLAY_BASE_CLASS = 0x03  # 0x0300 VGA, 0x0301 XGA, 0x0302 3D controller, 0x0380 other display
# NVSwitches are "other bridge" functions: class 0x068000 (kernel log "Class = 0x68000", lspci "Bridge [0680]").
OTHER_BRIDGE_CLASS = 0x0680

# Unprivileged readers get only the first 64 bytes of config; the header fields
# needed (vendor, device, revision, class) are all in the first 12.
_CONFIG_HEADER_BYTES = 12

# power/runtime_status values in which reading config neither wakes the device
# nor reads a powered-off one: "active", and "unsupported" (runtime PM disabled
# for the device, so the PM core never suspends it). "suspended", "suspending"
# and "resuming" would be woken or raced; "error" means the PM core no longer
# knows the power state, so the device may be in D3cold and read all-ones.
_SAFE_RUNTIME_STATES = frozenset({"active", "unsupported"})

_BUS_ID = re.compile(
    r"(?P<domain>[0-9a-fA-F]{4,8}):(?P<bus>[0-9a-fA-F]{2}):(?P<device>[0-9a-fA-F]{2})(?:\.(?P<function>[0-7]))?"
)


@dataclass(frozen=True)
class PCIGPU:
    """One NVIDIA display-class PCI function as sysfs shows it."""

    address: str  # canonical bus id, the sysfs name: "0000:3b:00.0"
    device_id: int  # from the cached sysfs `device` attribute
    revision: int  # from the cached sysfs `revision` attribute
    # False: live config space reads all-ones (the GPU fell off the bus, lspci's "rev ff").
    # True: it reads a real header. None: not read (runtime-suspended or PM state
    # unknown, so reading would wake it) or unreadable.
    responding: bool | None


def _parse_bus_id(bus_id: str) -> tuple[int, int, int, int]:
    match = _BUS_ID.fullmatch(bus_id)
    if match is None:
        raise ValueError(f"not a PCI bus id: {bus_id!r}")
    device = int(match["device"], 16)
    if device > 0x1F:  # 5 bits of device number
        raise ValueError(f"PCI device number out of range in {bus_id!r}")
    function = int(match["function"]) if match["function"] is not None else 0
    return int(match["domain"], 16), int(match["bus"], 16), device, function


def canonical_bus_id(bus_id: str) -> str:
    """NVML's "00000000:3B:00.0", sysfs' "0000:3b:00.0" and the kernel log's "0000:3b:00" -> "0000:3b:00.0".

    The kernel log form has no function and means function 0. The domain is
    printed with at least 4 hex digits, more when it is larger (VMD domains
    such as 10000), as the kernel names the sysfs directory. ValueError on
    anything else.
    """
    domain, bus, device, function = _parse_bus_id(bus_id)
    return f"{domain:04x}:{bus:02x}:{device:02x}.{function:x}"


_HEX = re.compile(rb"0x[0-9a-fA-F]{1,8}")


def _read_hex(path: Path) -> int:
    """"0x10de\n" (ValueError otherwise: int(_, 16) alone would take "_" and Unicode digits)."""
    text = read_attribute(path).strip()
    if _HEX.fullmatch(text) is None:
        raise ValueError(f"{path}: not a sysfs hex id: {text[:20]!r}")
    return int(text, 16)


def _responding(device_dir: str) -> bool | None:
    try:
        status = read_attribute(os.path.join(device_dir, "power", "runtime_status"))
        runtime_status: str | None = status.decode().strip()
    except FileNotFoundError:
        runtime_status = None  # kernel without CONFIG_PM: nothing is ever runtime-suspended
    except (OSError, UnicodeDecodeError):
        return None
    if runtime_status is not None and runtime_status not in _SAFE_RUNTIME_STATES:
        return None
    try:
        header = read_attribute(os.path.join(device_dir, "config"), _CONFIG_HEADER_BYTES)
    except OSError:  # PermissionError, EIO, the device being removed under us
        return None
    if len(header) < 2:
        return None
    # A read that no device completes returns all-ones; the vendor id is what
    # the kernel itself tests (pci_bus_read_dev_vendor_id), 0xffff is never valid.
    return int.from_bytes(header[0:2], "little") != 0xFFFF


_NOT_A_GPU = (-1, -1)
_NVSWITCH = (-2, -2)


def _identify(device_dir: Path) -> tuple[int, int] | None:
    """(device id, revision) of an NVIDIA display controller, _NVSWITCH for an NVIDIA class-0x0680
    function, _NOT_A_GPU for anything else, None when the cached attributes cannot be read (try
    again later)."""
    try:
        if _read_hex(device_dir / "vendor") != NVIDIA_VENDOR_ID:
            return _NOT_A_GPU
        pci_class = _read_hex(device_dir / "class")
        if pci_class >> 8 == OTHER_BRIDGE_CLASS:
            return _NVSWITCH
        if pci_class >> 16 != DISPLAY_BASE_CLASS:
            return _NOT_A_GPU  # HD audio (0x0403), USB-C (0x0c03) functions
        return _read_hex(device_dir / "device"), _read_hex(device_dir / "revision")
    except (OSError, ValueError):  # ValueError includes UnicodeDecodeError
        # A file missing or unreadable: the device directory is half gone (a
        # hot-remove in progress) or not a PCI device the kernel fully set up.
        return None


class BusScanner:
    """nvidia_gpus() for repeated scrapes.

    The cached attributes of each device are read once per address (they never
    change, see above); a scan then costs one directory listing plus, per GPU,
    its runtime PM state and 12 bytes of live config space.
    """

    def __init__(self, sysfs: Path) -> None:
        self.devices = sysfs / "bus" / "pci" / "devices"
        self.nvswitches = 0  # NVSwitches the last scan found
        # name -> (sort key, canonical address, identity); only devices identified for good.
        self._known: dict[str, tuple[tuple[int, int, int, int], str, tuple[int, int]]] = {}

    def scan(self) -> list[PCIGPU]:
        """[] if <sysfs>/bus/pci/devices does not exist; other listing errors raise."""
        try:
            names = os.listdir(self.devices)
        except (FileNotFoundError, NotADirectoryError):
            self.nvswitches = 0
            return []
        for gone in self._known.keys() - set(names):  # hot-removed: forget, re-read if it returns
            del self._known[gone]
        found: list[tuple[tuple[int, int, int, int], PCIGPU]] = []
        switches = 0
        for name in names:
            known = self._known.get(name)
            if known is None:
                try:
                    key = _parse_bus_id(name)
                except ValueError:
                    continue
                identity = _identify(self.devices / name)
                if identity is None:
                    continue  # unreadable for now: try again next scan
                known = self._known[name] = (key, canonical_bus_id(name), identity)
            key, address, identity = known
            if identity is _NVSWITCH:
                switches += 1
            if identity is _NOT_A_GPU or identity is _NVSWITCH:
                continue
            device_id, revision = identity
            found.append((key, PCIGPU(address, device_id, revision, _responding(os.path.join(self.devices, name)))))
        self.nvswitches = switches
        # Numeric order, so that domain 10000 sorts after ffff.
        return [gpu for _, gpu in sorted(found, key=lambda item: item[0])]


def nvidia_gpus(sysfs: Path) -> list[PCIGPU]:
    """NVIDIA (vendor 0x10de) display controllers (PCI class 0x03xxxx: VGA 0x0300, 3D 0x0302) under
    <sysfs>/bus/pci/devices, sorted by address. [] if that directory does not exist."""
    return BusScanner(sysfs).scan()
