"""The records the benchmark writes: the real kernel records of tests/fixtures/kmsg, renumbered
and cycled, with real Xid records among them, so that the parser meets what a node's log holds."""

from __future__ import annotations

import os
import re
from collections import Counter

import yaml
from benchlib import BenchError  # benchmarks/ is on sys.path when run as a script

from . import ROOT

KMSG = ROOT / "tests" / "fixtures" / "kmsg"
DGX_SYSFS = ROOT / "tests" / "fixtures" / "sysfs" / "dgx-h100"
# The 8 GPUs of the dgx-h100 sysfs fixture, in PCI order: their NVML-less index.
GPUS = {"0000:1b:00": "0", "0000:43:00": "1", "0000:52:00": "2", "0000:61:00": "3",
        "0000:9d:00": "4", "0000:c3:00": "5", "0000:d1:00": "6", "0000:df:00": "7"}
CODES = (13, 31, 48, 63, 74, 79, 94, 119)  # the codes the latency and flood Xids rotate through
XID_EVERY = 1000  # one Xid per this many records, in the mixed stream and the flood
USEC_PER_RECORD = 20  # kernel timestamps of the generated records: seq * 20 us


def fixture_records(name: str) -> list[tuple[int, bytes, bytes]]:
    """(seq, prio, text) of every record of a fixture; dictionary lines (" KEY=value") left out,
    as the reader leaves them out."""
    out = []
    for line in (KMSG / name).read_bytes().split(b"\n"):
        if not line or line[:1] == b" ":
            continue
        head, _, text = line.partition(b";")
        prio, seq = head.split(b",")[:2]
        out.append((int(seq), prio, text))
    return out


def real_xids() -> list[tuple[bytes, bytes]]:
    """(prio, text) of the 98 Xid records of real-xid.kmsg: those its hand-written expectations
    list, so the set does not depend on the parser under test."""
    seqs = {item["seq"] for item in yaml.safe_load((KMSG / "real-xid.expect.yaml").read_text())["xids"]}
    found = [(prio, text) for seq, prio, text in fixture_records("real-xid.kmsg") if seq in seqs]
    if len(found) != len(seqs):
        raise BenchError(f"real-xid.kmsg: {len(found)} of the {len(seqs)} expected Xid records found")
    return found


def real_others() -> list[tuple[bytes, bytes]]:
    return [(prio, text) for _, prio, text in fixture_records("real-other.kmsg")]


def templates() -> list[tuple[bytes, int, bytes]]:
    """(prio, code, text with the bus id as {bus}) for each of CODES: the first real record of
    that code in the common form `NVRM: Xid (PCI:dddd:bb:dd): code, ...`."""
    out = []
    for code in CODES:
        pattern = re.compile(rb"^NVRM: Xid \(PCI:[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\): %d," % code)
        for prio, text in real_xids():
            if pattern.match(text):
                out.append((prio, code, re.sub(rb"\(PCI:[^)]*\)", b"(PCI:{bus})", text, count=1)))
                break
        else:
            raise BenchError(f"real-xid.kmsg has no Xid {code} in the form NVRM: Xid (PCI:...): {code},")
    return out


def mixed_stream(n: int) -> tuple[list[bytes], int]:
    """n raw records (no newline), seq 0..n-1: the real non-Xid records cycled, with every
    XID_EVERY-th one a real Xid record (cycled). Returns (records, Xids in them)."""
    others, xids = real_others(), real_xids()
    records = []
    o = x = 0
    for seq in range(n):
        if seq % XID_EVERY == XID_EVERY - 1:
            prio, text = xids[x % len(xids)]
            x += 1
        else:
            prio, text = others[o % len(others)]
            o += 1
        records.append(b"%s,%d,%d,-;%s" % (prio, seq, seq * USEC_PER_RECORD, text))
    return records, x


class Stream:
    """Records to append, seq contiguous from 0: the real non-Xid records cycled, and Xids
    rotated across the 8 GPUs and CODES. `expected` counts the Xids made, per series."""

    def __init__(self, others: list[tuple[bytes, bytes]], xid_templates: list[tuple[bytes, int, bytes]]) -> None:
        self.seq = 0
        self.xids = 0
        self.expected: Counter[tuple[str, int]] = Counter()  # (canonical bus id, code)
        self._others = others
        self._o = 0
        self._templates = xid_templates
        self._buses = list(GPUS)

    def _record(self, prio: bytes, text: bytes) -> bytes:
        raw = b"%s,%d,%d,-;%s\n" % (prio, self.seq, self.seq * USEC_PER_RECORD, text)
        self.seq += 1
        return raw

    def other(self) -> bytes:
        prio, text = self._others[self._o % len(self._others)]
        self._o += 1
        return self._record(prio, text)

    def xid(self) -> bytes:
        bus = self._buses[self.xids % len(self._buses)]
        prio, code, text = self._templates[(self.xids // len(self._buses)) % len(self._templates)]
        self.xids += 1
        self.expected[(bus + ".0", code)] += 1
        return self._record(prio, text.replace(b"{bus}", bus.encode()))

    def batch(self, n: int) -> bytes:
        """n records, every XID_EVERY-th seq an Xid."""
        return b"".join(self.xid() if self.seq % XID_EVERY == XID_EVERY - 1 else self.other()
                        for _ in range(n))


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
