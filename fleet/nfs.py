"""A simulated node's NFS client: per sample, each operation's requests and where their time goes
(mountstats' queue and rtt), the transport's sends with the requests in flight and waiting at each,
and the bytes on the storage link.

Without a scenario's `storage:` the client is the older fixed one: each operation's slot wait and
network + server time are given per phase (a save's WRITEs wait 5 ms, a fault's READs 1.4 s).

With it, the time a request waits comes from the mechanism. A transport has `slots` RPC slots; a
request holds one from its transmission until the server's reply, `rtt` later (network + server).
A request that finds every slot taken waits in the transport's backlog, first come first served:
in flight = min(slots, outstanding), throughput = in flight / rtt, and the wait is the backlog
ahead over the throughput (Little's law).

- A save's writes reach the client in flushes (NFS writes a file's dirty pages back when it is
  closed, all at once). A flush of N WRITEs drains through S slots in ceil(N/S) waves of rtt
  each; the k-th wave waits k rtt, so a WRITE waits about (N/S - 1) rtt / 2 on average. A request
  of another operation that arrives meanwhile waits for the backlog ahead of it.
- A load's reads are a closed loop: readahead keeps `reads` READs asked for, and each reply asks
  for the next. With more than the slots outstanding, the slots stay full: throughput S / rtt,
  and every request waits (reads / S - 1) rtt.

mountstats counts per operation the requests and their summed queue, rtt and execute times;
per transport the sends, and at each send the requests in flight (req_u) and in the backlog
(bklog_u). Link utilization is the bytes over the link's speed and the time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gpunode_common.config import ConfigError

MIB = 1 << 20
LOAD_BYTES = 5e8  # fixed client: per second and node while an attempt loads its checkpoint
GETATTR_RATE = 50.0  # per second, every node: the training program's stat() calls
IDLE = {"WRITE": 0.5, "READ": 2.0}  # per second outside saves and loads
FAULT_BACKLOG = 600  # READs waiting per transport during an nfs_saturation fault
CLIENT_MS = 0.1  # the client's own time per request (execute = queue + rtt + this)
SMALL = 200  # bytes of a request or reply without data
PUBLISHED = ("lablup-table-13",)  # figures fleet/report_score.py holds a report's storage section to


@dataclass(frozen=True)
class Storage:
    """A node's NFS mount and storage link (the scenario's `storage:`)."""

    slots: int = 128  # RPC slots per transport (sunrpc.tcp_max_slot_table_entries, rdma's 128)
    transports: int = 1  # the mount's nconnect
    write_rtt: float = 0.110  # seconds on the network and in the server per WRITE
    read_rtt: float = 0.120
    wsize: int = MIB
    rsize: int = MIB
    flush: float = 3.3e9  # bytes a save's writes reach the client in at once
    reads: int = 64  # READs a load keeps asked for (readahead over the files it reads)
    link: float = 2.5e10  # bytes/s of the storage link (200 Gb/s)
    published: str = ""  # the published figures the report's storage section is scored against


KEYS = {"slots": int, "transports": int, "write_rtt_ms": float, "read_rtt_ms": float, "wsize": int, "rsize": int,
        "flush_bytes": float, "reads": int, "link_gbps": float, "published": str}


def parse(data: Any) -> Storage:
    if not isinstance(data, dict):
        raise ConfigError("storage: want a mapping")
    if unknown := set(data) - set(KEYS):
        raise ConfigError(f"storage: unknown key '{sorted(unknown)[0]}'")
    try:
        v = {k: KEYS[k](x) for k, x in data.items()}
    except (TypeError, ValueError):
        raise ConfigError(f"storage: want numbers for {', '.join(k for k in KEYS if k != 'published')}") from None
    if any(x <= 0 for k, x in v.items() if k != "published"):
        raise ConfigError("storage: want every number above 0")
    if v.get("published", "") not in ("", *PUBLISHED):
        raise ConfigError(f"storage.published: want one of {', '.join(PUBLISHED)}")
    d = Storage()
    return Storage(v.get("slots", d.slots), v.get("transports", d.transports),
                   v.get("write_rtt_ms", d.write_rtt * 1000) / 1000, v.get("read_rtt_ms", d.read_rtt * 1000) / 1000,
                   v.get("wsize", d.wsize), v.get("rsize", d.rsize), v.get("flush_bytes", d.flush),
                   v.get("reads", d.reads), v.get("link_gbps", d.link * 8 / 1e9) * 1e9 / 8, v.get("published", ""))


def flush_wait(n: int, slots: int, rtt: float) -> float:
    """Mean seconds a request of a flush of n waits for a slot: the k-th wave of `slots` waits k rtt."""
    waves = math.ceil(n / slots)
    return rtt * (slots * (waves - 2) * (waves - 1) / 2 + (waves - 1) * (n - (waves - 1) * slots)) / n


def saturates_loads(storage: Storage | None) -> bool:
    """Whether a load keeps more READs outstanding than the slots: the slot table stays full."""
    return storage is not None and storage.reads > storage.slots * storage.transports


@dataclass
class Client:
    """Per sample: each operation's requests/s, and its queue and rtt in ms per request; per
    transport (each alike) sends/s and their sums of requests in flight and in the backlog."""

    ops: dict[str, np.ndarray] = field(default_factory=dict)
    queue_ms: dict[str, np.ndarray] = field(default_factory=dict)
    rtt_ms: dict[str, np.ndarray] = field(default_factory=dict)
    size: dict[str, int] = field(default_factory=dict)  # bytes of data per request
    sends: np.ndarray = field(default_factory=lambda: np.zeros(0))
    in_flight: np.ndarray = field(default_factory=lambda: np.zeros(0))  # summed at each send, per second
    backlog: np.ndarray = field(default_factory=lambda: np.zeros(0))
    transports: int = 1

    def op_bytes(self, op: str, direction: str) -> np.ndarray:
        """Per second: `sent` (WRITE data, other requests' headers) or `received` (READ data, other replies)."""
        return self.ops[op] * (self.size[op] if op == ("WRITE" if direction == "sent" else "READ") else SMALL)

    def bytes(self, direction: str) -> np.ndarray:
        return sum((self.op_bytes(op, direction) for op in self.ops), np.zeros(self.sends.size))


def fixed(step: float, save: np.ndarray, load: np.ndarray, saturated: np.ndarray, save_bytes: np.ndarray) -> Client:
    """The older client: times per phase as given, not from slots."""
    ones = np.ones(save.size)
    c = Client(size={"GETATTR": 0, "WRITE": MIB, "READ": MIB})
    c.ops = {"GETATTR": np.full(save.size, GETATTR_RATE),
             "WRITE": np.where(save, save_bytes / MIB / step, IDLE["WRITE"]),
             # a fault's load saturates the slots (the report: 2.5 GB/s per node); a restart's load reads less
             "READ": np.where(saturated, 2400.0, np.where(load, LOAD_BYTES / MIB, IDLE["READ"]))}
    c.queue_ms = {"GETATTR": 0.0 * ones, "WRITE": np.where(save, 5.0, 1.0), "READ": np.where(saturated, 1400.0, 1.0)}
    c.rtt_ms = {"GETATTR": 0.6 * ones, "WRITE": 110.0 * ones, "READ": 120.0 * ones}
    c.sends = c.ops["GETATTR"] + c.ops["WRITE"] + c.ops["READ"]
    c.in_flight = c.sends * np.where(saturated, 128.0, np.where(save, 40.0, np.where(load, 30.0, 2.0)))
    c.backlog = c.sends * np.where(saturated, 600.0, 0.0)
    return c


def mechanism(s: Storage, step: float, save: np.ndarray, load: np.ndarray, saturated: np.ndarray,
              save_bytes: np.ndarray) -> Client:
    """The client of `s` (module docstring), per transport: each gets 1/transports of every request."""
    slots, tr = s.slots, s.transports
    c = Client(size={"GETATTR": 0, "WRITE": s.wsize, "READ": s.rsize}, transports=tr)
    # Saves: flushes of n WRITEs per transport, each drained in waves.
    n = max(1, round(s.flush / s.wsize / tr))
    waves = math.ceil(n / slots)
    writes = np.where(save, save_bytes / s.wsize, 0.0)  # WRITEs of the save in the sample
    flushes = writes / tr / n  # per transport
    write_wait = flush_wait(n, slots, s.write_rtt)
    drain = (waves - 1) * s.write_rtt  # from a flush's start until its last wave has slots
    # Loads (and a fault's reads): a closed loop of `outstanding` READs per transport.
    outstanding = np.where(saturated, slots + FAULT_BACKLOG, np.where(load & ~save, s.reads / tr, 0.0))
    reading = outstanding > 0
    held = np.minimum(outstanding, slots)
    read_rate = np.where(reading, tr * held / s.read_rtt, IDLE["READ"])
    read_wait = np.where(reading, np.maximum(outstanding - slots, 0) / np.maximum(held, 1) * s.read_rtt, 0.0)
    # What a request of another operation finds at a random moment of the sample (Poisson
    # arrivals see time averages): the wait until the backlog ahead has slots, the slots held,
    # the requests waiting.
    other_wait = np.where(reading, read_wait, np.minimum(flushes * drain ** 2 / 2 / step, drain))
    held_mean = np.where(reading, held, np.minimum(slots, flushes * n * s.write_rtt / step))
    waiting_mean = np.where(reading, outstanding - held, flushes * n * write_wait / step)
    idle_write = IDLE["WRITE"] * np.ones(save.size)
    c.ops = {"GETATTR": np.full(save.size, GETATTR_RATE), "WRITE": writes / step + idle_write, "READ": read_rate}
    c.queue_ms = {"GETATTR": 1000 * other_wait,
                  "WRITE": 1000 * (writes / step * write_wait + idle_write * other_wait) / c.ops["WRITE"],
                  "READ": 1000 * np.where(reading, read_wait, other_wait)}
    c.rtt_ms = {"GETATTR": 0.6 * np.ones(save.size), "WRITE": 1000 * s.write_rtt * np.ones(save.size),
                "READ": 1000 * s.read_rtt * np.ones(save.size)}
    c.sends = sum(c.ops.values(), np.zeros(save.size)) / tr  # per transport
    flush_sends = flushes * n / step
    others = c.sends - flush_sends
    # A flush's first wave finds 1, 2, ... slots taken as it is sent, the later ones every slot
    # (a reply frees a slot for the next); at the k-th send after the first wave, n - k wait.
    first = min(n, slots)
    c.in_flight = flushes / step * (first * (first + 1) / 2 + (n - first) * slots) + others * np.where(
        reading, held, 1 + held_mean)
    c.backlog = flushes / step * (n - first) * (n - first - 1) / 2 + others * waiting_mean
    return c


def client(storage: Storage | None, step: float, save: np.ndarray, load: np.ndarray, saturated: np.ndarray,
           save_bytes: np.ndarray) -> Client:
    if storage is None:
        return fixed(step, save, load, saturated, save_bytes)
    return mechanism(storage, step, save, load, saturated, save_bytes)
