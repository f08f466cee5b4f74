"""Running an outside command (a scheduler call, the operator's reset command) with a timeout."""

from __future__ import annotations

import ctypes
import signal
import subprocess
from collections.abc import Mapping, Sequence

_libc = ctypes.CDLL(None, use_errno=True)


class CommandError(RuntimeError):
    """A command that failed, timed out or could not start: one line saying which and why."""


def die_with_parent() -> None:
    """preexec_fn: the child gets SIGKILL when its parent dies, however it dies. A call cut short
    with the service (kill -9) then has no effect after it, and the restarted service, which looks
    at the scheduler before calling again, never doubles it."""
    _libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG


def run(argv: Sequence[str], timeout: float, env: Mapping[str, str] | None = None) -> str:
    """stdout of argv; CommandError when it cannot start, exceeds timeout or exits non-zero."""
    try:
        out = subprocess.run(list(argv), capture_output=True, timeout=timeout, env=env, stdin=subprocess.DEVNULL,
                             preexec_fn=die_with_parent)
    except subprocess.TimeoutExpired:
        raise CommandError(f"{argv[0]}: no answer within {timeout:g}s") from None
    except OSError as err:
        raise CommandError(f"{argv[0]}: {err.strerror}") from None
    if out.returncode != 0:
        said = out.stderr.decode(errors="replace").strip().splitlines()
        raise CommandError(f"{' '.join(argv[:3])}: exit {out.returncode}: {said[-1] if said else 'no message'}"[:300])
    return out.stdout.decode(errors="replace")
