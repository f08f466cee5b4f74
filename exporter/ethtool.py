"""Driver statistics of a network interface, as `ethtool -S` prints them: the SIOCETHTOOL ioctl.

Written against the socket and fcntl modules for the reason exporter/netroute.py
gives (pyroute2 costs ~12 MiB of resident memory); the tests check the answers
against `ethtool -S` and pyroute2 on a veth inside a network namespace.

Three ioctl commands, all allowed without CAP_NET_ADMIN (net/ethtool/ioctl.c,
__dev_ethtool(): GSSET_INFO, GSTRINGS and GSTATS are in the "anyone" list):

- ETHTOOL_GSSET_INFO with sset_mask = 1 << ETH_SS_STATS: how many statistics the
  driver has. A driver without statistics (lo) answers with that bit cleared.
- ETHTOOL_GSTRINGS (ETH_SS_STATS): their names, ETH_GSTRING_LEN (32) bytes each,
  NUL-padded. Cached per device: names change only when the count does.
- ETHTOOL_GSTATS: the values, u64 each, in the same order. The kernel writes
  n_stats back: the driver's current get_sset_count(ETH_SS_STATS), the number
  GSSET_INFO would report, so a change of count is seen without asking again.

The kernel sizes its answer by what the driver says *now*, not by the buffer the
caller allocated (ethtool_get_strings()/ethtool_get_stats()), and some drivers'
counts change at run time (mlx5 grows its per-channel stats when channels are
added). Since commit 7b07be1ff1cb ("ethtool: Avoid overflowing userspace buffer
on stats query", 2025, also in stable kernels) a caller that passes its count
gets nothing back on a mismatch; older kernels write past the end. So the
structs are placed to end exactly at an inaccessible page: an overlong answer
faults inside copy_to_user and the ioctl fails with EFAULT instead of
overwriting the Python heap. Either way the names are fetched again and the
read retried.

Layouts are those of include/uapi/linux/ethtool.h and linux/if.h on the running
ABI: struct ethtool_sset_info {u32 cmd; u32 reserved; u64 sset_mask; u32 data[];}
(data at 16), struct ethtool_gstrings {u32 cmd; u32 string_set; u32 len; u8 data[];}
(data at 12), struct ethtool_stats {u32 cmd; u32 n_stats; u64 data[];} (data at 8),
and struct ifreq {char ifr_name[16]; union {..., void *ifr_data, struct ifmap}},
40 bytes on 64-bit with ifr_data at 16; ctypes computes the union's size.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import mmap
import re
import socket
import struct
import threading

SIOCETHTOOL = 0x8946  # include/uapi/linux/sockios.h
ETHTOOL_GSTRINGS = 0x0000001B  # include/uapi/linux/ethtool.h
ETHTOOL_GSTATS = 0x0000001D
ETHTOOL_GSSET_INFO = 0x00000037
ETH_SS_STATS = 1  # enum ethtool_stringset: ETH_SS_TEST = 0, ETH_SS_STATS, ...
ETH_GSTRING_LEN = 32
IFNAMSIZ = 16
NETLINK_GENERIC = 16

_SSET_INFO = struct.Struct("=IIQ")  # cmd, reserved, sset_mask; then u32 data[]
_GSTRINGS = struct.Struct("=III")  # cmd, string_set, len; then u8 data[len][ETH_GSTRING_LEN]
_STATS = struct.Struct("=II")  # cmd, n_stats; then u64 data[n_stats]
_U32 = struct.Struct("=I")
_ATTEMPTS = 3  # count changes in a row before giving up on this scrape


class _IfMap(ctypes.Structure):
    _fields_ = [("mem_start", ctypes.c_ulong), ("mem_end", ctypes.c_ulong), ("base_addr", ctypes.c_ushort),
                ("irq", ctypes.c_ubyte), ("dma", ctypes.c_ubyte), ("port", ctypes.c_ubyte)]


class _IfrIfru(ctypes.Union):
    # Only ifru_data is used; ifru_map is the largest member and so sets the size.
    _fields_ = [("ifru_data", ctypes.c_void_p), ("ifru_map", _IfMap), ("ifru_newname", ctypes.c_char * IFNAMSIZ)]


class _IfReq(ctypes.Structure):
    _fields_ = [("ifr_name", ctypes.c_char * IFNAMSIZ), ("ifr_ifru", _IfrIfru)]


_libc = ctypes.CDLL(None, use_errno=True)
_libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_libc.mprotect.restype = ctypes.c_int
_PROT_NONE = 0


class _GuardedBuffer:
    """Anonymous memory followed by a PROT_NONE page; structs are placed to end at it."""

    def __init__(self) -> None:
        self._map: mmap.mmap | None = None
        self._size = 0  # accessible bytes
        self.address = 0

    def place(self, size: int) -> int:
        """The offset at which `size` bytes end exactly where the guard page begins."""
        if size > self._size:
            self._grow(size)
        return self._size - size

    @property
    def map(self) -> mmap.mmap:
        assert self._map is not None
        return self._map

    def _grow(self, size: int) -> None:
        page = mmap.PAGESIZE
        accessible = -(-size // page) * page
        new = mmap.mmap(-1, accessible + page, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        anchor = ctypes.c_char.from_buffer(new)  # only to learn the address; released at once
        address = ctypes.addressof(anchor)
        del anchor
        if _libc.mprotect(address + accessible, page, _PROT_NONE) != 0:
            err = ctypes.get_errno()
            new.close()
            raise OSError(err, f"mprotect: {errno.errorcode.get(err, err)}")
        self.close()
        self._map, self._size, self.address = new, accessible, address

    def close(self) -> None:
        if self._map is not None:
            self._map.close()
            self._map, self._size, self.address = None, 0, 0


def _ifname(device: str) -> bytes:
    name = device.encode()
    # The kernel would truncate a long name to 15 bytes and might find another device.
    if not name or len(name) >= IFNAMSIZ or b"\0" in name or b"/" in name:
        raise OSError(errno.ENODEV, f"no such network device: {device!r}")
    return name


class Ethtool:
    """Driver statistics via ETHTOOL_GSTRINGS (ETH_SS_STATS) / ETHTOOL_GSTATS, names cached per device
    (refetched when the count changes: the n_stats GSTATS reports is the count GSSET_INFO gives).

    One socket and one buffer, reused; calls are serialized. The socket's network
    namespace is the one the process was in when the object was made.
    """

    def __init__(self) -> None:
        try:
            self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        except OSError:
            # As ethtool does when IPv4 is unavailable: any socket reaches dev_ioctl().
            self._sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_GENERIC)
        self._buffer = _GuardedBuffer()
        self._names: dict[str, tuple[str, ...]] = {}
        self._lock = threading.Lock()

    def stats(self, device: str) -> dict[str, int]:
        """{name: value} of the driver's statistics. Raises OSError: ENODEV (no such device),
        EOPNOTSUPP (the driver has no statistics, like lo), EPERM, or EAGAIN if the
        count kept changing. A name that appears twice keeps its first value."""
        name = _ifname(device)
        with self._lock:
            try:
                return self._stats(device, name)
            except OSError as err:
                if err.errno == errno.ENODEV:
                    self._names.pop(device, None)  # gone (veths come and go): don't keep its names
                raise

    def _stats(self, device: str, name: bytes) -> dict[str, int]:
        for _ in range(_ATTEMPTS):
            names = self._names.get(device)
            if names is None:
                fetched = self._strings(name, self._count(name))
                if fetched is None:
                    continue
                names = self._names[device] = fetched
            values = self._values(name, len(names))
            if values is None:
                del self._names[device]
                continue
            result: dict[str, int] = {}
            for stat, value in zip(names, values, strict=True):
                result.setdefault(stat, value)
            return result
        raise OSError(errno.EAGAIN, f"{device}: the number of driver statistics kept changing")

    def close(self) -> None:
        with self._lock:
            self._sock.close()
            self._buffer.close()
            self._names.clear()

    def __enter__(self) -> Ethtool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- the three commands ------------------------------------------------------------------

    def _ioctl(self, name: bytes, offset: int) -> None:
        request = _IfReq()
        request.ifr_name = name
        request.ifr_ifru.ifru_data = self._buffer.address + offset
        fcntl.ioctl(self._sock.fileno(), SIOCETHTOOL, request)

    def _count(self, name: bytes) -> int:
        offset = self._buffer.place(_SSET_INFO.size + _U32.size)
        buf = self._buffer.map
        _SSET_INFO.pack_into(buf, offset, ETHTOOL_GSSET_INFO, 0, 1 << ETH_SS_STATS)
        _U32.pack_into(buf, offset + _SSET_INFO.size, 0)
        self._ioctl(name, offset)
        _cmd, _reserved, mask = _SSET_INFO.unpack_from(buf, offset)
        if not mask & (1 << ETH_SS_STATS):
            # The kernel clears the bit of a set the driver does not have (lo, ifb).
            raise OSError(errno.EOPNOTSUPP, f"{name.decode()}: driver has no statistics")
        return _U32.unpack_from(buf, offset + _SSET_INFO.size)[0]

    def _strings(self, name: bytes, count: int) -> tuple[str, ...] | None:
        """The statistics' names; None if the driver's count is no longer `count`."""
        offset = self._buffer.place(_GSTRINGS.size + count * ETH_GSTRING_LEN)
        buf = self._buffer.map
        _GSTRINGS.pack_into(buf, offset, ETHTOOL_GSTRINGS, ETH_SS_STATS, count)
        if not self._ioctl_fits(name, offset):
            return None
        _cmd, _set, length = _GSTRINGS.unpack_from(buf, offset)
        if length != count:
            return None
        data = buf[offset + _GSTRINGS.size:offset + _GSTRINGS.size + count * ETH_GSTRING_LEN]
        return tuple(data[i:i + ETH_GSTRING_LEN].split(b"\0", 1)[0].decode("ascii", "replace")
                     for i in range(0, len(data), ETH_GSTRING_LEN))

    def _values(self, name: bytes, count: int) -> tuple[int, ...] | None:
        """The statistics' values; None if the driver's count is no longer `count`."""
        offset = self._buffer.place(_STATS.size + count * 8)
        buf = self._buffer.map
        _STATS.pack_into(buf, offset, ETHTOOL_GSTATS, count)
        if not self._ioctl_fits(name, offset):
            return None
        _cmd, n_stats = _STATS.unpack_from(buf, offset)
        if n_stats != count:  # changed: older kernels say to what, newer ones say 0
            return None
        return struct.unpack_from(f"={count}Q", buf, offset + _STATS.size)

    def _ioctl_fits(self, name: bytes, offset: int) -> bool:
        """False when the kernel's answer ran into the guard page (the count grew)."""
        try:
            self._ioctl(name, offset)
        except OSError as err:
            if err.errno == errno.EFAULT:
                return False
            raise
        return True


# Per-priority (PFC) pause frame counters, by driver:
# - mlx5_core: "rx_prio%d_pause" / "tx_prio%d_pause" for each priority with PFC
#   enabled (drivers/net/ethernet/mellanox/mlx5/core/en_stats.c,
#   pport_per_prio_pfc_stats_desc "rx_%s_pause" with %s = "prio%d" in
#   mlx5e_grp_per_prio_pfc_fill_strings; link-level pause is "rx_global_pause",
#   not per priority, and not matched).
# - bnxt_en: "rx_pfc_ena_frames_pri%d" / "tx_pfc_ena_frames_pri%d", PFC frames with
#   the priority's enable bit set (drivers/net/ethernet/broadcom/bnxt/bnxt_ethtool.c,
#   bnxt_port_stats_arr; port statistics, so PF only).
# - ice: "rx_priority_%u_xoff.nic" / "tx_priority_%u_xoff.nic"
#   (drivers/net/ethernet/intel/ice/ice_ethtool.c, __ice_get_strings). ice also
#   counts XON frames ("..._xon.nic"): those end a pause, so they are not counted.
_PFC_PATTERNS = (
    re.compile(r"(?P<dir>rx|tx)_prio(?P<prio>[0-7])_pause"),
    re.compile(r"(?P<dir>rx|tx)_pfc_ena_frames_pri(?P<prio>[0-7])"),
    re.compile(r"(?P<dir>rx|tx)_priority_(?P<prio>[0-7])_xoff\.nic"),
)


def pfc_pause_frames(stats: dict[str, int]) -> dict[tuple[str, str], int]:
    """PFC pause frames per (direction 'rx'|'tx', priority '0'..'7') from driver stat names; {} if none.
    mlx5: rx_prio{N}_pause / tx_prio{N}_pause; bnxt_en: {rx,tx}_pfc_ena_frames_pri{N};
    ice: {rx,tx}_priority_{N}_xoff.nic (sources in the comment above)."""
    frames: dict[tuple[str, str], int] = {}
    for name, value in stats.items():
        for pattern in _PFC_PATTERNS:
            match = pattern.fullmatch(name)
            if match:
                frames[(match["dir"], match["prio"])] = value
                break
    return frames
