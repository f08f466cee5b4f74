"""A simulated node's kernel files, rewritten every second from its demo scenario.

The exporter reads them as it reads the real ones (--path.procfs, --path.sysfs,
--path.kmsg): /proc/self/mountstats and mountinfo of one NFSv4.2 mount, /proc/PID/{stat,io,fd}
of eight training processes (one per GPU), the node's sysfs tree (a copy of the DGX H100
fixture, whose RoCE counters tick), and the kernel log as a file of /dev/kmsg records.
The staging area is real: a tmpfs that each save really writes to (scaled down).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from demo.scenario import Scenario

FIXTURES = Path(__file__).parent.parent / "tests" / "fixtures"
SYSFS_FIXTURE = FIXTURES / "sysfs" / "dgx-h100"
# The RDMA port behind the storage interface (stor0) in that fixture.
HW_COUNTERS = "class/infiniband/mlx5_0/ports/1/hw_counters"
STAGING_SIZE = "256m"
WSIZE = 1 << 20  # the mount's wsize/rsize: one WRITE carries 1 MiB
# Xid messages as the driver prints them after "NVRM: Xid (PCI:...): N, pid=..., name=...,".
XID_TEXT = {79: "GPU has fallen off the bus.", 94: "Contained: SM (0x1). RST: No, D-RST: No",
            48: "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer."}
# NFSv4.2 operations a client lists, in the kernel's order (a subset; unused ones stay 0).
OPS = ("NULL", "READ", "WRITE", "COMMIT", "OPEN", "CLOSE", "SETATTR", "FSINFO", "ACCESS", "GETATTR",
       "LOOKUP", "LOOKUP_ROOT", "REMOVE", "RENAME", "CREATE", "STATFS", "READDIR", "SEQUENCE")
# Per-request times in ms: (queue, rtt). Healthy saves barely queue; slot-bound ones wait
# ~1.5 s for one of 128 slots while the network and server take ~0.1 s (the Lablup B200
# operations report's NFS split, docs/references.md).
WRITE_MS = {"healthy": (2, 60), "saturated": (1495, 120)}
GETATTR_MS = (0, 1)
GETATTR_PER_SECOND = 50


@dataclass
class _Op:
    ops: int = 0
    sent: int = 0
    received: int = 0
    queue_ms: int = 0
    rtt_ms: int = 0
    execute_ms: int = 0

    def add(self, n: int, sent: int, received: int, queue_ms: float, rtt_ms: float) -> None:
        self.ops += n
        self.sent += sent
        self.received += received
        self.queue_ms += round(n * queue_ms)
        self.rtt_ms += round(n * rtt_ms)
        self.execute_ms += round(n * (queue_ms + rtt_ms + 1))

    def line(self, name: str) -> str:
        return (f"\t{name:>12}: {self.ops} {self.ops} 0 {self.sent} {self.received} "
                f"{self.queue_ms} {self.rtt_ms} {self.execute_ms} 0\n")


@dataclass
class _Transport:
    sends: int = 0
    in_flight_sum: int = 0  # req_u
    backlog_sum: int = 0  # bklog_u
    max_slots: int = 2

    def add(self, n: int, in_flight: int, backlog: int) -> None:
        self.sends += n
        self.in_flight_sum += n * in_flight
        self.backlog_sum += n * backlog
        self.max_slots = max(self.max_slots, in_flight)


@dataclass
class SimulatedNode:
    name: str
    scenario: Scenario
    root: Path  # the node's files: proc/, sys/, kmsg, staging/
    ops: dict[str, _Op] = field(default_factory=lambda: {op: _Op() for op in OPS})
    transport: _Transport = field(default_factory=_Transport)
    written: list[int] = field(default_factory=lambda: [0] * 8)  # wchar per GPU process
    seq: int = 0
    staging_mounted: bool = False
    _xids_logged: int = 0
    _boot_uptime: float = 86400.0

    @property
    def procfs(self) -> Path:
        return self.root / "proc"

    @property
    def sysfs(self) -> Path:
        return self.root / "sys"

    @property
    def kmsg(self) -> Path:
        return self.root / "kmsg"

    @property
    def staging(self) -> Path:
        return self.root / "staging"

    def prepare(self) -> None:
        """Create the node's files at time 0; mounts the staging tmpfs when run as root."""
        shutil.copytree(SYSFS_FIXTURE, self.sysfs, symlinks=True)
        (self.procfs / "self").mkdir(parents=True)
        (self.procfs / "sys" / "kernel" / "random").mkdir(parents=True)
        (self.procfs / "sys" / "kernel" / "random" / "boot_id").write_text(f"{uuid.uuid4()}\n")
        (self.procfs / "self" / "mountinfo").write_text(self._mountinfo())
        self.staging.mkdir()
        if os.geteuid() == 0:
            subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={STAGING_SIZE}", f"demo-staging-{self.name}",
                            str(self.staging)], check=True)
            self.staging_mounted = True
        for gpu in range(8):
            self._write_process(gpu, 0.0)
        # A real kernel's records first (this machine's, tests/fixtures/kmsg), as after boot.
        boot = (FIXTURES / "kmsg" / "real-other.kmsg").read_text().splitlines()[:40]
        with self.kmsg.open("w") as log:
            for line in boot:
                self.seq = int(line.split(",")[1])
                log.write(line + "\n")
        self.tick(0.0, 0.0)

    def close(self) -> None:
        if self.staging_mounted:
            subprocess.run(["umount", "-l", str(self.staging)], check=False)
            self.staging_mounted = False

    def save_started(self, t: float) -> float | None:
        """When the save under way at t began (None between saves). A slot-bound save lasts longer."""
        ck, nfs = self.scenario.checkpoint, self.scenario.nfs
        if t < ck.first:
            return None
        start = t - (t - ck.first) % ck.every
        length = nfs.saturated_save_seconds if self._slot_bound(start) else ck.save_seconds
        return start if t - start < length else None

    def _slot_bound(self, start: float) -> bool:
        return self.scenario.nfs.saturated_from is not None and start >= self.scenario.nfs.saturated_from

    def saving(self, t: float) -> bool:
        return self.save_started(t) is not None

    def saturated(self, t: float) -> bool:
        start = self.save_started(t)
        return start is not None and self._slot_bound(start)

    def events(self, since: float, t: float) -> list[str]:
        """What happened in (since, t], for the demo's narration."""
        ck, said = self.scenario.checkpoint, []
        starts = [ck.first + n * ck.every for n in range(int(max(0.0, t - ck.first) // ck.every) + 1)]
        for start in starts:
            if since < start <= t:
                said.append("checkpoint save begins" + (": every RPC slot taken, WRITEs queue"
                                                         if self._slot_bound(start) else ""))
        for x in self.scenario.xids:
            if since < x.at <= t:
                said.append(f"kernel log: Xid {x.xid} on GPU {self._gpu_index(x.pci_bus_id)} ({x.pci_bus_id})")
        return said

    def tick(self, t: float, dt: float) -> None:
        """Advance the counters by dt seconds ending at t, and rewrite the files."""
        ck, nfs = self.scenario.checkpoint, self.scenario.nfs
        getattrs = round(GETATTR_PER_SECOND * dt)
        if (start := self.save_started(t)) is not None:
            mode = "saturated" if self._slot_bound(start) else "healthy"
            length = nfs.saturated_save_seconds if mode == "saturated" else ck.save_seconds
            written = round(ck.save_bytes * dt / length)
            writes = written // WSIZE
            self.ops["WRITE"].add(writes, written + 200 * writes, 150 * writes, *WRITE_MS[mode])
            in_flight, backlog = (nfs.slots, 4 * nfs.slots) if mode == "saturated" else (24, 0)
            self.transport.add(writes + getattrs, in_flight, backlog)
            for gpu in self._live_gpus(t):
                self.written[gpu] += written // 8
            self._stage(t - start, length)
            self._tick_roce(round(2000 * dt))
        else:
            self.transport.add(getattrs, 1, 0)
            self._clear_staging()
        self.ops["GETATTR"].add(getattrs, 240 * getattrs, 260 * getattrs, *GETATTR_MS)
        self.ops["SEQUENCE"].add(round(dt), 200, 120, 0, 1)
        self._write_atomic(self.procfs / "self" / "mountstats", self._mountstats(t))
        self._write_atomic(self.procfs / "uptime", f"{self._boot_uptime + t:.2f} {self._boot_uptime * 1.5:.2f}\n")
        for gpu in range(8):
            self._write_process(gpu, t)
        self._log_xids(t)

    def _live_gpus(self, t: float) -> list[int]:
        lost = {x.pci_bus_id for x in self.scenario.xids if x.xid == 79 and x.at <= t}
        return [i for i, g in enumerate(self.scenario.nvml["gpus"]) if g["pci_bus_id"] not in lost]

    def _write_process(self, gpu: int, t: float) -> None:
        """Process 5000+gpu: a training worker holding /dev/nvidiaN; it exits when its GPU is lost."""
        pid_dir = self.procfs / str(5000 + gpu)
        if gpu not in self._live_gpus(t):
            shutil.rmtree(pid_dir, ignore_errors=True)
            return
        if not pid_dir.exists():
            (pid_dir / "fd").mkdir(parents=True)
            for fd, target in enumerate(("/dev/null", "/dev/nvidiactl", "/dev/nvidia-uvm", f"/dev/nvidia{gpu}")):
                (pid_dir / "fd" / str(fd)).symlink_to(target)
            # Every demo node runs Slurm job 4242 (cgroup v2): one job, so the nodes are each other's peers.
            (pid_dir / "cgroup").write_text("0::/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0\n")
            start_ticks = int(self._boot_uptime * os.sysconf("SC_CLK_TCK")) - 100
            (pid_dir / "stat").write_text(
                f"{5000 + gpu} (python3) S 4999 4999 4999 0 -1 4194304 2859 0 6 0 400 100 0 0 20 0 12 0 "
                f"{start_ticks} 16965632 3380 18446744073709551615 0 0 0 0 0 0 0 16781312 2 0 0 0 17 1 0 0 0 0 0\n")
        wchar = self.written[gpu]
        self._write_atomic(pid_dir / "io", f"rchar: {wchar // 50 + 4096}\nwchar: {wchar}\nsyscr: {wchar // WSIZE + 9}\n"
                                           f"syscw: {wchar // WSIZE}\nread_bytes: 0\nwrite_bytes: 0\n"
                                           f"cancelled_write_bytes: 0\n")

    def _stage(self, into_save: float, length: float) -> None:
        """During a save, the staging file grows to staged_bytes (real bytes in the tmpfs)."""
        ck = self.scenario.checkpoint
        done = min(1.0, into_save / (length / 2))
        path = self.staging / "checkpoint.pt"
        want = int(ck.staged_bytes * done)
        have = path.stat().st_size if path.exists() else 0
        if want > have:
            with path.open("ab") as f:
                f.write(b"\0" * (want - have))

    def _clear_staging(self) -> None:
        (self.staging / "checkpoint.pt").unlink(missing_ok=True)

    def _tick_roce(self, packets: int) -> None:
        """ECN marks and CNPs on the storage port while it carries a save's traffic."""
        for name, share in (("np_ecn_marked_roce_packets", 1.0), ("np_cnp_sent", 0.3), ("rp_cnp_handled", 0.5)):
            path = self.sysfs / HW_COUNTERS / name
            if path.exists():
                path.write_text(f"{int(path.read_text()) + int(packets * share)}\n")

    def _log_xids(self, t: float) -> None:
        due = [x for x in self.scenario.xids if x.at <= t][self._xids_logged:]
        with self.kmsg.open("a") as log:
            for x in due:
                self.seq += 1
                bus = x.pci_bus_id[4:-2].lower()  # NVML's 00000000:52:00.0 -> the driver's 0000:52:00
                text = XID_TEXT.get(x.xid, "")
                log.write(f"3,{self.seq},{int((self._boot_uptime + t) * 1e6)},-;NVRM: Xid (PCI:{bus}): {x.xid}, "
                          f"pid={5000 + self._gpu_index(x.pci_bus_id)}, name=python3, {text}\n")
        self._xids_logged += len(due)

    def _gpu_index(self, pci_bus_id: str) -> int:
        return [g["pci_bus_id"] for g in self.scenario.nvml["gpus"]].index(pci_bus_id)

    def _mountinfo(self) -> str:
        nfs = self.scenario.nfs
        return ("22 1 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw\n"
                f"61 1 0:52 / {nfs.mountpoint} rw,relatime shared:40 - nfs4 {nfs.server}:{nfs.export} "
                "rw,vers=4.2,rsize=1048576,wsize=1048576,namlen=255,hard,proto=tcp,timeo=600,retrans=2,"
                f"sec=sys,clientaddr=10.20.0.2,local_lock=none,addr={nfs.server}\n")

    def _mountstats(self, t: float) -> str:
        nfs, tr = self.scenario.nfs, self.transport
        write, read = self.ops["WRITE"], self.ops["READ"]
        head = (
            "device proc mounted on /proc with fstype proc\n"
            f"device {nfs.server}:{nfs.export} mounted on {nfs.mountpoint} with fstype nfs4 statvers=1.1\n"
            "\topts:\trw,vers=4.2,rsize=1048576,wsize=1048576,namlen=255,acregmin=3,acregmax=60,acdirmin=30,"
            f"acdirmax=60,hard,proto=tcp,timeo=600,retrans=2,sec=sys,clientaddr=10.20.0.2,local_lock=none\n"
            f"\tage:\t{int(t) + 3600}\n"
            "\timpl_id:\tname='',domain='',date='0,0'\n"
            "\tcaps:\tcaps=0x3ffbffff,wtmult=512,dtsize=1048576,bsize=0,namlen=255\n"
            "\tnfsv4:\tbm0=0xfdffbfff,bm1=0xf9be3e,bm2=0x68800,acl=0x3,sessions,pnfs=not configured,"
            "lease_time=90,lease_expired=0\n"
            "\tsec:\tflavor=1,pseudoflavor=1\n"
            f"\tevents:\t{self.ops['GETATTR'].ops} 0 0 0 0 0 0 {write.ops} 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 \n"
            f"\tbytes:\t0 0 0 0 {read.received} {write.sent} {read.received // 4096} {write.sent // 4096} \n"
            "\tRPC iostats version: 1.1  p/v: 100003/4 (nfs)\n"
            f"\txprt:\ttcp 875 1 1 0 0 {tr.sends} {tr.sends} 0 {tr.in_flight_sum} {tr.backlog_sum} "
            f"{tr.max_slots} {tr.sends} {tr.backlog_sum}\n"
            "\tper-op statistics\n")
        return head + "".join(op.line(name) for name, op in self.ops.items()) + "\n"

    @staticmethod
    def _write_atomic(path: Path, text: str) -> None:
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text)
        tmp.rename(path)
