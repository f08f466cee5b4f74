"""The systemd unit and docs/install.md.

- `systemd-analyze verify` accepts the shipped unit; the sysusers and tmpfiles files apply.
- Its offline security exposure is at most 3.0, and the score and the table of remaining
  items in docs/install.md are the tool's (the docs cannot drift).
- The capabilities it grants are the ones docs/install.md names, and they are what the
  collectors need, tested rather than claimed: as nobody with exactly those capabilities and
  the unit's /proc, hidepid=invisible (setpriv, unshare: no systemd needed), `gpunode-exporter
  dump` reads the kernel log and counts a root process that holds /dev/nvidia0; without any
  one of them it cannot, and the kernel refuses the underlying read.
- MemoryDenyWriteExecute does not stop the simulated NVML's ctypes callbacks.
- The scrape config in docs/install.md is docs/rules.md's, uses the rule pack's job names,
  and promtool accepts it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.helpers import AS_NOBODY, FOLDERS, skip_without_kmsg

ROOT = Path(__file__).parent.parent
UNIT = ROOT / "systemd" / "gpunode-exporter.service"
SYSUSERS = ROOT / "systemd" / "gpunode-exporter.sysusers"
TMPFILES = ROOT / "systemd" / "gpunode-exporter.tmpfiles"
INSTALL_DOC = ROOT / "docs" / "install.md"
RULES_DOC = ROOT / "docs" / "rules.md"
SPEC = ROOT / "rulepack" / "spec.yaml"
SCENARIO = ROOT / "exporter" / "nvmlsim" / "scenarios" / "healthy-h100.yaml"


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} not installed (Debian's systemd / util-linux packages)")
    return path


def _setting(name: str, unit: Path = UNIT) -> str:
    values = re.findall(rf"^{name}=(.*)$", unit.read_text(), re.M)
    assert len(values) == 1, f"{name}= set {len(values)} times in {unit.name}"
    return values[0]


def _unit_capabilities() -> list[str]:
    caps = _setting("AmbientCapabilities").split()
    assert caps == _setting("CapabilityBoundingSet").split(), "the bounding and ambient sets differ"
    return caps


def _doc_section(title: str) -> str:
    text = INSTALL_DOC.read_text()
    start = text.index(f"\n{title}\n")
    end = text.find("\n#", start + len(title) + 2)
    return text[start:end if end >= 0 else None]


# --- the unit file ---------------------------------------------------------------------------

def _verify(root: Path, unit: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([_tool("systemd-analyze"), "verify", f"--root={root}", "--man=no", "--generators=no",
                           unit.name], capture_output=True, text=True, timeout=30)


def test_systemd_analyze_verify(tmp_path: Path) -> None:
    verify_unit(UNIT, tmp_path)


def verify_unit(unit: Path, tmp_path: Path) -> None:
    """A shipped unit, unchanged, in a scratch root with systemd's units. verify insists that ExecStart's
    binary exists (inside --root): a stand-in sits at the unit's own path, nothing in the unit is replaced."""
    _tool("systemd-analyze")
    (tmp_path / "etc" / "systemd" / "system").mkdir(parents=True)
    (tmp_path / "usr" / "lib" / "systemd").mkdir(parents=True)
    shutil.copytree("/lib/systemd/system", tmp_path / "usr" / "lib" / "systemd" / "system", symlinks=True)
    installed = tmp_path / "etc" / "systemd" / "system" / unit.name
    shutil.copy(unit, installed)
    # Without the binary, verify fails: the check is real, and looks inside --root.
    binary = _setting("ExecStart", unit).split()[0]
    assert binary in _verify(tmp_path, unit).stderr
    stand_in = tmp_path / binary.lstrip("/")
    stand_in.parent.mkdir(parents=True)
    stand_in.write_text("#!/bin/sh\n")
    stand_in.chmod(0o755)
    out = _verify(tmp_path, unit)
    assert out.returncode == 0 and not out.stderr.strip(), out.stderr
    # And it reads what it is given: an unknown key fails.
    installed.write_text(unit.read_text().replace("[Service]", "[Service]\nNoSuchSetting=1"))
    assert "NoSuchSetting" in _verify(tmp_path, unit).stderr


def exposure_level(output: str) -> str:
    """The overall exposure level `systemd-analyze security` printed, e.g. "2.3"."""
    found = re.search(r"Overall exposure level for \S+: (\d+\.\d)", output)
    assert found, output
    return found.group(1)


def offline_security(unit: Path = UNIT) -> subprocess.CompletedProcess[str]:
    """`systemd-analyze security --offline=true` on a shipped unit (tests/test_system_unit.py
    compares its level with the one systemd gives the running unit)."""
    return subprocess.run([_tool("systemd-analyze"), "security", "--offline=true", str(unit)],
                          capture_output=True, text=True, timeout=30)


def check_security_score(unit: Path, bound: float, section: str, doc: str) -> None:
    """The unit's offline exposure is at most `bound`, and the doc's section shows the tool's score
    and the tool's own list of what still counts."""
    out = offline_security(unit)
    score = exposure_level(out.stdout + out.stderr)
    assert float(score) <= bound, f"exposure {score}, above {bound}: what was loosened?"
    assert f"exposure level of **{score}**" in section, f"{doc}: the score is now {score}"
    measured = dict(re.findall(r"^✗ (\S+)\s.*?(\d\.\d)\s*$", out.stdout, re.M))
    documented = {name.replace("\\|", "|"): weight
                  for name, weight in re.findall(r"^\| `([^`]+)` \| (\d\.\d) \|", section, re.M)}
    assert documented == measured, f"{doc}: the table of remaining items differs from the tool's"


def test_security_exposure_is_documented_and_at_most_3() -> None:
    check_security_score(UNIT, 3.0, _doc_section("### Security score"), "docs/install.md")


def test_documented_capabilities_are_the_units() -> None:
    documented = re.search(r"^Capabilities: `([A-Z_ ]+)`", INSTALL_DOC.read_text(), re.M)
    assert documented, "docs/install.md: the 'Capabilities: `...`' line is gone"
    assert _unit_capabilities() == documented.group(1).split()


def apply_sysusers_and_tmpfiles(unit: Path, sysusers_file: Path, tmpfiles_file: Path, root: Path) -> int:
    """A unit's sysusers and tmpfiles files applied to a scratch root: its user exists (no home of its
    own) with its group, and its state directory has the unit's mode. The user's uid."""
    sysusers, tmpfiles = _tool("systemd-sysusers"), _tool("systemd-tmpfiles")
    if os.geteuid() != 0:
        pytest.skip("the state directory is chowned to the new user: needs root")
    for kind, source in (("sysusers.d", sysusers_file), ("tmpfiles.d", tmpfiles_file)):
        (root / "etc" / kind).mkdir(parents=True)
        shutil.copy(source, root / "etc" / kind / f"{unit.stem}.conf")
    subprocess.run([sysusers, f"--root={root}"], check=True, capture_output=True, timeout=30)
    user = _setting("User", unit)
    passwd = (root / "etc" / "passwd").read_text()
    entry = re.search(rf"^{user}:x:(\d+):\d+:.*:/:/usr/sbin/nologin$", passwd, re.M)
    assert entry, passwd  # no home of its own
    assert re.search(rf"^{user}:x:\d+:", (root / "etc" / "group").read_text(), re.M)
    subprocess.run([tmpfiles, f"--root={root}", "--create"], check=True, capture_output=True, timeout=30)
    state = root / "var" / "lib" / _setting("StateDirectory", unit)
    assert state.is_dir() and state.stat().st_mode & 0o777 == int(_setting("StateDirectoryMode", unit), 8)
    assert state.stat().st_uid == int(entry.group(1))
    return int(entry.group(1))


def test_sysusers_and_tmpfiles_apply(tmp_path: Path) -> None:
    assert _setting("User") == _setting("Group")
    apply_sysusers_and_tmpfiles(UNIT, SYSUSERS, TMPFILES, tmp_path)


# --- the scrape config -----------------------------------------------------------------------

def _scrape_config(doc: Path) -> str:
    blocks = [b for b in re.findall(r"```yaml[^\n]*\n(.*?)```", doc.read_text(), re.S) if "scrape_configs:" in b]
    assert len(blocks) == 1, f"{doc.name}: {len(blocks)} scrape_configs blocks"
    return blocks[0]


def test_scrape_config_is_the_rule_packs(tmp_path: Path) -> None:
    block = _scrape_config(INSTALL_DOC)
    assert block == _scrape_config(RULES_DOC), "docs/install.md and docs/rules.md show different scrape configs"
    jobs = {job["job_name"]: job for job in yaml.safe_load(block)["scrape_configs"]}
    selectors = yaml.safe_load(SPEC.read_text())["selectors"]
    # The per-node exporters; kube-state-metrics is one cluster service, scraped through Kubernetes SD,
    # and gpunode-remediate one per fleet, scraped on its host (docs/runbooks/remediation.md).
    per_node = {key: s for key, s in selectors.items() if key not in ("kube_state_metrics", "remediate")}
    assert set(jobs) == {re.fullmatch(r'job="([^"]+)"', s).group(1) for s in per_node.values()}
    # Every job's instance becomes the bare host (Prometheus anchors relabel regexes).
    for job in jobs.values():
        (rule,) = job["relabel_configs"]
        for target in job["static_configs"][0]["targets"]:
            host = target.split(":")[0]
            assert re.fullmatch(rule["regex"], target).expand(rule["replacement"].replace("$1", r"\1")) == host
    if shutil.which("promtool"):
        (tmp_path / "prometheus.yml").write_text(block)
        out = subprocess.run(["promtool", "check", "config", str(tmp_path / "prometheus.yml")],
                             capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stdout + out.stderr


# --- the capabilities, exercised without systemd: setpriv gives nobody exactly these -----------------

# A root "training process" holding /dev/nvidia0 open: in a private mount namespace, a /dev of its own
# (the null device's numbers), as tests/test_gpu_processes.py does. /proc shows the fd's target as
# /dev/nvidia0, as on a GPU node.
PRIVATE_DEV = ("mount -t tmpfs tmpfs /dev && mknod /dev/null c 1 3 && mknod /dev/nvidia0 c 1 3 && "
               "exec {python} -c \"$0\"")
HOLDER = ("import os, sys\ngpu = open('/dev/nvidia0')\nos.pread(os.open('/proc/self/stat', os.O_RDONLY), 4096, 0)\n"
          "print(gpu.fileno(), flush=True)\nsys.stdin.readline()\n")


class GpuProcess:
    def __init__(self, pid: int, gpu_fd: int) -> None:
        self.pid, self.gpu_fd = pid, gpu_fd


@pytest.fixture(scope="module")
def gpu_process() -> Iterator[GpuProcess]:
    if os.geteuid() != 0:
        pytest.skip("switching users and a private /dev need root")
    _tool("setpriv")
    _tool("unshare")
    holder = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                               PRIVATE_DEV.format(python=sys.executable), HOLDER],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None
        yield GpuProcess(holder.pid, int(holder.stdout.readline()))  # unshare and sh exec: same PID
    finally:
        holder.communicate("\n", timeout=10)


def _as_nobody(caps: list[str], *argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """argv as nobody with `caps` in the bounding, inheritable and ambient sets and no new privileges,
    the credentials the unit gives, and with the unit's /proc: its ProtectProc= is procfs's hidepid=
    (which hides the processes it may not ptrace). Not the rest of its sandbox."""
    names = "".join(f",+{c.removeprefix('CAP_').lower()}" for c in caps)
    setpriv = [*AS_NOBODY,
               f"--bounding-set=-all{names}", f"--inh-caps=-all{names}",
               f"--ambient-caps=-all{names}", "--no-new-privs", *argv]
    hidepid = _setting("ProtectProc")
    if hidepid != "default":
        setpriv = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                   f'mount -t proc -o hidepid={hidepid} proc /proc && exec "$@"', "sh", *setpriv]
    return subprocess.run(setpriv, capture_output=True, text=True, cwd=ROOT, env=env, timeout=60)


class NobodyPython:
    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.argv, self.env = argv, env


def _base_prefix_as_nobody(python: NobodyPython) -> str | None:
    probe = "import sys, gpunode_exporter, prometheus_client, yaml; print(sys.base_prefix)"
    out = _as_nobody([], *python.argv, "-c", probe, env=python.env)
    return out.stdout.strip() if out.returncode == 0 else None


@pytest.fixture(scope="module")
def nobody_python() -> Iterator[NobodyPython]:
    """An interpreter that nobody runs whole without any capability, so that each run below differs
    only in its capabilities. The venv's may not be: pyenv's lives under /root (mode 0700). setpriv
    still starts it (execve opens the binary with setpriv's own credentials), but as nobody it cannot
    read its standard library and falls back to whichever one its built-in prefix finds, or fails.
    Then the system's Python of the same version, with the venv's packages and the repository's own
    (PYTHONPATH reads no .pth file, so not the editable install's: a folder of links, one per package
    under its import name)."""
    own = NobodyPython([sys.executable], dict(os.environ))
    if _base_prefix_as_nobody(own) == sys.base_prefix:
        yield own
        return
    system = Path(f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}")
    links = Path(tempfile.mkdtemp(prefix="gpunode-packages-"))
    links.chmod(0o755)
    for name, folder in FOLDERS.items():
        (links / name).symlink_to(ROOT / folder)
    path = os.pathsep.join([str(links), sysconfig.get_paths()["purelib"]])
    fallback = NobodyPython([str(system)], {**os.environ, "PYTHONPATH": path})
    try:
        if not (system.exists() and _base_prefix_as_nobody(fallback) is not None):
            pytest.skip(f"nobody cannot run {sys.executable} with its own library (under /root?), nor {system}"
                        " with the venv's packages")
        yield fallback
    finally:
        shutil.rmtree(links)


def _dump(python: NobodyPython, caps: list[str], state: Path) -> dict[str, float]:
    state.chmod(0o777)
    out = _as_nobody(caps, *python.argv, "-m", "gpunode_exporter", "dump", "--collector.disable-defaults",
                     "--collector.xid", "--collector.gpu_processes", "--path.state", str(state), env=python.env)
    assert out.returncode == 0, out.stderr
    samples = re.findall(r"^(gpunode_\S+) (\S+)$", out.stdout, re.M)
    return {series: float(value) for series, value in samples}


def test_the_units_capabilities_suffice(gpu_process: GpuProcess, nobody_python: NobodyPython,
                                        tmp_path: Path) -> None:
    skip_without_kmsg()
    m = _dump(nobody_python, _unit_capabilities(), tmp_path)
    assert m['gpunode_scrape_collector_success{collector="xid"}'] == 1
    assert m['gpunode_xid_source{source="kmsg"}'] == 1
    assert m["gpunode_kmsg_records_read_total"] > 0
    assert m['gpunode_scrape_collector_success{collector="gpu_processes"}'] == 1
    assert m["gpunode_gpu_processes"] >= 1  # the root process holding /dev/nvidia0
    assert m["gpunode_gpu_process_read_bytes_total"] > 0
    assert m['gpunode_gpu_process_unreadable{file="fd"}'] == 0
    assert m['gpunode_gpu_process_unreadable{file="io"}'] == 0


@pytest.mark.parametrize("dropped", ["CAP_SYSLOG", "CAP_DAC_READ_SEARCH", "CAP_SYS_PTRACE"])
def test_each_capability_is_needed(gpu_process: GpuProcess, nobody_python: NobodyPython, tmp_path: Path,
                                   dropped: str) -> None:
    skip_without_kmsg()  # each case reads the kernel log, with CAP_SYSLOG or without
    caps = [c for c in _unit_capabilities() if c != dropped]
    assert len(caps) == len(_unit_capabilities()) - 1
    pid = gpu_process.pid
    if dropped == "CAP_SYSLOG":
        if Path("/proc/sys/kernel/dmesg_restrict").read_text().strip() != "1":
            pytest.skip("kernel.dmesg_restrict is 0 here: anyone may read /dev/kmsg")
        assert _as_nobody(caps, "dd", "if=/dev/kmsg", "of=/dev/null", "count=1", "bs=8192").returncode != 0
        m = _dump(nobody_python, caps, tmp_path)
        assert m['gpunode_xid_source{source="kmsg"}'] == 0 and m["gpunode_kmsg_records_read_total"] == 0
        assert m["gpunode_gpu_processes"] >= 1  # the other two still do their part
    else:
        assert _as_nobody(caps, "cat", f"/proc/{pid}/io").returncode != 0
        if dropped == "CAP_SYS_PTRACE" and _setting("ProtectProc") == "invisible":
            assert _as_nobody(caps, "test", "-e", f"/proc/{pid}").returncode != 0  # hidden: hidepid is on
        assert _as_nobody(caps, "readlink", f"/proc/{pid}/fd/{gpu_process.gpu_fd}").returncode != 0
        m = _dump(nobody_python, caps, tmp_path)
        assert m["gpunode_gpu_processes"] == 0
        assert m['gpunode_xid_source{source="kmsg"}'] == 1  # CAP_SYSLOG still does its part


# --- MemoryDenyWriteExecute= and the simulated NVML --------------------------------------------

PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN = 65, 1  # include/uapi/linux/prctl.h, Linux >= 6.3
NO_MDWE = 77  # exit status: prctl refused
UNDER_MDWE = """
import ctypes, mmap, runpy, sys
if ctypes.CDLL(None, use_errno=True).prctl({set}, {refuse}, 0, 0, 0) != 0:
    sys.exit({no_mdwe})
try:
    mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    sys.exit("a writable and executable mapping was allowed")
except PermissionError:
    pass
sys.argv = ["gpunode-exporter", "dump", "--collector.disable-defaults", "--collector.gpu",
            "--nvml.simulate", {scenario!r}]
runpy.run_module("gpunode_exporter", run_name="__main__")
"""


def test_simulated_nvml_runs_without_writable_executable_memory() -> None:
    """ctypes callbacks (the simulated NVML's) under the kernel's MDWE, which refuses what systemd's
    MemoryDenyWriteExecute= filter refuses: a mapping both writable and executable, or one turned executable."""
    script = UNDER_MDWE.format(set=PR_SET_MDWE, refuse=PR_MDWE_REFUSE_EXEC_GAIN, no_mdwe=NO_MDWE,
                               scenario=str(SCENARIO))
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=60)
    if out.returncode == NO_MDWE:
        pytest.skip("the kernel has no PR_SET_MDWE (Linux < 6.3)")
    assert out.returncode == 0, out.stderr
    assert re.search(r'^gpunode_scrape_collector_success\{collector="gpu"\} 1$', out.stdout, re.M), out.stdout
    assert re.search(r'^gpunode_gpus_visible\{source="nvml"\} [1-9]', out.stdout, re.M), out.stdout
