"""Driver statistics over SIOCETHTOOL, on a real veth inside a network namespace the
test makes, checked against two independent readers: the `ethtool` program and
pyroute2's ioctl code. PFC pause frames from published (and constructed) samples."""

from __future__ import annotations

import ctypes
import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpunode_exporter.ethtool import Ethtool, _GuardedBuffer, _IfReq, pfc_pause_frames
from tests.helpers import AS_NOBODY, ethtool_fixture, parse_ethtool_s, skip_unless_nobody_can_run_the_checkout
from tests.netns import STORAGE_DEVICE, storage_netns

ROOT = Path(__file__).parent.parent


# --- the real kernel, in a namespace -------------------------------------------------------------

PROBE = """
import json, sys
from gpunode_exporter.ethtool import Ethtool, _GSTRINGS, _STATS, ETHTOOL_GSTATS, ETHTOOL_GSTRINGS, ETH_SS_STATS
from pyroute2.ethtool.ioctl import IoctlEthtool

dev = sys.argv[1]

def code(call):
    try:
        call()
    except OSError as err:
        return err.errno
    return None

with Ethtool() as ethtool:
    first = ethtool.stats(dev)
    second = ethtool.stats(dev)  # names from the cache
    errors = {d: code(lambda d=d: ethtool.stats(d)) for d in ("nosuch0", "lo", "x" * 16, "")}
    # What lo answers to each command: GSTRINGS and GSTATS fail (no get_sset_count, no
    # get_ethtool_stats); GSSET_INFO succeeds with the ETH_SS_STATS bit cleared.
    buf = ethtool._buffer
    offset = buf.place(_GSTRINGS.size)
    _GSTRINGS.pack_into(buf.map, offset, ETHTOOL_GSTRINGS, ETH_SS_STATS, 0)
    lo_gstrings = code(lambda: ethtool._ioctl(b"lo", offset))
    offset = buf.place(_STATS.size)
    _STATS.pack_into(buf.map, offset, ETHTOOL_GSTATS, 0)
    lo_gstats = code(lambda: ethtool._ioctl(b"lo", offset))

ioctl = IoctlEthtool(dev)
pyroute2 = [[name, value] for name, value in ioctl.get_statistics()]
ioctl.close()
print(json.dumps({"first": list(first.items()), "second": list(second.items()), "errors": errors,
                  "lo": [lo_gstrings, lo_gstats], "pyroute2": pyroute2}))
"""

# The count changing between the ioctls, made to happen: a stale name cache, a count
# that is wrong once, and one that is always wrong. On this kernel the mismatch comes
# back as n_stats/len 0; on kernels before 7b07be1ff1cb the answer runs into the guard
# page (EFAULT). Both must end in a refetch, or EAGAIN. Then the device is deleted.
CHANGING = """
import json, subprocess, sys
from gpunode_exporter.ethtool import Ethtool, _STATS, ETHTOOL_GSTATS

dev = sys.argv[1]
with Ethtool() as ethtool:
    real = ethtool.stats(dev)
    ethtool._names[dev] = ethtool._names[dev][:-1]  # one statistic more than the cache knows
    after_stale_cache = ethtool.stats(dev)
    count = ethtool._count
    calls = []
    def wrong_once(name):
        calls.append(name)
        return count(name) - 1 if len(calls) == 1 else count(name)
    ethtool._count = wrong_once
    ethtool._names.clear()
    after_wrong_count = ethtool.stats(dev)
    ethtool._count = lambda name: count(name) - 1
    ethtool._names.clear()
    try:
        ethtool.stats(dev)
        always_wrong = None
    except OSError as err:
        always_wrong = err.errno
    ethtool._count = count
    recovered = ethtool.stats(dev)
    # Asking for 0 entries makes even this kernel answer with all of them (its check
    # skips a zero count), as older kernels always do: the write must hit the guard page.
    offset = ethtool._buffer.place(_STATS.size)
    _STATS.pack_into(ethtool._buffer.map, offset, ETHTOOL_GSTATS, 0)
    try:
        ethtool._ioctl(dev.encode(), offset)
        overlong = None
    except OSError as err:
        overlong = err.errno
    caught = [ethtool._values(dev.encode(), 0), ethtool._strings(dev.encode(), 0)]
    subprocess.run(["ip", "link", "del", dev], check=True)  # the device goes away: ENODEV, names dropped
    try:
        ethtool.stats(dev)
        gone = None
    except OSError as err:
        gone = err.errno
    cached_after_gone = dev in ethtool._names
print(json.dumps({"real": list(real), "stale": list(after_stale_cache), "wrong_once": list(after_wrong_count),
                  "calls": len(calls), "always_wrong": always_wrong, "recovered": list(recovered),
                  "gone": gone, "cached_after_gone": cached_after_gone, "overlong": overlong,
                  "caught": caught}))
"""


def run_in(ns: str, script: str, *args: str) -> dict:
    out = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", script, *args],
                         check=True, capture_output=True, text=True, cwd=ROOT)
    return json.loads(out.stdout)


def ethtool_s(ns: str, device: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", "netns", "exec", ns, "ethtool", "-S", device], capture_output=True, text=True)


def peer_ifindex(ns: str) -> int:
    out = subprocess.run(["ip", "-n", ns, "-j", "link", "show", "peer0"], check=True, capture_output=True,
                         text=True)
    return json.loads(out.stdout)[0]["ifindex"]


def test_veth_stats_agree_with_ethtool_and_pyroute2() -> None:
    if shutil.which("ethtool") is None:
        pytest.skip("the `ethtool` program is not installed (Debian package ethtool; scripts/install-deps.sh --test)")
    with storage_netns() as ns:
        got = run_in(ns, PROBE, STORAGE_DEVICE)
        program = ethtool_s(ns, STORAGE_DEVICE)
        program_lo = ethtool_s(ns, "lo")
        peer = peer_ifindex(ns)
    assert program.returncode == 0, program.stderr
    theirs = parse_ethtool_s(program.stdout)
    ours = dict(got["first"])
    # Same names in the same (driver) order from all three readers.
    names = [name for name, _ in got["first"]]
    assert names == list(theirs) == [name for name, _ in got["pyroute2"]]
    assert [name for name, _ in got["second"]] == names
    assert names[0] == "peer_ifindex" and len(names) > 1  # veth: the peer, then per-queue XDP counters
    # peer_ifindex does not move between the reads; it is peer0's ifindex.
    assert ours["peer_ifindex"] == theirs["peer_ifindex"] == dict(got["pyroute2"])["peer_ifindex"] == peer
    assert all(isinstance(value, int) and value >= 0 for value in ours.values())
    assert got["errors"] == {"nosuch0": errno.ENODEV, "lo": errno.EOPNOTSUPP, "x" * 16: errno.ENODEV,
                             "": errno.ENODEV}
    # lo: what the kernel really says, and how ethtool shows it.
    assert got["lo"] == [errno.EOPNOTSUPP, errno.EOPNOTSUPP]
    assert "no stats available" in program_lo.stdout + program_lo.stderr


def test_a_changing_count_refetches_the_names() -> None:
    with storage_netns() as ns:
        got = run_in(ns, CHANGING, STORAGE_DEVICE)
    assert got["stale"] == got["real"]
    assert got["wrong_once"] == got["real"] and got["calls"] == 2
    assert got["always_wrong"] == errno.EAGAIN
    assert got["recovered"] == got["real"]
    assert got["gone"] == errno.ENODEV and not got["cached_after_gone"]
    assert got["overlong"] == errno.EFAULT  # the guard page stopped the kernel's copy
    assert got["caught"] == [None, None]  # ... and both readers treat that as "count changed"


# The same names read as root and as nobody (no capabilities after setpriv --reuid).
UNPRIVILEGED = """
import json, os, sys
sys.path.insert(0, sys.argv[2])
from gpunode_exporter.ethtool import Ethtool
with Ethtool() as ethtool:
    print(json.dumps({"uid": os.geteuid(), "stats": list(ethtool.stats(sys.argv[1]))}))
"""


def test_no_privilege_needed() -> None:
    # GSSET_INFO, GSTRINGS and GSTATS are in __dev_ethtool()'s "allow anyone" list.
    skip_unless_nobody_can_run_the_checkout()
    with storage_netns() as ns:
        as_root = run_in(ns, UNPRIVILEGED, STORAGE_DEVICE, str(ROOT))
        out = subprocess.run(["ip", "netns", "exec", ns, *AS_NOBODY, sys.executable, "-c", UNPRIVILEGED,
                              STORAGE_DEVICE, str(ROOT)], check=True, capture_output=True, text=True, cwd="/")
    got = json.loads(out.stdout)
    assert got["uid"] == 65534
    assert got["stats"] == as_root["stats"]



# --- what needs no namespace ---------------------------------------------------------------------


@pytest.mark.skipif(ctypes.sizeof(ctypes.c_void_p) != 8, reason="layout checked for 64-bit ABIs")
def test_ifreq_layout_on_64_bit() -> None:
    # struct ifreq: char ifr_name[IFNAMSIZ]; then a union whose largest member is struct ifmap (24 bytes).
    assert ctypes.sizeof(_IfReq) == 40
    assert _IfReq.ifr_ifru.offset == 16


def test_names_the_kernel_would_truncate_are_rejected_before_asking() -> None:
    with Ethtool() as ethtool:
        for device in ("a" * 16, "", "bad\0name", "x/y"):
            with pytest.raises(OSError) as raised:
                ethtool.stats(device)
            assert raised.value.errno == errno.ENODEV, device


def test_guard_page_ends_the_buffer() -> None:
    buffer = _GuardedBuffer()
    try:
        offset = buffer.place(100)
        assert (offset + 100) % os.sysconf("SC_PAGE_SIZE") == 0
        assert buffer.place(40) == offset + 60  # same mapping, struct still ends at the guard
        # A kernel write that runs past the end: read() from /dev/zero into the last
        # 100 bytes, asking for 164. It stops at the guard (100) or fails (EFAULT).
        libc = ctypes.CDLL(None, use_errno=True)
        libc.read.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t]
        libc.read.restype = ctypes.c_ssize_t
        buffer.map[offset:offset + 100] = b"\xaa" * 100
        fd = os.open("/dev/zero", os.O_RDONLY)
        try:
            done = libc.read(fd, buffer.address + offset, 164)
        finally:
            os.close(fd)
        assert done == 100 or (done == -1 and ctypes.get_errno() == errno.EFAULT)
        assert buffer.map[offset:offset + 100] == bytes(100) or done == -1
        big = buffer.place(3 * 4096 + 1)  # grows: a new mapping, again ending at a guard
        assert (big + 3 * 4096 + 1) % os.sysconf("SC_PAGE_SIZE") == 0
    finally:
        buffer.close()


# --- pfc_pause_frames ---------------------------------------------------------------------------------


def test_pfc_from_intels_published_ice_output() -> None:
    stats = ethtool_fixture("ice-e810-enp175s0f0-grep-prio.txt")
    assert len(stats) == 32 and stats["tx_priority_2_xoff.nic"] == 14864
    assert pfc_pause_frames(stats) == {
        ("tx", "0"): 6434, ("tx", "1"): 6434, ("tx", "2"): 14864, ("tx", "3"): 6434,
        ("tx", "4"): 0, ("tx", "5"): 6434, ("tx", "6"): 6434, ("tx", "7"): 6434,
        **{("rx", str(prio)): 0 for prio in range(8)},
    }


def test_pfc_from_mlx5_names() -> None:
    stats = ethtool_fixture("mlx5-pfc-prio3-grep-CONSTRUCTED.txt")
    # Only priority 3 has PFC, so only it has pause counters; the _duration and
    # _transition counters, per-priority traffic and PHY pause totals are not pause frames.
    assert pfc_pause_frames(stats) == {("rx", "3"): 1290418, ("tx", "3"): 41927}
    assert stats["rx_pause_ctrl_phy"] == stats["rx_prio3_pause"]


def test_pfc_from_bnxt_names() -> None:
    # bnxt_port_stats_arr (drivers/net/ethernet/broadcom/bnxt/bnxt_ethtool.c), with plausible values.
    stats = {"rx_pause_frames": 0, "rx_pfc_frames": 5021, "tx_pfc_frames": 77}
    stats |= {f"rx_pfc_ena_frames_pri{prio}": 5021 if prio == 3 else 0 for prio in range(8)}
    stats |= {f"tx_pfc_ena_frames_pri{prio}": 77 if prio == 3 else 0 for prio in range(8)}
    stats |= {f"pfc_pri{prio}_rx_duration_us": 0 for prio in range(8)}
    frames = pfc_pause_frames(stats)
    assert len(frames) == 16
    assert frames[("rx", "3")] == 5021 and frames[("tx", "3")] == 77
    assert sum(frames.values()) == 5021 + 77


def test_no_pfc_names_no_frames() -> None:
    # veth's real names; an mlx5 port with link-level (global) pause only; ice XON only.
    veth = {"peer_ifindex": 7, "rx_queue_0_xdp_packets": 0, "rx_queue_0_drops": 0, "tx_queue_0_xdp_xmit": 0}
    mlx5_global = {"rx_pause_ctrl_phy": 12, "tx_pause_ctrl_phy": 3, "rx_global_pause": 12,
                   "rx_global_pause_duration": 900, "tx_global_pause": 3, "tx_global_pause_duration": 40,
                   "rx_global_pause_transition": 6, "tx_pause_storm_warning_events": 0}
    lookalikes = {"rx_prio8_pause": 1, "rx_prio3_pause_duration": 1, "xrx_prio3_pause": 1, "rx_priority_3_xon.nic": 1,
                  "rx_priority_3_xoff": 1, "rx_pfc_ena_frames_pri3_extra": 1}
    for stats in (veth, mlx5_global, lookalikes, {}):
        assert pfc_pause_frames(stats) == {}


def test_parser_keeps_names_with_colons() -> None:
    text = "NIC statistics:\n     [0]: rx_bytes: 209487403324\n     rx_prio3_pause: 17\n\n"
    assert parse_ethtool_s(text) == {"[0]: rx_bytes": 209487403324, "rx_prio3_pause": 17}
