"""Pure parsers of sysfs trees: a root path in, data out (like prometheus/procfs/sysfs)."""

from __future__ import annotations

import os


def read_attribute(path: str | os.PathLike[str], limit: int = 4096, dir_fd: int | None = None) -> bytes:
    """An attribute's bytes (OSError if unreadable); path relative to dir_fd if given.
    os.open/os.read: a buffered file object and a Path per file cost more than the read
    itself, and a scrape reads ~100 attributes."""
    fd = os.open(path, os.O_RDONLY, dir_fd=dir_fd)
    try:
        return os.read(fd, limit)
    finally:
        os.close(fd)


def read_line(path: str | os.PathLike[str], dir_fd: int | None = None) -> str | None:
    """The first line of an attribute, stripped; None if it cannot be read or is not ASCII."""
    try:
        data = read_attribute(path, dir_fd=dir_fd)
    except OSError:  # missing, EINVAL (what an attribute says for "no value"), EIO, EACCES
        return None
    try:
        return data.decode("ascii").split("\n", 1)[0].strip()
    except UnicodeDecodeError:
        return None
