"""What the XID counters have counted in this boot, kept on disk so a restart continues them.

The file is keyed by the boot id: within one boot a restarted exporter resumes
after the last kernel record it handled; after a reboot the counters start
again from the whole new ring buffer. Writes are atomic (temporary file, fsync,
rename), so a crash leaves the old state or the new one, never half of one.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

VERSION = 1
FILE_NAME = "xid-state.json"


@dataclass
class Count:
    value: int = 0
    last_seconds: float = 0.0  # Unix time of the latest event


@dataclass
class State:
    boot_id: str
    source: str = "kmsg"  # what counted the events: kmsg or nvml
    kmsg_seq: int | None = None  # the last kernel record handled
    records_lost: int = 0
    # canonical bus id ("" if the line had none) -> (gpu index, uuid), fixed when first seen
    gpus: dict[str, tuple[str, str]] = field(default_factory=dict)
    counts: dict[tuple[str, int], Count] = field(default_factory=dict)  # (bus id, xid)
    recovery: dict[str, int] = field(default_factory=dict)  # bus id -> recovery action

    def to_json(self) -> dict[str, Any]:
        return {
            "version": VERSION, "boot_id": self.boot_id, "source": self.source,
            "kmsg_seq": self.kmsg_seq, "records_lost": self.records_lost,
            "gpus": {bus: {"gpu": gpu, "uuid": uuid} for bus, (gpu, uuid) in sorted(self.gpus.items())},
            "xids": [{"pci_bus_id": bus, "xid": xid, "count": c.value, "last": c.last_seconds}
                     for (bus, xid), c in sorted(self.counts.items())],
            "recovery": dict(sorted(self.recovery.items())),
        }

    @classmethod
    def from_json(cls, data: Any) -> State:
        """ValueError (or KeyError/TypeError) on anything but what to_json() wrote."""
        if not isinstance(data, dict) or data.get("version") != VERSION:
            raise ValueError(f"not a version {VERSION} state")
        seq = data["kmsg_seq"]
        state = cls(boot_id=str(data["boot_id"]), source=str(data["source"]),
                    kmsg_seq=None if seq is None else _natural(seq), records_lost=_natural(data["records_lost"]))
        for bus, ids in data["gpus"].items():
            state.gpus[str(bus)] = (str(ids["gpu"]), str(ids["uuid"]))
        for item in data["xids"]:
            state.counts[(str(item["pci_bus_id"]), _natural(item["xid"]))] = Count(
                _natural(item["count"]), float(item["last"]))
        for bus, action in data["recovery"].items():
            state.recovery[str(bus)] = _natural(action)
        if state.source not in ("kmsg", "nvml"):
            raise ValueError(f"unknown source {state.source!r}")
        return state


def _natural(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"want a non-negative integer, got {value!r}")
    return value


def load(path: Path, boot_id: str) -> tuple[State, str | None]:
    """(state, problem). A missing file or one from another boot gives a fresh state and no
    problem; an unreadable or corrupt one gives a fresh state and says why."""
    fresh = State(boot_id)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return fresh, None
    except (OSError, UnicodeDecodeError) as err:
        return fresh, f"cannot read {path}: {err}"
    try:
        state = State.from_json(json.loads(text))
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        return fresh, f"corrupt {path} ({type(err).__name__}: {err}); starting again from the kernel log"
    return (state, None) if state.boot_id == boot_id else (fresh, None)


def save(path: Path, state: State) -> None:
    """Atomically replace path; OSError if the directory is not writable."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as out:
        json.dump(state.to_json(), out, separators=(",", ":"))
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
