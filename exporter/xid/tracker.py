"""Counts Xid events as they happen, in a thread of its own, exactly once across restarts.

The source is the kernel log (/dev/kmsg) when it can be read; otherwise NVML's
Xid events. Only one source counts: NVML's events carry no time or sequence
number to match against the log, so counting both would count most Xids twice.
Once on NVML, the tracker stays there until it restarts. Every kernel record's
sequence number is tracked: a jump (the reader fell behind and the kernel
overwrote records, or the exporter was down) is added to the lost count, so a
missed Xid is never silent.

Exactness across restarts: the state (counts, the last record handled) is saved
atomically and together, at most every SAVE_INTERVAL while Xids arrive (and on
close). A crash before a save loses nothing: the records after the saved
sequence number are read again from the ring buffer and counted then.
"""

from __future__ import annotations

import contextlib
import copy
import ctypes
import fcntl
import logging
import os
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pynvml
from pynvml import NVMLError

from gpunode_exporter.kmsg import KmsgReader, parse_record
from gpunode_exporter.nvml import Device, Session
from gpunode_exporter.problems import Problems
from gpunode_exporter.sysfs.pci import canonical_bus_id
from gpunode_exporter.xid import state as statefile
from gpunode_exporter.xid import sxid_catalog
from gpunode_exporter.xid.gpus import GpuDirectory, Identity
from gpunode_exporter.xid.kernel import KernelEvent, SXidEvent, event_in_record, worth_parsing
from gpunode_exporter.xid.parse import xid_in_record

log = logging.getLogger(__name__)

READER_BACKOFF, READER_BACKOFF_MAX = 1.0, 60.0  # seconds before a failed reader starts again
SAVE_INTERVAL = 0.5  # seconds between saves while Xids are being counted
IDLE_SAVE_INTERVAL = 5.0  # ... while only the record position moves
MAX_KEYS = 4096  # series kept per table (Xids, SXids, kernel events, NFS servers): a flood of odd
# bus ids or devices must not grow memory; past it, new series are counted as malformed records
_NVML_EVENTS = pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeGpuRecoveryAction


@dataclass(frozen=True)
class Snapshot:
    source: str | None  # "kmsg", "nvml", None: neither works
    counts: list[tuple[str, Identity, int, int, float]]  # (bus, identity, xid, count, last seconds)
    recovery: dict[str, int]
    sxids: list[tuple[int, str, int, str, int, float]]  # (switch, bus, sxid, severity, count, last)
    kernel: list[tuple[str, str, int, float]]  # (kind, device, count, last seconds)
    nfs_servers: dict[str, int]
    identities: dict[str, Identity]
    records_lost: int
    records_read: int
    records_malformed: int
    state_errors: dict[str, int]
    reader_failures: int
    reader_error: str | None  # set while the reader is down after a failure


class XidTracker:
    def __init__(self, kmsg: Path, state_dir: Path | None, persist: bool, procfs: Path,
                 directory: GpuDirectory, session: Session) -> None:
        """state_dir None: nothing kept across restarts. persist False: read the saved state, never
        write it (a one-off dump beside a running exporter)."""
        self._kmsg = kmsg
        self._directory = directory
        self._session = session
        self._lock = threading.Lock()
        self._save_lock = threading.Lock()
        self._stop = threading.Event()
        self.caught_up = threading.Event()  # the log read to its end once (or NVML events armed)
        self._problems = Problems()
        self.state_errors: Counter[str] = Counter()
        self.malformed = 0
        self.source: str | None = None
        self._skip_lost = False
        self._boot_wall = time.time() - time.monotonic()  # kmsg time is since boot
        self._dirty = self._dirty_xid = False
        self._last_save = 0.0
        self._path: Path | None = None
        self._lock_file: Any = None
        boot_id = _boot_id(procfs)
        self.state = statefile.State(boot_id)
        if state_dir is not None and not boot_id:
            self._problem("load", f"no boot id in {procfs}/sys/kernel/random/boot_id: Xid counts "
                          "are not kept across restarts")
        elif state_dir is not None:
            if persist:
                self._lock_file = self._claim(state_dir)
            self.state, problem = statefile.load(state_dir / statefile.FILE_NAME, boot_id)
            if problem:
                self._problem("load", problem)
            if self._lock_file is not None:
                self._path = state_dir / statefile.FILE_NAME
        self.records_read = 0
        self._save_wanted = threading.Event()
        self.reader_failures = 0
        self.reader_error: str | None = None  # why the reader is down; None while it runs
        self._thread = threading.Thread(target=self._supervise, name="xid", daemon=True)
        # Saves run in their own thread: a slow fsync must not hold up reading the log.
        self._saver = threading.Thread(target=self._save_loop, name="xid-state", daemon=True)

    def start(self) -> None:
        self._thread.start()
        self._saver.start()

    def _claim(self, state_dir: Path) -> Any:
        """One exporter per state directory: a second one would overwrite the first's counts."""
        path = state_dir / "xid-state.lock"
        try:
            state_dir.mkdir(parents=True, exist_ok=True)
            if path.is_symlink():  # created through, a planted link would create its target
                path.unlink()
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            lock = open(fd, "r+b")  # noqa: SIM115 - held for the process's life
        except OSError as err:
            self._problem("lock", f"cannot use {state_dir} ({err}); Xid counts will not be saved")
            return None
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            lock.close()
            self._problem("lock", f"another exporter holds {state_dir}; Xid counts will not be saved")
            return None
        return lock

    def _problem(self, operation: str, message: str) -> None:
        self.state_errors[operation] += 1
        if self._problems.new(operation, message):
            log.error("xid state: %s", message)

    # --- the kernel log -------------------------------------------------------

    def _supervise(self) -> None:
        """Whatever goes wrong in the reader, it starts again (after a growing pause) where it
        stopped: after the last record applied, as across an exporter restart."""
        backoff = 0.0
        while not self._stop.is_set():
            try:
                self._run()
                return
            except Exception as err:  # any: a dead reader would silently stop counting
                backoff = min(max(2 * backoff, READER_BACKOFF), READER_BACKOFF_MAX)
                with self._lock:
                    self.reader_failures += 1
                    self.reader_error = f"{type(err).__name__}: {err}"
                    self.source = None
                log.exception("Xid reader failed; starting it again in %.0f s", backoff)
                self._stop.wait(backoff)

    def _run(self) -> None:
        # Xids counted from NVML events have no log position: counting the ring buffer from
        # its start (or from the last record read before the switch) would count them again,
        # so only new records are read.
        from_end = self.state.source == "nvml" and bool(self.state.counts)
        try:
            reader = KmsgReader(self._kmsg, from_end=from_end)
        except OSError as err:
            log.warning("cannot read %s (%s): counting Xids from NVML events instead", self._kmsg, err.strerror)
            self._run_nvml()
            return
        with self._lock:
            self.source = self.state.source = "kmsg"
            self.reader_error = None
        self._skip_lost = from_end
        if from_end:
            self.state.kmsg_seq = None  # the first record read sets the position
        try:
            while not self._stop.is_set():
                try:
                    raws = reader.read()
                except OSError as err:
                    log.error("reading %s failed (%s): counting Xids from NVML events instead", self._kmsg, err)
                    break
                if raws:
                    overlong, reader.overlong = reader.overlong, 0
                    self._handle(raws, overlong)
                else:
                    self.caught_up.set()
                    self._save_wanted.set()
                    reader.wait(0.2)
            else:
                return
        finally:
            reader.close()
        self._run_nvml()

    def _handle(self, raws: list[bytes], malformed: int = 0) -> None:
        """Parse a batch outside the lock, then apply it under the lock in one step.
        malformed: records the reader already threw away (overlong lines)."""
        last = self.state.kmsg_seq  # only this thread moves it
        lost = 0
        events = []
        others: list[tuple[SXidEvent | KernelEvent, float]] = []
        for raw in raws:
            try:
                record = parse_record(raw)
            except ValueError:
                malformed += 1
                continue
            if last is not None:
                if record.seq <= last:
                    continue  # handled before a restart
                lost += record.seq - last - 1
            elif not self._skip_lost:
                lost += record.seq  # overwritten before this boot's log was first read
            last = record.seq
            if not worth_parsing(record):
                continue  # most records: one scan, nothing more
            try:
                event = xid_in_record(record)
                other = event_in_record(record, checked=True) if event is None else None
            except ValueError:  # a number or device no kernel prints: that record alone
                malformed += 1
                continue
            if event is not None:
                bus = _canonical(event.pci_bus_id)
                events.append((bus, event.xid, event.recovery_action, self._boot_wall + record.usec / 1e6))
            elif other is not None:
                others.append((other, self._boot_wall + record.usec / 1e6))
        self._skip_lost = False
        identities = {bus: self._identity(bus) for bus, *_ in events}
        with self._lock:
            self.records_read += len(raws)
            self.malformed += malformed
            self.state.records_lost += lost
            self.state.kmsg_seq = last
            for bus, xid, action, when in events:
                self._count(bus, identities[bus], xid, action, when)
            for other, when in others:
                self._count_other(other, when)
            self._dirty = True
        self._save_wanted.set()

    def _identity(self, bus: str) -> Identity:
        known = self.state.gpus.get(bus)
        if known is not None:
            return known
        return self._directory.lookup(bus) if bus else ("", "")

    def _count(self, bus: str, identity: Identity, xid: int, action: int | None, when: float) -> None:
        """Under the lock. The identity is fixed when a bus id is first seen, so a series keeps its labels."""
        key = (bus, xid)
        if key not in self.state.counts and len(self.state.counts) >= MAX_KEYS:
            self.malformed += 1
            return
        self.state.gpus.setdefault(bus, identity)
        count = self.state.counts.setdefault(key, statefile.Count())
        count.value += 1
        count.last_seconds = max(count.last_seconds, when)
        if action is not None:
            self.state.recovery[bus] = action
        self._dirty_xid = True

    def _count_other(self, event: SXidEvent | KernelEvent, when: float) -> None:
        """Under the lock: an SXid or a kernel event, each table capped at MAX_KEYS series."""
        table: dict[Any, statefile.Count]
        if isinstance(event, SXidEvent):
            table = self.state.sxids
            key: tuple[Any, ...] = (event.switch, event.pci_bus_id, event.sxid,
                                    sxid_catalog.severity(event.sxid, event.severity))
        else:
            table, key = self.state.kernel, (event.kind, event.device)
            if event.kind in ("nfs_not_responding", "nfs_ok"):
                servers = self.state.nfs_servers
                if event.device in servers or len(servers) < MAX_KEYS:
                    servers[event.device] = 1 if event.kind == "nfs_ok" else 0
        if key not in table and len(table) >= MAX_KEYS:
            self.malformed += 1
            return
        count = table.setdefault(key, statefile.Count())
        count.value += 1
        count.last_seconds = max(count.last_seconds, when)
        self._dirty_xid = True

    # --- NVML events ------------------------------------------------------------

    def _run_nvml(self) -> None:
        self.source = None
        self.caught_up.set()
        while not self._stop.is_set():
            try:
                devices = self._session.devices()
                event_set = pynvml.nvmlEventSetCreate()
            except NVMLError as err:
                log.debug("NVML events unavailable: %s", err)
                self.source = None
                self._stop.wait(5)
                continue
            try:
                handles = self._register(event_set, devices)
                if handles:
                    self.source = self.state.source = "nvml"
                    self.reader_error = None
                    self._wait_events(event_set, handles)
                self.source = None
                self._stop.wait(5 if not handles else 1)
            finally:
                with contextlib.suppress(NVMLError):
                    pynvml.nvmlEventSetFree(event_set)

    @staticmethod
    def _register(event_set: Any, devices: list[Device]) -> dict[int | None, Device]:
        handles = {}
        for device in devices:
            if device.handle is None:
                continue
            try:
                types = pynvml.nvmlDeviceGetSupportedEventTypes(device.handle) & _NVML_EVENTS
                if types:
                    pynvml.nvmlDeviceRegisterEvents(device.handle, types, event_set)
                    handles[ctypes.cast(device.handle, ctypes.c_void_p).value] = device
            except NVMLError as err:
                log.debug("GPU %d: no NVML events (%s)", device.index, err)
        return handles

    def _wait_events(self, event_set: Any, handles: dict[int | None, Device]) -> None:
        while not self._stop.is_set():
            try:
                data = pynvml.nvmlEventSetWait_v2(event_set, 200)
            except NVMLError as err:
                if err.value == pynvml.NVML_ERROR_TIMEOUT:
                    continue
                log.warning("waiting for NVML events failed (%s); registering again", err)
                return
            device = handles.get(ctypes.cast(data.device, ctypes.c_void_p).value)
            if device is None:
                continue
            bus = _canonical(device.pci_bus_id)
            identity = (str(device.index), device.uuid)
            with self._lock:
                if data.eventType == pynvml.nvmlEventTypeXidCriticalError:
                    self._count(bus, identity, int(data.eventData), None, time.time())
                elif data.eventType == pynvml.nvmlEventTypeGpuRecoveryAction:
                    self.state.gpus.setdefault(bus, identity)
                    self.state.recovery[bus] = int(data.eventData)
                    self._dirty_xid = True
                self._dirty = True
            self._save_wanted.set()

    # --- saving, reading, stopping -----------------------------------------------

    def _save_loop(self) -> None:
        while not self._stop.is_set():
            self._save_wanted.wait(SAVE_INTERVAL)
            self._save_wanted.clear()
            self._maybe_save()

    def _maybe_save(self, force: bool = False) -> None:
        if self._path is None:
            return
        with self._save_lock:
            with self._lock:
                interval = SAVE_INTERVAL if self._dirty_xid else IDLE_SAVE_INTERVAL
                due = time.monotonic() - self._last_save >= interval
                if not (self._dirty or self._dirty_xid) or not (force or due):
                    return
                snapshot = copy.deepcopy(self.state)
                self._dirty = self._dirty_xid = False
                self._last_save = time.monotonic()
            try:
                statefile.save(self._path, snapshot)
            except OSError as err:
                self._problem("save", f"cannot write {self._path}: {err}")
                with self._lock:
                    self._dirty = True
            else:
                if self._problems.solved("save"):
                    log.info("xid state: saved to %s again", self._path)

    def snapshot(self) -> Snapshot:
        identities = self._directory.identities()
        with self._lock:
            s = self.state
            return Snapshot(
                source=self.source,
                counts=[(bus, s.gpus.get(bus, ("", "")), xid, c.value, c.last_seconds)
                        for (bus, xid), c in sorted(s.counts.items())],
                recovery=dict(s.recovery),
                sxids=[(*key, c.value, c.last_seconds) for key, c in sorted(s.sxids.items())],
                kernel=[(*key, c.value, c.last_seconds) for key, c in sorted(s.kernel.items())],
                nfs_servers=dict(s.nfs_servers),
                identities={**identities, **s.gpus},
                records_lost=s.records_lost,
                records_read=self.records_read,
                records_malformed=self.malformed,
                state_errors=dict(self.state_errors),
                reader_failures=self.reader_failures,
                reader_error=self.reader_error,
            )

    def close(self) -> None:
        self._stop.set()
        self._save_wanted.set()
        for thread in (self._thread, self._saver):
            if thread.is_alive():
                thread.join(timeout=2)
        self._maybe_save(force=True)
        if self._lock_file is not None:
            self._lock_file.close()


def _boot_id(procfs: Path) -> str:
    try:
        return (procfs / "sys" / "kernel" / "random" / "boot_id").read_text().strip()
    except (OSError, UnicodeDecodeError):
        return ""


def _canonical(bus_id: str | None) -> str:
    if not bus_id:
        return ""
    try:
        return canonical_bus_id(bus_id)
    except ValueError:
        return bus_id
