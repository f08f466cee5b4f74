"""Pure parsers for /proc/PID/stat and /proc/uptime, and what a process's /proc/PID/io holds
(psutil reads that file: exporter/gpu_processes.py)."""

from __future__ import annotations

from dataclasses import dataclass

from gpunode_exporter.numbers import KernelNumberError, u64


class PidFileError(ValueError):
    """The file is not in the kernel's format (or was cut short)."""


@dataclass(frozen=True)
class Stat:
    ppid: int
    start_ticks: int  # field 22: clock ticks after boot at which the process started


def parse_stat(data: bytes) -> Stat:
    """/proc/PID/stat: parent and start time. comm (field 2) may hold any bytes but NUL, spaces and
    parentheses included (prctl(PR_SET_NAME) lets any user set it): split after the last ')'."""
    _, paren, rest = data.rpartition(b")")
    fields = rest.split()
    if not paren or len(fields) < 20:
        raise PidFileError(f"stat: want >= 22 fields, got {data[:80]!r}")
    try:
        # fields starts at field 3 (state): ppid is field 4 (%d), starttime field 22 (%llu).
        return Stat(ppid=u64(fields[1]), start_ticks=u64(fields[19]))
    except KernelNumberError as err:
        raise PidFileError(f"stat: ppid or starttime: {err}") from None


@dataclass(frozen=True)
class IO:
    """read()/write() bytes and calls of a process and its reaped children (fs/proc/base.c do_io_accounting)."""

    rchar: int = 0
    wchar: int = 0
    syscr: int = 0
    syscw: int = 0

    def __add__(self, other: IO) -> IO:
        return IO(self.rchar + other.rchar, self.wchar + other.wchar,
                  self.syscr + other.syscr, self.syscw + other.syscw)

    def at_least(self, other: IO) -> IO:
        """Field-wise max: a process's counters never go back (a zombie's io no longer sums its threads)."""
        return IO(max(self.rchar, other.rchar), max(self.wchar, other.wchar),
                  max(self.syscr, other.syscr), max(self.syscw, other.syscw))


def parse_uptime(data: bytes) -> float:
    """/proc/uptime: seconds since boot (first of two numbers, "%lu.%02lu")."""
    whole, dot, hundredths = (data.split() or [b""])[0].partition(b".")
    try:
        return u64(whole) + (u64(hundredths) / 10 ** len(hundredths) if dot else 0.0)
    except KernelNumberError:
        raise PidFileError(f"uptime: {data[:40]!r}") from None
