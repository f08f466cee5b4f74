"""The kernel log as /dev/kmsg gives it: one record per read, `prio,seq,usec,flags[,..];text`.

Documentation/ABI/testing/dev-kmsg: the text escapes non-printable bytes and
backslash as \\xNN; lines after the first that start with a space are the
record's dictionary (SUBSYSTEM=, DEVICE=). A reader that falls behind gets
EPIPE once and continues at the oldest record still held, so lost records show
as a jump in seq. A regular file or FIFO holding records one per line (a
capture, a replay, a test) is read the same way and followed as it grows.
"""

from __future__ import annotations

import errno
import os
import re
import select
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from gpunode_exporter.numbers import U32_MAX, U64_MAX, KernelNumberError

# A kernel record is at most 8 KiB with its dictionary (CONSOLE_EXT_LOG_MAX); a
# read with a smaller buffer fails with EINVAL.
DEVICE_READ_SIZE = 16384
# Longest line accepted from a file; longer ones are skipped as malformed.
MAX_LINE = 16384
_FILE_CHUNK = 1 << 16
_ESCAPE = re.compile(rb"\\x([0-9a-fA-F]{2})")
FACILITY_KERNEL = 0


@dataclass(frozen=True, slots=True)
class Record:
    facility: int  # 0 = the kernel; user space writing to /dev/kmsg gets 1 (user) or its own
    level: int
    seq: int
    usec: int  # since boot, the kernel's local clock
    text: bytes  # the first line, still escaped; see unescape()


def parse_record(raw: bytes) -> Record:
    """One record (its first line is used, the dictionary ignored). ValueError if malformed
    (KernelNumberError, a ValueError, for a number the kernel could not have printed)."""
    head, sep, body = raw.partition(b";")
    fields = head.split(b",", 4)
    if not sep or len(fields) < 4:
        raise ValueError("not a kmsg record: want prio,seq,usec,flags;text")
    # printk's devkmsg_read prints "%u,%llu,%llu": anything else is no kernel record. Inline
    # rather than numbers.u64() (the reader's hot loop); bytes.isdigit() is ASCII digits only.
    p, s, u = fields[0], fields[1], fields[2]
    if not (p.isdigit() and s.isdigit() and u.isdigit() and len(p) <= 10 and len(s) <= 20 and len(u) <= 20):
        raise KernelNumberError("not a kmsg record: prio, seq or usec is no kernel number")
    prio, seq, usec = int(p), int(s), int(u)
    if prio > U32_MAX or seq > U64_MAX or usec > U64_MAX:
        raise KernelNumberError("not a kmsg record: prio, seq or usec past its type")
    line_end = body.find(b"\n")
    return Record(prio >> 3, prio & 7, seq, usec, body if line_end < 0 else body[:line_end])


def unescape(text: bytes) -> str:
    r"""Undo the kernel's \xNN escaping; invalid UTF-8 becomes U+FFFD."""
    if b"\\x" in text:
        text = _ESCAPE.sub(lambda m: bytes((int(m[1], 16),)), text)
    return text.decode("utf-8", errors="replace")


class KmsgReader:
    """Reads raw records from /dev/kmsg, or from a file/FIFO of records one per line.

    read() returns the records available now (possibly none) without blocking;
    wait() sleeps until more may be there. Open errors (permission, missing)
    are raised by the constructor as OSError.
    """

    def __init__(self, path: Path, from_end: bool = False) -> None:
        self.path = path
        self._fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        mode = os.fstat(self._fd).st_mode
        self.is_device = stat.S_ISCHR(mode)
        self._is_regular = stat.S_ISREG(mode)
        self._at_eof = False  # a FIFO with no writer selects readable forever: poll it instead
        self._pending = b""  # a file's incomplete last line
        self._skipping = False  # inside an overlong line
        self.overlong = 0  # lines skipped for length (files only; the kernel bounds records itself)
        if from_end:
            os.lseek(self._fd, 0, os.SEEK_END)

    def fileno(self) -> int:
        return self._fd

    def read(self, max_records: int = 4096) -> list[bytes]:
        return self._read_device(max_records) if self.is_device else self._read_file()

    def _read_device(self, max_records: int) -> list[bytes]:
        records: list[bytes] = []
        while len(records) < max_records:
            try:
                raw = os.read(self._fd, DEVICE_READ_SIZE)
            except BlockingIOError:
                break
            except OSError as err:
                if err.errno == errno.EPIPE:
                    continue  # overwritten under us: the next read resumes at the oldest record
                raise
            if not raw:
                break
            records.append(raw)
        return records

    def _read_file(self) -> list[bytes]:
        if self._is_regular and os.fstat(self._fd).st_size < os.lseek(self._fd, 0, os.SEEK_CUR):
            os.lseek(self._fd, 0, os.SEEK_SET)  # truncated and rewritten: start over (seq says what's new)
            self._pending = b""
        try:
            chunk = os.read(self._fd, _FILE_CHUNK)
        except BlockingIOError:
            return []
        self._at_eof = not chunk
        if not chunk:
            return []
        lines = (self._pending + chunk).split(b"\n")
        self._pending = lines.pop()
        records = []
        for line in lines:
            if self._skipping:  # the end of an overlong line
                self._skipping = False
                continue
            if line and line[0] != 0x20:  # " key=value": the previous record's dictionary
                if len(line) > MAX_LINE:
                    self.overlong += 1
                else:
                    records.append(line)
        if len(self._pending) > MAX_LINE:
            if not self._skipping:
                self.overlong += 1
            self._pending, self._skipping = b"", True
        return records

    def wait(self, timeout: float) -> None:
        """Until records may be available, at most timeout seconds."""
        if self.is_device or not (self._is_regular or self._at_eof):
            select.select([self._fd], [], [], timeout)
        else:
            time.sleep(min(timeout, 0.005))  # a file is always "readable": poll its growth

    def close(self) -> None:
        os.close(self._fd)
