"""The process fleet: real processes on the real /proc, some holding /dev/nvidia0 through a
private /dev, so that the collector meets a GPU node's process table without a GPU; and a census
of /proc, what a first scrape must read."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchlib import BenchError, die_with_parent, percentile  # benchmarks/ is on sys.path when run as a script

STARTUP_TIMEOUT = 60.0  # seconds for the fleet (plus 1 per 50 processes), and for a server to listen

# Runs as `python -c FLEET CONFIG_JSON` in a new session. Forks the plain processes, starts the
# GPU holders, then obeys "churn K" (kill and reap the K oldest plain processes, fork K new ones,
# answer when they hold their fds) and "quit" on stdin.
FLEET = r'''
import ctypes, json, os, random, signal, socket, subprocess, sys
libc = ctypes.CDLL(None, use_errno=True)
def die_with_parent():
    libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
die_with_parent()
cfg = json.loads(sys.argv[1])
if os.getppid() != cfg["parent"]:
    sys.exit("fleet: parent already gone")
me = os.getpid()
rng = random.Random(cfg["seed"])
tmp = cfg["tmp"]

pool = [os.open(os.path.join(tmp, f"shard-{i:02d}.bin"), os.O_RDWR | os.O_CREAT, 0o600) for i in range(12)]
pool += [os.open(p, os.O_RDONLY) for p in ("/etc/hostname", "/etc/passwd", "/proc/self/status")]
for _ in range(4):
    a, b = socket.socketpair()
    pool += [a.detach(), b.detach()]
for _ in range(2):
    pool += list(os.pipe())
tcp = socket.socket()
tcp.bind(("127.0.0.1", 0))
tcp.listen()
udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
pool += [tcp.detach(), udp.detach(), os.open("/dev/null", os.O_RDWR), os.open("/dev/urandom", os.O_RDONLY),
         os.eventfd(0)]
ready_r, ready_w = os.pipe()
COMMS = ["pt_data_worker", "python3", "sshd", "bash", "containerd-shim", "runc", "node_exporter", "dcgm",
         "nv-hostengine", "slurmstepd", "srun", "torchrun", "ray::IDLE", "raylet", "gcs_server", "nscd",
         "rsyslogd", "cron", "dbus-daemon", "systemd-journal", "chronyd", "sleep", "tail", "tmux: server",
         "jupyter-lab", "tensorboard", "wandb-service", "fluent-bit", "kubelet", "pause"]

def fds_wanted():
    x = rng.random()
    if x < 0.5:
        return rng.randint(8, 30)
    if x < 0.85:
        return rng.randint(50, 120)
    return rng.randint(120, 200)

def spawn(n):
    pids = []
    for _ in range(n):
        want, comm = fds_wanted(), rng.choice(COMMS)
        pid = os.fork()
        if pid == 0:
            try:
                die_with_parent()
                if os.getppid() != me:
                    os._exit(0)
                with open("/proc/self/comm", "w") as f:
                    f.write(comm)
                inherited = [int(n) for n in os.listdir("/proc/self/fd")]
                keep = {0, 1, 2, ready_w}
                keep.update(os.dup(pool[i % len(pool)]) for i in range(want - len(keep)))
                for fd in inherited:  # the rest of the pool and the supervisor's pipes
                    if fd not in keep:
                        try:
                            os.close(fd)
                        except OSError:
                            pass
                os.write(ready_w, b".")
                while True:
                    signal.pause()
            finally:
                os._exit(0)
        pids.append(pid)
    got = 0
    while got < n:
        got += len(os.read(ready_r, n - got))
    return pids

data = os.path.join(tmp, "dataset.bin")
with open(data, "wb") as f:
    f.write(b"\1" * (1 << 20))
holders = []
for i in range(cfg["gpu"]):
    holders.append(subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", cfg["private_dev"], cfg["holder"], data,
         str(rng.randint(40, 120))],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, preexec_fn=die_with_parent))
for h in holders:
    if h.stdout.readline().strip() != b"ready":
        sys.exit("fleet: a GPU holder did not start")
plain = spawn(cfg["plain"])
print(json.dumps({"gpu": [h.pid for h in holders], "plain": len(plain)}), flush=True)

def reap(pids):
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    for pid in pids:
        os.waitpid(pid, 0)

for line in sys.stdin:
    cmd = line.split()
    if cmd and cmd[0] == "churn":
        k = int(cmd[1])
        reap(plain[:k])
        plain = plain[k:] + spawn(k)
        print("ok", flush=True)
    else:
        break
reap(plain)
for h in holders:
    h.kill()
    h.wait()
'''

# The private /dev: tmpfs with null and nvidia0 (the null device's numbers), then python. Seen from
# outside, the holder's fd points to /dev/nvidia0, as on a GPU node.
PRIVATE_DEV = ('mount -t tmpfs tmpfs /dev && mknod /dev/null c 1 3 && mknod /dev/nvidia0 c 1 3 && '
               'exec {python} -c "$0" "$@"')
# A GPU process: the device, a data file, some more fds; reads 64 KiB and writes 64 KiB every 100 ms.
HOLDER = r'''
import os, sys, time
gpu = os.open("/dev/nvidia0", os.O_RDWR)
data = os.open(sys.argv[1], os.O_RDONLY)
for _ in range(int(sys.argv[2])):
    os.dup(data)
print("ready", flush=True)
block = b"\0" * 65536
while True:
    os.pread(data, 65536, 0)
    os.write(gpu, block)
    time.sleep(0.1)
'''


class Fleet:
    """The benchmark's processes, in a session of their own: one killpg ends them all."""

    def __init__(self, processes: int, gpu: int, seed: int, tmp: Path) -> None:
        cfg = {"parent": os.getpid(), "seed": seed, "tmp": str(tmp), "gpu": gpu, "plain": processes - gpu,
               "private_dev": PRIVATE_DEV.format(python=sys.executable), "holder": HOLDER}
        self.proc = subprocess.Popen([sys.executable, "-c", FLEET, json.dumps(cfg)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, start_new_session=True,
                                     preexec_fn=die_with_parent)
        self.pgid = self.proc.pid
        self.started = time.monotonic()
        self.startup_timeout = STARTUP_TIMEOUT + processes / 50
        self.gpu_pids: list[int] = []

    def age(self) -> float:
        """Seconds since the fleet started: its oldest processes are younger than that."""
        return time.monotonic() - self.started

    def wait_started(self) -> None:
        self.gpu_pids = json.loads(self._reply(self.startup_timeout))["gpu"]

    def _reply(self, timeout: float) -> str:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            raise BenchError(f"the process fleet did not answer within {timeout:.0f}s "
                             f"(exit status {self.proc.poll()})")
        return line

    def churn(self, k: int) -> None:
        """k of the oldest plain processes exit (reaped), k new ones start and open their fds."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"churn {k}\n")
        self.proc.stdin.flush()
        if self._reply(30).strip() != "ok":
            raise BenchError("the process fleet failed to churn")

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(OSError):
                assert self.proc.stdin is not None
                self.proc.stdin.write("quit\n")
                self.proc.stdin.flush()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=20)  # it kills and reaps its own
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pgid, signal.SIGKILL)  # whatever is left of the group
        self.proc.wait()


def pids() -> list[int]:
    return [int(n) for n in os.listdir("/proc") if n.isdigit()]


def exe_of(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return ""


def fd_census() -> dict[str, Any]:
    """How many processes there are and how many fds they hold (what a first scrape readlinks)."""
    counts = []
    for pid in pids():
        try:
            counts.append(len(os.listdir(f"/proc/{pid}/fd")))
        except OSError:
            counts.append(0)  # kernel thread (no fd table) or gone
    return {"processes": len(counts), "fds": sum(counts),
            "fds_per_process": {"p50": percentile(counts, 0.5), "p90": percentile(counts, 0.9), "max": max(counts)},
            "processes_with_50_to_200_fds": sum(1 for c in counts if 50 <= c <= 200)}

