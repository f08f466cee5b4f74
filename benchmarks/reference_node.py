#!/usr/bin/env python3
"""The reference node: what one GPU training node gives the exporter to read, as fixture trees.

    python benchmarks/reference_node.py OUTDIR       # writes OUTDIR/{proc,sys,config.yml}, prints the flags

- 8 GPUs: the DGX H100 sysfs fixture (tests/fixtures/sysfs/dgx-h100) and a simulated NVML with
  the same bus ids (exporter/nvmlsim/scenarios/gpu122-uncorrectable-steps.yaml);
- 4 NFSv4.2 mounts with nconnect=8 and the kernel's full per-operation list (make_fixture.py);
- 4 storage NICs with an RDMA (RoCE) port each: the fixture's two ConnectX-7s and two more
  like them;
- 2,000 processes, 8 of which hold a GPU (one per GPU, as a training job's ranks do).

docs/series-budget.md counts the series the exporter serves for it; benchmarks/series_budget.py
measures them and a full scrape's time.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_fixture import write_fixture

ROOT = Path(__file__).resolve().parent.parent
SYSFS = ROOT / "tests" / "fixtures" / "sysfs" / "dgx-h100"
SCENARIO = ROOT / "exporter" / "nvmlsim" / "scenarios" / "gpu122-uncorrectable-steps.yaml"
PROCESSES, GPU_PROCESSES, FIRST_PID = 2000, 8, 10_000
TICKS = 100
# /proc/PID/stat as Linux 6.x prints it (52 fields); comm, ppid and starttime filled in.
_STAT = ("{pid} ({comm}) S {ppid} {pid} {pid} 0 -1 4194560 2859 6532 6 1 4 1 4 2 20 0 1 0 {start} "
         "16965632 3380 18446744073709551615 1 1 0 0 0 0 0 16781312 2 0 0 0 17 1 0 0 0 0 0 1 1 1 1 1 1 1 0\n")
_IO = "rchar: {0}\nwchar: {1}\nsyscr: {2}\nsyscw: {3}\nread_bytes: 0\nwrite_bytes: 0\ncancelled_write_bytes: 0\n"
STORAGE_NICS = ("stor0", "enp64s0np0", "stor2", "stor3")


def _processes(proc: Path) -> None:
    (proc / "uptime").write_text("864000.00 6912000.00\n")
    for i in range(PROCESSES):
        pid = FIRST_PID + i
        d = proc / str(pid)
        (d / "fd").mkdir(parents=True)
        gpu = i >= PROCESSES - GPU_PROCESSES  # the trainers are the newest
        comm = "python3" if gpu else f"worker-{i % 40}"
        (d / "stat").write_text(_STAT.format(pid=pid, comm=comm, ppid=1, start=100 * TICKS + i))
        (d / "io").write_text(_IO.format(10_000_000 * i, 1_000 * i, 40 * i, 2 * i))
        targets = ["/dev/null", "pipe:[73921]", "socket:[73925]"]
        if gpu:
            targets += ["/dev/nvidiactl", "/dev/nvidia-uvm", f"/dev/nvidia{i % GPU_PROCESSES}"]
        for n, target in enumerate(targets):
            (d / "fd" / str(n)).symlink_to(target)
        (d / "cgroup").write_text(f"0::/system.slice/slurmstepd.scope/job_4242/step_0/user/task_{i % 8}\n")


def _sunrpc(proc: Path) -> None:
    sunrpc = proc / "sys" / "sunrpc"
    sunrpc.mkdir(parents=True, exist_ok=True)
    for name, value in (("tcp_max_slot_table_entries", 65536), ("tcp_slot_table_entries", 2),
                        ("udp_max_slot_table_entries", 65536), ("udp_slot_table_entries", 16),
                        ("rdma_slot_table_entries", 128)):
        (sunrpc / name).write_text(f"{value}\n")
    random = proc / "sys" / "kernel" / "random"
    random.mkdir(parents=True, exist_ok=True)
    (random / "boot_id").write_text("5b0c7c1e-3f3a-4a59-9d2e-2b7f0f6f9a10\n")


def _nics(sys_root: Path) -> None:
    """Two more ConnectX-7s like the fixture's mlx5_0 (stor0): netdev and RoCE port."""
    template = (sys_root / "class" / "infiniband" / "mlx5_0").resolve()
    for index, netdev in ((3, "stor2"), (4, "stor3")):  # mlx5_2 is the fixture's InfiniBand port
        ibdev = sys_root / "class" / "infiniband" / f"mlx5_{index}"
        shutil.copytree(template, ibdev, symlinks=False, ignore=shutil.ignore_patterns("device"))
        ndevs = ibdev / "ports" / "1" / "gid_attrs" / "ndevs"
        ndevs.mkdir(parents=True, exist_ok=True)
        (ndevs / "0").write_text(f"{netdev}\n")
        net = sys_root / "class" / "net" / netdev
        net.mkdir(parents=True)
        (net / "speed").write_text("400000\n")
        (net / "operstate").write_text("up\n")


def write_reference_node(out: Path) -> list[str]:
    """Writes the trees under `out`; returns the exporter's flags for them (without a command)."""
    proc, sys_root = out / "proc", out / "sys"
    write_fixture(proc, mounts=4, nconnect=8)
    _processes(proc)
    _sunrpc(proc)
    shutil.copytree(SYSFS, sys_root, symlinks=True)
    _nics(sys_root)
    (out / "shm").mkdir()
    (out / "state").mkdir()
    config = {"gpu": {"expected_count": 8}, "storage": {"interfaces": list(STORAGE_NICS)},
              "staging": {"paths": [str(out / "shm")]}, "nfs": {"resolve_devices": False}}
    (out / "config.yml").write_text(yaml.safe_dump(config))
    # The kernel log of a healthy node: no Xids, nothing new. A FIFO, so that a reader waits in
    # select() as on /dev/kmsg (a regular file is polled for growth every few ms) once a writer
    # holds it open: hold_kmsg_open().
    os.mkfifo(out / "kmsg")
    return ["--path.procfs", str(proc), "--path.sysfs", str(sys_root), "--path.kmsg", str(out / "kmsg"),
            "--path.state", str(out / "state"), "--config.file", str(out / "config.yml"),
            "--nvml.simulate", str(SCENARIO)]


@contextmanager
def hold_kmsg_open(out: Path) -> Iterator[None]:
    """Holds the reference node's kernel log open for writing, writing nothing: /dev/kmsg with no
    new records. Without a writer, a FIFO reads as ended and its reader polls it."""
    fd = os.open(out / "kmsg", os.O_RDWR | os.O_NONBLOCK)  # O_RDWR: does not wait for a reader
    try:
        yield
    finally:
        os.close(fd)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("outdir", type=Path)
    args = p.parse_args(argv)
    if args.outdir.exists() and any(args.outdir.iterdir()):
        p.error(f"{args.outdir} is not empty")
    print(" ".join(write_reference_node(args.outdir)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
