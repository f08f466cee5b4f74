"""The exporters under test and what their /metrics say: started on the fixtures, the Xid
counts read back and checked against what was written."""

from __future__ import annotations

import fcntl
import os
import time
import uuid
from collections import Counter
from pathlib import Path

import requests
from benchlib import (  # benchmarks/ is on sys.path when run as a script
    BenchError,
    ServerProcess,
    die_with_parent,
    find_ours,
    free_port,
    wait_ready,
)
from prometheus_client.parser import text_string_to_metric_families

from .records import DGX_SYSFS, GPUS

XID_ERRORS = b"gpunode_xid_errors_total{"
LOST = b"gpunode_kmsg_records_lost_total "
MALFORMED = b"gpunode_kmsg_records_malformed_total "


def xid_counts(body: bytes) -> tuple[int, int, int]:
    """(sum of gpunode_xid_errors_total, records lost, records malformed) of one exposition."""
    total = lost = malformed = 0
    for line in body.split(b"\n"):
        if line.startswith(XID_ERRORS):
            total += int(float(line.rpartition(b" ")[2]))
        elif line.startswith(LOST):
            lost = int(float(line[len(LOST):]))
        elif line.startswith(MALFORMED):
            malformed = int(float(line[len(MALFORMED):]))
    return total, lost, malformed


def get(http: requests.Session, url: str) -> bytes:
    resp = http.get(url, timeout=10)
    resp.raise_for_status()
    return resp.content


def get_new_connection(url: str) -> bytes:
    resp = requests.get(url, headers={"Connection": "close"}, timeout=10)
    resp.raise_for_status()
    return resp.content


def check_series(body: bytes, expected: Counter[tuple[str, int]], what: str) -> None:
    """Every Xid series as written: the count per (bus id, code), the GPU index of each bus id."""
    seen: dict[tuple[str, int], int] = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            if s.name == "gpunode_xid_errors_total":
                bus = s.labels["pci_bus_id"]
                if s.labels["gpu"] != GPUS.get(bus[:-2]):
                    raise BenchError(f"{what}: {bus} is labelled gpu={s.labels['gpu']!r}, want {GPUS.get(bus[:-2])}")
                seen[(bus, int(s.labels["xid"]))] = int(s.value)
    if seen != dict(expected):
        wrong = {k: (seen.get(k), expected.get(k)) for k in set(seen) | set(expected) if seen.get(k) != expected.get(k)}
        raise BenchError(f"{what}: Xid series differ from what was written, (seen, written): "
                         f"{dict(list(wrong.items())[:5])}")


# --- the exporter processes --------------------------------------------------------------


def fake_procfs(tmp: Path) -> Path:
    """A procfs holding only sys/kernel/random/boot_id: what the tracker keys its state by."""
    proc = tmp / "proc"
    (proc / "sys" / "kernel" / "random").mkdir(parents=True)
    (proc / "sys" / "kernel" / "random" / "boot_id").write_text(f"{uuid.uuid4()}\n")
    return proc


def exporter(key: str, label: str, collector: str, kmsg: Path, directory: Path, proc: Path) -> ServerProcess:
    port = free_port()
    argv = [find_ours(), "--collector.disable-defaults", f"--collector.{collector}", "--path.kmsg", str(kmsg),
            "--path.state", str(directory / "state"), "--path.procfs", str(proc), "--path.sysfs", str(DGX_SYSFS),
            "--web.listen-address", f"127.0.0.1:{port}"]
    return ServerProcess(key, label, argv, port, directory / "exporter.log")


def start(server: ServerProcess, running: list[ServerProcess]) -> None:
    running.append(server)
    server.start(die_with_parent)
    wait_ready(server)


def open_fifo_writer(path: Path, server: ServerProcess) -> int:
    """The FIFO's write end, once the exporter has its read end open (ENXIO until then)."""
    deadline = time.monotonic() + 10
    while True:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as err:
            server.check_running()
            if time.monotonic() > deadline:
                raise BenchError(f"{server.label} never opened {path} for reading ({err})") from None
            time.sleep(0.05)
            continue
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        return fd

