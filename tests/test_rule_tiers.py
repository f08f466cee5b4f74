"""`rules render --tier local|fleet`: the pack split for sharded Prometheus servers (docs/scaling.md).

Together the tiers are the single-server pack; the fleet tier reads only what reaches it: the
local tier's recordings, the out-of-service marker, the nodes' workload series (one per node)
and kube-state-metrics'; the local tier reads nothing the fleet tier writes. Both pass promtool,
and the vmalert target vmalert.
"""

from __future__ import annotations

import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pytest
import yaml

from gpunode_common.family import MetricSpec
from gpunode_exporter.cli import main
from gpunode_remediate import metrics as remediate_metrics
from gpunode_rulepack import load_spec, render
from gpunode_rulepack.tiers import SERVICES, analyse, split

SPEC = load_spec()
NODE = SPEC["labels"]["node"]
# Raw series the fleet tier reads, sent on with the recordings: the marker of nodes out of
# service, the nodes' workloads (one series per node) and kube-state-metrics' pods (one service);
# and the remediation service's own, scraped where the fleet tier runs (one service per fleet).
REMEDIATE_METRICS = {spec.name for spec in vars(remediate_metrics).values() if isinstance(spec, MetricSpec)}
FLEET_RAW_INPUTS = {*analyse(SPEC["out_of_service"], NODE)[0], "gpunode_node_workload_info", "kube_pod_info",
                    "kube_pod_owner", *REMEDIATE_METRICS}


def _rules(files: dict[str, str]) -> list[dict]:
    return [rule for text in files.values() for group in yaml.safe_load(text)["groups"] for rule in group["rules"]]


def _key(rule: dict) -> tuple:
    return (rule.get("record") or rule["alert"], rule["expr"], rule.get("for"), str(rule.get("labels")))


@pytest.mark.parametrize("target", ["prometheus", "vmalert"])
def test_the_tiers_together_are_the_single_pack(target: str) -> None:
    files = render(SPEC, target)
    local, fleet = (_rules(split(files, tier, NODE)) for tier in ("local", "fleet"))
    assert local and fleet
    assert Counter(map(_key, local)) + Counter(map(_key, fleet)) == Counter(map(_key, _rules(files)))


def test_the_fleet_tier_reads_only_recordings_and_the_named_inputs() -> None:
    files = render(SPEC)
    local, fleet = (_rules(split(files, tier, NODE)) for tier in ("local", "fleet"))
    written_local = {r["record"] for r in local if "record" in r}
    written_fleet = {r["record"] for r in fleet if "record" in r}
    for rule in fleet:
        reads, _ = analyse(rule["expr"], NODE)
        assert reads <= written_local | written_fleet | FLEET_RAW_INPUTS, (rule.get("record") or rule["alert"],
                                                                          reads - written_local - written_fleet)
    for rule in local:
        reads, across = analyse(rule["expr"], NODE)
        assert not reads & written_fleet and not across, rule.get("record") or rule["alert"]
    # The comparisons of nodes are all in the fleet tier.
    names = {r.get("record") or r["alert"] for r in fleet}
    assert {"GpuNodePrecursorMultiSignal", "GpuJobSlowedDown", "GpuNodeClockThrottled",
            "gpunode:precursor_signal:peer_median", "gpunode:failslow_proxy:peer_median"} <= names
    # The remediation service runs once per fleet: its alerts run where it is scraped, once.
    assert {"GpuRemediationBreakerOpen", "GpuRemediationNodeHeld", "GpuRemediationSchedulerFailing",
            "GpuRemediationActionsFailing", "GpuJobRetryChainStopped"} <= names
    assert all(name.startswith(SERVICES) for name in REMEDIATE_METRICS)
    assert not any(name.startswith(SERVICES) for rule in local for name in analyse(rule["expr"], NODE)[0])
    # The evidence of a cause is the node's own: recorded where its exporters are scraped.
    assert {"gpunode:gpu_clock_reason:active", "gpunode:fabric_link:errors", "gpunode:gpu_pcie_link:below_max",
            "GpuNvLinkDegraded"} <= {r.get("record") or r["alert"] for r in local}


def test_a_tier_runs_no_more_rules_at_once_than_its_group_has() -> None:
    """vmalert: a group split across the tiers keeps `concurrency` only as high as the rules it keeps."""
    files = render(SPEC, "vmalert")
    for tier in ("local", "fleet"):
        groups = [g for text in split(files, tier, NODE).values() for g in yaml.safe_load(text)["groups"]]
        want = {g["name"]: min(SPEC["vmalert_concurrency"], len(g["rules"])) for g in groups}
        assert {g["name"]: g.get("concurrency") for g in groups} == {k: n if n > 1 else None for k, n in want.items()}
        assert any(g.get("concurrency") for g in groups)


def test_tier_files_pass_promtool_and_vmalert(tmp_path: Path) -> None:
    for target, checker in (("prometheus", ["promtool", "check", "rules", "--lint-fatal"]), ("vmalert", None)):
        for tier in ("local", "fleet"):
            out = tmp_path / target / tier
            assert main(["rules", "render", "--target", target, "--tier", tier, "--out", str(out)]) == 0
            paths = sorted(str(p) for p in out.glob("*.yml"))
            assert paths and all(f".{tier}.rules.yml" in p for p in paths)
            if checker:
                done = subprocess.run([*checker, *paths], capture_output=True, text=True)
            else:
                vmalert = shutil.which("vmalert")
                assert vmalert, "vmalert not installed: scripts/install-deps.sh --test"
                done = subprocess.run([vmalert, "-dryRun", *(f"-rule={p}" for p in paths)],
                                      capture_output=True, text=True)
            assert done.returncode == 0, done.stdout + done.stderr


def test_the_default_is_the_single_pack(tmp_path: Path) -> None:
    assert main(["rules", "render", "--out", str(tmp_path)]) == 0
    committed = Path(__file__).parent.parent / "rules" / "prometheus"
    assert sorted(p.name for p in tmp_path.glob("*.yml")) == sorted(p.name for p in committed.glob("*.yml"))


def test_fleet_alert_texts_query_only_what_reaches_the_fleet_tier() -> None:
    import re

    fleet = _rules(split(render(SPEC), "fleet", NODE))
    for rule in fleet:
        text = " ".join(str(v) for v in (rule.get("annotations") or {}).values())
        raw = set(re.findall(r"(?<![\w:])(?:gpunode_\w+|node_\w+|DCGM_\w+|kube_\w+)\b", text)) - FLEET_RAW_INPUTS
        assert not raw, (rule.get("alert"), raw)
