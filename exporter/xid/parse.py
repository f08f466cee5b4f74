"""NVRM Xid lines of the kernel log -> XidEvent. Pure: no I/O.

The forms the driver prints (kernel_rc.c and real logs):
    NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.
    NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus.
    NVRM: Xid (PCI:0000:18:00): 94, pid='<unknown>', name=<unknown>, Contained: ...
    NVRM: Xid (PCI:0000:3b:00 GPU-I:01 GPU-CI:00): 43, pid=..., ...     (MIG)
    NVRM: Xid (0000:01:00): 13, ...                                     (older drivers, no "PCI:")
    NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)
Xid 45 ("... caused by previous Xid") and NVLink5's 144-150 (with sub-codes in the
text) have the same head; the code is what is counted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpunode_exporter.kmsg import FACILITY_KERNEL, Record, unescape
from gpunode_exporter.numbers import U32_MAX, KernelNumberError, u64

_XID = re.compile(
    r"NVRM: Xid \("
    r"(?:PCI:)?(?P<bus>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?)?"
    r"(?:\s*GPU-I:\s*(?P<gi>\d+))?(?:\s*GPU-CI:\s*(?P<ci>\d+))?"
    r"[^)]*\):\s*(?P<xid>[^\s,]+),?\s*(?P<rest>.*)",  # the code checked by _u32, so a bad one is seen
    re.DOTALL | re.ASCII,  # \d: the driver prints ASCII digits, not any Unicode digit
)
_PROCESS = re.compile(r"pid=(?P<pid>'<unknown>'|<unknown>|\d+)(?:,\s*name=(?P<name>[^,]*))?,?\s*", re.ASCII)
_RECOVERY = re.compile(r"recovery action changed from 0x[0-9a-fA-F]+ \([^)]*\) to 0x(?P<to>[0-9a-fA-F]+)")
RECOVERY_XID = 154


@dataclass(frozen=True)
class XidEvent:
    xid: int
    pci_bus_id: str | None  # as logged, without "PCI:" ("0000:3b:00"); None if the line has none
    pid: int | None = None
    name: str | None = None
    gpu_instance: int | None = None  # MIG
    compute_instance: int | None = None
    recovery_action: int | None = None  # Xid 154: the action now required
    message: str = ""


def xid_in_record(record: Record) -> XidEvent | None:
    """The Xid a kernel log record reports, or None. Only the kernel's own records count: user
    space writing to /dev/kmsg gets another facility, so it cannot fake an Xid."""
    if record.facility != FACILITY_KERNEL or b"NVRM: Xid" not in record.text:
        return None  # the cheap test first: most records are other subsystems'
    return parse_xid(unescape(record.text))


def parse_xid(text: str) -> XidEvent | None:
    """The event in one kernel log line (its text after the kmsg header), or None.
    KernelNumberError (a ValueError) if it is an Xid line with a number no driver prints."""
    match = _XID.match(text)
    if match is None:
        return None
    rest = match["rest"]
    pid: int | None = None
    name: str | None = None
    process = _PROCESS.match(rest)
    if process is not None:
        pid = _u32(process["pid"]) if process["pid"].isdigit() else None
        raw_name = process["name"]
        name = raw_name.strip() if raw_name and raw_name.strip() != "<unknown>" else None
        rest = rest[process.end():]
    xid = _u32(match["xid"])
    recovery = _RECOVERY.search(rest) if xid == RECOVERY_XID else None
    return XidEvent(
        xid=xid,
        pci_bus_id=match["bus"].lower() if match["bus"] else None,
        pid=pid,
        name=name,
        gpu_instance=_u32(match["gi"]) if match["gi"] else None,
        compute_instance=_u32(match["ci"]) if match["ci"] else None,
        recovery_action=_u32(int(recovery["to"], 16)) if recovery else None,
        message=rest.strip(),
    )


def _u32(text: str | int) -> int:
    value = text if isinstance(text, int) else u64(text)
    if value > U32_MAX:
        raise KernelNumberError(f"{value} past 2**32 - 1")
    return value
