#!/usr/bin/env python3
"""Write a fake procfs tree with many NFSv4.2 mounts, readable by both exporters.

    python benchmarks/make_fixture.py OUTDIR [--mounts 32] [--nconnect 8] [--seed 1]

Layout (what node_exporter's procfs library and gpunode-exporter both read):

    OUTDIR/self -> 4242          procfs resolves /proc/self with readlink
    OUTDIR/4242/mountstats       kernel format (fs/nfs/super.c nfs_show_stats)
    OUTDIR/4242/mountinfo        one line per mountstats `device` line, same order

The NFS sections copy the shape of the real sample
tests/fixtures/mountstats-real/pcp-rhel8-4.18.0-105-nfs3-nfs40-41-42-tcp-9col.txt
(NFSv4.2 over tcp, statvers=1.1, 9 numbers per op) with nconnect transports and
seeded, plausible numbers for a checkpoint-writing training node.

As on a real kernel, `addr=` is only in mountinfo's super options
(nfs_show_options), never in mountstats' `opts:` line (nfs_show_stats); both
exporters take it from mountinfo.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

PID = "4242"

# The NFSv4.2 per-op list, in kernel order, as printed by the RHEL8 4.18.0-105 sample.
NFS42_OPS = (
    "NULL", "READ", "WRITE", "COMMIT", "OPEN", "OPEN_CONFIRM", "OPEN_NOATTR", "OPEN_DOWNGRADE",
    "CLOSE", "SETATTR", "FSINFO", "RENEW", "SETCLIENTID", "SETCLIENTID_CONFIRM", "LOCK", "LOCKT",
    "LOCKU", "ACCESS", "GETATTR", "LOOKUP", "LOOKUP_ROOT", "REMOVE", "RENAME", "LINK", "SYMLINK",
    "CREATE", "PATHCONF", "STATFS", "READLINK", "READDIR", "SERVER_CAPS", "DELEGRETURN", "GETACL",
    "SETACL", "FS_LOCATIONS", "RELEASE_LOCKOWNER", "SECINFO", "FSID_PRESENT", "EXCHANGE_ID",
    "CREATE_SESSION", "DESTROY_SESSION", "SEQUENCE", "GET_LEASE_TIME", "RECLAIM_COMPLETE",
    "LAYOUTGET", "GETDEVICEINFO", "LAYOUTCOMMIT", "LAYOUTRETURN", "SECINFO_NO_NAME",
    "TEST_STATEID", "FREE_STATEID", "GETDEVICELIST", "BIND_CONN_TO_SESSION", "DESTROY_CLIENTID",
    "SEEK", "ALLOCATE", "DEALLOCATE", "LAYOUTSTATS", "CLONE", "COPY", "LOOKUPP",
)

# Ops a checkpointing client actually issues: (typical count, request bytes, reply bytes,
# mean queue ms, mean rtt ms). Everything else stays 0, as in the real samples.
BUSY_OPS: dict[str, tuple[int, int, int, float, float]] = {
    "NULL": (1, 44, 24, 0.0, 0.0),
    "READ": (40_000, 208, 524_400, 0.1, 14.0),
    "WRITE": (400_000, 1_048_800, 176, 900.0, 30.0),
    "COMMIT": (12_000, 216, 104, 0.05, 0.6),
    "OPEN": (12_000, 310, 368, 0.07, 4.5),
    "CLOSE": (12_000, 236, 176, 0.03, 0.4),
    "SETATTR": (3_000, 260, 280, 0.04, 0.8),
    "FSINFO": (2, 204, 164, 0.0, 0.0),
    "ACCESS": (30_000, 208, 168, 0.02, 0.3),
    "GETATTR": (900_000, 200, 240, 0.02, 0.3),
    "LOOKUP": (60_000, 232, 300, 0.03, 0.4),
    "REMOVE": (2_000, 220, 140, 0.03, 0.9),
    "RENAME": (6_000, 300, 220, 0.04, 1.1),
    "PATHCONF": (2, 196, 116, 0.0, 0.0),
    "STATFS": (800, 200, 160, 0.02, 0.3),
    "READDIR": (1_500, 236, 4_200, 0.03, 1.5),
    "SERVER_CAPS": (4, 204, 164, 0.0, 0.2),
    "DELEGRETURN": (500, 240, 140, 0.03, 0.3),
    "EXCHANGE_ID": (2, 300, 148, 0.0, 3.0),
    "CREATE_SESSION": (1, 248, 124, 0.0, 1.5),
    "SEQUENCE": (900, 144, 80, 0.01, 0.2),
    "RECLAIM_COMPLETE": (1, 152, 88, 0.0, 33.0),
    "LAYOUTGET": (0, 0, 0, 0.0, 0.0),
    "TEST_STATEID": (3, 176, 96, 0.0, 0.3),
}

# Mounts a node has before any NFS: (device, mountpoint, fstype, mount opts, optional fields,
# super opts). Only the NFS ones carry statistics.
BASE_MOUNTS = (
    ("/dev/vda1", "/", "ext4", "rw,relatime", "shared:1", "rw,errors=remount-ro"),
    ("sysfs", "/sys", "sysfs", "rw,nosuid,nodev,noexec,relatime", "shared:7", "rw"),
    ("proc", "/proc", "proc", "rw,nosuid,nodev,noexec,relatime", "shared:13", "rw"),
    ("udev", "/dev", "devtmpfs", "rw,nosuid,relatime", "shared:2",
     "rw,size=32874848k,nr_inodes=8218712,mode=755,inode64"),
    ("tmpfs", "/dev/shm", "tmpfs", "rw,nosuid,nodev", "shared:3", "rw,inode64"),
    ("tmpfs", "/run", "tmpfs", "rw,nosuid,nodev,noexec,relatime", "shared:5",
     "rw,size=6578296k,mode=755,inode64"),
)
BASE_PARENTS = (None, 0, 0, 0, 3, 0)  # index into BASE_MOUNTS of each one's parent mount
BASE_DEVS = ("252:1", "0:21", "0:22", "0:5", "0:24", "0:25")


def server_addr(index: int) -> str:
    """Loopback server address of mount `index`: 127.0.0.1, 127.0.0.2, ..."""
    return f"127.0.0.{index % 254 + 1}"


def nfs_options(nconnect: int, showdefaults: bool) -> str:
    """What nfs_show_mount_options prints for a v4.2 tcp mount (after rw). mountstats asks
    for the defaults too (showdefaults=1); /proc/mounts and mountinfo don't."""
    defaults = "acregmin=3,acregmax=60,acdirmin=30,acdirmax=60," if showdefaults else ""
    nconnect_opt = f",nconnect={nconnect}" if nconnect > 1 else ""
    return (f"vers=4.2,rsize=1048576,wsize=1048576,namlen=255,{defaults}hard,proto=tcp{nconnect_opt},"
            "timeo=600,retrans=2,sec=sys,clientaddr=127.0.0.1,local_lock=none")


def op_line(name: str, nums: list[int]) -> str:
    # net/sunrpc/stats.c rpc_print_iostats: "\t%12s: " then 9 space-separated numbers.
    return f"\t{name:>12}: " + " ".join(str(n) for n in nums)


def op_numbers(rng: random.Random, name: str, scale: float) -> list[int]:
    """requests transmissions major_timeouts bytes_sent bytes_recv queue_ms rtt_ms execute_ms errors."""
    spec = BUSY_OPS.get(name)
    if spec is None or spec[0] == 0:
        return [0] * 9
    count, req_bytes, rep_bytes, queue_ms, rtt_ms = spec
    reqs = max(1, int(count * scale * rng.uniform(0.6, 1.4))) if count > 10 else count
    retrans = int(reqs * rng.uniform(0, 2e-5))
    major = 1 if retrans and rng.random() < 0.1 else 0
    queue = int(reqs * queue_ms * rng.uniform(0.5, 1.5))
    rtt = int(reqs * rtt_ms * rng.uniform(0.7, 1.3))
    execute = queue + rtt + int(reqs * rng.uniform(0.005, 0.05))
    errors = int(reqs * rng.uniform(0, 0.002)) if name in ("OPEN", "LOOKUP", "REMOVE") else 0
    return [reqs, reqs + retrans, major, reqs * req_bytes, reqs * rep_bytes, queue, rtt, execute, errors]


def xprt_line(rng: random.Random, port: int, sends: int) -> str:
    # net/sunrpc/xprtsock.c xs_tcp_print_stats: port bind_count connect_count connect_time
    # idle_time sends recvs bad_xids req_u bklog_u max_slots sending_u pending_u
    in_flight = sends * rng.randint(2, 24)
    nums = [port, 0, rng.choice((1, 1, 1, 2)), rng.randint(0, 40), rng.randint(0, 30),
            sends, sends - rng.randint(0, 3), 0, in_flight, sends * rng.randint(0, 6),
            rng.choice((32, 64, 128, 256)), sends * rng.randint(0, 2), in_flight - sends]
    return "\txprt:\ttcp " + " ".join(str(n) for n in nums)


def nfs_section(rng: random.Random, index: int, nconnect: int) -> list[str]:
    scale = rng.uniform(0.5, 2.0)  # some mounts are busier than others
    ops = {name: op_numbers(rng, name, scale) for name in NFS42_OPS}
    total_reqs = sum(nums[1] for nums in ops.values())
    opts = "rw," + nfs_options(nconnect, showdefaults=True)
    written = ops["WRITE"][3]
    read = ops["READ"][4]
    events = [rng.randint(0, 10**6) for _ in range(27)]
    lines = [
        f"device nfs-{index}.example:/ckpt/{index} mounted on /mnt/ckpt/{index} "
        "with fstype nfs4 statvers=1.1",
        f"\topts:\t{opts}",
        f"\tage:\t{rng.randint(3600, 30 * 86400)}",
        "\timpl_id:\tname='',domain='',date='0,0'",
        "\tcaps:\tcaps=0x3ffbffff,wtmult=512,dtsize=1048576,bsize=0,namlen=255",
        "\tnfsv4:\tbm0=0xfdffbfff,bm1=0x40f9be3e,bm2=0x20803,acl=0x3,sessions,pnfs=not configured",
        "\tsec:\tflavor=1,pseudoflavor=1",
        # nfs_show_stats prints each event and byte counter followed by a space.
        "\tevents:\t" + "".join(f"{n} " for n in events),
        "\tbytes:\t" + "".join(f"{n} " for n in (read, written, 0, 0, read, written,
                                                   read // 4096, written // 4096)),
        "\tRPC iostats version: 1.1  p/v: 100003/4 (nfs)",
    ]
    # nconnect: one xprt line per connection, the sends split between them.
    shares = [rng.uniform(0.8, 1.2) for _ in range(nconnect)]
    for conn, share in enumerate(shares):
        sends = int(total_reqs * share / sum(shares))
        lines.append(xprt_line(rng, 700 + (index * nconnect + conn) % 320, sends))
    lines.append("\tper-op statistics")
    lines.extend(op_line(name, nums) for name, nums in ops.items())
    lines.append("")  # the kernel ends every NFS section with a blank line
    return lines


def build(mounts: int, nconnect: int, seed: int) -> tuple[str, str]:
    """(mountstats text, mountinfo text)."""
    rng = random.Random(seed)
    stats: list[str] = []
    info: list[str] = []
    first_id = 21
    for i, (dev, mnt, fstype, mopts, optional, sopts) in enumerate(BASE_MOUNTS):
        parent_index = BASE_PARENTS[i]
        parent = 1 if parent_index is None else first_id + parent_index  # 1: outside the namespace
        stats.append(f"device {dev} mounted on {mnt} with fstype {fstype}")
        info.append(f"{first_id + i} {parent} {BASE_DEVS[i]} / {mnt} {mopts} {optional} - "
                    f"{fstype} {dev} {sopts}")
    for n in range(mounts):
        stats.extend(nfs_section(rng, n, nconnect))
        mount_id = first_id + len(BASE_MOUNTS) + n
        # mountinfo super options: nfs_show_options, i.e. the same options plus addr=.
        info.append(f"{mount_id} {first_id} 0:{50 + n} / /mnt/ckpt/{n} rw,relatime shared:{100 + n} - "
                    f"nfs4 nfs-{n}.example:/ckpt/{n} rw,{nfs_options(nconnect, showdefaults=False)},"
                    f"addr={server_addr(n)}")
    return "\n".join(stats) + "\n", "\n".join(info) + "\n"


def write_fixture(outdir: Path, mounts: int = 32, nconnect: int = 8, seed: int = 1) -> Path:
    """Create (or overwrite) the procfs tree under `outdir`; returns `outdir`."""
    if not 1 <= mounts <= 254:
        raise ValueError("--mounts must be 1..254 (one loopback address each)")
    if not 1 <= nconnect <= 16:
        raise ValueError("--nconnect must be 1..16 (the kernel's limit)")
    stats, info = build(mounts, nconnect, seed)
    piddir = outdir / PID
    piddir.mkdir(parents=True, exist_ok=True)
    (piddir / "mountstats").write_text(stats)
    (piddir / "mountinfo").write_text(info)
    self_link = outdir / "self"
    if self_link.is_symlink() or self_link.exists():
        self_link.unlink()
    self_link.symlink_to(PID)  # relative, like the kernel's: readlink gives the PID
    return outdir


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("outdir", type=Path)
    p.add_argument("--mounts", type=int, default=32, help="NFSv4.2 mounts (default: 32)")
    p.add_argument("--nconnect", type=int, default=8, help="transports per mount (default: 8)")
    p.add_argument("--seed", type=int, default=1, help="random seed (default: 1)")
    args = p.parse_args(argv)
    try:
        out = write_fixture(args.outdir, args.mounts, args.nconnect, args.seed)
    except ValueError as err:
        p.error(str(err))
    stats = out / PID / "mountstats"
    print(f"wrote {stats} ({stats.stat().st_size} bytes) and {out / PID / 'mountinfo'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
