"""Running an outside command (a scheduler call, the operator's reset command) with a timeout."""

from __future__ import annotations

import ctypes
import signal
import subprocess
from collections.abc import Mapping, Sequence

_libc = ctypes.CDLL(None, use_errno=True)


class CommandError(RuntimeError):
    """A command that failed, timed out or could not start: one line saying which and why."""

    def __init__(self, message: str, last_line: str = "") -> None:
        super().__init__(message)
        self.last_line = last_line or message  # what the command said last, else why it failed


def die_with_parent() -> None:
    """preexec_fn: the child gets SIGKILL when its parent dies, however it dies. A call cut short
    with the service (kill -9) then has no effect after it, and the restarted service, which looks
    at the scheduler before calling again, never doubles it."""
    _libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG


def run(argv: Sequence[str], timeout: float, env: Mapping[str, str] | None = None, merge_output: bool = False) -> str:
    """stdout of argv (merge_output: with stderr); CommandError when it cannot start, exceeds timeout
    or exits non-zero, with the last line it wrote (stderr's, or the merged output's)."""
    try:
        out = subprocess.run(list(argv), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT if merge_output else subprocess.PIPE, timeout=timeout, env=env,
                             stdin=subprocess.DEVNULL, preexec_fn=die_with_parent)
    except subprocess.TimeoutExpired:
        raise CommandError(f"{argv[0]}: no answer within {timeout:g}s") from None
    except OSError as err:
        raise CommandError(f"{argv[0]}: {err.strerror}") from None
    if out.returncode != 0:
        said = (out.stdout if merge_output else out.stderr).decode(errors="replace").strip().splitlines()
        last = said[-1].strip()[:200] if said else ""
        raise CommandError(f"{' '.join(argv[:3])}: exit {out.returncode}: {last or 'no message'}"[:300],
                           last or f"exit {out.returncode}, no message")
    return out.stdout.decode(errors="replace")
