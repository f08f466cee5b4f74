"""The exporter's log lines on stderr, with their priority where stderr is the journal.

Under systemd, stderr is a stream into journald, which reads a line's priority from a "<N>"
prefix (sd-daemon(3)); without one every line is info, and `journalctl -p err` shows none of
the exporter's errors. systemd sets JOURNAL_STREAM to that stream's device and inode, so a
stderr redirected elsewhere (a pipe, a file) keeps plain lines.
"""

from __future__ import annotations

import logging
import os
import sys

FORMAT = "%(asctime)s level=%(levelname)s %(name)s: %(message)s"
# syslog(3) priorities, as sd-daemon(3) prefixes them, highest level first.
_PRIORITY = ((logging.CRITICAL, 2), (logging.ERROR, 3), (logging.WARNING, 4), (logging.INFO, 6))


class JournalFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        priority = next((p for level, p in _PRIORITY if record.levelno >= level), 7)  # 7: debug
        return f"<{priority}>{super().format(record)}"


def stderr_is_the_journal() -> bool:
    device, _, inode = os.environ.get("JOURNAL_STREAM", "").partition(":")
    try:
        stat = os.fstat(sys.stderr.fileno())
    except (OSError, ValueError, AttributeError):
        return False
    return f"{stat.st_dev}:{stat.st_ino}" == f"{device}:{inode}"


def setup(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JournalFormatter(FORMAT) if stderr_is_the_journal() else logging.Formatter(FORMAT))
    logging.basicConfig(level=level.upper().replace("WARN", "WARNING"), handlers=[handler])
