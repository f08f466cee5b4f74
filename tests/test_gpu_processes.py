"""GPU-process accounting: classification, exits, PID reuse, reaped children, permissions.

Rules are checked on a procfs tree built in the kernel's formats, then the same
rules against real processes and the real kernel (root only: a private mount
namespace gives the test process a /dev/nvidia0).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from gpunode_exporter.gpu_processes import ProcessTracker
from gpunode_exporter.procfs.pid import IO, PidFileError, parse_stat
from tests.fakeproc import IO_TEXT, STAT, FakeProc


@pytest.fixture
def proc(tmp_path: Path) -> FakeProc:
    return FakeProc(tmp_path)


def test_stat_parser_on_the_real_format() -> None:
    stat = parse_stat(STAT.format(pid=77, ppid=12, start=98765).encode())
    assert (stat.ppid, stat.start_ticks) == (12, 98765)  # comm with spaces and parentheses
    with pytest.raises(PidFileError):
        parse_stat(b"77 (cut")


@pytest.mark.parametrize("bad", [b"-12", b"+12", b"1_2", "\u0661\u0662".encode(), b"9" * 400])
def test_stat_numbers_are_the_kernels(bad: bytes) -> None:
    with pytest.raises(PidFileError):
        parse_stat(STAT.format(pid=77, ppid=12, start=98765).encode().replace(b" 12 ", b" " + bad + b" ", 1))


# psutil reads io with int(), which takes "+1" (and "1_2") as the number; what no counter can be
# (negative, past u64, no number, a line missing) is a parse error, that process alone uncounted.
@pytest.mark.parametrize(("io", "counted"), [
    (IO_TEXT.format(1, 2, 3, 4), 1),
    (IO_TEXT.format("+1", 2, 3, 4), 1),
    (IO_TEXT.format("-12", 2, 3, 4), None),
    (IO_TEXT.format("9" * 400, 2, 3, 4), None),
    (IO_TEXT.format(1 << 64, 2, 3, 4), None),
    (IO_TEXT.format("\u0661\u0662", 2, 3, 4), None),
    (IO_TEXT.format("x", 2, 3, 4), None),
    (IO_TEXT.format(1, 2, 3, 4).replace("write_bytes: 0\n", ""), None),
    ("", None),
])
def test_io_numbers_no_kernel_prints_cost_that_process_alone(proc: FakeProc, io: str, counted: int | None) -> None:
    proc.spawn(10, gpu=True, io=(1000, 0, 0, 0))
    proc.spawn(11, gpu=True)
    (proc.root / "11" / "io").write_text(io)
    snap = ProcessTracker(proc.root).scan()
    assert (snap.processes, snap.totals.rchar) == (2, 1000 + (counted or 0))
    assert snap.parse_errors == (counted is None)


def test_a_name_that_is_not_utf8_costs_nothing() -> None:
    # prctl(PR_SET_NAME) takes any bytes: a comm of invalid UTF-8 with ') (' in it.
    stat = parse_stat(b"77 (\xff\xfe) (x) S 12" + b" 0" * 17 + b" 98765 0 0\n")
    assert (stat.ppid, stat.start_ticks) == (12, 98765)


def test_only_per_gpu_device_nodes_count(proc: FakeProc) -> None:
    proc.spawn(10, gpu=True, io=(1000, 500, 10, 5))
    proc.spawn(11, io=(7, 7, 7, 7))  # nvidiactl and nvidia-uvm only: not a GPU process
    snap = ProcessTracker(proc.root).scan()
    assert (snap.processes, snap.totals) == (1, IO(1000, 500, 10, 5))


def test_the_exporter_itself_is_not_a_gpu_process(proc: FakeProc) -> None:
    # NVML's device fds are open in the exporter; its reads of /proc are no checkpoint I/O.
    proc.spawn(10, gpu=True, io=(1000, 500, 10, 5))
    proc.spawn(20, gpu=True, io=(9999, 0, 99, 0))
    (proc.root / "self").symlink_to("20")
    snap = ProcessTracker(proc.root).scan()
    assert (snap.processes, snap.totals, snap.pending) == (1, IO(1000, 500, 10, 5), 0)


def test_exit_keeps_the_total(proc: FakeProc) -> None:
    tracker = ProcessTracker(proc.root)
    proc.spawn(10, gpu=True, io=(1000, 500, 10, 5))
    proc.spawn(20, gpu=True, io=(1, 1, 1, 1))
    tracker.scan()
    proc.set_io(10, 3000, 900, 30, 9)
    proc.kill(20)
    snap = tracker.scan()
    assert (snap.processes, snap.totals) == (1, IO(3001, 901, 31, 10))
    proc.kill(10)
    snap = tracker.scan()
    assert (snap.processes, snap.totals) == (0, IO(3001, 901, 31, 10))


def test_the_listing_is_followed_as_entries_come_and_go(proc: FakeProc) -> None:
    tracker = ProcessTracker(proc.root)
    proc.spawn(10, gpu=True, io=(1, 0, 0, 0))
    (proc.root / "\u0661\u0662").mkdir()  # Arabic-Indic "12": int() reads it, yet no PID
    assert tracker.scan().processes == 1
    proc.spawn(12, gpu=True, io=(2, 0, 0, 0))
    assert (tracker.scan().processes, tracker.scan().pending) == (2, 0)
    shutil.rmtree(proc.root / "\u0661\u0662")  # its going takes no PID 12 with it
    snap = tracker.scan()
    assert (snap.processes, snap.totals.rchar) == (2, 3)
    proc.kill(10)
    assert tracker.scan().processes == 1


def test_pid_reuse_is_a_new_process(proc: FakeProc) -> None:
    tracker = ProcessTracker(proc.root)
    proc.spawn(10, gpu=True, io=(1000, 0, 0, 0), start_s=100)
    tracker.scan()
    proc.spawn(10, gpu=True, io=(50, 0, 0, 0), start_s=9000)  # same PID, later start, counters from 0
    assert tracker.scan().totals.rchar == 1050
    proc.spawn(10, gpu=False, io=(70, 0, 0, 0), start_s=9500)  # reused by a process without a GPU
    snap = tracker.scan()
    assert (snap.processes, snap.totals.rchar) == (0, 1050)


def test_reaped_child_is_not_counted_twice(proc: FakeProc) -> None:
    """The kernel adds a reaped child's I/O to its parent (dataloader workers inherit the GPU fds)."""
    tracker = ProcessTracker(proc.root)
    proc.spawn(10, gpu=True, io=(100, 0, 0, 0))
    proc.spawn(11, gpu=True, ppid=10, io=(40, 0, 0, 0))
    assert tracker.scan().totals.rchar == 140
    proc.kill(11)
    proc.set_io(10, 100 + 45, 0, 0, 0)  # the child read 5 more before exiting; the parent reaped it
    assert tracker.scan().totals.rchar == 145
    # A child whose parent does not use a GPU (a launcher) is kept on its own.
    proc.spawn(20, io=(0, 0, 0, 0))
    proc.spawn(21, gpu=True, ppid=20, io=(60, 0, 0, 0))
    tracker.scan()
    proc.kill(21)
    assert tracker.scan().totals.rchar == 145 + 60


def test_child_and_parent_gone_together(proc: FakeProc) -> None:
    tracker = ProcessTracker(proc.root)
    proc.spawn(10, gpu=True, io=(100, 0, 0, 0))
    proc.spawn(11, gpu=True, ppid=10, io=(40, 0, 0, 0))
    tracker.scan()
    proc.kill(11)
    proc.kill(10)
    assert tracker.scan().totals.rchar == 140  # nobody left to hold the child's I/O: keep both


def test_late_gpu_open_seen_only_while_young(proc: FakeProc) -> None:
    proc.set_uptime(1000)
    tracker = ProcessTracker(proc.root, rescan_young_seconds=300)
    proc.spawn(10, start_s=900, io=(5, 0, 0, 0))  # 100 s old
    proc.spawn(20, start_s=100, io=(9, 0, 0, 0))  # 900 s old
    assert tracker.scan().processes == 0
    proc.open_gpu(10)
    proc.open_gpu(20)
    snap = tracker.scan()
    assert (snap.processes, snap.totals.rchar) == (1, 5)  # only the young one is re-checked


def test_check_budget_newest_first_and_pending(proc: FakeProc) -> None:
    for pid in (100, 200, 300):
        proc.spawn(pid, gpu=pid == 300, io=(pid, 0, 0, 0))
    tracker = ProcessTracker(proc.root, check_budget_seconds=0)  # one check per scan, after the first
    assert tracker.scan().pending == 0  # the first scan checks everything
    for pid in (400, 500, 600):
        proc.spawn(pid, gpu=pid == 600, io=(pid, 0, 0, 0))
    second = tracker.scan()
    assert (second.processes, second.pending, second.totals.rchar) == (2, 2, 900)  # the newest PID went first
    assert tracker.scan().pending == 1
    assert tracker.scan().pending == 0


def test_young_rechecks_take_turns(proc: FakeProc) -> None:
    """Without fd counts (a fake /proc, or Linux < 6.2) every young process is re-checked: in turns."""
    proc.set_uptime(1000)
    for pid in (10, 20, 30):
        proc.spawn(pid, start_s=990)
    tracker = ProcessTracker(proc.root, check_budget_seconds=0)
    assert tracker.scan().processes == 0
    for pid in (10, 20, 30):
        proc.open_gpu(pid)
    assert [tracker.scan().processes for _ in range(3)] == [1, 2, 3]


def test_counters_never_go_back(proc: FakeProc) -> None:
    tracker = ProcessTracker(proc.root)
    proc.spawn(10, gpu=True, io=(1000, 0, 0, 0))
    tracker.scan()
    proc.set_io(10, 10, 0, 0, 0)  # a zombie's io no longer sums its threads
    assert tracker.scan().totals.rchar == 1000


def test_vanishing_files_mid_scan(proc: FakeProc) -> None:
    tracker = ProcessTracker(proc.root)
    proc.spawn(10, gpu=True, io=(1000, 0, 0, 0))
    (proc.root / "10" / "io").unlink()  # exited between listing and reading
    (proc.root / "33").mkdir()  # a directory without stat
    snap = tracker.scan()
    assert (snap.processes, snap.totals.rchar) == (1, 0)


def test_denied_io_is_reported_not_raised(proc: FakeProc, monkeypatch: pytest.MonkeyPatch) -> None:
    proc.spawn(10, gpu=True, io=(1000, 0, 0, 0))
    proc.spawn(11, gpu=True, io=(5, 0, 0, 0))
    denied = str(proc.root / "11" / "io")
    real_open = open

    def guarded(file: object, *args: object, **kwargs: object) -> object:
        if file == denied:
            raise PermissionError(13, "Permission denied", file)
        return real_open(file, *args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr("builtins.open", guarded)
    snap = ProcessTracker(proc.root).scan()
    assert (snap.processes, snap.io_denied, snap.totals.rchar) == (2, 1, 1000)


# What psutil raises for a process that went, a zombie, a file denied or no kernel's: that process alone.
@pytest.mark.parametrize(("error", "outcome"), [
    (psutil.NoSuchProcess(11), "kept"),
    (psutil.ZombieProcess(11), "kept"),
    (psutil.AccessDenied(11), "denied"),
    (OSError(5, "Input/output error"), "kept"),
    (ValueError("invalid literal for int()"), "parse error"),
    (IndexError("list index out of range"), "parse error"),
    (RuntimeError("/proc/11/io file was empty"), "parse error"),
])
def test_what_psutil_raises_reading_io(proc: FakeProc, monkeypatch: pytest.MonkeyPatch, error: Exception,
                                       outcome: str) -> None:
    proc.spawn(10, gpu=True, io=(1000, 0, 0, 0))
    proc.spawn(11, gpu=True, io=(5, 0, 0, 0))
    tracker = ProcessTracker(proc.root)
    assert tracker.scan().totals.rchar == 1005
    real = psutil.Process.io_counters

    def failing(self: psutil.Process) -> object:
        if self.pid == 11:
            raise error
        return real(self)

    monkeypatch.setattr(psutil.Process, "io_counters", failing)
    proc.set_io(10, 2000, 0, 0, 0)
    snap = tracker.scan()
    assert (snap.processes, snap.totals.rchar) == (2, 2005)  # 11's last value stands
    assert (snap.io_denied, snap.parse_errors) == (outcome == "denied", outcome == "parse error")


@pytest.mark.parametrize("stat", [
    b"", b"11 (cut", b"11 (x) S 1" + b" 0" * 17 + b" 98765 0 0\n",  # psutil wants field 39 (cpu)
    *(STAT.format(pid=11, ppid=1, start=start).encode() for start in ("x", "nan", "-5", "9" * 400)),
])
def test_a_gpu_processs_stat_gone_bad_retires_it_alone(proc: FakeProc, stat: bytes) -> None:
    proc.spawn(10, gpu=True, io=(1000, 0, 0, 0))
    proc.spawn(11, gpu=True, io=(5, 0, 0, 0))
    tracker = ProcessTracker(proc.root)
    tracker.scan()
    (proc.root / "11" / "stat").write_bytes(stat)
    snap = tracker.scan()
    assert (snap.processes, snap.totals.rchar) == (1, 1005)  # gone, its last value kept
    assert snap.parse_errors >= 1  # psutil's reading, or ours of the PID listed again


def test_psutil_reads_the_trackers_procfs_and_it_alone(tmp_path: Path) -> None:
    """psutil takes procfs from a module global: each tracker's while it scans, untouched after."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first, second = FakeProc(tmp_path / "a"), FakeProc(tmp_path / "b")
    first.spawn(10, gpu=True, io=(1, 0, 0, 0))
    second.spawn(10, gpu=True, io=(2, 0, 0, 0), start_s=500)
    trackers, before = (ProcessTracker(first.root), ProcessTracker(second.root)), psutil.PROCFS_PATH
    for _ in range(2):
        assert [t.scan().totals.rchar for t in trackers] == [1, 2]  # same PID, each its own start time
    assert before == psutil.PROCFS_PATH


# --- the real kernel ---------------------------------------------------------------------------

needs_root = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"),
                                reason="needs root and unshare(1) for a private /dev with nvidia0")

# In a private mount namespace: a /dev of our own with nvidia0 (the null device's numbers), then run
# python. The exporter, outside, sees the fd's target as /dev/nvidia0, as on a GPU node.
PRIVATE_DEV = ("mount -t tmpfs tmpfs /dev && mknod /dev/null c 1 3 && mknod /dev/nvidia0 c 1 3 && "
               "exec {python} -c \"$0\"")
WORKLOAD = r"""
import os, sys
gpu = open('/dev/nvidia0')
data = os.open('{data}', os.O_RDONLY)
release_r, release_w = os.pipe()
child = os.fork()
if child == 0:                      # a dataloader worker: inherits the GPU fd, reads 3 MiB, exits
    os.close(release_w)
    for _ in range(3):
        os.pread(data, 1 << 20, 0)
    os.read(release_r, 1)           # until the trainer closes its end
    os._exit(0)
os.close(release_r)
for _ in range(2):
    os.pread(data, 1 << 20, 0)      # the trainer reads 2 MiB
print(child, flush=True)
sys.stdin.readline()                # the test scans; then the worker is released and reaped
os.close(release_w)
os.waitpid(child, 0)
print('reaped', flush=True)
sys.stdin.readline()
"""

@needs_root
def test_real_processes_and_reaping(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.write_bytes(b"\0" * (1 << 20))
    script = WORKLOAD.format(data=data)
    trainer = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                                PRIVATE_DEV.format(python=sys.executable), script],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        worker = int(trainer.stdout.readline())
        pid = _child_python(trainer.pid)
        tracker = ProcessTracker(Path("/proc"), rescan_young_seconds=0)
        _wait(lambda: _rchar(worker) >= 3 << 20)
        before = tracker.scan()
        assert before.processes >= 2  # the trainer and its worker (and nothing else here uses /dev/nvidia0)
        mine = {p: _rchar(p) for p in (pid, worker)}
        assert mine[worker] >= 3 << 20 and mine[pid] >= 2 << 20
        trainer.stdin.write("\n")  # the worker exits and is reaped
        trainer.stdin.flush()
        assert trainer.stdout.readline().strip() == "reaped"
        after = tracker.scan()
        # The worker's reads now show in the trainer's own io (kernel's wait_task_zombie)...
        assert _rchar(pid) >= mine[pid] + mine[worker]
        # ...and our total counted them once: it grew by less than the worker's 3 MiB again.
        assert before.totals.rchar <= after.totals.rchar < before.totals.rchar + (3 << 20)
        assert after.processes == before.processes - 1
    finally:
        trainer.stdin.write("\n")
        trainer.stdin.close()
        trainer.wait(timeout=10)
    gone = tracker.scan()
    assert gone.totals.rchar >= after.totals.rchar  # the trainer exited: its total stays


@needs_root
def test_young_process_rechecked_when_its_fds_change() -> None:
    """Opening /dev/nvidia0 after the first check is seen on the next scan (fd count, Linux >= 6.2, or a rescan)."""
    late = ("import sys; print(1, flush=True); sys.stdin.readline(); f = open('/dev/nvidia0'); "
            "print(2, flush=True); sys.stdin.readline()")
    holder = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                               PRIVATE_DEV.format(python=sys.executable), late],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        holder.stdout.readline()
        tracker = ProcessTracker(Path("/proc"))
        baseline = tracker.scan().processes
        holder.stdin.write("\n")
        holder.stdin.flush()
        holder.stdout.readline()
        assert tracker.scan().processes == baseline + 1
    finally:
        holder.stdin.write("\n")
        holder.stdin.close()
        holder.wait(timeout=10)


@needs_root
def test_unprivileged_reader_is_told_so(tmp_path: Path) -> None:
    """As nobody, a root process's fds and io are off limits: counted, never an exception."""
    holder = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                               PRIVATE_DEV.format(python=sys.executable),
                               "import sys; f = open('/dev/nvidia0'); print(1, flush=True); sys.stdin.readline()"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        holder.stdout.readline()
        # Import first: the interpreter's own files may be readable by root only.
        probe = ("import os; from pathlib import Path; from gpunode_exporter.gpu_processes import ProcessTracker\n"
                 "tracker = ProcessTracker(Path('/proc')); os.setgid(65534); os.setuid(65534)\n"
                 "s = tracker.scan(); print(s.processes, s.fds_denied)")
        out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60,
                             cwd=Path(__file__).parent.parent, check=True)
    finally:
        holder.stdin.write("\n")
        holder.stdin.close()
        holder.wait(timeout=10)
    processes, denied = map(int, out.stdout.split())
    assert processes == 0 and denied > 0


def _rchar(pid: int) -> int:
    """The kernel's count, read apart from psutil's reading of it."""
    match = re.search(rb"^rchar: ([0-9]+)$", Path(f"/proc/{pid}/io").read_bytes(), re.MULTILINE)
    assert match
    return int(match.group(1))


def _child_python(sh_pid: int) -> int:
    """unshare execs sh, which execs python: the PID stays, but wait until the exec happened."""
    _wait(lambda: "python" in Path(f"/proc/{sh_pid}/comm").read_text())
    return sh_pid


def _wait(condition: object, seconds: float = 10) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if condition():  # type: ignore[operator]
                return
        except OSError:
            pass
        time.sleep(0.02)
    raise AssertionError("condition not met in time")
