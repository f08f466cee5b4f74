"""Before a rebooted or reset node returns, its exporter must see every GPU: read from real output."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gpunode_remediate.health import gpu_trouble

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "exporter" / "nvmlsim" / "scenarios"


def dump(tmp_path: Path, scenario: str, expected: int) -> str:
    (tmp_path / "config.yml").write_text(f"gpu: {{expected_count: {expected}}}\n")
    out = subprocess.run([sys.executable, "-m", "gpunode_exporter", "dump", "--collector.disable-defaults",
                          "--collector.gpu",
                          "--nvml.simulate", str(SCENARIOS / scenario), "--config.file", str(tmp_path / "config.yml"),
                          "--path.state", str(tmp_path)], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_a_healthy_node_returns(tmp_path: Path) -> None:
    assert gpu_trouble(dump(tmp_path, "healthy-h100.yaml", 8)) is None


def test_a_node_that_sees_fewer_gpus_than_it_has_does_not(tmp_path: Path) -> None:
    assert gpu_trouble(dump(tmp_path, "healthy-h100.yaml", 9)) == "its exporter sees 8 of 9 GPUs"


@pytest.mark.parametrize(("text", "trouble"), [
    ("", "its exporter serves no NVML GPU count"),
    ('gpunode_gpus_visible{source="pci"} 8\n', "its exporter serves no NVML GPU count"),
    ('gpunode_gpus_visible{source="nvml"} 8\ngpunode_gpu_up{gpu="3",uuid="x"} 0\n', "1 GPU(s) down"),
    ('gpunode_gpus_visible{source="nvml"} NaN\ngpunode_gpus_expected 8\n', "its exporter serves no NVML GPU count"),
    ('gpunode_gpus_visible{source="nvml"} 8\ngpunode_gpus_expected 8\n', None),
])
def test_odd_answers(text: str, trouble: str | None) -> None:
    assert gpu_trouble(text) == trouble


def test_flags_are_spelled_in_full_in_the_exporter_too() -> None:
    out = subprocess.run([sys.executable, "-m", "gpunode_exporter", "dump", "--path.stat=/var/lib/x"],
                         capture_output=True,
                         text=True, cwd=ROOT, timeout=60)
    assert out.returncode == 2 and "unrecognized arguments: --path.stat=/var/lib/x" in out.stderr
