"""Which problems are already in the log, so that each is logged when it starts or changes, not every scrape."""

from __future__ import annotations

import threading


class Problems:
    """Per key (a collector, a path, a device): the problem last logged. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: dict[str, str] = {}

    def new(self, key: str, problem: str) -> bool:
        """Record the problem; True when it is not the one last logged for key (log it)."""
        with self._lock:
            if self._last.get(key) == problem:
                return False
            self._last[key] = problem
            return True

    def solved(self, key: str) -> bool:
        """Forget key's problem; True when there was one (log the recovery if you like)."""
        with self._lock:
            return self._last.pop(key, None) is not None
