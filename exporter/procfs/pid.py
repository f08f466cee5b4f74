"""Pure parsers for per-process files: /proc/PID/stat and /proc/PID/io, and /proc/uptime."""

from __future__ import annotations

from dataclasses import dataclass

from exporter.numbers import KernelNumberError, u64


class PidFileError(ValueError):
    """The file is not in the kernel's format (or was cut short)."""


@dataclass(frozen=True)
class Stat:
    ppid: int
    start_ticks: int  # field 22: clock ticks after boot at which the process started


@dataclass(frozen=True)
class Usage:
    """What a process costs, from /proc/PID/stat."""

    cpu_ticks: int  # utime + stime (fields 14 and 15)
    start_ticks: int
    virtual_bytes: int  # field 23, vsize
    resident_pages: int  # field 24, rss


def _stat_fields(data: bytes, want: int) -> list[bytes]:
    """The fields after comm (field 2), which may hold any bytes but NUL, spaces and parentheses
    included (prctl(PR_SET_NAME) lets any user set it): split after the last ')'."""
    _, paren, rest = data.rpartition(b")")
    fields = rest.split()
    if not paren or len(fields) < want - 2:
        raise PidFileError(f"stat: want >= {want} fields, got {data[:80]!r}")
    return fields


def parse_stat(data: bytes) -> Stat:
    """/proc/PID/stat: parent and start time."""
    fields = _stat_fields(data, 22)
    try:
        # rest starts at field 3 (state): ppid is field 4 (%d), starttime field 22 (%llu).
        return Stat(ppid=u64(fields[1]), start_ticks=u64(fields[19]))
    except KernelNumberError as err:
        raise PidFileError(f"stat: ppid or starttime: {err}") from None


def parse_usage(data: bytes) -> Usage:
    """/proc/PID/stat: CPU time, start time and memory."""
    fields = _stat_fields(data, 24)
    try:
        # rest starts at field 3: utime is field 14 (%lu), rss field 24 (%ld, never negative).
        return Usage(cpu_ticks=u64(fields[11]) + u64(fields[12]), start_ticks=u64(fields[19]),
                     virtual_bytes=u64(fields[20]), resident_pages=u64(fields[21]))
    except KernelNumberError as err:
        raise PidFileError(f"stat: usage: {err}") from None


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


def parse_io(data: bytes) -> IO:
    """/proc/PID/io: 'rchar: 323934931' lines (%llu)."""
    values: dict[bytes, int] = {}
    for line in data.splitlines():
        key, sep, value = line.partition(b":")
        if sep:
            try:
                values[key.strip()] = u64(value.strip())
            except KernelNumberError as err:
                raise PidFileError(f"io: {key[:20]!r}: {err}") from None
    try:
        return IO(values[b"rchar"], values[b"wchar"], values[b"syscr"], values[b"syscw"])
    except KeyError as missing:
        raise PidFileError(f"io: no {missing.args[0]!r} line") from None


def parse_uptime(data: bytes) -> float:
    """/proc/uptime: seconds since boot (first of two numbers, "%lu.%02lu")."""
    whole, dot, hundredths = (data.split() or [b""])[0].partition(b".")
    try:
        return u64(whole) + (u64(hundredths) / 10 ** len(hundredths) if dot else 0.0)
    except KernelNumberError:
        raise PidFileError(f"uptime: {data[:40]!r}") from None
