"""What a panel query reads: which exporters' series, through the rule pack's rules.

`Lineage.reads(expr)` follows the query's series back to the exporters that produce them: a
recording rule or ALERTS to the rules of the pack rendered from the same spec, recursively. It
tells the exporters a query reads (`sources`) from those without which it returns nothing
(`requires`): `a or b` needs only what both sides need, `a and b` and `a / b` need both, so a
score that any of seven signals feeds needs none of their exporters in particular.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache, reduce
from typing import Any

import promql_parser as pp
import yaml

from gpunode_rulepack import render as render_rules
from gpunode_rulepack.dashboards.grafana import parseable

# The exporters (and Prometheus itself, for `up`) a series can come from, as the docs name them.
EXPORTERS = {"gpunode": "gpunode-exporter", "node": "node_exporter", "dcgm": "dcgm-exporter",
             "kube_state_metrics": "kube-state-metrics", "remediate": "gpunode-remediate", "prometheus": "Prometheus"}
_PREFIXES = (("gpunode_remediate_", "remediate"), ("gpunode_", "gpunode"), ("node_", "node"), ("DCGM_", "dcgm"),
             ("kube_", "kube_state_metrics"))
_PROMETHEUS = {"up"}  # series Prometheus writes about its own targets


def exporter_of(metric: str) -> str | None:
    """The exporter a metric name comes from; None for what the rule pack computes (recording
    rules, ALERTS). The spec's selectors, one per exporter, are keyed the same way."""
    if ":" in metric or metric == "ALERTS":
        return None
    if metric in _PROMETHEUS:
        return "prometheus"
    for prefix, source in _PREFIXES:
        if metric.startswith(prefix):
            return source
    raise ValueError(f"{metric}: not a series of {', '.join(EXPORTERS.values())} nor of the rule pack")


@dataclass(frozen=True)
class Reads:
    sources: frozenset[str] = frozenset()   # every exporter whose series the query reads
    requires: frozenset[str] = frozenset()  # the exporters without which it returns nothing

    def both(self, other: Reads) -> Reads:  # a and b, a * b, f(a, b): empty when either is
        return Reads(self.sources | other.sources, self.requires | other.requires)

    def either(self, other: Reads) -> Reads:  # a or b: empty only when both are
        return Reads(self.sources | other.sources, self.requires & other.requires)


_NOTHING = Reads()


class Lineage:
    """The rule pack rendered from one spec: recording rule name -> its expressions (a name may
    be recorded by several rules, one per signal), alert name -> its expression."""

    def __init__(self, records: dict[str, list[str]], alerts: dict[str, str]) -> None:
        self.records, self.alerts = records, alerts
        self._memo: dict[str, Reads] = {}

    @classmethod
    def of(cls, spec: dict[str, Any]) -> Lineage:
        records: dict[str, list[str]] = {}
        alerts: dict[str, str] = {}
        for text in render_rules(spec, "prometheus").values():
            for group in yaml.safe_load(text)["groups"]:
                for rule in group["rules"]:
                    if "record" in rule:
                        records.setdefault(rule["record"], []).append(rule["expr"])
                    else:
                        alerts[rule["alert"]] = rule["expr"]
        return cls(records, alerts)

    def reads(self, expr: str) -> Reads:
        """What a query reads; Grafana's variables in it are fine."""
        return self._node(_parse(parseable(expr)))

    def _node(self, node: Any) -> Reads:
        if isinstance(node, pp.VectorSelector):
            return self._series(node)
        if isinstance(node, pp.MatrixSelector):
            return self._node(node.vector_selector)
        if isinstance(node, pp.SubqueryExpr | pp.ParenExpr | pp.UnaryExpr | pp.AggregateExpr):
            return self._node(node.expr)
        if isinstance(node, pp.Call):
            reads = _NOTHING
            for arg in node.args:
                reads = reads.both(self._node(arg))
            # absent() returns a series exactly when its argument has none
            return Reads(reads.sources) if node.func.name.startswith("absent") else reads
        if isinstance(node, pp.BinaryExpr):
            lhs, rhs, op = self._node(node.lhs), self._node(node.rhs), str(node.op)
            if op == "or":
                return lhs.either(rhs)
            if op == "unless":
                return Reads(lhs.sources | rhs.sources, lhs.requires)
            return lhs.both(rhs)
        return _NOTHING  # number and string literals

    def _series(self, node: Any) -> Reads:
        name = node.name
        source = exporter_of(name)
        if source is not None:
            return Reads(frozenset({source}), frozenset({source}))
        if name == "ALERTS":
            exprs = [expr for alert, expr in sorted(self.alerts.items()) if _matches(node, "alertname", alert)]
            if not exprs:
                raise ValueError(f"{node}: matches no alert of the rule pack")
            return _either(self.reads(e) for e in exprs)
        if name not in self.records:
            raise ValueError(f"{name}: not a recording rule of the rule pack rendered from this spec")
        if name not in self._memo:
            # A rule may read its own past (an Xid episode's start): iterate from "reads
            # nothing, needs everything" until its reads stop changing.
            self._memo[name] = Reads(frozenset(), frozenset(EXPORTERS))
            while True:
                found = _either(self.reads(e) for e in self.records[name])
                if found == self._memo[name]:
                    break
                self._memo[name] = found
        return self._memo[name]


def _either(reads: Iterable[Reads]) -> Reads:
    """Several rules recording one name (or alerts in one ALERTS selector): their union."""
    return reduce(Reads.either, reads)


def _matches(node: Any, label: str, value: str) -> bool:
    """Whether a selector's matchers on `label` accept `value` (Prometheus anchors regexes)."""
    for m in node.matchers.matchers:
        if m.name != label:
            continue
        if m.op in (pp.MatchOp.Re, pp.MatchOp.NotRe):
            ok = (re.fullmatch(m.value, value) is not None) == (m.op == pp.MatchOp.Re)
        else:
            ok = (value == m.value) == (m.op == pp.MatchOp.Equal)
        if not ok:
            return False
    return True


@cache
def _parse(expr: str) -> Any:
    return pp.parse(expr)
