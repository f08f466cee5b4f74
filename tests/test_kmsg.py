"""The kernel log reader: record format, escapes, dictionaries, files followed as they grow, the real device."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpunode_exporter.kmsg import MAX_LINE, KmsgReader, parse_record, unescape


def test_record_fields() -> None:
    r = parse_record(b"4,1017,5437771269,-;NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.\n")
    assert (r.facility, r.level, r.seq, r.usec) == (0, 4, 1017, 5437771269)
    assert r.text == b"NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus."


def test_record_with_extra_header_fields_and_dictionary() -> None:
    # Newer kernels append ",caller=..." style fields; the dictionary follows the text.
    r = parse_record(b"3,7,8,-,caller=T1;text here\n SUBSYSTEM=pci\n DEVICE=+pci:0000:3b:00.0\n")
    assert (r.seq, r.text) == (7, b"text here")


def test_user_space_record_has_user_facility() -> None:
    assert parse_record(b"14,9,10,-;hi").facility == 1  # prio 14 = user.info


@pytest.mark.parametrize("raw", [b"garbage", b"3,x,10,-;t", b"3,4;t", b"", b"\xff\xfe;\x00", b"3, 4,5,-;t"])
def test_malformed_records_raise(raw: bytes) -> None:
    with pytest.raises(ValueError):
        parse_record(raw)


def test_unescape() -> None:
    assert unescape(rb"a\x0ab\x5cc") == "a\nb\\c"
    assert unescape(b"caf\xc3\xa9 \xff") == "caf\u00e9 \ufffd"


def test_file_followed_as_it_grows(tmp_path: Path) -> None:
    log = tmp_path / "kmsg"
    log.write_bytes(b"6,1,1,-;one\n SUBSYSTEM=x\n6,2,2,-;tw")
    reader = KmsgReader(log)
    assert reader.read() == [b"6,1,1,-;one"]  # the dictionary line is not a record; "tw" is incomplete
    with log.open("ab") as f:
        f.write(b"o\n\n6,3,3,-;three\n")
    assert reader.read() == [b"6,2,2,-;two", b"6,3,3,-;three"]
    assert reader.read() == []
    reader.close()


def test_overlong_line_skipped_and_counted(tmp_path: Path) -> None:
    log = tmp_path / "kmsg"
    log.write_bytes(b"6,1,1,-;" + b"x" * (3 * MAX_LINE) + b"\n6,2,2,-;after\n")
    reader = KmsgReader(log)
    records: list[bytes] = []
    for _ in range(10):
        records += reader.read()
    assert records == [b"6,2,2,-;after"]
    assert reader.overlong == 1
    reader.close()


def test_truncated_file_read_again(tmp_path: Path) -> None:
    log = tmp_path / "kmsg"
    log.write_bytes(b"6,1,1,-;one\n6,2,2,-;two\n")
    reader = KmsgReader(log)
    assert len(reader.read()) == 2
    log.write_bytes(b"6,3,3,-;x\n")
    assert reader.read() == [b"6,3,3,-;x"]
    reader.close()


def test_fifo(tmp_path: Path) -> None:
    fifo = tmp_path / "kmsg"
    os.mkfifo(fifo)
    reader = KmsgReader(fifo)  # non-blocking open: no writer needed yet
    writer = os.open(fifo, os.O_WRONLY)
    os.write(writer, b"6,1,1,-;one\n")
    deadline = time.monotonic() + 10
    got: list[bytes] = []
    while not got and time.monotonic() < deadline:
        got = reader.read()
        reader.wait(0.05)
    assert got == [b"6,1,1,-;one"]
    os.close(writer)
    reader.close()


def test_missing_path_raises(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        KmsgReader(tmp_path / "nope")


@pytest.mark.skipif(not os.access("/dev/kmsg", os.R_OK), reason="/dev/kmsg not readable here")
def test_real_dev_kmsg() -> None:
    """The kernel's own device: one record per read, sequence numbers increasing, and a record
    written now (a harmless marker, not an Xid) read back."""
    reader = KmsgReader(Path("/dev/kmsg"))
    assert reader.is_device
    records = [parse_record(raw) for raw in reader.read(max_records=100000)]
    seqs = [r.seq for r in records]
    assert seqs and seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    if not os.access("/dev/kmsg", os.W_OK):
        reader.close()
        return
    marker = f"gpunode-exporter test marker {uuid.uuid4()}"
    with open("/dev/kmsg", "w") as kmsg:
        kmsg.write(f"<14>{marker}\n")  # user.info
    found = None
    deadline = time.monotonic() + 10
    while found is None and time.monotonic() < deadline:
        reader.wait(0.2)
        for raw in reader.read():
            r = parse_record(raw)
            if marker.encode() in r.text:
                found = r
    reader.close()
    if found is None:
        pytest.skip("the kernel dropped the marker (printk_devkmsg rate limit)")
    assert found.facility == 1 and found.seq > seqs[-1]


@pytest.fixture
def unlimited_devkmsg() -> Iterator[None]:
    """Lift the kernel's rate limit on writes to /dev/kmsg for the test, then restore it."""
    knob = Path("/proc/sys/kernel/printk_devkmsg")
    try:
        before = knob.read_text().strip()
        knob.write_text("on\n")
    except OSError:
        pytest.skip("cannot set kernel.printk_devkmsg here (not root, or read-only /proc)")
    try:
        yield
    finally:
        knob.write_text(before + "\n")


@pytest.mark.skipif(not os.access("/dev/kmsg", os.R_OK | os.W_OK), reason="/dev/kmsg not usable here")
def test_real_ring_buffer_overrun_shows_as_a_seq_gap(unlimited_devkmsg: None) -> None:
    """The real kernel: a reader that falls behind gets EPIPE and resumes at the oldest record;
    the jump in seq is what the tracker counts as lost. Writes user-facility records (never
    Xids) until the ring buffer has wrapped past the reader."""
    reader = KmsgReader(Path("/dev/kmsg"))
    last = max(parse_record(raw).seq for raw in reader.read(max_records=1_000_000))
    tag = uuid.uuid4().hex
    written = 0
    with open("/dev/kmsg", "w") as kmsg:
        # ~200 B per record; 20 MiB is past any default ring buffer (log_buf_len up to 16 MiB here)
        while written < 100_000:
            kmsg.write(f"<14>gpunode-exporter overrun test {tag} {written:06d} " + "x" * 120 + "\n")
            kmsg.flush()
            written += 1
            if written % 5000 == 0 and _oldest_seq() > last + 1:
                break
    records = [parse_record(raw) for raw in reader.read(max_records=1_000_000)]
    reader.close()
    assert records, "nothing read after the overrun"
    gap = records[0].seq - last - 1
    assert gap > 0, "the reader did not fall behind: no EPIPE, no gap"
    seen = sum(tag.encode() in r.text for r in records)
    assert seen < written and gap >= written - seen  # every record not seen is in the gap


def _oldest_seq() -> int:
    """The seq of the oldest record the kernel still holds (a fresh reader starts there)."""
    fresh = KmsgReader(Path("/dev/kmsg"))
    try:
        return parse_record(fresh.read(max_records=1)[0]).seq
    finally:
        fresh.close()
