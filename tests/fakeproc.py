"""A procfs tree of processes in the kernel's formats, for GPU-process accounting tests and fixtures."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")
# /proc/PID/stat of python3 on Linux 6.18 (this project's CI machine), with pid, ppid (field 4) and
# starttime (field 22) made parameters and comm given a space and parentheses, which the kernel allows.
STAT = ("{pid} (python3 (train)) R {ppid} 2176 24769 0 -1 4194304 2859 6532 6 1 4 1 4 2 20 0 1 0 {start} "
        "16965632 3380 18446744073709551615 94574818803712 94574818804053 140726328698960 0 0 0 0 16781312 2 0 "
        "0 0 17 1 0 0 0 0 0 94574818815408 94574818816024 94574836097024 140726328703192 140726328703274 "
        "140726328703274 140726328704975 0\n")
IO_TEXT = ("rchar: {0}\nwchar: {1}\nsyscr: {2}\nsyscw: {3}\nread_bytes: 0\nwrite_bytes: 0\n"
           "cancelled_write_bytes: 0\n")


class FakeProc:
    """A procfs tree: /uptime and /PID/{stat,io,fd/N -> target}."""

    def __init__(self, root: Path, uptime: float = 10_000.0) -> None:
        self.root = root
        self.set_uptime(uptime)

    def set_uptime(self, seconds: float) -> None:
        (self.root / "uptime").write_text(f"{seconds:.2f} 12345.67\n")

    def spawn(self, pid: int, *, start_s: float = 100.0, ppid: int = 1, gpu: bool = False,
              io: tuple[int, int, int, int] = (0, 0, 0, 0), cgroup: bytes | None = None,
              environ: bytes | None = None) -> None:
        d = self.root / str(pid)
        shutil.rmtree(d, ignore_errors=True)
        (d / "fd").mkdir(parents=True)
        (d / "stat").write_text(STAT.format(pid=pid, ppid=ppid, start=int(start_s * TICKS)))
        targets = ["/dev/null", "pipe:[73921]", "socket:[73925]", "anon_inode:[eventfd]", "/dev/nvidiactl",
                   "/dev/nvidia-uvm"] + (["/dev/nvidia3"] if gpu else [])
        for n, target in enumerate(targets):
            (d / "fd" / str(n)).symlink_to(target)
        self.set_io(pid, *io)
        if cgroup is not None:  # /proc/PID/cgroup, as tests/fixtures/cgroup holds them
            (d / "cgroup").write_bytes(cgroup)
        if environ is not None:  # NUL-separated NAME=value entries
            (d / "environ").write_bytes(environ)

    def open_gpu(self, pid: int) -> None:
        (self.root / str(pid) / "fd" / "99").symlink_to("/dev/nvidia0")

    def set_io(self, pid: int, *io: int) -> None:
        (self.root / str(pid) / "io").write_text(IO_TEXT.format(*io))

    def kill(self, pid: int) -> None:
        shutil.rmtree(self.root / str(pid))
