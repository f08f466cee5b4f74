"""Pure parsers for per-process files: /proc/PID/stat and /proc/PID/io, and /proc/uptime."""

from __future__ import annotations

from dataclasses import dataclass


class PidFileError(ValueError):
    """The file is not in the kernel's format (or was cut short)."""


@dataclass(frozen=True)
class Stat:
    ppid: int
    start_ticks: int  # field 22: clock ticks after boot at which the process started


def parse_stat(text: str) -> Stat:
    """/proc/PID/stat. comm (field 2) may hold spaces and parentheses: split after the last ')'."""
    _, paren, rest = text.rpartition(")")
    fields = rest.split()
    if not paren or len(fields) < 20:
        raise PidFileError(f"stat: want >= 22 fields, got {text[:80]!r}")
    try:
        # rest starts at field 3 (state): ppid is field 4, starttime field 22.
        return Stat(ppid=int(fields[1]), start_ticks=int(fields[19]))
    except ValueError:
        raise PidFileError(f"stat: non-numeric ppid or starttime in {text[:80]!r}") from None


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


def parse_io(text: str) -> IO:
    """/proc/PID/io: 'rchar: 323934931' lines."""
    values: dict[str, int] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            try:
                values[key.strip()] = int(value)
            except ValueError:
                raise PidFileError(f"io: non-numeric {line!r}") from None
    try:
        return IO(values["rchar"], values["wchar"], values["syscr"], values["syscw"])
    except KeyError as missing:
        raise PidFileError(f"io: no {missing.args[0]} line") from None


def parse_uptime(text: str) -> float:
    """/proc/uptime: seconds since boot (first of two numbers)."""
    try:
        return float(text.split()[0])
    except (IndexError, ValueError):
        raise PidFileError(f"uptime: {text[:40]!r}") from None
