"""The systemd unit run by a real systemd: a minimal Debian booted with systemd-nspawn.

tests/test_systemd.py checks the unit offline; here it runs. The exporter is installed into a
fresh Debian as docs/install.md says (the wheels of this checkout and its dependencies, built on
the host, into a venv at /opt/gpunode-exporter; the unit, sysusers and tmpfiles files by the
guide's own commands), the system boots and starts the unit: simulated NVML, the host's kernel
log through /dev/kmsg, the host's network. On that one boot, in this order:

- the system comes up with no failed unit, the unit enabled and active;
- its process runs as the unit's user with exactly the capabilities the unit file grants, no new
  privileges and a seccomp filter; the state directory has the unit's mode and owner;
- every enabled collector succeeds, and the Xid source is the kernel log;
- an Xid written to /dev/kmsg from user space is read but not counted: the kernel marks such
  records with the user facility and only the kernel's own count. Counting across restarts is
  therefore shown on a log replayed from a file (--path.kmsg): one Xid counts 1, still 1 after a
  restart (read again, skipped), still 1 after a restart that no longer finds it in the log
  (kept in the state directory);
- `systemd-analyze security` rates the running unit as the offline analysis rates the file;
- `systemctl stop` ends it cleanly, within its stop timeout;
- its journal holds no warning or error but the simulated NVML's.

Root only; about 25 s with the rootfs cached, 55 s without (2 cores).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import re
import shlex
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from gpunode_exporter.collector import COLLECTORS
from gpunode_exporter.kmsg import KmsgReader, parse_record
from gpunode_exporter.xid import state as statefile
from gpunode_exporter.xid.tracker import IDLE_SAVE_INTERVAL
from tests import rootfs
from tests.helpers import Series, build_wheel, free_port, parse_exposition, skip_without_kmsg, wait_for_port
from tests.test_systemd import TMPFILES, UNIT, _setting, exposure_level, offline_security

# Debian rootfs under systemd-nspawn: one at a time (the rootfs cache, nspawn's runtime directory).
pytestmark = pytest.mark.xdist_group("nspawn")

ROOT = Path(__file__).resolve().parent.parent
INSTALL_DOC = ROOT / "docs" / "install.md"
REAL_XIDS = ROOT / "tests" / "fixtures" / "kmsg" / "real-xid.kmsg"
# systemd boots to "running" without dbus; python3-venv brings python3.
PACKAGES = ["systemd", "python3-venv"]
VENV = "/opt/gpunode-exporter"
SERVICE = UNIT.name
SCENARIO = "healthy-h100.yaml"
KMSG = Path("/dev/kmsg")
# nspawn keeps CAP_SYSLOG from containers unless told: without it the unit could not grant it.
BOOT_OPTIONS = ("--capability=CAP_SYSLOG", f"--bind={KMSG}")
REPLAY = "/etc/gpunode-exporter/kmsg"  # inside: read-only to the service (ProtectSystem=strict), which is enough
USER_FACILITY = 1  # what the kernel gives every record user space writes to /dev/kmsg


class Node:
    """The booted system, its rootfs on the host, and the port the exporter listens on."""

    def __init__(self, machine: rootfs.Booted, root: Path, port: int) -> None:
        self.machine, self.root, self.port = machine, root, port
        self.boot_state = ""

    def run(self, *argv: str) -> str:
        out = self.machine.run(*argv)
        assert out.returncode == 0, f"{shlex.join(argv)}: {out.stdout}{out.stderr}"
        return out.stdout

    def path(self, inside: str) -> Path:
        return self.root / inside.lstrip("/")

    def show(self, prop: str) -> str:
        return self.run("systemctl", "show", "-P", prop, SERVICE).strip()

    def systemctl(self, verb: str) -> None:
        self.run("systemctl", verb, SERVICE)
        if verb in ("start", "restart"):
            self.wait_listening()

    def wait_listening(self) -> None:
        try:
            wait_for_port(self.port, alive=lambda: self.machine.process.poll() is None, seconds=30)
        except AssertionError as err:
            journal = self.machine.run("journalctl", "-u", SERVICE, "-o", "cat", "--no-pager").stdout
            raise AssertionError(f"{err}; {SERVICE}'s journal:\n{journal}") from None

    def configure(self, *flags: str) -> None:
        _configure(self.root, self.port, *flags)

    def scrape(self) -> Series:
        return parse_exposition(requests.get(f"http://127.0.0.1:{self.port}/metrics", timeout=10).text)

    def state_file(self) -> Path:
        return self.path(f"/var/lib/{_setting('StateDirectory')}/{statefile.FILE_NAME}")


def _checked(out: subprocess.CompletedProcess[str]) -> None:
    assert out.returncode == 0, f"{shlex.join(map(str, out.args))}:\n{out.stdout}{out.stderr}"


def _unit_commands() -> str:
    """docs/install.md's commands for the unit, its user and its state directory, for a system not
    yet booted: there systemctl enables the unit but cannot reload or start it (the boot starts it)."""
    blocks = [b for b in re.findall(r"```sh root\n(.*?)```", INSTALL_DOC.read_text(), re.S) if "systemd-sysusers" in b]
    assert len(blocks) == 1, "docs/install.md: no single block installs the unit"
    lines = [line.replace(" enable --now ", " enable ") for line in blocks[0].splitlines()
             if line != "systemctl daemon-reload"]
    assert f"systemctl enable {UNIT.stem}" in lines, lines
    return "\n".join(lines) + "\n"


def _configure(root: Path, port: int, *flags: str) -> None:
    """ARGS in the unit's EnvironmentFile: the simulated scenario the wheel ships, `port`, `flags`."""
    (scenario,) = root.glob(f"{VENV[1:]}/lib/python3*/site-packages/gpunode_exporter/nvmlsim/scenarios/{SCENARIO}")
    args = [f"--nvml.simulate=/{scenario.relative_to(root)}", f"--web.listen-address=127.0.0.1:{port}", *flags]
    (root / _setting("EnvironmentFile").lstrip("-/")).write_text(f'ARGS="{" ".join(args)}"\n')


def _install(root: Path, port: int) -> None:
    """As docs/install.md says, but with the wheels built here: pip inside has no index to fetch from."""
    build_wheel(root.parent / "source", root / "wheels", with_dependencies=True)
    _checked(rootfs.nspawn(root, "/usr/bin/python3", "-m", "venv", VENV))
    _checked(rootfs.nspawn(root, f"{VENV}/bin/pip", "install", "-q", "--no-index", "--find-links", "/wheels",
                           "gpunode-exporter"))
    (root / "install-unit.sh").write_text(_unit_commands())
    _checked(rootfs.nspawn(root, "sh", "-e", "/install-unit.sh",
                           options=(f"--bind-ro={ROOT / 'systemd'}:/src/systemd", "--chdir=/src")))
    _configure(root, port)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    rootfs.skip_unless_ready("nsenter")
    skip_without_kmsg()  # the booted system is given the host's
    work = tmp_path_factory.mktemp("system-unit")
    root = work / "root"
    try:
        rootfs.unpack(rootfs.build(PACKAGES), root)
        port = free_port()
        _install(root, port)
        with rootfs.boot(root, options=BOOT_OPTIONS, console=work / "console.log") as machine:
            booted = Node(machine, root, port)
            booted.boot_state = machine.wait_running()
            booted.wait_listening()
            yield booted
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_the_system_boots_clean_and_starts_the_unit(node: Node) -> None:
    failed = node.machine.run("systemctl", "--failed", "--no-legend").stdout
    assert node.boot_state == "running", failed
    assert node.run("systemctl", "is-enabled", SERVICE).strip() == "enabled"
    assert (node.show("ActiveState"), node.show("SubState")) == ("active", "running")


def _capability_mask(names: list[str]) -> int:
    """The kernel's bits for capability names, numbered by libcap (not a table of ours)."""
    libcap = ctypes.CDLL(ctypes.util.find_library("cap") or "libcap.so.2")
    mask = 0
    for name in names:
        number = ctypes.c_int()
        assert libcap.cap_from_name(name.encode(), ctypes.byref(number)) == 0, f"libcap knows no {name}"
        mask |= 1 << number.value
    return mask


def test_it_runs_as_its_user_with_exactly_the_units_capabilities(node: Node) -> None:
    pid = node.show("MainPID")
    status = dict(line.partition(":\t")[::2] for line in node.run("cat", f"/proc/{pid}/status").splitlines())
    uid, gid = node.run("id", "-u", _setting("User")).strip(), node.run("id", "-g", _setting("Group")).strip()
    assert uid != "0"
    assert (status["Uid"].split(), status["Gid"].split()) == ([uid] * 4, [gid] * 4)
    bounding = _capability_mask(_setting("CapabilityBoundingSet").split())
    granted = _capability_mask(_setting("AmbientCapabilities").split()) & bounding
    # A non-root user keeps the ambient set through exec, and nothing else.
    expected = {"CapBnd": bounding, "CapAmb": granted, "CapPrm": granted, "CapEff": granted}
    assert {field: status[field] for field in expected} == {field: f"{mask:016x}" for field, mask in expected.items()}
    assert status["NoNewPrivs"] == "1"
    assert status["Seccomp"] == "2"  # a filter: SystemCallFilter=


def test_the_state_directory_has_the_units_mode_and_owner(node: Node) -> None:
    path = f"/var/lib/{_setting('StateDirectory')}"
    mode, owner, group = node.run("stat", "-c", "%a %U %G", path).split()
    assert int(mode, 8) == int(_setting("StateDirectoryMode"), 8)
    assert (owner, group) == (_setting("User"), _setting("Group"))
    # The tmpfiles line, for runs outside the unit, makes the same directory.
    (line,) = [line.split() for line in TMPFILES.read_text().splitlines() if line and not line.startswith("#")]
    assert (line[1], int(line[2], 8), line[3], line[4]) == (path, int(mode, 8), owner, group)


def test_every_enabled_collector_succeeds(node: Node) -> None:
    """In the container too: nfs with no NFS mount, gpu_processes with no GPU process, staging and
    storage_network with none configured each have nothing to report, and report success."""
    s = node.scrape()
    enabled = [name for name, collector in COLLECTORS.items() if collector.default_enabled]
    success = {dict(labels)["collector"]: value for labels, value in s["gpunode_scrape_collector_success"].items()}
    assert success == dict.fromkeys(enabled, 1)
    assert s["gpunode_nvml_simulated"][()] == 1
    # The kernel log is read: CAP_SYSLOG (kernel.dmesg_restrict) and DeviceAllow=/dev/kmsg at work.
    assert s["gpunode_xid_source"] == {(("source", "kmsg"),): 1, (("source", "nvml"),): 0}
    assert s["gpunode_kmsg_records_read_total"][()] > 0


def _log_from_user_space(text: str) -> int:
    """Writes `text` to the kernel log as any root process can; the sequence number of its record."""
    reader = KmsgReader(KMSG, from_end=True)
    try:
        with KMSG.open("w") as log:
            log.write(f"<4>{text}\n")
        for _ in range(100):
            for record in map(parse_record, reader.read()):
                if record.text == text.encode():
                    assert record.facility == USER_FACILITY
                    return record.seq
            reader.wait(0.1)
    finally:
        reader.close()
    raise AssertionError(f"not in the kernel log: {text}")


def _position(node: Node) -> int:
    """The last kernel record the exporter saved as handled; -1 before it saved any."""
    state = node.state_file()
    return (json.loads(state.read_text()) if state.exists() else {}).get("kmsg_seq") or -1


def test_an_xid_written_from_user_space_is_read_not_counted(node: Node) -> None:
    # A bus id no other series has, and Xid 43, which NVIDIA's catalog says to ignore, should another
    # tool on the machine count it.
    bus = "0000:e7:00"
    seq = _log_from_user_space(f"NVRM: Xid (PCI:{bus}): 43, pid={os.getpid()}, name=gpunode-exporter-test, Ch 00000008")
    deadline = time.monotonic() + 3 * IDLE_SAVE_INTERVAL  # the position is saved that often while no Xid comes
    while _position(node) < seq and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _position(node) >= seq, "the exporter did not get past the record"
    counted = [dict(labels)["pci_bus_id"] for labels in node.scrape().get("gpunode_xid_errors_total", {})]
    assert not [b for b in counted if b.startswith(bus)], counted


def test_systemd_rates_the_running_unit_as_the_offline_analysis_does(node: Node) -> None:
    offline = offline_security()
    assert exposure_level(node.run("systemd-analyze", "security", SERVICE)) == exposure_level(
        offline.stdout + offline.stderr)


def _xids(node: Node) -> float:
    return sum(node.scrape().get("gpunode_xid_errors_total", {}).values())


def test_xid_counts_survive_restarts(node: Node) -> None:
    """The kernel will not log an Xid for us (above): a kernel record, as the driver prints it,
    replayed from a file."""
    text = next(line for line in REAL_XIDS.read_text().splitlines() if "NVRM: Xid" in line).partition(";")[2]
    replay = node.path(REPLAY)
    replay.parent.mkdir(parents=True, exist_ok=True)
    replay.write_text(f"4,1,1000000,-;{text}\n")  # facility 0, the kernel; sequence number 1
    node.systemctl("stop")
    node.state_file().unlink(missing_ok=True)  # its position is the real log's, far past record 1
    node.configure(f"--path.kmsg={REPLAY}")
    try:
        node.systemctl("start")
        assert _xids(node) == 1
        node.systemctl("restart")
        assert _xids(node) == 1  # read again and skipped: the saved position is past it
        node.systemctl("stop")
        replay.write_text("6,2,2000000,-;a later record: the ring buffer has overwritten the Xid\n")
        node.systemctl("start")
        assert _xids(node) == 1  # no longer in the log: the count came from the state directory
    finally:
        node.systemctl("stop")
        node.state_file().unlink(missing_ok=True)
        node.configure()
        node.systemctl("start")


def _seconds(node: Node, timespan: str) -> float:
    """A systemd time span ("1min 30s") in seconds, as systemd reads it."""
    found = re.search(r"(?:μs|us): (\d+)$", node.run("systemd-analyze", "timespan", timespan), re.M)
    assert found, timespan
    return int(found.group(1)) / 1e6


def test_stop_ends_it_cleanly_within_its_stop_timeout(node: Node) -> None:
    timeout = _seconds(node, node.show("TimeoutStopUSec"))  # TimeoutStopSec=, else the manager's default
    started = time.monotonic()
    node.systemctl("stop")
    took = time.monotonic() - started
    assert node.show("ActiveState") == "inactive"
    assert node.show("Result") == "success"  # not "timeout": SIGTERM ended it, not SIGKILL
    assert (node.show("ExecMainCode"), node.show("ExecMainStatus")) == ("1", "0")  # exited, status 0
    assert took < timeout, f"stop took {took:.1f} s, the unit allows {timeout:.0f} s"


def test_the_journal_holds_no_warning_but_the_simulated_nvmls(node: Node) -> None:
    """Each line reaches the journal with its level as the priority (the "<N>" prefix the exporter
    writes where stderr is the journal); the level's name is looked at too."""
    entries = [json.loads(line) for line in node.run("journalctl", "-u", SERVICE, "-o", "json").splitlines()]
    messages = [(int(e["PRIORITY"]), e["MESSAGE"]) for e in entries if isinstance(e.get("MESSAGE"), str)]
    simulated = [priority for priority, text in messages if "NVML is SIMULATED" in text]
    assert simulated and set(simulated) == {4}, "the simulated NVML's warning is not a warning in the journal"
    bad = [text for priority, text in messages
           if (priority <= 4 or re.search(r"level=(WARNING|ERROR|CRITICAL)", text)) and "NVML is SIMULATED" not in text]
    assert bad == []
