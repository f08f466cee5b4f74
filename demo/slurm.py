"""A real Slurm cluster for the demo and the end-to-end tests, in a directory of its own on free loopback ports.

Under `base`: its own munged (key, socket, pid, log, seed), slurm.conf, state and spool; the system munge
and /etc/slurm stay untouched. Debian's Slurm is built with MULTIPLE_SLURMD, so each node is a real
`slurmd -N NAME` on this host, NodeAddr=127.0.0.1 with its own Port: no network namespace, and
`scontrol_path` is the system scontrol run with `env` (SLURM_CONF=<base>/slurm.conf). RebootProgram logs
the node to reboots.log and, detached by setsid, restarts its slurmd as a reboot would, with a boot clock
of its own (_write_reboot_program); with ReturnToService=1 (or 0) `scontrol reboot nextstate=DOWN` leaves
the node DOWN until `state=resume`.
`return_to_service` and `stuck_reboots` (nodes whose reboot stops slurmd and never starts it again, for
ResumeTimeout to catch) set up the cases tests/test_slurm_reboot_behaviour.py observes.
On exit, the processes with GPUNODE_SLURM_CLUSTER=<base> in their environment, jobs and descendants die.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from gpunode_common.http import free_port
from gpunode_remediate.scheduler.slurm import fields  # the service's own parser: Reason= last, its stamp dropped

DEFAULT_NODES = tuple(f"gpu{i:03d}" for i in range(1, 9))
TOOLS = ("munged", "slurmctld", "slurmd", "scontrol", "sinfo", "sbatch", "scancel")
MARK = "GPUNODE_SLURM_CLUSTER"  # in every daemon's environment: how stop() finds what to kill
NODE_VAR = "GPUNODE_SLURM_NODE"  # the node a slurmd (and so its RebootProgram) runs for
BOOT_SECONDS = 2  # a rebooted node's power-on to its slurmd's start: slurmctld's arithmetic needs over 1 s

_ANY_KEY = re.compile(r"(?:^|(?<=\s))([A-Za-z_][\w:/]*)=")  # show job: keys such as ReqB:S:C:T, CPUs/Task


def _tool(name: str) -> str:
    """Its path: on PATH, or in an sbin directory a non-root PATH leaves out (else the bare name)."""
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin") or name


def slurm_unavailable() -> str | None:
    if missing := [name for name in TOOLS if not shutil.which(_tool(name))]:
        return f"{', '.join(missing)} not installed (scripts/install-deps.sh --demo installs them)"
    return None if os.geteuid() == 0 else "a Slurm cluster of our own needs root (SlurmUser=root, its own munged)"


def time_namespaces() -> bool:
    """Whether this kernel (CONFIG_TIME_NS, Linux 5.6+) and our privileges give a process its own boot clock."""
    try:
        return subprocess.run(["unshare", "--time", "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def _signal(pids: set[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def parse(line: str, keys: re.Pattern[str] = _ANY_KEY) -> dict[str, str]:
    """`Key=value Key=value ...` (one line of `scontrol -o show ...`) into a dict; a value runs to the next key."""
    found = list(keys.finditer(line))
    return {m.group(1): line[m.end(): nxt.start() if nxt else len(line)].strip()
            for m, nxt in zip(found, [*found[1:], None], strict=True)}


def flags(node: dict[str, str]) -> set[str]:
    """A node's State as a set: "IDLE+DRAIN+REBOOT_REQUESTED" -> {"IDLE", "DRAIN", "REBOOT_REQUESTED"}."""
    return set(node["State"].split("+"))


class SlurmCluster:
    """`with SlurmCluster(tmp_path) as cluster:` a running cluster whose nodes are all IDLE."""

    def __init__(self, base: Path, nodes: Sequence[str] = DEFAULT_NODES, partition: str = "gpu",
                 reboot_seconds: float = 1.0, start_timeout: float = 30.0, return_to_service: int = 1,
                 stuck_reboots: Sequence[str] = ()) -> None:
        self.base = Path(base).resolve()
        self.nodes = list(nodes)
        self.partition = partition
        self.reboot_seconds = reboot_seconds  # how long a simulated reboot keeps the node's slurmd away
        self.start_timeout = start_timeout
        self.return_to_service = return_to_service
        self.stuck_reboots = set(stuck_reboots)  # their RebootProgram never starts slurmd again
        self.conf = self.base / "slurm.conf"
        self.logs = self.base / "log"
        self.reboot_log = self.base / "reboots.log"
        # A unix socket's path has at most 107 bytes, which a test's or the demo's directory can exceed.
        self._socket_dir = Path(tempfile.mkdtemp(prefix="gpunode-munge-"))
        self.munge_socket = self._socket_dir / "socket"
        self.scontrol_path = _tool("scontrol")  # SLURM_CONF in the environment suffices: no wrapper
        outer = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_"))}  # run in a job?
        self.env = {**outer, "SLURM_CONF": str(self.conf)}  # for its users; no MARK: stop() spares them
        self.ctld_port = free_port()
        self.ports = {node: free_port() for node in self.nodes}
        self._daemons: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> SlurmCluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        for sub in ("munge", "log", "state", "spool"):
            (self.base / sub).mkdir(parents=True, exist_ok=True)
        self._start_munge()
        self._write_reboot_program()
        self.conf.write_text(self._slurm_conf())
        self._spawn("slurmctld", [_tool("slurmctld"), "-D", "-i"])
        # slurmd registers once, at start: a slurmctld not yet listening would leave it to the next ping.
        self._wait(lambda: "is UP" in self.scontrol("ping", timeout=5).stdout, "slurmctld to answer", 15)
        for node in self.nodes:
            self._spawn(f"slurmd-{node}", [_tool("slurmd"), "-D", "-N", node], {NODE_VAR: node})
        self._wait(lambda: [flags(n) for n in self.all_nodes()] == [{"IDLE"}] * len(self.nodes),
                   "every node to be IDLE", self.start_timeout)

    def stop(self) -> None:
        """Kill every process we started and all they started. SIGSTOP first, until no new one turns up,
        so that none forks, or is orphaned out of our sight, between a look at /proc and the kill."""
        frozen: set[int] = set()
        deadline = time.monotonic() + 15
        while (pids := self.processes() - frozen) and time.monotonic() < deadline:
            _signal(pids, signal.SIGSTOP)
            frozen |= pids
        _signal(frozen, signal.SIGKILL)
        for proc in self._daemons:
            proc.wait(timeout=10)
        while (pids := self.processes()) and time.monotonic() < deadline:
            _signal(pids, signal.SIGKILL)  # still dying, or escaped the freeze
            time.sleep(0.05)
        shutil.rmtree(self._socket_dir, ignore_errors=True)
        if pids:
            raise RuntimeError(f"Slurm test processes survived SIGKILL: {sorted(pids)}")

    def processes(self) -> set[int]:
        """Live processes carrying our MARK, jobs of this cluster (SLURM_JOB_ID, and SLURM_CONF from their
        submitter, even once orphaned) and the descendants of both. Not the clients using `env`."""
        mark, conf = f"{MARK}={self.base}".encode(), f"SLURM_CONF={self.conf}".encode()
        parent: dict[int, int] = {}
        ours: set[int] = set()
        for pid in (int(entry.name) for entry in os.scandir("/proc") if entry.name.isdigit()):
            with contextlib.suppress(OSError):  # gone meanwhile
                state, ppid = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[:2]
                if state != "Z":  # a zombie is dead, only not reaped yet
                    parent[pid] = int(ppid)
                    env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                    if mark in env or (conf in env and any(v.startswith(b"SLURM_JOB_ID=") for v in env)):
                        ours.add(pid)
        while more := {pid for pid, ppid in parent.items() if ppid in ours} - ours:
            ours |= more
        return ours - {os.getpid()}

    def stop_controller(self) -> None:
        """slurmctld stopped as for maintenance (SIGTERM: it saves its state first); munged, the slurmds and
        their jobs run on, and every client call fails until start_controller()."""
        proc = next(p for p in self._daemons if p.args[0] == _tool("slurmctld") and p.poll() is None)
        proc.terminate()
        proc.wait(timeout=60)

    def start_controller(self) -> None:
        """slurmctld again, as at start (same slurm.conf and StateSaveLocation): it recovers its nodes and
        jobs, and the slurmds, still running, answer its pings and register again."""
        self._spawn("slurmctld", [_tool("slurmctld"), "-D", "-i"])
        self._wait(lambda: "is UP" in self.scontrol("ping", timeout=5).stdout, "slurmctld to answer", 30)

    def run(self, *cmd: str, timeout: float = 30, check: bool = False) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(cmd), env=self.env, cwd=self.base, capture_output=True, text=True,
                              timeout=timeout, check=check)

    def scontrol(self, *args: str, timeout: float = 30, check: bool = False) -> subprocess.CompletedProcess[str]:
        return self.run(self.scontrol_path, *args, timeout=timeout, check=check)

    def node(self, name: str) -> dict[str, str]:  # `scontrol -o show node NAME` as {key: value}
        return fields(self.scontrol("-o", "show", "node", name, check=True).stdout.strip())

    def all_nodes(self) -> list[dict[str, str]]:
        out = self.scontrol("-o", "show", "node", timeout=10).stdout
        return [fields(line) for line in out.splitlines() if line.startswith("NodeName=")]

    def job(self, job_id: int) -> dict[str, str]:
        return parse(self.scontrol("-o", "show", "job", str(job_id), check=True).stdout.strip())

    def sinfo_reasons(self) -> str:
        return self.run(_tool("sinfo"), "-R", check=True).stdout

    def submit(self, node: str, seconds: int, wait: bool = True) -> int:
        """A batch job sleeping `seconds` on `node`; by default returns once it runs."""
        out = self.run(_tool("sbatch"), "--parsable", f"--nodelist={node}", f"--partition={self.partition}",
                       "--job-name=gpunode-test", "--output=/dev/null", f"--wrap=sleep {seconds}", check=True).stdout
        job_id = int(out.strip().split(";")[0])  # --parsable prints "id" or "id;cluster"
        if wait:
            self._wait(lambda: self.job(job_id)["JobState"] == "RUNNING", f"job {job_id} to run on {node}", 20)
        return job_id

    def cancel(self, job_id: int) -> None:
        self.run(_tool("scancel"), str(job_id), check=True)

    def wait_state(self, name: str, predicate: Callable[[dict[str, str]], bool], timeout: float = 30) -> dict[str, str]:
        """Poll the node until predicate(its dict) holds and return that dict, else AssertionError."""
        deadline = time.monotonic() + timeout
        while not predicate(info := self.node(name)):
            if time.monotonic() > deadline:
                raise AssertionError(f"{name} not as wanted after {timeout}s: State={info['State']} "
                                     f"Reason={info.get('Reason')}\n{self.log_tail()}")
            time.sleep(0.2)
        return info

    def reboots(self, node: str) -> int:  # how often the RebootProgram ran for `node`
        text = self.reboot_log.read_text() if self.reboot_log.exists() else ""
        return sum(1 for line in text.splitlines() if line.split()[:1] == [node])

    def log_tail(self) -> str:
        log = self.logs / "slurmctld.log"
        return "slurmctld.log:\n" + ("\n".join(log.read_text().splitlines()[-30:]) if log.exists() else "(none)")

    def _start_munge(self) -> None:
        munge = self.base / "munge"
        key = munge / "munge.key"
        subprocess.run(["dd", "if=/dev/urandom", f"of={key}", "bs=1024", "count=1", "status=none"], check=True)
        os.chown(key, os.geteuid(), os.getegid())  # munged runs as us (root) and insists the key is its own
        key.chmod(0o400)
        # --force: munged wants every directory above its socket world-searchable; pytest's tmp dirs are 0700.
        self._spawn("munged", [_tool("munged"), "--foreground", "--force", f"--socket={self.munge_socket}",
                               f"--key-file={key}", f"--pid-file={munge / 'munged.pid'}",
                               f"--log-file={munge / 'munged.log'}", f"--seed-file={munge / 'munged.seed'}"])
        self._wait(self.munge_socket.exists, "munged's socket", 10)

    def _slurm_conf(self) -> str:
        host = socket.gethostname().split(".")[0]  # slurmctld only runs where SlurmctldHost names this host
        nodes = "\n".join(f"NodeName={n} NodeAddr=127.0.0.1 Port={self.ports[n]} CPUs=1 RealMemory=1000 State=UNKNOWN"
                          for n in self.nodes)
        b = self.base
        return f"""\
ClusterName=gpunode-test
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={self.ctld_port}
CommunicationParameters=NoInAddrAny  # slurmd listens on its NodeAddr only, not on every address
SlurmUser=root
AuthType=auth/munge
AuthInfo=socket={self.munge_socket}  # cred/munge's socket too (22.05 has no CredInfo)
CredType=cred/munge
StateSaveLocation={b}/state
SlurmdSpoolDir={b}/spool/%n
SlurmctldPidFile={b}/slurmctld.pid
SlurmdPidFile={b}/slurmd-%n.pid
SlurmctldLogFile={b}/log/slurmctld.log
SlurmdLogFile={b}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SchedulerParameters=batch_sched_delay=0  # start a batch job when submitted, not up to 3 s later
MailProg=/bin/true
SlurmdParameters=config_overrides  # nodes are declared, not measured: all run on this one host
ReturnToService={self.return_to_service}
RebootProgram={b}/reboot
ResumeTimeout=20
SlurmdTimeout=10
{nodes}
PartitionName={self.partition} Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""

    def _write_reboot_program(self) -> None:
        """slurmd runs it (by system()) with its own environment, where $GPUNODE_SLURM_NODE names the node.
        Its detached half (`restart NODE`) stops that slurmd, keeps it away reboot_seconds (power off), and
        starts it BOOT_SECONDS after a power-on at a whole second of the host's uptime, in a time namespace
        whose boot clock starts there: slurmd reports that uptime, and slurmctld takes now - uptime for the
        boot time. As on a real node, the boot comes after the reboot request and seconds before slurmd
        registers. `slurmd -b` (boot = slurmd's start) let slurmctld's whole-second arithmetic put the boot
        after the first registration, and take a later one for a reboot nobody asked for ("Node
        unexpectedly rebooted", DOWN); it remains where the kernel has no time namespaces.
        For a node in stuck_reboots it only stops slurmd: a reboot that hangs, for ResumeTimeout to catch."""
        q = shlex.quote
        stuck = " ".join(sorted(self.stuck_reboots))
        script = self.base / "reboot"
        slurmd = q(_tool("slurmd"))
        # Offsets count from the host's clock, even in the namespace a rebooted node's slurmd (and so this
        # script) runs in: the host's uptime is ours minus our boottime offset.
        host_uptime = ("awk '$1 == \"boottime\" {off = $2 + $3 / 1e9} FILENAME ~ /uptime/ {up = $1 - off; "
                       "s = int(up) + 1; printf \"%d %.3f\\n\", s, s - up}' /proc/self/timens_offsets /proc/uptime")
        boot = (f"""set -- "$2" $({host_uptime})
sleep "$3"  # power-on at the host's uptime $2, where the namespace's uptime is 0
sleep {BOOT_SECONDS}
exec unshare --time --boottime "-$2" {slurmd} -D -N "$1\"""" if time_namespaces()
                else f'exec {slurmd} -D -b -N "$2"')
        script.write_text(f"""#!/bin/sh
if [ "$1" != restart ]; then
  echo "${NODE_VAR} $(date +%Y-%m-%dT%H:%M:%S)" >> {q(str(self.reboot_log))}
  setsid -f "$0" restart "${NODE_VAR}" </dev/null >/dev/null 2>&1
  exit 0
fi
exec >> {q(str(self.logs))}/slurmd-"$2".out 2>&1
pid=$(cat {q(str(self.base))}/slurmd-"$2".pid)
kill "$pid"
# Gone, or a zombie its parent has yet to reap: either way its port is free.
while [ -e /proc/"$pid" ] && ! grep -qs '^State:.*zombie' /proc/"$pid"/status; do sleep 0.1; done
case " {stuck} " in *" $2 "*) exit 0;; esac  # a stuck reboot: the node never comes back
sleep {self.reboot_seconds}
{boot}
""")
        script.chmod(0o755)

    def _spawn(self, name: str, cmd: list[str], extra: dict[str, str] | None = None) -> None:
        env = {**self.env, MARK: str(self.base), **(extra or {})}
        with open(self.logs / f"{name}.out", "ab") as out:
            self._daemons.append(subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                                  stderr=subprocess.STDOUT, start_new_session=True))

    def _wait(self, ready: Callable[[], Any], what: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(subprocess.SubprocessError, OSError):  # not up yet
                if ready():
                    return
            time.sleep(0.2)
        raise RuntimeError(f"timed out after {timeout}s waiting for {what}\n{self.log_tail()}")
