"""NFS server addresses from mountinfo's super options."""

from __future__ import annotations

from gpunode_exporter.procfs.mountinfo import nfs_server_addresses

REAL = (  # from a Debian bookworm host, NFS lines added in the kernel's format
    "22 28 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw\n"
    "61 28 0:52 / /mnt/a\\040b rw,relatime shared:40 - nfs4 srv:/a rw,vers=4.2,rsize=1048576,"
    "wsize=1048576,namlen=255,hard,proto=tcp,timeo=600,retrans=2,sec=sys,clientaddr=10.0.0.2,"
    "local_lock=none,addr=10.0.0.5\n"
    "62 28 0:53 / /v3 rw,relatime shared:41 - nfs [fd00::5]:/v3 rw,vers=3,proto=tcp6,mountaddr=fd00::5,"
    "mountvers=3,mountproto=tcp6,local_lock=none,addr=fd00::5\n"
    "63 28 0:54 / /noaddr rw - nfs srv:/x rw,vers=3\n"
    "64 28 259:1 / /scratch rw,relatime - xfs /dev/nvme0n1p1 rw,addr=not-nfs\n"
    "garbage line\n"
    "65 28 0:55 / - nfs4\n"
)


def test_addresses_of_nfs_mounts_only() -> None:
    assert nfs_server_addresses(REAL) == {("srv:/a", "/mnt/a b"): "10.0.0.5",
                                          ("[fd00::5]:/v3", "/v3"): "fd00::5"}


def test_empty() -> None:
    assert nfs_server_addresses("") == {}
