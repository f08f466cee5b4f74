"""End to end: `gpunode-exporter dump` on fixture trees (and simulated GPUs) equals the checked-in output.

Regenerate after an intended change with:  GOLDEN_UPDATE=1 python -m pytest tests/test_golden.py
Review the diff of tests/golden/ before committing it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.netns import storage_netns

HERE = Path(__file__).parent
FIXTURES = HERE / "fixtures"
_NFS = ("--collector.disable-defaults", "--collector.nfs")
_GPU = ("--collector.disable-defaults", "--collector.gpu",
        "--config.file", str(FIXTURES / "nvml" / "expect-8-gpus.yaml"))
# Golden file name -> dump flags.
SCENARIOS = {
    "real": (*_NFS, "--path.procfs", str(FIXTURES / "procfs" / "real")),
    "edge": (*_NFS, "--path.procfs", str(FIXTURES / "procfs" / "edge")),
    # nfs: operations and transport_series all, per_transport: every operation and transport of the samples.
    "real-every-series": (*_NFS, "--path.procfs", str(FIXTURES / "procfs" / "real"),
                          "--config.file", str(FIXTURES / "procfs" / "every-nfs-series.yaml")),
    "gpu-healthy": (*_GPU, "--path.sysfs", str(FIXTURES / "sysfs" / "dgx-h100"),
                    "--nvml.simulate", "exporter/nvmlsim/scenarios/healthy-h100.yaml"),
    "gpu-faults": (*_GPU, "--path.sysfs", str(FIXTURES / "sysfs" / "edge"),
                   "--nvml.simulate", str(FIXTURES / "nvml" / "faults.yaml")),
    "datapath": ("--collector.disable-defaults", "--collector.staging", "--collector.gpu_processes",
                 "--collector.storage_network", "--path.procfs", str(FIXTURES / "procfs" / "datapath"),
                 "--path.sysfs", str(FIXTURES / "sysfs" / "dgx-h100"),
                 "--config.file", str(FIXTURES / "procfs" / "datapath-config.yaml"),
                 "--nvml.simulate", "exporter/nvmlsim/scenarios/healthy-h100.yaml"),  # GPU minors -> indices
    # 98 real Xid lines from many machines: those on the simulated DGX's bus ids get its GPUs' names.
    "xid": ("--collector.disable-defaults", "--collector.xid", "--path.kmsg", str(FIXTURES / "kmsg" / "real-xid.kmsg"),
            "--path.state", "/nonexistent/gpunode-golden", "--path.sysfs", str(FIXTURES / "sysfs" / "dgx-h100"),
            "--nvml.simulate", "exporter/nvmlsim/scenarios/healthy-h100.yaml"),
}
# Run first, in a private mount namespace: the staging filesystem the datapath config names.
_STAGING = ("mount -t tmpfs -o size=64m tmpfs /mnt && mkdir /mnt/staging && "
            "mount -t tmpfs -o size=64m tmpfs /mnt/staging && head -c 3145728 /dev/zero > /mnt/staging/shard")
# Lines that differ from run to run or release to release.
_DURATION = re.compile(r"^gpunode_scrape_collector_duration_seconds\{.*$\n", re.M)
_BUILD = re.compile(r'^(gpunode_exporter_build_info)\{.*\} ', re.M)
# Kernel log times are since boot: as Unix time they depend on when this machine booted.
_XID_TIME = re.compile(r"^(gpunode_(?:xid_last_event|sxid_last_event|kernel_event_last)_timestamp_seconds"
                       r"\{.*\}) .*$", re.M)


def dump(netns: str, scenario: str) -> str:
    cmd = ["ip", "netns", "exec", netns, "unshare", "--mount", "--propagation", "private", "sh", "-c",
           f'{_STAGING} && exec "$@"', "sh", sys.executable, "-m", "gpunode_exporter", "dump", *SCENARIOS[scenario]]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=HERE.parent)
    return out.stdout


def normalize(exposition: str) -> str:
    exposition = _XID_TIME.sub(r"\1 X", _DURATION.sub("", exposition))
    return _BUILD.sub(r'\1{python_version="X",version="X"} ', exposition)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_dump_matches_golden(scenario: str) -> None:
    with storage_netns() as ns:
        got = normalize(dump(ns, scenario))
    golden = HERE / "golden" / f"{scenario}.prom"
    if os.environ.get("GOLDEN_UPDATE"):
        golden.write_text(got)
    assert got == golden.read_text(), f"dump differs from {golden}; see the module docstring"


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_dump_passes_promtool(scenario: str) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (scripts/install-deps.sh installs it)")
    with storage_netns() as ns:
        exposition = dump(ns, scenario)
    check = subprocess.run([promtool, "check", "metrics"], input=exposition,
                           capture_output=True, text=True)
    assert check.returncode == 0 and not check.stdout.strip() and not check.stderr.strip(), (
        check.stdout + check.stderr)
