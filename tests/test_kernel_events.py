"""SXids and kernel events from the Xid reader: real lines parse as expected, look-alikes count
nothing, multi-line events count once, counts survive restarts, odd devices stay bounded."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpunode_exporter.kmsg import Record, parse_record
from gpunode_exporter.xid import state as statefile
from gpunode_exporter.xid import sxid_catalog, tracker
from gpunode_exporter.xid.kernel import KINDS, KernelEvent, SXidEvent, event_in_record, parse_event
from tests.test_xid import Node

KMSG = Path(__file__).parent / "fixtures" / "kmsg"
FIXTURES = ("real-kernel-events", "real-xid", "real-other", "edge")


def _want(name: str) -> dict[str, Any]:
    return yaml.safe_load((KMSG / f"{name}.events.yaml").read_text())


def _item(seq: int, event: SXidEvent | KernelEvent) -> dict[str, Any]:
    if isinstance(event, SXidEvent):
        return {"seq": seq, "sxid": event.sxid, "switch": event.switch, "pci_bus_id": event.pci_bus_id,
                "severity": event.severity}
    return {"seq": seq, "kind": event.kind, "device": event.device}


@pytest.mark.parametrize("name", FIXTURES)
def test_fixture_records_parse_as_expected(name: str) -> None:
    """Every counted line gives the (kind, device) read off it by hand; every other line nothing."""
    got, malformed = [], 0
    for raw in (KMSG / f"{name}.kmsg").read_bytes().split(b"\n"):
        if not raw or raw.startswith(b" "):
            continue
        try:
            record = parse_record(raw)
        except ValueError:
            malformed += 1
            continue
        event = event_in_record(record)
        if event is not None:
            got.append(_item(record.seq, event))
    want = _want(name)
    assert malformed == want["malformed"]
    assert got == [{k: v for k, v in item.items() if k != "source"} for item in want["events"] or []]


def test_every_real_fixture_line_has_a_source() -> None:
    assert all(item.get("source") for item in _want("real-kernel-events")["events"])


@pytest.mark.parametrize("line", [
    "EXT4-fs (sda1): mounted filesystem with ordered data mode",
    "EXT4-fs (nvme0n1p5): re-mounted. Opts: errors=remount-ro. Quota mode: none.",
    "NMI watchdog: Enabled. Permanently consumes one hw-PMU counter.",
    "Call Trace:",
    " ? __schedule+0x2b8/0x7fc",
    "nvme nvme0: 63/0/0 default/read/poll queues",
    "mlx5_core 0004:01:00.0: firmware version: 16.27.2048",
    "nfs: server 7.247.192.16 OK and more",
])
def test_look_alikes_count_nothing(line: str) -> None:
    assert parse_event(line) is None


def test_user_space_cannot_fake_a_kernel_event() -> None:
    text = b"nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Fatal, Link 62 LTSSM Fault Up"
    assert event_in_record(Record(1, 3, 0, 0, text)) is None
    assert event_in_record(Record(0, 3, 0, 0, text)) == SXidEvent(0, "0000:05:00.0", 20034, "fatal")


def test_odd_device_is_that_record_alone() -> None:
    with pytest.raises(ValueError):
        parse_event("nfs: server " + "x" * 300 + " not responding, still trying")
    with pytest.raises(ValueError):
        parse_event("EXT4-fs (Sda/../1): Remounting filesystem read-only")


def test_sxid_severity_from_the_line_then_the_catalog() -> None:
    catalog = sxid_catalog.load()
    assert catalog[11004][2] == "nonfatal" and catalog[20034][2] == "fatal" and catalog[23001][1] == "always_fatal"
    assert sxid_catalog.severity(20034, "nonfatal") == "nonfatal"
    assert sxid_catalog.severity(20034, None) == "fatal"
    assert sxid_catalog.severity(10002, None) == sxid_catalog.UNKNOWN  # "Other notable": no class
    assert sxid_catalog.severity(99999, None) == sxid_catalog.UNKNOWN


# --- counting through the tracker -------------------------------------------------------------


def _copy(node: Node, name: str) -> None:
    node.kmsg.write_bytes((KMSG / f"{name}.kmsg").read_bytes())


def _kernel(t: tracker.XidTracker) -> Counter[tuple[str, str]]:
    return Counter({(kind, device): n for kind, device, n, _ in t.snapshot().kernel})


def _expected_kernel(name: str) -> Counter[tuple[str, str]]:
    return Counter((item["kind"], item["device"]) for item in _want(name)["events"] if "kind" in item)


def test_tracker_counts_each_event_once(tmp_path: Path) -> None:
    node = Node(tmp_path)
    _copy(node, "real-kernel-events")
    t = node.tracker()
    try:
        snap = t.snapshot()
    finally:
        t.close()
    assert _kernel(t) == _expected_kernel("real-kernel-events")
    sxids = {(sw, bus, code, sev): n for sw, bus, code, sev, n, _ in snap.sxids}
    assert sxids == {(1, "0000:00:08.0", 11004, "nonfatal"): 1, (2, "0000:00:09.0", 11004, "nonfatal"): 1,
                     (0, "0000:00:07.0", 11004, "nonfatal"): 1, (3, "0000:00:0a.0", 11004, "nonfatal"): 1}
    # an OOM report's many lines, a hung task's hints, an AER error's details, an mlx5 health
    # report's print_health_info lines, a command timeout's lines before and after: once each
    assert _kernel(t)[("oom_kill", "")] == 1 and _kernel(t)[("hung_task", "")] == 4
    assert _kernel(t)[("nic_fw_error", "0000:0d:00.0")] == 1 and _kernel(t)[("nic_cmd_timeout", "0000:56:00.0")] == 1
    assert snap.nfs_servers == {"fs.tcblab": 0, "7.247.192.16": 1}
    assert snap.records_malformed == 0


def test_restart_counts_nothing_twice(tmp_path: Path) -> None:
    node = Node(tmp_path)
    _copy(node, "real-kernel-events")
    first = node.tracker()
    first_counts = _kernel(first)
    first.close()
    node.seq = 3000
    node.log("nfs: server fs.tcblab OK", prio=5)  # logged while the exporter was down
    second = node.tracker()
    try:
        got = _kernel(second)
        assert second.snapshot().nfs_servers["fs.tcblab"] == 1
    finally:
        second.close()
    assert got == first_counts + Counter({("nfs_ok", "fs.tcblab"): 1})


def test_old_state_file_still_loads(tmp_path: Path) -> None:
    old = {"version": 1, "boot_id": "b", "source": "kmsg", "kmsg_seq": 7, "records_lost": 0, "gpus": {},
           "xids": [{"pci_bus_id": "0000:1b:00.0", "xid": 79, "count": 2, "last": 1.5e9}], "recovery": {}}
    path = tmp_path / statefile.FILE_NAME
    path.write_text(json.dumps(old))
    state, problem = statefile.load(path, "b")
    assert problem is None and state.kmsg_seq == 7 and not state.kernel and not state.sxids
    state.kernel[("oom_kill", "")] = statefile.Count(3, 1.6e9)
    state.nfs_servers["nfs1"] = 0
    statefile.save(path, state)
    again, problem = statefile.load(path, "b")
    assert problem is None and again == state


def test_flood_of_odd_devices_stays_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tracker, "MAX_KEYS", 50)
    node = Node(tmp_path)
    node.log(*[f"nfs: server srv{i} not responding, still trying" for i in range(200)], prio=5)
    t = node.tracker()
    try:
        snap = t.snapshot()
    finally:
        t.close()
    assert len(snap.kernel) == 50 and len(snap.nfs_servers) == 50
    assert snap.records_malformed == 150  # the series refused, counted where a reader sees them


def test_kinds_are_the_public_list() -> None:
    assert len(KINDS) == len(set(KINDS)) == 34


def test_every_kind_has_a_real_line() -> None:
    real = ("real-kernel-events", "real-xid", "real-other")
    kinds = {item["kind"] for name in real for item in _want(name)["events"] if "kind" in item}
    assert kinds == set(KINDS)
