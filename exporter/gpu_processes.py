"""Which processes use a GPU, and their read()/write() totals kept monotonic across exits.

A process uses a GPU when one of its file descriptors is a per-GPU device node
(/dev/nvidia0, /dev/nvidia1, ...; /dev/nvidiactl and /dev/nvidia-uvm don't say
which GPU and are opened by any CUDA process). Scanning fds is costly (~0.35 ms
of kernel time per process to list them), so each process is classified when
first seen and re-checked only while it is young (CUDA is usually initialised
within seconds of start) and its number of fds has changed; a process that
opens a GPU later than `rescan_young_seconds` after starting is missed. After
the first scan, which checks everything, checks stop for the scrape when
`check_budget_seconds` is spent (new PIDs newest first, then young processes
least recently checked first); the rest wait for the next scrape and are counted
as pending. /proc/PID/io
counts from process start, so a late check loses no bytes, unless the process
exits first.

Node totals = the last values of GPU processes that are gone + the current
values of live ones. The kernel adds a reaped child's I/O to its parent
(wait_task_zombie), so a child whose GPU-using parent is alive is not added
again when it disappears: the parent's own counter now holds it.
PIDs are recognised by (pid, start time), so a reused PID is a new process.
I/O between a process's last scrape and its exit is not seen (no eBPF here).

psutil reads a GPU process's io: one psutil.Process per GPU process, kept while it lives. A
process's start time and parent are read here from its stat, when first seen and, for a GPU
process, at each scan to tell it is still the same: psutil's create_time() reads <procfs>/stat
for the boot time, which costs milliseconds on a node with thousands of interrupts, its ppid()
reads stat twice more, and its is_running() builds a new Process.

A GPU process's device minors (N of /dev/nvidiaN) and its workload identity (cgroup,
allow-listed environment: exporter/workload.py) are read once, when it is classified.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from gpunode_exporter.procfs.pid import IO, PidFileError, Stat, parse_stat, parse_uptime
from gpunode_exporter.workload import Identity, Reader

log = logging.getLogger(__name__)

_GPU_DEVICE = re.compile(r"/dev/nvidia([0-9]{1,4})")
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
_U64 = 1 << 64
# psutil defines io_counters() only where its own /proc/PID/io exists (CONFIG_TASK_IO_ACCOUNTING).
_HAS_IO = hasattr(psutil.Process, "io_counters")
# What psutil lets through from a file no kernel writes: int() of a word that is no number, a stat
# cut short, an empty io (RuntimeError).
_MALFORMED = (ValueError, IndexError, OverflowError, RuntimeError)


@dataclass
class _Process:
    start_ticks: int
    ppid: int
    gpu: bool = False
    fd_count: int = -1  # when last classified (-1 unknown); a young process is re-checked when it changes
    checked_in: int = 0  # the scan that last classified it
    handle: psutil.Process | None = None  # GPU processes only: psutil reads their identity and io
    io: IO | None = None  # last read, GPU processes only
    io_denied: bool = False
    minors: frozenset[int] = frozenset()  # the /dev/nvidiaN it holds
    identity: Identity = field(default_factory=Identity)
    identity_denied: frozenset[str] = frozenset()  # "cgroup", "environ": files we may not read


@dataclass(frozen=True)
class Snapshot:
    processes: int  # GPU processes alive now
    totals: IO  # monotonic node totals
    fds_denied: int  # processes whose fds we may not read: unknown whether they use a GPU
    io_denied: int  # GPU processes whose io we may not read: not counted
    pending: int  # processes not checked yet (the check budget ran out)
    holders: tuple[tuple[frozenset[int], Identity], ...] = ()  # per live GPU process: minors, identity
    identity_denied: dict[str, int] = field(default_factory=dict)  # file -> GPU processes we may not read it of
    parse_errors: int = 0


class ProcessTracker:
    def __init__(self, procfs: Path, rescan_young_seconds: float = 300.0,
                 check_budget_seconds: float = 0.05, workload: Reader | None = None) -> None:
        self.procfs = procfs
        self.workload = workload  # None: GPU processes' workloads are not read
        self._root = str(procfs)  # string paths: a Path per fd costs as much as the readlink
        self.rescan_young_ticks = rescan_young_seconds * _CLOCK_TICKS
        self.check_budget = check_budget_seconds
        self._procs: dict[int, _Process] = {}
        # Kept up to date rather than found among every process at each scrape (2,000 on a node):
        self._young: dict[int, _Process] = {}  # not using a GPU and started within rescan_young_seconds
        self._fds_denied: set[int] = set()  # whose fds we may not read
        self._gpu: dict[int, _Process] = {}  # using a GPU
        self._gone = IO()  # last values of GPU processes that have exited
        self._last_totals = IO()
        self._stat_counts_fds = _stat_counts_fds(self._root)
        # Ourselves: NVML's fds make the exporter look like a GPU process, and its reads of /proc
        # are no checkpoint I/O. <procfs>/self names our PID as that procfs counts (a container too).
        try:
            self._own_pid: int | None = int(os.readlink(os.path.join(self._root, "self")))
        except (OSError, ValueError):
            self._own_pid = None
        self._names: set[str] = set()  # the last listing of procfs
        self._pids: set[int] = set()  # the PIDs in it
        self._unchecked: set[int] = set()  # listed but not checked yet: new, or the budget ran out
        self._scans = 0
        self.parse_errors = 0  # stat or io files not in the kernel's format, on every read that saw one

    def scan(self) -> Snapshot:
        with _procfs(self._root):
            return self._scan()

    def _scan(self) -> Snapshot:
        # The first scan checks everything (~0.3 ms a process): counts are right from the start.
        self._scans += 1
        deadline = time.perf_counter() + (self.check_budget if self._scans > 1 else float("inf"))
        pids, gone = self._listed_pids()
        for pid in sorted(gone & self._procs.keys()):
            self._retire(pid, pids)
        for pid, proc in list(self._gpu.items()):  # GPU processes: still the same process?
            if not self._running(pid, proc):  # exited, or PID reused
                self._retire(pid, pids - {pid})
                if pid in pids:
                    self._unchecked.add(pid)  # reused: a new process to check
        # New processes, newest PIDs first (trainers rather than daemons), then young ones whose
        # fds changed; at least one check per scrape, so a tiny budget still makes progress.
        checked = 0
        for pid in sorted(self._unchecked, reverse=True):
            if checked and time.perf_counter() > deadline:
                break
            stat = self._stat(pid)
            if stat is not None:
                self._unchecked.discard(pid)
                proc = self._procs[pid] = self._young[pid] = _Process(stat.start_ticks, stat.ppid)
                self._classify(pid, proc)
                checked += 1
        now_ticks = self._uptime_ticks()
        for pid, proc in list(self._young.items()):  # a process only ages: once old, never young again
            if proc.gpu or now_ticks - proc.start_ticks >= self.rescan_young_ticks:
                del self._young[pid]
        young = [(proc.checked_in, pid, proc) for pid, proc in self._young.items()]
        for _, pid, proc in sorted(young, key=lambda item: item[0]):  # least recently checked first
            if checked and time.perf_counter() > deadline:
                break
            count = self._fd_count(pid)
            if count < 0 or count != proc.fd_count:  # unknown (Linux < 6.2), or fds opened or closed
                self._classify(pid, proc)
                checked += 1
        live = sorted(self._gpu.items())
        totals = self._gone
        for pid, proc in live:
            self._read_io(pid, proc)
            if proc.io is not None:
                totals = totals + proc.io
        # The rules above keep totals monotonic; this guards what they may have missed.
        self._last_totals = totals = totals.at_least(self._last_totals)
        denied = {name: sum(name in p.identity_denied for _, p in live) for name in ("cgroup", "environ")}
        return Snapshot(processes=len(live), totals=totals,
                        fds_denied=len(self._fds_denied),
                        io_denied=sum(p.io_denied for _, p in live),
                        pending=len(self._unchecked),
                        holders=tuple((p.minors, p.identity) for _, p in live),
                        identity_denied=denied, parse_errors=self.parse_errors)

    def _listed_pids(self) -> tuple[set[int], set[int]]:
        """The PIDs in procfs but our own, and those gone since the last listing: kept up to date
        from what the listing adds and drops (int() of each of 2,000 names at every scrape cost a
        quarter of the scan, and so did comparing every PID with those known, twice)."""
        names = set(os.listdir(self._root))
        gone = {int(name) for name in self._names - names if name.isdigit() and name.isascii()}
        new = {int(name) for name in names - self._names if name.isdigit() and name.isascii()}
        self._names = names
        new.discard(self._own_pid)  # type: ignore[arg-type]
        self._pids -= gone
        self._pids |= new
        self._unchecked -= gone
        self._unchecked |= new
        return self._pids, gone

    def _retire(self, pid: int, alive: set[int]) -> None:
        proc = self._procs.pop(pid)
        self._young.pop(pid, None)
        self._gpu.pop(pid, None)
        self._fds_denied.discard(pid)
        if not proc.gpu or proc.io is None:
            return
        parent = self._procs.get(proc.ppid)
        if parent is not None and parent.gpu and proc.ppid in alive:
            return  # the parent reaped it and now counts its I/O
        self._gone = self._gone + proc.io

    def _stat(self, pid: int) -> Stat | None:
        try:
            with open(f"{self._root}/{pid}/stat", "rb") as f:
                return parse_stat(f.read())
        except OSError:
            return None
        except PidFileError as err:
            self._parse_error(pid, err)
            return None

    def _parse_error(self, pid: int, err: Exception) -> None:
        self.parse_errors += 1
        log.debug("/proc/%d: %s", pid, err)

    def _fd_count(self, pid: int) -> int:
        """The number of open fds (Linux >= 6.2 reports it as the fd directory's size), else -1: unknown."""
        if not self._stat_counts_fds:
            return -1
        try:
            return os.stat(f"{self._root}/{pid}/fd").st_size
        except OSError:
            return -1

    def _classify(self, pid: int, proc: _Process) -> None:
        proc.fd_count, proc.checked_in = self._fd_count(pid), self._scans
        try:
            fd_dir = os.open(f"{self._root}/{pid}/fd", os.O_RDONLY | os.O_DIRECTORY)
        except PermissionError:
            self._fds_denied.add(pid)
            return
        except OSError:
            return  # exited, or a kernel thread with no fd table
        self._fds_denied.discard(pid)
        minors = set()
        try:
            for name in os.listdir(fd_dir):
                try:
                    target = os.readlink(name, dir_fd=fd_dir)
                except OSError:
                    continue  # closed meanwhile, or denied per fd
                if match := _GPU_DEVICE.fullmatch(target):
                    minors.add(int(match.group(1)))
        except OSError:
            return  # exited while listed
        finally:
            os.close(fd_dir)
        if minors and (handle := self._handle(pid)) is not None:
            proc.gpu, proc.minors, proc.handle = True, frozenset(minors), handle
            self._gpu[pid] = proc
            if self.workload is not None:
                identity, denied = self.workload.identify(pid)
                proc.identity, proc.identity_denied = identity, frozenset(denied)

    def _handle(self, pid: int) -> psutil.Process | None:
        """psutil's handle on the process (it reads stat for the start time); None for a process that
        went or a stat no kernel wrote."""
        try:
            return psutil.Process(pid)
        except _MALFORMED as err:
            self._parse_error(pid, err)
        except (psutil.Error, OSError):
            pass
        return None

    def _running(self, pid: int, proc: _Process) -> bool:
        """Whether the GPU process is still the one classified: its stat read again has the same start
        time. A stat we may not read counts as gone, as for psutil's is_running(), which costs more:
        it builds a new Process to compare."""
        stat = self._stat(pid)
        return stat is not None and stat.start_ticks == proc.start_ticks

    def _read_io(self, pid: int, proc: _Process) -> None:
        if not _HAS_IO or proc.handle is None:
            return
        try:
            io = _io(proc.handle)
        except psutil.AccessDenied:
            proc.io_denied = True
            return
        except (psutil.NoSuchProcess, OSError):  # a zombie is a NoSuchProcess too
            return  # exited meanwhile: its last value stands
        except _MALFORMED as err:  # PidFileError is a ValueError
            self._parse_error(pid, err)
            return
        proc.io_denied = False
        proc.io = io if proc.io is None else io.at_least(proc.io)

    def _uptime_ticks(self) -> float:
        try:
            with open(f"{self._root}/uptime", "rb") as f:
                return parse_uptime(f.read()) * _CLOCK_TICKS
        except (OSError, PidFileError):
            return time.monotonic() * _CLOCK_TICKS  # CLOCK_MONOTONIC counts from boot on Linux


def _stat_counts_fds(root: str) -> bool:
    """Whether stat() of /proc/PID/fd gives the number of fds (Linux >= 6.2), tried on our own."""
    try:
        size = os.stat(f"{root}/self/fd").st_size
        listed = len(os.listdir(f"{root}/self/fd"))  # one more fd: the listing's own
    except OSError:
        return False
    return size > 0 and abs(listed - size) <= 1


def _io(handle: psutil.Process) -> IO:
    """/proc/PID/io as psutil reads it. Its int() also takes numbers no kernel prints ("-12", 400
    digits): a counter outside u64 is refused, so totals never go back or overflow."""
    counters = handle.io_counters()
    io = IO(counters.read_chars, counters.write_chars, counters.read_count, counters.write_count)
    if not all(0 <= value < _U64 for value in (io.rchar, io.wchar, io.syscr, io.syscw)):
        raise PidFileError(f"io: a counter no kernel prints: {io}")
    return io


@contextmanager
def _procfs(root: str) -> Iterator[None]:
    """psutil reads the procfs a module global names (is_running() makes a new Process from it):
    ours while scanning, as it was afterwards (tests scan other trees in the same process)."""
    saved, psutil.PROCFS_PATH = psutil.PROCFS_PATH, root
    try:
        yield
    finally:
        psutil.PROCFS_PATH = saved
