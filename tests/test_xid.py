"""Xid events: parsing the driver's lines, counting them exactly (restarts, reboots, gaps), NVML events."""

from __future__ import annotations

import json
import shutil
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpunode_exporter.kmsg import parse_record
from gpunode_exporter.nvml import Session
from gpunode_exporter.xid.gpus import GpuDirectory
from gpunode_exporter.xid.parse import XidEvent, parse_xid, xid_in_record
from gpunode_exporter.xid.state import FILE_NAME
from gpunode_exporter.xid.tracker import XidTracker
from tests.helpers import simulated_nvml

FIXTURES = Path(__file__).parent / "fixtures"
DGX = FIXTURES / "sysfs" / "dgx-h100"
H100 = Path(__file__).parent.parent / "exporter" / "nvmlsim" / "scenarios" / "healthy-h100.yaml"


@pytest.mark.parametrize(("line", "want"), [
    ("NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.",
     XidEvent(79, "0000:3b:00", 1234, "python", message="GPU has fallen off the bus.")),
    ("NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus.",
     XidEvent(79, "0000:2b:00", message="GPU has fallen off the bus.")),
    ("NVRM: Xid (PCI:0000:18:00): 94, pid='<unknown>', name=<unknown>, Contained: SM (0x1). RST: No, D-RST: No",
     XidEvent(94, "0000:18:00", message="Contained: SM (0x1). RST: No, D-RST: No")),
    ("NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper: New row marked for remapping, reset gpu to activate.",
     XidEvent(63, "0000:10:1c", 1896,
              message="Row Remapper: New row marked for remapping, reset gpu to activate.")),
    ("NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)",
     XidEvent(154, "0000:01:00", recovery_action=2,
              message="GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)")),
    ("NVRM: Xid (PCI:0000:3b:00 GPU-I:01 GPU-CI:00): 43, pid=77, name=python3, Ch 00000008",
     XidEvent(43, "0000:3b:00", 77, "python3", 1, 0, message="Ch 00000008")),
    ("NVRM: Xid (0000:01:00): 13, 0001 00000000 0000a0c0 00000d80 00000000 00000000",
     XidEvent(13, "0000:01:00", message="0001 00000000 0000a0c0 00000d80 00000000 00000000")),
    ("NVRM: Xid (PCI:10000:3b:00): 48, DBE", XidEvent(48, "10000:3b:00", message="DBE")),
])
def test_parse_forms(line: str, want: XidEvent) -> None:
    assert parse_xid(line) == want


@pytest.mark.parametrize("line", [
    "NVRM: GPU at PCI:0000:3b:00: GPU-1b0f3c9e-0000-0000-0000-000000000000",
    "NVRM: Xid without parentheses 79",
    "usb 1-1: new high-speed USB device",
    "",
])
def test_parse_not_an_xid(line: str) -> None:
    assert parse_xid(line) is None


_KMSG_FIXTURES = ("real-xid", "real-other", "edge")


def _expectations(name: str) -> dict[str, Any]:
    return yaml.safe_load((FIXTURES / "kmsg" / f"{name}.expect.yaml").read_text())


def _lines(name: str) -> list[bytes]:
    """The records of a fixture as a file reader yields them: no empty or dictionary lines."""
    return [line for line in (FIXTURES / "kmsg" / f"{name}.kmsg").read_bytes().split(b"\n")
            if line and not line.startswith(b" ")]


@pytest.mark.parametrize("name", _KMSG_FIXTURES)
def test_fixture_records_parse_as_expected(name: str) -> None:
    """Real drivers' lines (and the edge cases), against expectations written by reading them."""
    want = _expectations(name)
    got, malformed = [], 0
    for raw in _lines(name):
        try:
            record = parse_record(raw)
        except ValueError:
            malformed += 1
            continue
        event = xid_in_record(record)
        if event is not None:
            got.append({"seq": record.seq, "xid": event.xid, "pci_bus_id": event.pci_bus_id, "pid": event.pid,
                        "name": event.name, "gpu_instance": event.gpu_instance,
                        "compute_instance": event.compute_instance, "recovery_action": event.recovery_action})
    expected = [{k: v for k, v in item.items() if k != "source"} for item in want["xids"] or []]
    assert malformed == want["malformed"]
    assert got == expected


@pytest.mark.parametrize("name", _KMSG_FIXTURES)
def test_fixture_counted_by_the_tracker(name: str, tmp_path: Path) -> None:
    """The same files through the reader and tracker: per code, as many Xids as expected."""
    want = _expectations(name)
    node = Node(tmp_path)
    shutil.copy(FIXTURES / "kmsg" / f"{name}.kmsg", node.kmsg)
    t = node.tracker()
    try:
        snap = t.snapshot()
    finally:
        t.close()
    by_code = Counter(item["xid"] for item in want["xids"] or [])
    got = Counter()
    for _, _, xid, n, _ in snap.counts:
        got[xid] += n
    assert got == by_code
    assert snap.records_malformed == want["malformed"]


# --- counting -------------------------------------------------------------------


class Node:
    """A node's kernel log (a file in /dev/kmsg format), boot id and state directory."""

    def __init__(self, root: Path) -> None:
        self.procfs = root / "proc"
        (self.procfs / "sys" / "kernel" / "random").mkdir(parents=True)
        self.boot("boot-1")
        self.kmsg = root / "kmsg"
        self.kmsg.write_bytes(b"")
        self.state_dir = root / "state"
        self.seq = 0

    def boot(self, boot_id: str) -> None:
        (self.procfs / "sys" / "kernel" / "random" / "boot_id").write_text(boot_id + "\n")

    def log(self, *texts: str, prio: int = 3, skip: int = 0) -> None:
        """Append records; skip: sequence numbers left out before them (overwritten records)."""
        self.seq += skip
        with self.kmsg.open("a") as f:
            for text in texts:
                f.write(f"{prio},{self.seq},{self.seq * 1000},-;{text}\n")
                self.seq += 1

    def xid(self, code: int, bus: str = "0000:1b:00", **kw: Any) -> None:
        self.log(f"NVRM: Xid (PCI:{bus}): {code}, pid=1, name=python, test", **kw)

    def reboot(self, boot_id: str) -> None:
        self.boot(boot_id)
        self.kmsg.write_bytes(b"")
        self.seq = 0

    def tracker(self, persist: bool = True, kmsg: Path | None = None) -> XidTracker:
        session = Session()
        t = XidTracker(kmsg or self.kmsg, self.state_dir, persist, self.procfs,
                       GpuDirectory(session, DGX, self.procfs), session)
        t.start()
        assert t.caught_up.wait(5)
        return t


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path)


def counts(t: XidTracker) -> dict[tuple[str, int], int]:
    return {(bus, xid): n for bus, _, xid, n, _ in t.snapshot().counts}


def wait_for(t: XidTracker, want: dict[tuple[str, int], int], seconds: float = 15) -> None:
    deadline = time.monotonic() + seconds
    while counts(t) != want and time.monotonic() < deadline:
        time.sleep(0.01)
    assert counts(t) == want


@pytest.fixture
def trackers() -> Iterator[list[XidTracker]]:
    made: list[XidTracker] = []
    yield made
    for t in made:
        t.close()


def test_counts_as_logged_and_followed(node: Node, trackers: list[XidTracker]) -> None:
    node.log("Linux version 6.8.0", prio=5)
    node.xid(79)
    node.xid(94, bus="0000:43:00")
    trackers.append(t := node.tracker())
    assert counts(t) == {("0000:1b:00.0", 79): 1, ("0000:43:00.0", 94): 1}
    node.xid(94, bus="0000:43:00")
    wait_for(t, {("0000:1b:00.0", 79): 1, ("0000:43:00.0", 94): 2})
    snap = t.snapshot()
    assert snap.source == "kmsg" and snap.records_lost == 0
    # Without NVML the index is the GPU's place in bus order (sysfs fixture: 1b is GPU 0, 43 GPU 1).
    assert {bus: ids for bus, ids, *_ in snap.counts} == {"0000:1b:00.0": ("0", ""), "0000:43:00.0": ("1", "")}


def test_user_space_cannot_fake_an_xid(node: Node, trackers: list[XidTracker]) -> None:
    node.log("NVRM: Xid (PCI:0000:1b:00): 79, GPU has fallen off the bus.", prio=12)  # user.warning
    trackers.append(t := node.tracker())
    assert counts(t) == {}


def test_uuid_from_the_driver_when_nvml_is_unavailable(node: Node, trackers: list[XidTracker]) -> None:
    info = node.procfs / "driver" / "nvidia" / "gpus" / "0000:1b:00.0"
    info.mkdir(parents=True)
    info.joinpath("information").write_text(
        "Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 510\n"
        "GPU UUID: \t GPU-3f4e0c1a-9a1b-4c2d-8e3f-5a6b7c8d9e0f\nBus Location: \t 0000:1b:00.0\n")
    node.xid(79)
    trackers.append(t := node.tracker())
    assert t.snapshot().counts[0][1] == ("0", "GPU-3f4e0c1a-9a1b-4c2d-8e3f-5a6b7c8d9e0f")


def test_identity_from_nvml_fixed_when_first_seen(node: Node, trackers: list[XidTracker]) -> None:
    node.xid(79, bus="0000:43:00")
    with simulated_nvml(H100):
        trackers.append(t := node.tracker())
        ids = t.snapshot().counts[0][1]
    assert ids[0] == "1" and ids[1].startswith("GPU-")
    node.xid(79, bus="0000:43:00")  # NVML gone now: the series keeps its labels
    wait_for(t, {("0000:43:00.0", 79): 2})
    assert t.snapshot().counts[0][1] == ids


def test_unmappable_bus_keeps_its_id(node: Node, trackers: list[XidTracker]) -> None:
    node.xid(31, bus="0000:ee:00")
    trackers.append(t := node.tracker())
    assert t.snapshot().counts[0][:3] == ("0000:ee:00.0", ("", ""), 31)


def test_gap_in_sequence_counted_as_lost(node: Node, trackers: list[XidTracker]) -> None:
    node.xid(79)
    node.xid(79, skip=250)  # the kernel overwrote 250 records the reader never saw
    trackers.append(t := node.tracker())
    assert t.snapshot().records_lost == 250
    assert counts(t) == {("0000:1b:00.0", 79): 2}


def test_buffer_wrapped_before_first_read_counted_as_lost(node: Node, trackers: list[XidTracker]) -> None:
    node.xid(79, skip=1000)
    trackers.append(t := node.tracker())
    assert t.snapshot().records_lost == 1000


def test_restart_continues_without_recounting(node: Node, trackers: list[XidTracker]) -> None:
    node.xid(79)
    node.xid(94)
    first = node.tracker()
    first.close()
    node.xid(94)  # logged while the exporter was down
    trackers.append(second := node.tracker())
    assert counts(second) == {("0000:1b:00.0", 79): 1, ("0000:1b:00.0", 94): 2}
    assert second.snapshot().records_lost == 0


def test_crash_before_save_recounts_nothing_twice(node: Node, trackers: list[XidTracker]) -> None:
    node.xid(79)
    first = node.tracker()
    first.close()  # saved: seq 0 handled
    crashed = node.tracker()
    crashed._path = None  # type: ignore[attr-defined]  # from here it saves nothing, like a crash
    node.xid(79)
    wait_for(crashed, {("0000:1b:00.0", 79): 2})
    crashed._stop.set()  # type: ignore[attr-defined]
    crashed._lock_file.close()  # type: ignore[attr-defined]  # the process died: its lock is gone
    trackers.append(third := node.tracker())
    assert counts(third) == {("0000:1b:00.0", 79): 2}


def test_records_overwritten_while_down_are_lost(node: Node, trackers: list[XidTracker]) -> None:
    node.xid(79)
    node.tracker().close()
    node.kmsg.write_bytes(b"")  # the ring buffer moved on while the exporter was down
    node.xid(94, skip=40)
    trackers.append(t := node.tracker())
    assert t.snapshot().records_lost == 40
    assert counts(t) == {("0000:1b:00.0", 79): 1, ("0000:1b:00.0", 94): 1}


def test_reboot_counts_the_new_log_from_its_start(node: Node) -> None:
    node.xid(79)
    node.xid(79)
    node.tracker().close()
    node.reboot("boot-2")
    node.xid(94)  # logged before the exporter started in the new boot
    t = node.tracker()
    assert counts(t) == {("0000:1b:00.0", 94): 1}
    t.close()  # saves
    state = json.loads((node.state_dir / FILE_NAME).read_text())
    assert state["boot_id"] == "boot-2" and state["xids"] == [
        {"pci_bus_id": "0000:1b:00.0", "xid": 94, "count": 1, "last": state["xids"][0]["last"]}]


@pytest.mark.parametrize("content", [b"{not json", b'{"version": 1}', b"\xff\xfe", b'{"version": 99}',
                                     b'{"version":1,"boot_id":"boot-1","source":"kmsg","kmsg_seq":-5,'
                                     b'"records_lost":0,"gpus":{},"xids":[],"recovery":{}}'])
def test_corrupt_state_reported_and_replaced(node: Node, trackers: list[XidTracker], content: bytes) -> None:
    node.state_dir.mkdir()
    (node.state_dir / FILE_NAME).write_bytes(content)
    node.xid(79)
    trackers.append(t := node.tracker())
    assert counts(t) == {("0000:1b:00.0", 79): 1}
    assert t.snapshot().state_errors == {"load": 1}
    t.close()
    assert json.loads((node.state_dir / FILE_NAME).read_text())["kmsg_seq"] == 0


def test_unwritable_state_dir_reported_not_fatal(node: Node, trackers: list[XidTracker]) -> None:
    node.state_dir.write_text("a file where the directory should be")
    node.xid(79)
    trackers.append(t := node.tracker())
    assert counts(t) == {("0000:1b:00.0", 79): 1}
    assert t.snapshot().state_errors.get("lock") == 1


def test_second_exporter_on_the_same_state_does_not_write(node: Node, trackers: list[XidTracker]) -> None:
    trackers.append(node.tracker())
    trackers.append(second := node.tracker())
    assert second.snapshot().state_errors == {"lock": 1}


def test_dump_reads_state_but_never_writes(node: Node, trackers: list[XidTracker]) -> None:
    node.xid(79)
    trackers.append(t := node.tracker(persist=False))
    assert counts(t) == {("0000:1b:00.0", 79): 1}
    t.close()
    assert not (node.state_dir / FILE_NAME).exists()


def test_recovery_action_from_xid_154(node: Node, trackers: list[XidTracker]) -> None:
    node.log("NVRM: Xid (PCI:0000:43:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 "
             "(GPU Reset Required)")
    trackers.append(t := node.tracker())
    assert t.snapshot().recovery == {"0000:43:00.0": 1}
    node.log("NVRM: Xid (PCI:0000:43:00): 154, GPU recovery action changed from 0x1 (GPU Reset Required) "
             "to 0x0 (None)")
    deadline = time.monotonic() + 15
    while t.snapshot().recovery != {"0000:43:00.0": 0} and time.monotonic() < deadline:
        time.sleep(0.01)
    assert t.snapshot().recovery == {"0000:43:00.0": 0}


def test_garbage_and_other_subsystems_do_not_disturb(node: Node, trackers: list[XidTracker]) -> None:
    with node.kmsg.open("ab") as f:
        f.write(bytes(range(256)).replace(b"\n", b"") + b"\n")
        f.write(b"no header at all\n")
    node.log(*[f"mlx5_core 0000:0{i % 10}:00.0: link up" for i in range(500)], prio=6)
    node.xid(79)
    trackers.append(t := node.tracker())
    snap = t.snapshot()
    assert counts(t) == {("0000:1b:00.0", 79): 1}
    assert snap.records_malformed == 2 and snap.records_lost == 0


# --- NVML events ------------------------------------------------------------------

_EVENTS = {"gpus": [
    {"uuid": "GPU-00000000-0000-0000-0000-000000000001", "pci_bus_id": "00000000:1B:00.0",
     "xids": [{"at": 0, "xid": 79}]},
    {"uuid": "GPU-00000000-0000-0000-0000-000000000002", "pci_bus_id": "00000000:43:00.0",
     "xids": [{"at": 0, "xid": 94}, {"at": 0, "xid": 94}], "recovery_actions": [{"at": 0, "action": 2}]},
]}


def test_nvml_events_when_kmsg_unreadable(node: Node, trackers: list[XidTracker]) -> None:
    with simulated_nvml(_EVENTS):
        trackers.append(t := node.tracker(kmsg=node.kmsg.parent / "no-such-kmsg"))
        wait_for(t, {("0000:1b:00.0", 79): 1, ("0000:43:00.0", 94): 2})
        deadline = time.monotonic() + 15
        while t.snapshot().recovery != {"0000:43:00.0": 2} and time.monotonic() < deadline:
            time.sleep(0.01)
        snap = t.snapshot()
        t.close()
    assert snap.source == "nvml" and snap.recovery == {"0000:43:00.0": 2}
    assert {bus: ids for bus, ids, *_ in snap.counts}["0000:1b:00.0"] == (
        "0", "GPU-00000000-0000-0000-0000-000000000001")


def test_both_sources_count_each_xid_once(node: Node, trackers: list[XidTracker]) -> None:
    node.xid(79)  # the same Xid the simulated driver delivers as an event
    with simulated_nvml(_EVENTS):
        trackers.append(t := node.tracker())
        time.sleep(0.5)
        assert t.snapshot().source == "kmsg"
        assert counts(t) == {("0000:1b:00.0", 79): 1}
        t.close()


def test_kmsg_after_nvml_counted_only_from_now(node: Node, trackers: list[XidTracker]) -> None:
    """A state counted from NVML events has no log position: the log is read from its end, so the
    Xids NVML already counted are not counted again from the ring buffer."""
    node.xid(79)
    with simulated_nvml(_EVENTS):
        first = node.tracker(kmsg=node.kmsg.parent / "no-such-kmsg")
        wait_for(first, {("0000:1b:00.0", 79): 1, ("0000:43:00.0", 94): 2})
        first.close()
    trackers.append(t := node.tracker())
    assert counts(t) == {("0000:1b:00.0", 79): 1, ("0000:43:00.0", 94): 2}
    node.xid(79)
    wait_for(t, {("0000:1b:00.0", 79): 2, ("0000:43:00.0", 94): 2})
    assert t.snapshot().source == "kmsg" and t.snapshot().records_lost == 0


def test_back_to_kmsg_after_an_nvml_spell_skips_what_nvml_counted(node: Node, trackers: list[XidTracker]) -> None:
    """kmsg, then NVML (the log unreadable for a while), then kmsg again: the records logged during
    the NVML spell were counted from NVML events; reading on from the old position would count them twice."""
    node.xid(79)
    node.tracker().close()  # position saved: seq 0
    with simulated_nvml(_EVENTS):
        spell = node.tracker(kmsg=node.kmsg.parent / "no-such-kmsg")
        wait_for(spell, {("0000:1b:00.0", 79): 2, ("0000:43:00.0", 94): 2})
        node.xid(79)  # the kernel logged the Xid NVML just delivered
        spell.close()
    trackers.append(t := node.tracker())
    assert counts(t) == {("0000:1b:00.0", 79): 2, ("0000:43:00.0", 94): 2}
    node.xid(94, bus="0000:43:00")
    wait_for(t, {("0000:1b:00.0", 79): 2, ("0000:43:00.0", 94): 3})
    assert t.snapshot().records_lost == 0
