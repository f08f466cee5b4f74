"""The systemd unit: `systemd-analyze verify` accepts it, its offline security exposure is what
docs/install.md says (and at most 3.0), the sysusers/tmpfiles files apply, and the capabilities it
grants are exactly those the collectors need: with them an unprivileged user reads /dev/kmsg and
another user's /proc/PID/{io,fd}; without any one of them it cannot."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
UNIT = ROOT / "systemd" / "gpunode-exporter.service"
INSTALL_DOC = ROOT / "docs" / "install.md"
EXPOSURE = re.compile(r"Overall exposure level for \S+: (\d+\.\d)")


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} not installed (Debian's systemd package)")
    return path


def _unit_capabilities() -> list[str]:
    caps = re.search(r"^AmbientCapabilities=(.+)$", UNIT.read_text(), re.M)
    bounding = re.search(r"^CapabilityBoundingSet=(.+)$", UNIT.read_text(), re.M)
    assert caps and bounding and caps.group(1) == bounding.group(1)
    return caps.group(1).split()


def test_systemd_analyze_verify(tmp_path: Path) -> None:
    """Against a root holding the unit, systemd's own units and the ExecStart path (verify checks it exists)."""
    analyze = _tool("systemd-analyze")
    binary = tmp_path / "opt" / "gpunode-exporter" / "bin" / "gpunode-exporter"
    binary.parent.mkdir(parents=True)
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    (tmp_path / "etc" / "systemd" / "system").mkdir(parents=True)
    (tmp_path / "usr" / "lib" / "systemd").mkdir(parents=True)
    shutil.copytree("/lib/systemd/system", tmp_path / "usr" / "lib" / "systemd" / "system", symlinks=True)
    shutil.copy(UNIT, tmp_path / "etc" / "systemd" / "system")
    out = subprocess.run([analyze, "verify", f"--root={tmp_path}", "--man=no", "--generators=no", UNIT.name],
                         capture_output=True, text=True)
    assert out.returncode == 0 and not out.stderr.strip(), out.stderr
    # And it does complain: an unknown key makes it fail.
    broken = tmp_path / "etc" / "systemd" / "system" / UNIT.name
    broken.write_text(UNIT.read_text().replace("[Service]", "[Service]\nNoSuchSetting=1"))
    out = subprocess.run([analyze, "verify", f"--root={tmp_path}", "--man=no", "--generators=no", UNIT.name],
                         capture_output=True, text=True)
    assert "NoSuchSetting" in out.stderr


def test_security_exposure_is_documented_and_at_most_3() -> None:
    out = subprocess.run([_tool("systemd-analyze"), "security", "--offline=true", str(UNIT)],
                         capture_output=True, text=True)
    found = EXPOSURE.search(out.stdout + out.stderr)
    assert found, out.stdout + out.stderr
    assert float(found.group(1)) <= 3.0
    assert f"exposure level: **{found.group(1)}**" in INSTALL_DOC.read_text(), "docs/install.md: update the score"


def test_documented_capabilities_are_the_units() -> None:
    caps = _unit_capabilities()
    assert caps == ["CAP_SYSLOG", "CAP_DAC_READ_SEARCH", "CAP_SYS_PTRACE"]
    assert f"`{' '.join(caps)}`" in INSTALL_DOC.read_text()


def test_sysusers_and_tmpfiles_apply(tmp_path: Path) -> None:
    sysusers, tmpfiles = _tool("systemd-sysusers"), _tool("systemd-tmpfiles")
    for kind, source in (("sysusers.d", "gpunode-exporter.sysusers"), ("tmpfiles.d", "gpunode-exporter.tmpfiles")):
        (tmp_path / "usr" / "lib" / kind).mkdir(parents=True)
        shutil.copy(ROOT / "systemd" / source, tmp_path / "usr" / "lib" / kind / "gpunode-exporter.conf")
    (tmp_path / "etc").mkdir()
    subprocess.run([sysusers, f"--root={tmp_path}"], check=True, capture_output=True)
    passwd = (tmp_path / "etc" / "passwd").read_text()
    assert re.search(r"^gpunode-exporter:x:\d+:\d+:.*:/var/lib/gpunode-exporter:/usr/sbin/nologin$", passwd, re.M)
    subprocess.run([tmpfiles, f"--root={tmp_path}", "--create"], check=True, capture_output=True)
    state = tmp_path / "var" / "lib" / "gpunode-exporter"
    assert state.is_dir() and state.stat().st_mode & 0o777 == 0o700


# --- the capabilities, exercised without systemd: setpriv gives an unprivileged user exactly these.

@pytest.fixture
def other_users_process() -> Iterator[int]:
    if os.geteuid() != 0:
        pytest.skip("switching users needs root")
    _tool("setpriv")
    proc = subprocess.Popen(["sleep", "60"])
    yield proc.pid
    proc.kill()
    proc.wait()


def _as_nobody(caps: list[str], *argv: str) -> subprocess.CompletedProcess[str]:
    names = ",".join(f"+{c.removeprefix('CAP_').lower()}" for c in caps)
    setcaps = [f"--inh-caps={names}", f"--ambient-caps={names}"] if caps else []
    return subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", *setcaps, *argv],
                          capture_output=True, text=True, cwd=ROOT)


def test_the_units_capabilities_suffice(other_users_process: int, tmp_path: Path) -> None:
    caps = _unit_capabilities()
    tmp_path.chmod(0o777)
    dump = _as_nobody(caps, sys.executable, "-m", "exporter", "dump", "--collector.disable-defaults",
                      "--collector.xid", "--path.state", str(tmp_path))
    read = re.search(r"^gpunode_kmsg_records_read_total (\S+)$", dump.stdout, re.M)
    assert read and float(read.group(1)) > 0, dump.stdout + dump.stderr
    assert _as_nobody(caps, "cat", f"/proc/{other_users_process}/io").returncode == 0
    assert _as_nobody(caps, "readlink", f"/proc/{other_users_process}/fd/0").returncode == 0


@pytest.mark.parametrize("dropped", ["CAP_SYSLOG", "CAP_DAC_READ_SEARCH", "CAP_SYS_PTRACE"])
def test_each_capability_is_needed(other_users_process: int, dropped: str) -> None:
    caps = [c for c in _unit_capabilities() if c != dropped]
    if dropped == "CAP_SYSLOG":
        if Path("/proc/sys/kernel/dmesg_restrict").read_text().strip() != "1":
            pytest.skip("kernel.dmesg_restrict is 0 here: anyone may read /dev/kmsg")
        assert _as_nobody(caps, "dd", "if=/dev/kmsg", "of=/dev/null", "count=1", "bs=8192").returncode != 0
    else:
        assert _as_nobody(caps, "cat", f"/proc/{other_users_process}/io").returncode != 0
        assert _as_nobody(caps, "readlink", f"/proc/{other_users_process}/fd/0").returncode != 0
