"""What the Xid counters have counted in this boot, kept on disk so a restart continues them.

The file is keyed by the boot id: within one boot a restarted exporter resumes
after the last kernel record it handled; after a reboot the counters start
again from the whole new ring buffer. Writes are atomic (temporary file, fsync,
rename), so a crash leaves the old state or the new one, never half of one.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpunode_exporter.numbers import U32_MAX, U64_MAX
from gpunode_exporter.xid.kernel import KINDS, SEVERITIES

VERSION = 1
FILE_NAME = "xid-state.json"
MAX_BYTES = 8 << 20  # a full state (4096 counts of each table) is ~2 MiB
MAX_ENTRIES = 8192


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
    # NVSwitch SXids: (switch index, bus id, sxid, severity)
    sxids: dict[tuple[int, str, int, str], Count] = field(default_factory=dict)
    kernel: dict[tuple[str, str], Count] = field(default_factory=dict)  # (kind, device)
    nfs_servers: dict[str, int] = field(default_factory=dict)  # server -> 1 responding, 0 not

    def to_json(self) -> dict[str, Any]:
        return {
            "version": VERSION, "boot_id": self.boot_id, "source": self.source,
            "kmsg_seq": self.kmsg_seq, "records_lost": self.records_lost,
            "gpus": {bus: {"gpu": gpu, "uuid": uuid} for bus, (gpu, uuid) in sorted(self.gpus.items())},
            "xids": [{"pci_bus_id": bus, "xid": xid, "count": c.value, "last": c.last_seconds}
                     for (bus, xid), c in sorted(self.counts.items())],
            "recovery": dict(sorted(self.recovery.items())),
            "sxids": [{"switch": sw, "pci_bus_id": bus, "sxid": code, "severity": sev, "count": c.value,
                       "last": c.last_seconds} for (sw, bus, code, sev), c in sorted(self.sxids.items())],
            "kernel_events": [{"kind": kind, "device": device, "count": c.value, "last": c.last_seconds}
                              for (kind, device), c in sorted(self.kernel.items())],
            "nfs_servers": dict(sorted(self.nfs_servers.items())),
        }

    @classmethod
    def from_json(cls, data: Any) -> State:
        """ValueError on anything but what to_json() wrote: every field checked for its type and range."""
        if not isinstance(data, dict) or data.get("version") != VERSION:
            raise ValueError(f"not a version {VERSION} state")
        seq = data["kmsg_seq"]
        state = cls(boot_id=_text(data["boot_id"]), source=_text(data["source"]),
                    kmsg_seq=None if seq is None else _natural(seq), records_lost=_natural(data["records_lost"]))
        for bus, ids in _mapping(data["gpus"]).items():
            ids = _mapping(ids)
            state.gpus[_text(bus)] = (_text(ids["gpu"]), _text(ids["uuid"]))
        if not isinstance(data["xids"], list) or len(data["xids"]) > MAX_ENTRIES:
            raise ValueError(f"xids: want a list of at most {MAX_ENTRIES}")
        for item in data["xids"]:
            item = _mapping(item)
            state.counts[(_text(item["pci_bus_id"]), _natural(item["xid"], U32_MAX))] = Count(
                _natural(item["count"]), _seconds(item["last"]))
        for bus, action in _mapping(data["recovery"]).items():
            state.recovery[_text(bus)] = _natural(action, U32_MAX)
        # Absent from files written before SXids and kernel events were counted: nothing counted yet.
        for item in _entries(data.get("sxids", [])):
            state.sxids[(_natural(item["switch"], U32_MAX), _text(item["pci_bus_id"]),
                         _natural(item["sxid"], U32_MAX), _text(item["severity"]))] = _count(item)
        for item in _entries(data.get("kernel_events", [])):
            state.kernel[(_text(item["kind"]), _text(item["device"]))] = _count(item)
        for server, up in _mapping(data.get("nfs_servers", {})).items():
            state.nfs_servers[_text(server)] = _natural(up, 1)
        if any(kind not in KINDS for kind, _ in state.kernel) or any(k[3] not in SEVERITIES for k in state.sxids):
            raise ValueError("an unknown kernel event kind or SXid severity")
        if state.source not in ("kmsg", "nvml"):
            raise ValueError(f"unknown source {state.source!r}")
        return state


def _entries(value: Any) -> list[dict[str, Any]]:
    if not isinstance(value, list) or len(value) > MAX_ENTRIES:
        raise ValueError(f"want a list of at most {MAX_ENTRIES}")
    return [_mapping(item) for item in value]


def _count(item: dict[str, Any]) -> Count:
    return Count(_natural(item["count"]), _seconds(item["last"]))


def _natural(value: Any, limit: int = U64_MAX) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= limit:
        raise ValueError(f"want an integer from 0 to {limit}, got {str(value)[:40]!r}")
    return value


def _seconds(value: Any) -> float:
    # A 400-digit integer is valid JSON but no float: float() would raise OverflowError.
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1e12:
        raise ValueError(f"want a Unix time, got {str(value)[:40]!r}")
    return float(value)


def _text(value: Any) -> str:
    # JSON may hold lone surrogates ("\ud800"): no label value can carry them.
    if not isinstance(value, str) or len(value) > 256:
        raise ValueError(f"want a short string, got {str(value)[:40]!r}")
    value.encode("utf-8")  # UnicodeEncodeError is a ValueError
    return value


def _mapping(value: Any) -> dict[Any, Any]:
    if not isinstance(value, dict) or len(value) > MAX_ENTRIES:
        raise ValueError(f"want a mapping of at most {MAX_ENTRIES} entries")
    return value


def load(path: Path, boot_id: str) -> tuple[State, str | None]:
    """(state, problem). A missing file or one from another boot gives a fresh state and no
    problem. Anything else that is not a state this module wrote (a symlink, a FIFO, a device,
    a huge file, bad JSON, values out of range) is moved aside to NAME.corrupt and gives a
    fresh state, counted again from the kernel log as after a reboot, and says why."""
    fresh = State(boot_id)
    try:
        text = _read_regular(path)
    except FileNotFoundError:
        return fresh, None
    except (OSError, ValueError) as err:
        return fresh, f"cannot read {path} ({err}){_move_aside(path)}; starting again from the kernel log"
    try:
        state = State.from_json(json.loads(text))
    except (ValueError, KeyError, TypeError, RecursionError) as err:
        return fresh, (f"corrupt {path} ({type(err).__name__}: {str(err)[:200]}){_move_aside(path)}; "
                       "starting again from the kernel log")
    return (state, None) if state.boot_id == boot_id else (fresh, None)


def _read_regular(path: Path) -> str:
    """The file's text: no symlink followed, no FIFO waited on, at most MAX_BYTES read."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError("not a regular file")
        data = os.read(fd, MAX_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_BYTES:
        raise ValueError(f"larger than {MAX_BYTES} bytes")
    return data.decode("utf-8")  # UnicodeDecodeError is a ValueError


def _move_aside(path: Path) -> str:
    """Keep the bad file for a post-mortem, out of the way of the next save."""
    aside = path.with_name(path.name + ".corrupt")
    try:
        os.replace(path, aside)  # moves a symlink itself, never its target
    except OSError as err:
        return f", could not move it aside: {err.strerror}"
    return f", moved to {aside.name}"


def save(path: Path, state: State) -> None:
    """Atomically replace path; OSError if the directory is not writable.

    The temporary file is created afresh (O_EXCL, mode 0600) after removing whatever has its
    name: a symlink planted there is never written through."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with open(fd, "w", encoding="utf-8") as out:
        json.dump(state.to_json(), out, separators=(",", ":"))
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
