"""Pure parser for /proc/PID/mountstats (NFS client sections only).

Text in, data out: no file access, no metrics. Field layouts follow the kernel's
printers (fs/nfs/super.c nfs_show_stats, net/sunrpc/stats.c, xprtsock.c,
xprtrdma/transport.c); see tests/fixtures/mountstats-real/FORMAT.md.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import NamedTuple

from gpunode_exporter.numbers import U64_MAX, KernelNumberError, s64, u64

NFS_FSTYPES = frozenset({"nfs", "nfs4"})

# Field names of each transport's xprt line, in kernel order. Older kernels
# print a prefix of these (statvers 1.0 lacks max_slots, sending_u, pending_u);
# newer ones may append fields, which are ignored.
TRANSPORT_FIELDS: dict[str, tuple[str, ...]] = {
    "tcp": ("port", "bind_count", "connect_count", "connect_time", "idle_time",
            "sends", "recvs", "bad_xids", "req_u", "bklog_u",
            "max_slots", "sending_u", "pending_u"),
    "udp": ("port", "bind_count", "sends", "recvs", "bad_xids", "req_u", "bklog_u",
            "max_slots", "sending_u", "pending_u"),
    "local": ("bind_count", "connect_count", "connect_time", "idle_time",
              "sends", "recvs", "bad_xids", "req_u", "bklog_u",
              "max_slots", "sending_u", "pending_u"),
    # rdma prints the generic counters, then its own; it has no max_slots.
    "rdma": ("port", "bind_count", "connect_count", "connect_time", "idle_time",
             "sends", "recvs", "bad_xids", "req_u", "bklog_u"),
}
# idle_time is the one signed field (%ld: jiffies since last use, divided by HZ).
_SIGNED = {protocol: frozenset({names.index("idle_time")}) for protocol, names in TRANSPORT_FIELDS.items()
           if "idle_time" in names}
# Every kernel prints each transport's fields up to bklog_u; a shorter line is malformed.
_LAST_REQUIRED = "bklog_u"
_REQUIRED = {protocol: names.index(_LAST_REQUIRED) + 1 for protocol, names in TRANSPORT_FIELDS.items()}

_DEVICE_RE = re.compile(
    r"^device (?P<device>\S+) mounted on (?P<mountpoint>\S+) with fstype (?P<fstype>\S+)"
    r"(?: statvers=(?P<statvers>\S+))?\s*$"
)
_U64_FIELDS = re.compile(r"[ \t]*(?:[0-9]{1,20}(?:[ \t]+|\Z))*", re.ASCII)
# A per-op block as kernels >= 5.3 print it: every line a name and 9 numbers. Such a block is
# parsed in bulk (a column at a time); any other line sends the block to parse_operation.
_OP_FIELDS = 9
_OP_LINE = rf"[ \t]*[!-9;-~]+:(?:[ \t]+[0-9]{{1,20}}){{{_OP_FIELDS}}}[ \t]*"  # names: printable ASCII
_OP_BLOCK = re.compile(rf"(?:{_OP_LINE}(?:\n|\Z))*")
_OCTAL_ESCAPE_RE = re.compile(r"\\([0-7]{3})")
# Times above this are negative sums wrapped to u64 by old kernels (procfs #166).
WRAPPED_THRESHOLD = 1 << 63


class MountStatsError(ValueError):
    """A line that does not have the shape the kernel prints."""


class Operation(NamedTuple):
    """One per-op line, its fields in the kernel's order (a tuple: a mount's columns are zip(*ops))."""

    name: str
    requests: int
    transmissions: int
    major_timeouts: int
    sent_bytes: int
    received_bytes: int
    queue_ms: int
    rtt_ms: int
    execute_ms: int
    errors: int | None = None  # only kernels >= 5.3 print it


@dataclass(slots=True)
class Transport:
    protocol: str
    values: dict[str, int]


@dataclass(slots=True)
class NFSMount:
    device: str
    mountpoint: str
    fstype: str
    statvers: str
    options: dict[str, str] = field(default_factory=dict)
    transports: list[Transport] = field(default_factory=list)
    operations: list[Operation] = field(default_factory=list)

    @property
    def export(self) -> str:
        return self.device

    @property
    def server_address(self) -> str:
        """The server as far as mountstats tells: NFSv3's mountaddr=, else the device's host.

        The resolved address of every version is in mountinfo (procfs.mountinfo).
        """
        if self.options.get("mountaddr"):
            return self.options["mountaddr"]
        host = self.device.rsplit(":", 1)[0] if ":" in self.device else ""
        return host.strip("[]")


@dataclass(slots=True)
class ParseProblem:
    mountpoint: str
    line: int
    reason: str


@dataclass(slots=True)
class MountStats:
    mounts: list[NFSMount]
    problems: list[ParseProblem]


def unescape(value: str) -> str:
    """Undo the kernel's seq_escape of space, tab, newline and backslash (\\040 etc.)."""
    if "\\" not in value:
        return value
    return _OCTAL_ESCAPE_RE.sub(lambda m: chr(int(m.group(1), 8)), value)


def _ints(fields: list[str], what: str, signed: frozenset[int] = frozenset()) -> list[int]:
    """The kernel prints these %lu/%llu, except the positions in signed (%ld)."""
    try:
        return [s64(f) if i in signed else u64(f) for i, f in enumerate(fields)]
    except KernelNumberError as err:
        raise MountStatsError(f"{what}: {err}") from None


def _u64s(text: str, what: str) -> list[int]:
    """Whitespace-separated %llu fields; one regex and map(int) keep the scrape's hot loop fast."""
    if _U64_FIELDS.fullmatch(text) is None:
        raise MountStatsError(f"{what}: a field that is not an unsigned 64-bit number")
    nums = list(map(int, text.split()))
    if nums and max(nums) > U64_MAX:
        raise MountStatsError(f"{what}: a field past 2**64 - 1")
    return nums


def parse_operation(line: str) -> Operation:
    name, sep, rest = line.strip().partition(":")
    if not sep or not name:
        raise MountStatsError("per-op line without 'NAME:'")
    nums = _u64s(rest, f"op {name}")
    if len(nums) < 8:
        raise MountStatsError(f"op {name}: {len(nums)} numbers, want 8 or 9")
    return Operation(name, *nums[:8], errors=nums[8] if len(nums) > 8 else None)


def parse_operations(lines: list[str]) -> list[Operation]:
    """The per-op lines of one mount; the same as parse_operation on each, faster."""
    block = "\n".join(lines)
    width = _OP_FIELDS + 1
    if _OP_BLOCK.fullmatch(block) is not None:
        tokens = block.split()
        columns = [list(map(int, tokens[i::width])) for i in range(1, width)]
        if not columns[0] or max(map(max, columns)) <= U64_MAX:
            names = [name[:-1] for name in tokens[::width]]
            return list(map(Operation._make, zip(names, *columns, strict=True)))
    return [parse_operation(line) for line in lines if line.strip()]  # says what is wrong, and where


def parse_transport(rest: str) -> Transport:
    parts = rest.split()
    if not parts:
        raise MountStatsError("empty xprt line")
    protocol, fields = parts[0], parts[1:]
    names = TRANSPORT_FIELDS.get(protocol)
    if names is None:
        raise MountStatsError(f"unknown transport {protocol!r}")
    digits = "".join(fields)  # checked at once: ASCII digits only, each below 10**18 (every type fits)
    if digits.isdigit() and digits.isascii() and max(map(len, fields)) < 19:
        nums = list(map(int, fields))
    else:  # a '-' (the signed idle_time), or a number to check field by field
        nums = _ints(fields, f"xprt {protocol}", _SIGNED.get(protocol, frozenset()))
    required = _REQUIRED[protocol]
    if len(nums) < required:
        raise MountStatsError(f"xprt {protocol}: {len(nums)} numbers, want at least {required}")
    return Transport(protocol, dict(zip(names, nums, strict=False)))


def _parse_options(rest: str) -> dict[str, str]:
    options = {}
    for item in rest.strip().split(","):
        key, _, value = item.partition("=")
        options[key] = value
    return options


def _parse_nfs_body(mount: NFSMount, lines: list[str]) -> None:
    for index, line in enumerate(lines):
        stripped = line.strip()
        if not stripped:
            continue
        if stripped == "per-op statistics":  # the rest of the section is operations
            mount.operations = parse_operations([line for line in lines[index + 1:] if line.strip()])
            return
        tag, _, rest = stripped.partition(":")
        if tag == "opts":
            mount.options = _parse_options(rest)
        elif tag == "xprt":
            mount.transports.append(parse_transport(rest))
        # age, events, bytes, caps, sec, nfsv4, fsc, impl_id, RPC iostats: not used here.


def parse(text: str) -> MountStats:
    """Parse a whole mountstats file; malformed NFS sections are dropped and reported."""
    mounts: list[NFSMount] = []
    problems: list[ParseProblem] = []
    lines = text.split("\n")
    n = len(lines)
    i = 0
    while i < n:
        line = lines[i]
        if not line.startswith("device "):
            if line.strip():
                problems.append(ParseProblem("", i + 1, "text outside a device section"))
            i += 1
            continue
        start = i
        i += 1
        while i < n and not lines[i].startswith("device "):
            i += 1
        m = _DEVICE_RE.match(line)
        if m is None:
            if " fstype nfs" in line:  # only NFS headers concern us
                problems.append(ParseProblem("", start + 1, "malformed device line"))
            continue
        if m.group("fstype") not in NFS_FSTYPES:
            continue
        mount = NFSMount(
            device=unescape(m.group("device")),
            mountpoint=unescape(m.group("mountpoint")),
            fstype=m.group("fstype"),
            statvers=m.group("statvers") or "",
        )
        if not mount.statvers:
            # NFS prints stats only once the superblock is set up; a bare header is
            # a mount that is still being set up or torn down.
            continue
        try:
            _parse_nfs_body(mount, lines[start + 1 : i])
        except MountStatsError as err:
            problems.append(ParseProblem(mount.mountpoint, start + 1, str(err)))
            continue
        mounts.append(mount)
    return MountStats(mounts, problems)
