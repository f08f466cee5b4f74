"""Which processes use a GPU, and their read()/write() totals kept monotonic across exits.

A process uses a GPU when one of its file descriptors is a per-GPU device node
(/dev/nvidia0, /dev/nvidia1, ...; /dev/nvidiactl and /dev/nvidia-uvm don't say
which GPU and are opened by any CUDA process). Scanning fds is costly, so each
process is classified when first seen and re-checked only while it is young
(CUDA is usually initialised within seconds of start); a process that opens a
GPU later than `rescan_young_seconds` after starting is missed.

Node totals = the last values of GPU processes that are gone + the current
values of live ones. The kernel adds a reaped child's I/O to its parent
(wait_task_zombie), so a child whose GPU-using parent is alive is not added
again when it disappears: the parent's own counter now holds it.
PIDs are recognised by (pid, start time), so a reused PID is a new process.
I/O between a process's last scrape and its exit is not seen (no eBPF here).
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from exporter.procfs.pid import IO, PidFileError, Stat, parse_io, parse_stat, parse_uptime

_GPU_DEVICE = re.compile(r"/dev/nvidia\d+")
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class _Process:
    start_ticks: int
    ppid: int
    gpu: bool
    fds_denied: bool = False
    io: IO | None = None  # last read, GPU processes only
    io_denied: bool = False


@dataclass(frozen=True)
class Snapshot:
    processes: int  # GPU processes alive now
    totals: IO  # monotonic node totals
    fds_denied: int  # processes whose fds we may not read: unknown whether they use a GPU
    io_denied: int  # GPU processes whose io we may not read: not counted


class ProcessTracker:
    def __init__(self, procfs: Path, rescan_young_seconds: float = 300.0) -> None:
        self.procfs = procfs
        self.rescan_young_ticks = rescan_young_seconds * _CLOCK_TICKS
        self._procs: dict[int, _Process] = {}
        self._gone = IO()  # last values of GPU processes that have exited
        self._last_totals = IO()

    def scan(self) -> Snapshot:
        pids = {int(name) for name in os.listdir(self.procfs) if name.isdigit()}
        now_ticks = self._uptime_ticks()
        for pid in sorted(self._procs.keys() - pids):
            self._retire(pid, pids)
        for pid in pids:
            proc = self._procs.get(pid)
            if proc is None or proc.gpu:
                stat = self._stat(pid)
                if stat is None:  # exited while we looked
                    if proc is not None:
                        self._retire(pid, pids - {pid})
                    continue
                if proc is not None and stat.start_ticks != proc.start_ticks:  # PID reused
                    self._retire(pid, pids - {pid})
                    proc = None
                if proc is None:
                    proc = self._procs[pid] = _Process(stat.start_ticks, stat.ppid, gpu=False)
                    self._classify(pid, proc)
            elif now_ticks - proc.start_ticks < self.rescan_young_ticks:
                self._classify(pid, proc)  # young: CUDA may not be initialised yet
            if proc.gpu:
                self._read_io(pid, proc)
        live = [p for p in self._procs.values() if p.gpu]
        totals = self._gone
        for proc in live:
            if proc.io is not None:
                totals = totals + proc.io
        # The rules above keep totals monotonic; this guards what they may have missed.
        self._last_totals = totals = totals.at_least(self._last_totals)
        return Snapshot(processes=len(live), totals=totals,
                        fds_denied=sum(p.fds_denied for p in self._procs.values()),
                        io_denied=sum(p.io_denied for p in live))

    def _retire(self, pid: int, alive: set[int]) -> None:
        proc = self._procs.pop(pid)
        if not proc.gpu or proc.io is None:
            return
        parent = self._procs.get(proc.ppid)
        if parent is not None and parent.gpu and proc.ppid in alive:
            return  # the parent reaped it and now counts its I/O
        self._gone = self._gone + proc.io

    def _stat(self, pid: int) -> Stat | None:
        try:
            return parse_stat((self.procfs / str(pid) / "stat").read_text())
        except (OSError, PidFileError):
            return None

    def _classify(self, pid: int, proc: _Process) -> None:
        fd_dir = self.procfs / str(pid) / "fd"
        try:
            names = os.listdir(fd_dir)
        except PermissionError:
            proc.fds_denied = True
            return
        except OSError:
            return  # exited, or a kernel thread with no fd table
        proc.fds_denied = False
        for name in names:
            try:
                target = os.readlink(fd_dir / name)
            except OSError:
                continue  # closed meanwhile, or denied per fd
            if _GPU_DEVICE.fullmatch(target):
                proc.gpu = True
                return

    def _read_io(self, pid: int, proc: _Process) -> None:
        try:
            io = parse_io((self.procfs / str(pid) / "io").read_text())
        except PermissionError:
            proc.io_denied = True
            return
        except (OSError, PidFileError):
            return  # exited meanwhile: its last value stands
        proc.io_denied = False
        proc.io = io if proc.io is None else io.at_least(proc.io)

    def _uptime_ticks(self) -> float:
        try:
            return parse_uptime((self.procfs / "uptime").read_text()) * _CLOCK_TICKS
        except (OSError, PidFileError):
            return time.monotonic() * _CLOCK_TICKS  # CLOCK_MONOTONIC counts from boot on Linux
