"""The Xid collector in the running exporter: records appended to the log show in /metrics,
counts survive SIGTERM and SIGKILL exactly, output passes promtool."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from gpunode_exporter.xid import catalog
from tests.helpers import Series, free_port, parse_exposition, wait_for_port

ROOT = Path(__file__).parent.parent
DGX = ROOT / "tests" / "fixtures" / "sysfs" / "dgx-h100"


class Node:
    def __init__(self, root: Path) -> None:
        self.procfs = root / "proc"
        (self.procfs / "sys" / "kernel" / "random").mkdir(parents=True)
        (self.procfs / "sys" / "kernel" / "random" / "boot_id").write_text("5e1f0d6c-boot\n")
        self.kmsg = root / "kmsg"
        self.kmsg.write_text("")
        self.state = root / "state"
        self.seq = 0
        self.proc: subprocess.Popen[str] | None = None
        self.port = 0

    def log(self, text: str, prio: int = 4) -> None:
        with self.kmsg.open("a") as f:
            f.write(f"{prio},{self.seq},{self.seq * 1000 + 5},-;{text}\n")
        self.seq += 1

    def start(self) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gpunode_exporter", "--collector.disable-defaults", "--collector.xid",
             "--path.kmsg", str(self.kmsg), "--path.state", str(self.state), "--path.procfs", str(self.procfs),
             "--path.sysfs", str(DGX), "--web.listen-address", f"127.0.0.1:{self.port}"],
            cwd=ROOT, stderr=subprocess.PIPE, text=True)
        wait_for_port(self.port, alive=lambda: self.proc is not None and self.proc.poll() is None)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)
        self.proc.wait(timeout=10)

    def text(self) -> str:
        return requests.get(f"http://127.0.0.1:{self.port}/metrics", timeout=10).text

    def scrape(self) -> Series:
        return parse_exposition(self.text())

    def xids(self) -> dict[tuple[str, str, str], float]:
        """(gpu, xid, action) -> count."""
        got = self.scrape().get("gpunode_xid_errors_total", {})
        return {(d["gpu"], d["xid"], d["action"]): v for labels, v in got.items() for d in [dict(labels)]}

    def wait_xids(self, want: dict[tuple[str, str, str], float], seconds: float = 5) -> None:
        deadline = time.monotonic() + seconds
        while self.xids() != want and time.monotonic() < deadline:
            time.sleep(0.02)
        assert self.xids() == want


@pytest.fixture
def node(tmp_path: Path) -> Node:
    n = Node(tmp_path)
    yield n
    if n.proc is not None and n.proc.poll() is None:
        n.proc.kill()
        n.proc.wait()


XID79 = "NVRM: Xid (PCI:0000:1b:00): 79, pid=2001, name=python, GPU has fallen off the bus."
XID94 = "NVRM: Xid (PCI:0000:43:00): 94, pid='<unknown>', name=<unknown>, Contained: SM (0x1)."


def test_appended_xids_show_with_the_catalog_action(node: Node) -> None:
    action = catalog.load().action
    assert action(79) != catalog.UNKNOWN
    node.log(XID79)  # in the log before the exporter starts: in its first scrape
    node.start()
    assert node.xids() == {("0", "79", action(79)): 1}
    node.log(XID94)
    node.log("NVRM: Xid (PCI:0000:43:00): 999, a code no catalog has")
    node.wait_xids({("0", "79", action(79)): 1, ("1", "94", action(94)): 1, ("1", "999", "UNKNOWN"): 1})
    s = node.scrape()
    assert s["gpunode_xid_source"] == {(("source", "kmsg"),): 1, (("source", "nvml"),): 0}
    assert s["gpunode_kmsg_records_lost_total"] == {(): 0}
    assert s["gpunode_scrape_collector_success"] == {(("collector", "xid"),): 1}
    recovery = {dict(k)["gpu"]: v for k, v in s["gpunode_gpu_recovery_action"].items()}
    assert recovery == {str(i): 0 for i in range(8)}  # every GPU of the sysfs tree, none needs action
    promtool = shutil.which("promtool")
    if promtool:
        check = subprocess.run([promtool, "check", "metrics"], input=node.text(), capture_output=True, text=True)
        assert check.returncode == 0 and not (check.stdout + check.stderr).strip(), check.stdout + check.stderr


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_counts_continue_across_restarts(node: Node, sig: int) -> None:
    action = catalog.load().action
    node.log(XID79)
    node.start()
    node.log(XID79)
    node.wait_xids({("0", "79", action(79)): 2})
    node.stop(sig)  # SIGKILL: whatever was not saved is read again from the log, not lost or doubled
    node.log(XID94)  # while the exporter is down
    node.start()
    assert node.xids() == {("0", "79", action(79)): 2, ("1", "94", action(94)): 1}
    node.stop()
    assert node.proc is not None and "Traceback" not in (node.proc.stderr.read() if node.proc.stderr else "")
