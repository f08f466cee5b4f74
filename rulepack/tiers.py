"""The rule pack in two tiers, for fleets that one Prometheus no longer holds.

- local: every rule that reads one node's series and writes per-node recordings and alerts. It
  runs on each server that scrapes a shard of the nodes (all three exporters of a node on the
  same shard).
- fleet: every rule that compares nodes (an aggregation across the node label: peer medians,
  MADs, scores, majorities) and every rule that reads one of those. It reads only the local
  tier's recordings (`gpunode:*`, sent on by federation or remote write) and the
  out-of-service marker, and runs once, where they all arrive. Also every rule that reads a
  service of which a fleet has one (SERVICES: gpunode-remediate, beside Alertmanager): it is
  scraped once, by the server that runs the fleet tier, not by every shard.

Which tier a rule is in follows from its expression, so a new rule cannot land in the wrong
one: tests/test_rule_tiers.py checks that the fleet tier reads nothing else.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import yaml

from gpunode_rulepack import concurrency

# Metric name prefixes of the services a fleet runs once (spec selectors.remediate: gpunode-remediate).
SERVICES = ("gpunode_remediate_",)


def walk(node: Any) -> Iterator[Any]:
    """Every node of a parsed PromQL expression (promql_parser), depth first."""
    yield node
    for attr in ("lhs", "rhs", "expr", "vector_selector", "param"):
        child = getattr(node, attr, None)
        if child is not None and not isinstance(child, int | float | str):
            yield from walk(child)
    for arg in getattr(node, "args", None) or []:
        yield from walk(arg)


def analyse(expr: str, node_label: str) -> tuple[set[str], bool]:
    """(metric names the expression reads, whether it aggregates across nodes)."""
    import promql_parser as pp  # only `rules render --tier` needs it

    names: set[str] = set()
    across = False
    for node in walk(pp.parse(expr)):
        if isinstance(node, pp.VectorSelector):
            names.add(node.name or next(m.value for m in node.matchers.matchers if m.name == "__name__"))
        elif isinstance(node, pp.AggregateExpr):
            modifier = node.modifier
            if modifier is None:
                across = True
            elif modifier.type == pp.AggModifierType.By:
                across |= node_label not in modifier.labels
            else:
                across |= node_label in modifier.labels
    return names, across


def fleet_rules(files: dict[str, str], node_label: str) -> set[str]:
    """Names (records and alerts) of the fleet tier: the rules that aggregate across nodes or read
    a once-per-fleet service (SERVICES), and every rule that reads what one of them writes."""
    rules = [rule for text in files.values() for group in yaml.safe_load(text)["groups"] for rule in group["rules"]]
    read = {id(rule): analyse(rule["expr"], node_label) for rule in rules}
    fleet = {rule.get("record") or rule["alert"] for rule in rules
             if read[id(rule)][1] or any(name.startswith(SERVICES) for name in read[id(rule)][0])}
    while True:  # what reads a fleet recording is fleet too
        more = {rule.get("record") or rule["alert"] for rule in rules if read[id(rule)][0] & fleet} - fleet
        if not more:
            return fleet
        fleet |= more


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (expressions, descriptions) as YAML blocks, as the templates write them."""


_Dumper.add_representer(str, lambda dumper, value: dumper.represent_scalar(
    "tag:yaml.org,2002:str", value, style="|" if "\n" in value else None))


def split(files: dict[str, str], tier: str, node_label: str) -> dict[str, str]:
    """The files of one tier: each group keeps the rules of that tier (empty groups go); fleet
    groups are named NAME-fleet, files NAME.TIER.rules.yml (vmalert's keep their .vmalert)."""
    if tier == "all":
        return files
    fleet = fleet_rules(files, node_label)
    out = {}
    for name, text in files.items():
        groups = []
        for group in yaml.safe_load(text)["groups"]:
            rules = [rule for rule in group["rules"]
                     if ((rule.get("record") or rule["alert"]) in fleet) == (tier == "fleet")]
            if rules:
                kept = {**group, "rules": rules}
                if "concurrency" in group:  # vmalert: no more at once than the tier's group has rules
                    width = concurrency(len(rules), group["concurrency"])
                    if width:
                        kept["concurrency"] = width
                    else:
                        del kept["concurrency"]
                if tier == "fleet":
                    kept["name"] = f"{group['name']}-fleet"
                groups.append(kept)
        if groups:
            header = text.split("\n", 1)[0] + f" Tier: {tier} (docs/scaling.md).\n"
            body = yaml.dump({"groups": groups}, Dumper=_Dumper, sort_keys=False, width=10_000, allow_unicode=True)
            out[name.replace(".rules.yml", f".{tier}.rules.yml")] = header + body
    return out
