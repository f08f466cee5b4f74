"""Kernel log records past Xid -> SXidEvent or KernelEvent. Pure: no I/O.

Each record yields at most one event, and an event printed over several records is counted
on the one record that marks it (docs/kernel-events.md lists the lines of each kind):
an SXid on its "Fatal"/"Non-fatal" line, not its "Severity ..." and "Data {...}" lines;
an OOM kill on "Killed process" (the oom-killer header, Mem-Info dump and "oom-kill:"
summary count nothing); a hung task on "INFO: task ... blocked", not its hints; an AER
error on "AER: ... error received", not its "PCIe Bus Error" and status detail lines.

`device` is what the line names (a block device, an NVMe controller, a PCI address, an
interface, an NFS server, a memory controller), checked against that kind's pattern and
length: never pids, process names or sector numbers, so the series stay bounded.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpunode_exporter.kmsg import FACILITY_KERNEL, Record, unescape
from gpunode_exporter.numbers import U32_MAX, KernelNumberError, u64

KINDS = (
    "hung_task", "soft_lockup", "hard_lockup", "rcu_stall", "kernel_panic", "oom_kill",
    "fs_error", "fs_readonly", "block_io_error", "nvme_timeout", "nvme_failed", "raid_disk_failed",
    "nfs_not_responding", "nfs_ok", "nfs_error", "machine_check", "memory_corrected",
    "memory_uncorrected", "pcie_aer_corrected", "pcie_aer_uncorrected", "nic_link_down",
    "nic_link_up", "nic_fw_error", "nic_hw_error", "nic_cmd_timeout", "nic_cmd_error",
    "nic_init_failed", "gpu_fallen_off_bus", "gpu_init_failed", "gsp_timeout", "gsp_error",
    "nvlink_error", "peermem_error", "segfault",
)
SEVERITIES = ("fatal", "nonfatal", "unknown")
MAX_DEVICE = 64

# Words at least one of which every counted line holds: most records are other subsystems' and
# fail this one scan. Plain literals only: a class or a case-insensitive part makes it 4x slower.
_TRIGGER = re.compile(b"|".join(re.escape(word) for word in (
    b"SXid", b"blocked for", b"lockup", b"LOCKUP", b"stall", b"panic", b"Killed process", b"-fs", b"XFS",
    b"BTRFS", b"error, dev", b"nvme", b"Disk failure", b"nfs", b"Machine check", b"EDAC", b"AER:", b"ink ",
    b"Port module", b"insufficient power", b"mlx5_cmd_out_err", b"poll_health", b"Will cause a leak", b"probe of",
    b"NVRM:", b"peermem",
    b"segfault")))

_PCI = r"[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]"
_DEVICE = {  # kind of name -> what the kernel prints for it
    "block": re.compile(r"[a-z][a-z0-9._-]{0,31}", re.ASCII),
    "nvme": re.compile(r"nvme[0-9]{1,4}", re.ASCII),
    "pci": re.compile(_PCI, re.ASCII),
    "iface": re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:@-]{0,14}", re.ASCII),  # IFNAMSIZ - 1
    "server": re.compile(r"[A-Za-z0-9][A-Za-z0-9._:%-]{0,63}|\[[0-9A-Fa-f:.%]{2,62}\]", re.ASCII),
    "mc": re.compile(r"MC[0-9]{1,3}", re.ASCII),
}


@dataclass(frozen=True, slots=True)
class SXidEvent:
    switch: int  # the N of nvidia-nvswitchN
    pci_bus_id: str
    sxid: int
    severity: str | None  # "fatal", "nonfatal", or None: the line says neither (ask the catalog)


@dataclass(frozen=True, slots=True)
class KernelEvent:
    kind: str
    device: str = ""


class DeviceError(ValueError):
    """A line of a counted kind that names a device no kernel would print: that record alone."""


_SXID = re.compile(r"nvidia-nvswitch([0-9]+): SXid \(PCI:(" + _PCI + r")\): ([0-9]+), (.*)",
                   re.ASCII | re.DOTALL | re.IGNORECASE)
_SXID_MORE = ("Severity ", "Data {")  # the driver's follow-up lines of the same SXid

_PREFIX = r"(?:\S+ (?P<pci>" + _PCI + r")(?: (?P<ifname>[^\s:]+))?: )?"  # dev_printk/netdev_printk
# mlx5_core_err/warn: "FUNCTION:LINE:(pid N): ", without the pid on kernels that dropped it.
_MLX5 = r"\w+:[0-9]+:(?:\(pid [0-9]+\):)? "
# (kind, pattern, which group names the device, its device pattern); the first match wins.
_RULES: list[tuple[str, re.Pattern[str], str | None, str | None]] = [
    ("hung_task", re.compile(r"INFO: task .+:[0-9]+ blocked for more than [0-9]+ seconds\."), None, None),
    ("soft_lockup", re.compile(r"(?:NMI )?watchdog: BUG: soft lockup - CPU#[0-9]+ stuck for [0-9]+s!"), None, None),
    ("hard_lockup", re.compile(r"NMI watchdog: Watchdog detected hard LOCKUP on cpu [0-9]+"), None, None),
    ("rcu_stall", re.compile(r"(?:rcu: )?INFO: rcu_\w+ (?:self-)?detected (?:expedited )?stalls? on CPU"),
     None, None),
    ("kernel_panic", re.compile(r"Kernel panic - not syncing: "), None, None),
    # Every OOM kill prints this once (mm/oom_kill.c); "oom-kill:" and the header are the same kill.
    ("oom_kill", re.compile(r"(?:(?:Memory cgroup )?[Oo]ut of memory: )?Killed process [0-9]+ "), None, None),
    ("fs_readonly", re.compile(r"(?:EXT[234]-fs|BTRFS[^(]*) \((?P<dev>[^)\s]+)\): (?:Remounting filesystem "
                               r"read-only|forced readonly)"), "dev", "block"),
    ("fs_readonly", re.compile(r"XFS \((?P<dev>[^)\s]+)\): .*Shutting down filesystem"), "dev", "block"),
    ("fs_error", re.compile(r"(?:EXT[234]-fs|BTRFS) error \(device (?P<dev>[^)\s]+)\)"), "dev", "block"),
    ("fs_error", re.compile(r"XFS \((?P<dev>[^)\s]+)\): (?:Internal error|Metadata corruption detected)"),
     "dev", "block"),
    ("block_io_error", re.compile(r"(?:blk_update_request: )?[A-Za-z/ ]*error, dev (?P<dev>[^,\s]+), sector [0-9]+"),
     "dev", "block"),
    ("block_io_error", re.compile(r"block (?P<dev>nvme[0-9]+n[0-9]+): no available path - failing I/O"),
     "dev", "block"),
    ("nvme_timeout", re.compile(r"nvme (?P<dev>nvme[0-9]+): I/O (?:tag )?[0-9].* timeout"), "dev", "nvme"),
    ("nvme_failed", re.compile(r"nvme (?P<dev>nvme[0-9]+): (?:Disabling device after reset failure|Removing "
                               r"after probe failure|controller is down; will reset|Device not ready; aborting)"),
     "dev", "nvme"),
    ("raid_disk_failed", re.compile(r"md/raid[0-9]*:?\S*: Disk failure on (?P<dev>\S+?),? (?:disabling device|"
                                    r"detected, failing array)"), "dev", "block"),
    ("nfs_not_responding", re.compile(r"nfs: server (?P<dev>\S+) not responding"), "dev", "server"),
    ("nfs_ok", re.compile(r"nfs: server (?P<dev>\S+) OK$"), "dev", "server"),
    ("nfs_error", re.compile(r"(?:NFS: )?nfs4_reclaim_open_state: (?:Lock reclaim failed|unhandled error)"),
     None, None),
    ("machine_check", re.compile(r"mce: \[Hardware Error\]: Machine check events logged"), None, None),
    ("memory_corrected", re.compile(r"EDAC (?P<dev>MC[0-9]+): [0-9]+ CE "), "dev", "mc"),
    ("memory_uncorrected", re.compile(r"EDAC (?P<dev>MC[0-9]+): [0-9]+ UE "), "dev", "mc"),
    # drivers/pci/pcie/aer.c: "AER: %s%s error received: %s" (to 6.x) and "... error message
    # received from %s" (newer); the source is named, or the reporting port is (id=00e5).
    ("pcie_aer_corrected", re.compile(_PREFIX + r"AER: (?:Multiple )?Correct(?:ed|able) error (?:message )?"
                                      r"received(?:: | from )(?:(?P<src>" + _PCI + r")|id=)"), "src", "pci"),
    ("pcie_aer_uncorrected", re.compile(_PREFIX + r"AER: (?:Multiple )?Uncorrect(?:ed|able) \((?:Non-)?Fatal\) "
                                        r"error (?:message )?received(?:: | from )(?:(?P<src>" + _PCI + r")|id=)"),
     "src", "pci"),
    ("nic_link_down", re.compile(r"\S+ \S+ (?P<dev>[^\s:]+): (?:NIC )?[Ll]ink (?:is )?[Dd]own$"), "dev", "iface"),
    ("nic_link_up", re.compile(r"\S+ \S+ (?P<dev>[^\s:]+): (?:NIC )?[Ll]ink (?:is )?[Uu]p\b"), "dev", "iface"),
    ("nic_hw_error", re.compile(_PREFIX + r"(?:mlx5_port_module_event:[0-9]+:\(pid [0-9]+\): )?Port module "
                                r"event\[error\]: "), "pci", "pci"),
    ("nic_hw_error", re.compile(_PREFIX + r"mlx5_pcie_event:[0-9]+:\(pid [0-9]+\): Detected insufficient power"),
     "pci", "pci"),
    ("nic_cmd_error", re.compile(_PREFIX + r"(?=mlx5_cmd_out_err:)" + _MLX5 + r"\w+\(0x[0-9a-f]+\) "
                                 r"op_mod\(0x[0-9a-f]+\) failed"), "pci", "pci"),
    # mlx5 cmd.c: a firmware command with no completion in time. Its "No done completion" line
    # before it and "Command completion arrived after timeout" after it are the same event.
    ("nic_cmd_timeout", re.compile(_PREFIX + _MLX5 + r"(?:cmd\[-?[0-9]+\]: )?\w+\(0x[0-9a-f]+\) (?:Async, )?"
                                   r"timeout\. Will cause a leak of a command resource"), "pci", "pci"),
    # mlx5 health.c: the firmware stopped its health counter, or raised a fatal sensor; the
    # print_health_info lines after it (syndrome, assert_var ...) are its detail.
    ("nic_fw_error", re.compile(_PREFIX + r"(?=poll_health:)" + _MLX5 + r"(?:device's health compromised - reached "
                                r"miss count|Fatal error [0-9]+ detected)"), "pci", "pci"),
    ("nic_init_failed", re.compile(r"mlx5_core: probe of (?P<dev>" + _PCI + r") failed with error"), "dev", "pci"),
    ("gpu_init_failed", re.compile(r"nvidia: probe of (?P<dev>" + _PCI + r") failed with error"), "dev", "pci"),
    ("gpu_init_failed", re.compile(r"NVRM: GPU (?P<dev>" + _PCI + r"): RmInitAdapter failed!"), "dev", "pci"),
    ("gpu_fallen_off_bus", re.compile(r"NVRM: (?:GPU at |GPU |The NVIDIA GPU )(?:PCI:)?(?P<dev>" + _PCI
                                      + r")\b.*fallen off the bus", re.DOTALL), "dev", "pci"),
    ("gsp_timeout", re.compile(r"NVRM: _kgspRpcRecvPoll: GSP RM heartbeat timed out"), None, None),
    ("gsp_error", re.compile(r"NVRM: (?:GPU[0-9]+ )?(?:RmInitAdapter: Cannot initialize GSP firmware RM|"
                             r"_kgspRpcGspEventPmuHalted: Received signal from GSP that PMU has halted)"),
     None, None),
    ("nvlink_error", re.compile(r"NVRM: knvlink\w+: (?:Getting peer\S* postRxDetLinkMask failed|Failed to update "
                                r"Rx Detect Link mask)"), None, None),
    ("peermem_error", re.compile(r"nvidia-peermem \S+ ERROR "), None, None),
    ("segfault", re.compile(r"\S+\[[0-9]+\]: segfault at [0-9a-f]+ ip [0-9a-f]+ sp [0-9a-f]+ error [0-9]+"),
     None, None),
]
_RULES = [(kind, re.compile(p.pattern, (p.flags & ~re.UNICODE) | re.ASCII), g, d) for kind, p, g, d in _RULES]


def worth_parsing(record: Record) -> bool:
    """False for the records that can be no Xid, SXid or kernel event: user space's, and (most)
    those holding none of the words such lines hold. One scan, before anything else."""
    return record.facility == FACILITY_KERNEL and _TRIGGER.search(record.text) is not None


def event_in_record(record: Record, checked: bool = False) -> SXidEvent | KernelEvent | None:
    """The SXid or kernel event a record marks, or None. Only the kernel's own records count.
    ValueError (KernelNumberError, DeviceError) for a counted kind with a number or device no
    kernel prints: the caller counts that record as malformed. checked: worth_parsing() said so."""
    if not (checked or worth_parsing(record)):
        return None
    return parse_event(unescape(record.text))


def parse_event(text: str) -> SXidEvent | KernelEvent | None:
    if "SXid (" in text:
        return parse_sxid(text)
    for kind, pattern, group, device_kind in _RULES:
        m = pattern.match(text)
        if m is None:
            continue
        if group is None:
            return KernelEvent(kind)
        device = m[group] or m.groupdict().get("pci") or ""
        if device and (len(device) > MAX_DEVICE or device_kind is None
                       or not _DEVICE[device_kind].fullmatch(device)):
            raise DeviceError(f"{kind}: {device[:40]!r} is no {device_kind} name")
        return KernelEvent(kind, device)
    return None


def parse_sxid(text: str) -> SXidEvent | None:
    """An SXid's first line; None for its follow-up lines and anything else."""
    m = _SXID.match(text)
    if m is None:
        return None
    rest = m[4]
    if rest.startswith(_SXID_MORE):
        return None
    head = rest.split(",", 1)[0].strip().lower()
    severity = {"fatal": "fatal", "non-fatal": "nonfatal"}.get(head)
    return SXidEvent(_u32(m[1]), m[2].lower(), _u32(m[3]), severity)


def _u32(text: str) -> int:
    value = u64(text)
    if value > U32_MAX:
        raise KernelNumberError(f"{value} past 2**32 - 1")
    return value
