"""Pure parser for the NFS entries of /proc/PID/mountinfo.

The kernel prints an NFS mount's server address (`addr=`) only in mountinfo's
super options, never in mountstats, so the two files are joined on
(source, mountpoint).
"""

from __future__ import annotations

from gpunode_exporter.procfs.mountstats import NFS_FSTYPES, unescape


def nfs_server_addresses(text: str) -> dict[tuple[str, str], str]:
    """{(source, mountpoint): server address} for the NFS mounts that carry addr=."""
    addresses: dict[tuple[str, str], str] = {}
    for line in text.splitlines():
        # 36 35 0:52 / /mnt/ckpt rw,relatime shared:1 - nfs4 srv:/ckpt rw,vers=4.2,...,addr=10.0.0.5
        left, sep, right = line.partition(" - ")
        fields = right.split(" ")
        if not sep or len(fields) < 3 or fields[0] not in NFS_FSTYPES:
            continue
        mount_fields = left.split(" ")
        if len(mount_fields) < 5:
            continue
        for option in fields[2].split(","):
            if option.startswith("addr="):
                key = (unescape(fields[1]), unescape(mount_fields[4]))
                addresses.setdefault(key, option[5:])
                break
    return addresses
