"""End to end: the exporter served from a node where everything is wrong at once.

A corrupt Xid state with planted symlinks beside it, a process named in bytes that are not
UTF-8 and one whose stat has a 400-digit number, a mount with a negative 30-digit time and
one with Arabic-Indic digits, an RDMA device whose name is not UTF-8 and counters no
kernel prints, kernel records with numbers no kernel prints. The exporter must start,
every collector must report success, and every series of the same node without the
hostile parts must be there with the same value.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from tests.helpers import Series, free_port, parse_exposition, wait_for_port

ROOT = Path(__file__).parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
COLLECTORS = ("xid", "gpu", "gpu_processes", "nfs", "storage_network")
BAD_MOUNT = "/storage/test"
# Differ from run to run, or count the hostile parts themselves.
VOLATILE = ("gpunode_scrape_collector_duration_seconds", "gpunode_exporter_build_info",
            "gpunode_nfs_parse_errors_total", "gpunode_kmsg_records_malformed_total",
            "gpunode_kmsg_records_read_total", "gpunode_kmsg_records_lost_total", "gpunode_xid_state_errors_total",
            "gpunode_xid_last_event_timestamp_seconds", "gpunode_sxid_last_event_timestamp_seconds",
            "gpunode_kernel_event_last_timestamp_seconds", "gpunode_gpu_process_parse_errors_total",
            "gpunode_storage_network_parse_errors_total",
            "gpunode_gpu_process_checks_pending")  # a process whose stat is unreadable stays unchecked


def _node(root: Path, hostile: bool) -> list[str]:
    """Build a node's trees under root; the exporter's flags for it."""
    procfs, sysfs, state = root / "proc", root / "sys", root / "state"
    shutil.copytree(FIXTURES / "procfs" / "datapath", procfs, symlinks=True)
    (procfs / "sys" / "kernel" / "random").mkdir(parents=True)
    (procfs / "sys" / "kernel" / "random" / "boot_id").write_text("5e1f0d6c-boot\n")
    stats = (FIXTURES / "procfs" / "real" / "self" / "mountstats").read_text()
    shutil.copytree(FIXTURES / "sysfs" / "dgx-h100", sysfs, symlinks=True)
    kmsg = (FIXTURES / "kmsg" / "real-xid.kmsg").read_text()
    state.mkdir()
    if hostile:
        head, sep, tail = stats.partition(f"mounted on {BAD_MOUNT} ")
        tail = tail.replace("READ: ", "READ: 1 1 0 1 1 -100000000000000000000000000000 1 1 0\n\t\tX: ", 1)
        stats = head + sep + tail
        stats += ("device srv:/arabic mounted on /arabic with fstype nfs statvers=1.1\n\topts:\trw\n"
                  "\txprt:\ttcp 1 0 1 0 0 5 5 0 5 0 1 0 5\n\tper-op statistics\n"
                  "\t        READ: 1 1 0 1 1 \u0661\u0662 1 1 0\n")
        # Processes: a name that is not UTF-8 (any user can set one), a stat with a 400-digit field.
        for pid, stat in ((3200, b"3200 (\xff\xfe) (x) S 1" + b" 0" * 17 + b" 98765 0 0\n"),
                          (3201, b"3201 (big) S 1" + b" 0" * 17 + b" " + b"9" * 400 + b" 0 0\n")):
            (procfs / str(pid) / "fd").mkdir(parents=True)
            (procfs / str(pid) / "stat").write_bytes(stat)
        # RDMA: a device named in bytes that are not UTF-8; counters no kernel prints on a good one.
        bad = os.fsencode(sysfs / "class" / "infiniband") + b"/mlx5_\xff"
        os.makedirs(bad + b"/ports/1/hw_counters")
        Path(os.fsdecode(bad + b"/ports/1/link_layer")).write_text("Ethernet\n")
        for name, value in (("np_cnp_sent", "7"), ("rp_cnp_handled", "+7"), ("rp_cnp_ignored", "1_000"),
                            ("out_of_sequence", "-5"), ("out_of_buffer", "\u0667")):
            Path(os.fsdecode(bad + b"/ports/1/hw_counters/" + name.encode())).write_text(value + "\n")
        # Kernel records with numbers no kernel prints, after the real ones.
        seq = int(kmsg.splitlines()[-1].split(",")[1]) + 1
        for record in (f"4,{seq},{'9' * 400},-;NVRM: Xid (PCI:0000:1b:00): 79, GPU has fallen off the bus.",
                       f"4,{seq + 1},1000,-;NVRM: Xid (PCI:0000:1b:00): {'7' * 5000}, x",
                       f"4,{seq + 2},1000,-;NVRM: Xid (PCI:0000:1b:00): \u0667\u0669, pid=1, name=x, y",
                       f"+4,{seq + 3},1000,-;NVRM: Xid (PCI:0000:1b:00): 79, x"):
            kmsg += record + "\n"
        # The state: a 400-digit time, a planted temporary-file symlink, a dangling lock symlink.
        (state / "xid-state.json").write_text(json.dumps({
            "version": 1, "boot_id": "5e1f0d6c-boot", "source": "kmsg", "kmsg_seq": 2, "records_lost": 0,
            "gpus": {}, "xids": [{"pci_bus_id": "0000:1b:00.0", "xid": 79, "count": 1, "last": int("9" * 400)}],
            "recovery": {}}))
        (root / "victim").write_text("precious\n")
        (state / ".xid-state.json.tmp").symlink_to(root / "victim")
        (state / "xid-state.lock").symlink_to(root / "created-anywhere")
    (procfs / "4242" / "mountstats").write_text(stats)
    (root / "kmsg").write_text(kmsg)
    config = root / "config.yaml"
    config.write_text("storage:\n  interfaces: [enp64s0np0]\n")
    return ["--collector.disable-defaults", *(f"--collector.{c}" for c in COLLECTORS),
            "--path.procfs", str(procfs), "--path.sysfs", str(sysfs), "--path.kmsg", str(root / "kmsg"),
            "--path.state", str(state), "--config.file", str(config),
            "--nvml.simulate", "exporter/nvmlsim/scenarios/healthy-h100.yaml"]


def _stable(series: Series) -> Series:
    return {name: {labels: v for labels, v in values.items() if ("mountpoint", BAD_MOUNT) not in labels}
            for name, values in series.items() if name not in VOLATILE}


@pytest.fixture(scope="module")
def scrapes(tmp_path_factory: pytest.TempPathFactory) -> tuple[Series, str, Path]:
    clean = tmp_path_factory.mktemp("clean")
    out = subprocess.run([sys.executable, "-m", "gpunode_exporter", "dump", *_node(clean, hostile=False)],
                         capture_output=True, text=True, cwd=ROOT, timeout=60, check=True)
    root = tmp_path_factory.mktemp("hostile")
    flags = _node(root, hostile=True)
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "gpunode_exporter", *flags,
                             "--web.listen-address", f"127.0.0.1:{port}"],
                            cwd=ROOT, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_port(port, alive=lambda: proc.poll() is None)
        text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=20).text
    finally:
        proc.terminate()
        proc.wait(10)
    assert proc.stderr is not None and "Traceback" not in proc.stderr.read()
    return parse_exposition(out.stdout), text, root


def test_every_collector_succeeds(scrapes: tuple[Series, str, Path]) -> None:
    got = parse_exposition(scrapes[1])["gpunode_scrape_collector_success"]
    assert got == {(("collector", c),): 1 for c in COLLECTORS}


def test_every_good_series_is_there_with_its_value(scrapes: tuple[Series, str, Path]) -> None:
    clean, text, _ = scrapes
    hostile = _stable(parse_exposition(text))
    want = _stable(clean)
    assert sum(map(len, want.values())) > 500  # the clean node gives a full scrape to compare with
    missing = {name: {k: v for k, v in values.items() if hostile.get(name, {}).get(k) != v}
               for name, values in want.items()}
    assert {name: rows for name, rows in missing.items() if rows} == {}


def test_the_hostile_parts_are_counted_not_hidden(scrapes: tuple[Series, str, Path]) -> None:
    clean, series = scrapes[0], parse_exposition(scrapes[1])
    assert series["gpunode_nfs_parse_errors_total"][()] == 2  # the bad mount and the Arabic one
    # The record with a 400-digit time has no trustworthy sequence number either: the jump
    # over it shows as one record lost, as the reader cannot tell what it held.
    assert series["gpunode_kmsg_records_lost_total"][()] == clean["gpunode_kmsg_records_lost_total"][()] + 1
    assert series["gpunode_kmsg_records_malformed_total"][()] == 4
    assert series["gpunode_gpu_process_parse_errors_total"][()] >= 1  # the 400-digit stat, on every scan
    # "+7", "1_000", "-5"; Arabic-Indic digits are not even ASCII, read as an unreadable file is.
    assert series["gpunode_storage_network_parse_errors_total"][()] == 3
    assert series["gpunode_xid_state_errors_total"][(("operation", "load"),)] == 1
    # The device named in bytes that are not UTF-8 is served under a valid name; of its counters,
    # only the one the kernel could have printed.
    bad = {name: v for name, values in series.items() if name.startswith("gpunode_rdma_")
           for k, v in values.items() if ("device", "mlx5_\ufffd") in k}
    assert bad == {"gpunode_rdma_cnp_sent_total": 7, "gpunode_rdma_port_info": 1}


def test_no_file_outside_the_state_directory_is_touched(scrapes: tuple[Series, str, Path]) -> None:
    root = scrapes[2]
    assert (root / "victim").read_text() == "precious\n"
    assert not os.path.lexists(root / "created-anywhere")
    assert (root / "state" / "xid-state.json.corrupt").exists()  # kept for a post-mortem


def test_the_output_passes_promtool(scrapes: tuple[Series, str, Path]) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (scripts/install-deps.sh --test installs it)")
    check = subprocess.run([promtool, "check", "metrics"], input=scrapes[1], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
