"""`gpunode-exporter doctor`: a healthy fixture node passes; each broken part is named, with its fix."""

from __future__ import annotations

import ctypes.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers import AS_NOBODY, skip_unless_nobody_can_run_the_checkout, skip_without_kmsg

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
SCENARIO = ROOT / "exporter" / "nvmlsim" / "scenarios" / "gpu122-uncorrectable-steps.yaml"


def doctor(*flags: str | Path, user: list[str] | None = None) -> tuple[int, dict[str, list[str]]]:
    """Exit status and {check: [its lines, fix lines included]}."""
    done = subprocess.run([*(user or []), sys.executable, "-m", "gpunode_exporter", "doctor", *map(str, flags)],
                          capture_output=True, text=True, cwd=ROOT, timeout=60)
    checks: dict[str, list[str]] = {}
    name = ""
    for line in done.stdout.splitlines():
        if line and not line[0].isspace():
            name = line.split("  ")[0]
            checks.setdefault(name, [])
        checks[name].append(line.strip())
    return done.returncode, checks


@pytest.fixture
def node(tmp_path: Path) -> list[str | Path]:
    """The flags of a healthy node: simulated GPUs matching the fixture bus, a kernel log file, NFS mounts."""
    cfg = tmp_path / "config.yml"
    cfg.write_text(yaml.safe_dump({"gpu": {"expected_count": 8}, "nfs": {"resolve_devices": False},
                                   "staging": {"paths": [str(tmp_path)]}}))
    return ["--nvml.simulate", SCENARIO, "--path.sysfs", FIXTURES / "sysfs" / "dgx-h100",
            "--path.procfs", FIXTURES / "procfs" / "real", "--path.kmsg", FIXTURES / "kmsg" / "real-xid.kmsg",
            "--path.state", tmp_path / "state", "--config.file", cfg, "--no-collector.gpu_processes"]


def _replace(flags: list[str | Path], flag: str, value: str | Path) -> list[str | Path]:
    i = flags.index(flag)
    return [*flags[:i + 1], value, *flags[i + 2:]]


def test_a_healthy_node_passes(node) -> None:
    code, checks = doctor(*node)
    assert code == 0, checks
    assert "driver 550.54.15, 8 GPUs" in checks["nvml"][-1]
    assert " ok " in checks["gpus"][0] and "NVML 8, PCI bus 8, expected 8" in checks["gpus"][0]
    assert any("mountstats v1.1" in line for line in checks["nfs"]), checks["nfs"]
    assert " ok " in checks["checkpoint"][0] and "times saves to /mnt/" in checks["checkpoint"][0]
    assert not [line for lines in checks.values() for line in lines if " fail " in line]


def test_no_nvml_library_fails_the_gpu_collector_and_says_how_to_go_on(node) -> None:
    if ctypes.util.find_library("nvidia-ml"):
        pytest.skip("this machine has NVIDIA's driver")
    flags = list(node)
    i = flags.index("--nvml.simulate")
    del flags[i:i + 2]
    code, checks = doctor(*flags)
    assert code == 1
    assert "fail" in checks["nvml"][0] and "LibraryNotFound" in checks["nvml"][0]
    assert "--no-collector.gpu" in checks["nvml"][1]
    # The kernel log still carries the Xids: without NVML, that is enough for the xid collector.
    assert " ok " in checks["kmsg"][0]
    code, checks = doctor(*flags, "--no-collector.gpu")
    assert code == 0, checks
    assert "off" in checks["gpu"][0]


def test_a_driver_that_did_not_load(node, tmp_path: Path) -> None:
    scenario = yaml.safe_load(SCENARIO.read_text())
    scenario["driver"]["init_error"] = "DRIVER_NOT_LOADED"
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(scenario))
    code, checks = doctor(*_replace(node, "--nvml.simulate", tmp_path / "s.yaml"))
    assert code == 1
    assert "DriverNotLoaded" in checks["nvml"][-2] and "modprobe nvidia" in checks["nvml"][-1]


def test_a_gpu_the_driver_does_not_see(node, tmp_path: Path) -> None:
    scenario = yaml.safe_load(SCENARIO.read_text())
    scenario["gpus"] = scenario["gpus"][:7]
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(scenario))
    code, checks = doctor(*_replace(node, "--nvml.simulate", tmp_path / "s.yaml"))
    assert code == 0  # the exporter works; the node does not: its alerts say so
    assert " warn " in checks["gpus"][0] and "NVML 7, PCI bus 8, expected 8" in checks["gpus"][0]
    assert "dmesg" in checks["gpus"][1]


def test_an_unreadable_kernel_log(node, tmp_path: Path) -> None:
    code, checks = doctor(*_replace(node, "--path.kmsg", tmp_path / "missing"))
    assert code == 0  # NVML's events stand in
    assert " warn " in checks["kmsg"][0] and "NVML events instead" in checks["kmsg"][0]
    code, checks = doctor(*_replace(node, "--path.kmsg", tmp_path / "missing"), "--no-collector.gpu",
                          "--nvml.simulate", _broken_scenario(tmp_path))
    assert code == 1
    assert " fail " in checks["kmsg"][0]


def _broken_scenario(tmp_path: Path) -> Path:
    scenario = yaml.safe_load(SCENARIO.read_text())
    scenario["driver"]["init_error"] = "LIB_RM_VERSION_MISMATCH"
    (tmp_path / "broken.yaml").write_text(yaml.safe_dump(scenario))
    return tmp_path / "broken.yaml"


def test_a_state_directory_that_cannot_be_written(node, tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    code, checks = doctor(*_replace(node, "--path.state", tmp_path / "a-file"))
    assert code == 1
    assert " fail " in checks["state"][0] and "would not survive a restart" in checks["state"][0]
    assert "StateDirectory=" in checks["state"][1]


def test_no_mountstats(node) -> None:
    code, checks = doctor(*_replace(node, "--path.procfs", FIXTURES / "procfs" / "datapath"))
    assert code == 1
    assert " fail " in checks["nfs"][0] and "mountstats" in checks["nfs"][0]
    assert "--path.procfs" in checks["nfs"][1]
    assert " fail " in checks["checkpoint"][0] and "--path.procfs" in checks["checkpoint"][1]


def test_checkpoint_mountpoints_that_match_no_mount(node, tmp_path: Path) -> None:
    cfg = tmp_path / "c.yml"
    cfg.write_text(yaml.safe_dump({"nfs": {"resolve_devices": False}, "checkpoint": {"mountpoints": ["^/ckpt$"]}}))
    code, checks = doctor(*_replace(node, "--config.file", cfg))
    assert code == 0
    assert " warn " in checks["checkpoint"][0] and "^/ckpt$" in checks["checkpoint"][0]


def test_bad_config_and_web_config_files(node, tmp_path: Path) -> None:
    (tmp_path / "bad.yml").write_text("gpu: {expected_cont: 8}\n")
    code, checks = doctor(*_replace(node, "--config.file", tmp_path / "bad.yml"))
    assert code == 1 and " fail " in checks["config"][0] and "expected_cont" in checks["config"][0]
    (tmp_path / "web.yml").write_text("basic_auth_users: {prometheus: not-a-hash}\n")
    code, checks = doctor(*node, "--web.config.file", tmp_path / "web.yml")
    assert code == 1 and "fail" in checks["web config"][0] and "bcrypt" in checks["web config"][0]


def test_a_missing_staging_path_and_storage_interface(node, tmp_path: Path) -> None:
    cfg = tmp_path / "c.yml"
    cfg.write_text(yaml.safe_dump({"nfs": {"resolve_devices": False}, "staging": {"paths": ["/no/such/path"]},
                                   "storage": {"interfaces": ["nosuch0"]}}))
    code, checks = doctor(*_replace(node, "--config.file", cfg))
    assert code == 0
    assert " warn " in checks["staging"][0] and "/no/such/path" in checks["staging"][0]
    assert " warn " in checks["storage"][0] and "no interface nosuch0" in checks["storage"][1]


def test_gpu_processes_without_the_capabilities_the_unit_grants(tmp_path: Path) -> None:
    skip_unless_nobody_can_run_the_checkout()
    flags = ["--collector.disable-defaults", "--collector.gpu_processes", "--path.state", tmp_path]
    code, checks = doctor(*flags, user=[*AS_NOBODY, "--inh-caps=-all"])
    assert code == 1
    assert " fail " in checks["gpu_processes"][0]
    assert "CAP_DAC_READ_SEARCH and CAP_SYS_PTRACE" in checks["gpu_processes"][1]
    # With the two capabilities, as the systemd unit gives them, it passes.
    caps = "+dac_read_search,+sys_ptrace"
    code, checks = doctor(*flags, user=[*AS_NOBODY, f"--inh-caps={caps}", f"--ambient-caps={caps}"])
    assert code == 0, checks
    assert " ok " in checks["gpu_processes"][0]


def test_the_kernel_log_without_cap_syslog() -> None:
    import tempfile

    skip_without_kmsg()
    skip_unless_nobody_can_run_the_checkout()
    with tempfile.TemporaryDirectory() as state:
        os.chmod(state, 0o777)
        flags = ["--collector.disable-defaults", "--collector.xid", "--path.kmsg", "/dev/kmsg", "--path.state", state]
        code, checks = doctor(*flags, user=[*AS_NOBODY, "--inh-caps=-all"])
        if " ok " in checks["kmsg"][0]:
            pytest.skip("this kernel lets anyone read /dev/kmsg (kernel.dmesg_restrict=0)")
        assert code == 1 and "CAP_SYSLOG" in checks["kmsg"][1]
        assert " ok " in checks["state"][0]
        code, checks = doctor(*flags, user=[*AS_NOBODY, "--inh-caps=+syslog", "--ambient-caps=+syslog"])
        assert " ok " in checks["kmsg"][0], checks
