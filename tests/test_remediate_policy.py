"""The policy file: documented defaults, and one line naming the key for anything wrong (exit 2)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gpunode_common.config import ConfigError
from gpunode_remediate import policy as policies
from gpunode_remediate.scheduler.slurm import expand_hostlist, fields, node_view

ROOT = Path(__file__).resolve().parent.parent


def test_the_defaults_are_safe() -> None:
    p = policies.build({})
    assert (p.mode, p.enforce, p.node_label, p.quiet_period) == ("dry-run", False, "instance", 900.0)
    assert (p.budget.fraction, p.budget.minimum, p.budget.window) == (0.05, 1, 86400.0)
    assert (p.repeat_offender.drains, p.repeat_offender.window) == (3, 604800.0)
    assert p.requeue.enabled is False and p.requeue.backoff == (600.0, 1200.0, 2400.0)
    assert p.budget.nodes(8) == 1 and p.budget.nodes(40) == 2 and p.budget.nodes(1000) == 50


@pytest.mark.parametrize(("instance", "node"), [
    ("gpu071:19835", "gpu071"), ("gpu071.cluster.local:19835", "gpu071"), ("gpu071", "gpu071"),
    ("[fe80::1]:19835", "fe80"), ("", None),
])
def test_the_node_is_the_host_part_of_the_instance(instance: str, node: str | None) -> None:
    assert policies.build({}).node({"instance": instance}) == node


@pytest.mark.parametrize(("data", "message"), [
    ({"mdoe": "enforce"}, "unknown key 'mdoe'"),
    ({"mode": "on"}, "key 'mode': want dry-run or enforce"),
    ({"budget": {"fraction": 2}}, "key 'budget.fraction'"),
    ({"budget": {"minimum": "one"}}, "key 'budget.minimum'"),
    ({"budget": {"windw": "1h"}}, "unknown key 'budget.windw'"),
    ({"quiet_period": "soon"}, "quiet_period"),
    ({"node_pattern": "gpu.*"}, "key 'node_pattern': want a group"),
    ({"node_pattern": "(["}, "not a regular expression"),
    ({"reset_command": "nvidia-smi -r"}, "key 'reset_command': want a command"),
    ({"reset_command": ["reset", "{host}"]}, "unknown placeholder {host}"),
    ({"scheduler": {"kind": "pbs"}}, "key 'scheduler.kind'"),
    ({"scheduler": {"kind": "commands", "commands": {"drain": ["x"]}}}, "needs nodes, resume, reboot"),
    ({"requeue": {"enabled": "yes"}}, "key 'requeue.enabled'"),
    ({"rules": [{"alertname": "X", "action": "explode"}]}, "key 'rules[0].action'"),
    ({"rules": [{"alertname": "X", "action": "drain", "labels": {"xid": "(["}}]}, "rules[0].labels.xid"),
    ([], "top level: want a mapping"),
])
def test_wrong_keys_and_types_name_the_key(data: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("{", r"\{").replace("[", r"\[")
                       .replace("(", r"\(").replace(")", r"\)")):
        policies.build(data)


def test_check_says_valid_or_one_line_and_exit_2(tmp_path: Path) -> None:
    good, bad = tmp_path / "good.yml", tmp_path / "bad.yml"
    good.write_text("mode: enforce\nreset_command: [/usr/local/sbin/gpu-reset, '{node}', '{gpu}']\n")
    bad.write_text("mode: enforce\nbudget: {fracton: 0.1}\n")
    run = [sys.executable, "-m", "gpunode_remediate", "check", "--config.file"]
    ok = subprocess.run([*run, str(good)], capture_output=True, text=True, cwd=ROOT)
    assert ok.returncode == 0 and "valid (enforce, scheduler slurm" in ok.stdout
    no = subprocess.run([*run, str(bad)], capture_output=True, text=True, cwd=ROOT)
    assert no.returncode == 2
    assert no.stderr == f"gpunode-remediate: error: {bad}: unknown key 'budget.fracton'\n"


def test_flags_are_spelled_in_full() -> None:
    out = subprocess.run([sys.executable, "-m", "gpunode_remediate", "serve", "--config.file", "x",
                          "--web.listen", ":1"],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 2 and "unrecognized arguments: --web.listen :1" in out.stderr


def test_scontrol_records_with_spaces_and_a_reason() -> None:
    line = ("NodeName=gpu003 Arch=x86_64 CoresPerSocket=1 CPUAlloc=0 State=IDLE+DRAIN+REBOOT_REQUESTED "
            "OS=Linux 6.1.0-18-amd64 #1 SMP PREEMPT_DYNAMIC Debian 6.1.76-1 (2024-02-01) RealMemory=1000 "
            "Reason=gpunode: reboot GpuXidHardwareFault xid=79 gpu=3 [root@2026-11-27T10:00:00]")
    record = fields(line)
    assert record["OS"] == "Linux 6.1.0-18-amd64 #1 SMP PREEMPT_DYNAMIC Debian 6.1.76-1 (2024-02-01)"
    assert record["Reason"] == "gpunode: reboot GpuXidHardwareFault xid=79 gpu=3"
    view = node_view(record)
    assert (view.state, view.flags, view.ours, view.rebooting) == (
        "idle", frozenset({"drain", "reboot_requested"}), True, True)
    assert node_view(fields("NodeName=gpu004 State=DOWN* Reason=Not responding [slurm@x]")).flags == {
        "not_responding"}


@pytest.mark.parametrize(("text", "names"), [
    ("gpu[001-003,007]", ["gpu001", "gpu002", "gpu003", "gpu007"]),
    ("gpu001,login1", ["gpu001", "login1"]),
    ("rack[1-2]-gpu", ["rack1-gpu", "rack2-gpu"]),
    ("", []),
])
def test_host_lists(text: str, names: list[str]) -> None:
    assert expand_hostlist(text) == names


@pytest.mark.parametrize("text", ["gpu[a-b]", "gpu[1-100000000]", "gpu[\uff11-2]"])
def test_bad_host_lists_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        expand_hostlist(text)
