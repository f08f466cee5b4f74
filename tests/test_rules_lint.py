"""Lint of the rendered rule pack with a real PromQL parser (promql-parser):
rate()/increase() only over counters, and every metric a rule reads is one our exporter
produces (its golden outputs, or a family a collector declares: some appear only on hardware
the golden nodes lack, as PFC pauses) or the remediation service declares (remediate/metrics.py),
another rule records, or one on the documented list of node_exporter and dcgm-exporter metrics
(rules/external-metrics.yaml)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import promql_parser
import pytest
import yaml

from gpunode_rulepack.tiers import walk

ROOT = Path(__file__).parent.parent
RULES = ROOT / "rules"
COUNTER_FUNCTIONS = {"rate", "irate", "increase", "resets"}
_TYPE = re.compile(r"^# TYPE (\S+) (\S+)$", re.M)


def _rules() -> list[dict[str, Any]]:
    return [rule for path in sorted((RULES / "prometheus").glob("*.yml"))
            for group in yaml.safe_load(path.read_text())["groups"] for rule in group["rules"]]


def _ours() -> dict[str, str]:
    from gpunode_common.family import MetricSpec
    from gpunode_exporter.collector import COLLECTORS
    from gpunode_remediate import metrics as remediate_metrics

    types: dict[str, str] = {spec.name: spec.kind for cls in COLLECTORS.values() for spec in cls.metrics}
    types.update({spec.name: spec.kind for spec in vars(remediate_metrics).values() if isinstance(spec, MetricSpec)})
    for golden in (ROOT / "tests" / "golden").glob("*.prom"):
        types.update(dict(_TYPE.findall(golden.read_text())))
    return types


def _external() -> dict[str, str]:
    listed = yaml.safe_load((RULES / "external-metrics.yaml").read_text())
    return {name: kind for metrics in listed.values() for name, kind in metrics.items()}


def _metric(selector: Any) -> str:
    if selector.name:
        return selector.name
    for matcher in selector.matchers.matchers:
        if matcher.name == "__name__":
            return matcher.value
    raise AssertionError(f"selector without a metric name: {selector}")


def _function(call: Any) -> str:
    return call.func.name


@pytest.fixture(scope="module")
def known() -> dict[str, str]:
    recorded = {rule["record"]: "recorded" for rule in _rules() if "record" in rule}
    return {**_ours(), **_external(), **recorded}


def test_rules_exist() -> None:
    assert _rules(), "no rules rendered"


def lint(expr: str, known: dict[str, str]) -> None:
    """AssertionError naming the problem."""
    for node in walk(promql_parser.parse(expr)):
        if isinstance(node, promql_parser.VectorSelector):
            name = _metric(node)
            assert name in known, f"{name}: not produced by us, recorded, or in external-metrics.yaml"
        if isinstance(node, promql_parser.Call) and _function(node) in COUNTER_FUNCTIONS:
            (arg,) = [a for a in node.args if not isinstance(a, promql_parser.NumberLiteral)]
            assert isinstance(arg, promql_parser.MatrixSelector), f"{_function(node)}() over {arg}"
            name = _metric(arg.vector_selector)
            assert known.get(name) == "counter", f"{_function(node)}({name}): {name} is a {known.get(name)}"


@pytest.mark.parametrize("rule", _rules(), ids=lambda r: r.get("alert") or r.get("record"))
def test_rule_reads_known_metrics_and_rates_only_counters(rule: dict[str, Any], known: dict[str, str]) -> None:
    lint(rule["expr"], known)


@pytest.mark.parametrize(("expr", "problem"), [
    ("rate(gpunode_gpu_up[5m])", "is a gauge"),
    ("increase(node_procs_running[5m])", "is a gauge"),
    ("no_such_metric > 0", "not produced"),
    ("rate(gpunode:x:y[5m])", "is a recorded"),
])
def test_lint_catches(expr: str, problem: str, known: dict[str, str]) -> None:
    """The lint itself fails on what it is meant to catch."""
    with pytest.raises(AssertionError, match=problem):
        lint(expr, {**known, "gpunode:x:y": "recorded", "node_procs_running": "gauge"})


def test_external_list_names_only_other_exporters() -> None:
    ours = _ours()
    for name in _external():
        assert not name.startswith("gpunode"), f"{name} is ours: it belongs in the golden outputs"
        assert name not in ours


# The prefixes each rule file's alerts may use (docs/rules.md, "Alert names"); a per-GPU prefix
# (Gpu but not GpuNode) is checked against the labels its promtool cases expect.
PREFIXES = {
    "xid": ("GpuXid", "GpuRecoveryAction"),
    "remap": ("GpuRowRemap",),
    "gpu": ("Gpu",),
    "precursor": ("GpuNode",),
    "failslow": ("GpuNode", "GpuJob"),
    "exporter": ("GpuNode",),
    "nfs": ("Nfs",),
    "kernel": ("GpuNode", "GpuNvSwitch"),
    "fabric": ("GpuNode", "GpuFabric"),
    "checkpoint": ("Checkpoint",),
    "remediate": ("GpuRemediation", "GpuJob"),
}


def test_alert_names_follow_the_prefix_scheme() -> None:
    for path in sorted((RULES / "prometheus").glob("*.rules.yml")):
        area = path.name.split(".")[0]
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                if "alert" in rule:
                    assert rule["alert"].startswith(PREFIXES[area]), f"{path.name}: {rule['alert']}"


# Causes of a per-GPU alert that are the node's: GpuFabricNotReady's NVSwitches missing from the bus.
NODE_CAUSES = {("GpuFabricNotReady", "nvswitch_missing")}


def test_node_alerts_name_no_gpu_and_gpu_alerts_do() -> None:
    """GpuNode alerts are about a node, GpuJob alerts about a job, GpuRemediation alerts about the remediation
    service (none of them names a GPU); GpuNvSwitch alerts name an NVSwitch, not a GPU; other Gpu alerts name one."""
    expected: dict[str, set[bool]] = {}
    switch: dict[str, set[bool]] = {}
    for path in (ROOT / "tests" / "rules").glob("*.test.yml"):
        for case in yaml.safe_load(path.read_text())["tests"]:
            for check in case.get("alert_rule_test") or []:
                for alert in check.get("exp_alerts") or []:
                    if (check["alertname"], alert.get("exp_labels", {}).get("cause")) in NODE_CAUSES:
                        assert "gpu" not in alert["exp_labels"], f"{check['alertname']}: the node's, names no GPU"
                        continue
                    expected.setdefault(check["alertname"], set()).add("gpu" in alert.get("exp_labels", {}))
                    switch.setdefault(check["alertname"], set()).add("switch" in alert.get("exp_labels", {}))
    for name, has_gpu in expected.items():
        if name.startswith("GpuNvSwitch"):
            assert has_gpu == {False} and switch[name] == {True}, f"{name}: names the switch, no GPU"
        elif name.startswith(("GpuNode", "GpuJob", "GpuRemediation")):
            assert has_gpu == {False}, f"{name} is about a node but names a GPU"
        elif name.startswith("Gpu") and name != "GpuXidRepeatedHardwareFaults":  # that one counts the node's
            assert has_gpu == {True}, f"{name} is about one GPU but does not name it"
