"""What every dashboard shares: the spec's selectors and variables, and a panel builder that
insists on a title, a description, a unit and the datasource variable.

Built with Grafana's own SDK (grafana-foundation-sdk), so the JSON follows Grafana's schema.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import yaml
from grafana_foundation_sdk.builders import dashboard as gd
from grafana_foundation_sdk.builders import prometheus
from grafana_foundation_sdk.cog.builder import Builder
from grafana_foundation_sdk.models import dashboard as model

from exporter.rulepack import render as render_rules
from exporter.rulepack import selector

DATASOURCE = model.DataSourceRef(type_val="prometheus", uid="${datasource}")
PANEL_HEIGHT = 8
# What some panels need beyond gpunode-exporter and node_exporter (docs/dashboards.md lists them).
DCGM = "dcgm-exporter"
PEERS = "at least precursor.min_peers nodes in a peer group"
PFC = "a NIC whose driver reports per-priority pause frames (mlx5, ice)"
NFS_MOUNT = "an NFS mount that node_exporter sees"


@dataclass
class Board:
    """One dashboard under construction, bound to a spec (selectors, labels, recording rule names)."""

    spec: dict[str, Any]
    per_node: bool  # the node dashboard filters every series by $node
    builder: gd.Dashboard
    # panel title -> what beyond gpunode-exporter and node_exporter it needs to show data
    needs: dict[str, str] = field(default_factory=dict)
    _next_id: int = 1
    _x: int = 0

    @property
    def node(self) -> str:
        return str(self.spec["labels"]["node"])

    @property
    def peer_labels(self) -> list[str]:
        return [label for label in self.spec["labels"]["peer_group"] if label != "job"]

    def sel(self, metric: str, source: str = "gpunode", *matchers: str) -> str:
        """metric{the source's selector, the dashboard's variables, matchers...}."""
        scope = []
        if source == "gpunode":
            scope = ['job=~"$job"', *(f'{label}=~"${label}"' for label in self.peer_labels)]
        if self.per_node or source != "gpunode":
            scope.append(f'{self.node}=~"$node"')
        return selector(self.spec, metric, source, *scope, *matchers)

    def recorded(self, prefix: str) -> str:
        """A recording rule of the pack rendered from this spec, by its name up to the window
        (gpunode:nfs_rpc_queue_seconds_per_request: -> ...:rate5m), so spec windows carry over."""
        names = [n for n in recording_rules(self.spec) if n.startswith(prefix)]
        if len(names) != 1:
            raise ValueError(f"{prefix!r} matches {len(names)} recording rules of the rule pack: {names}")
        return names[0]

    def row(self, title: str) -> None:
        self.builder.with_row(gd.Row(title).id(self._take_id()))
        self._x = 0

    def panel(self, kind: Builder[Any], title: str, description: str, unit: str,
              queries: list[tuple[str, str]], width: int = 12, instant: bool = False, needs: str = "") -> None:
        """A panel of `kind` (a panel builder of the SDK) with (expr, legend) queries A, B, ..."""
        kind.id(self._take_id()).title(title).description(description).unit(unit).datasource(DATASOURCE)
        kind.height(PANEL_HEIGHT).span(width)
        for ref, (expr, legend) in zip("ABCDEFGH", queries, strict=False):
            query = prometheus.Dataquery().ref_id(ref).expr(expr).legend_format(legend)
            kind.with_target(query.instant() if instant else query.range())
        self.builder.with_panel(kind)
        if needs:
            self.needs[title] = needs

    def _take_id(self) -> int:
        self._next_id += 1
        return self._next_id - 1


def recording_rules(spec: dict[str, Any]) -> dict[str, str]:
    """Recording rule name -> expression, of the rule pack rendered from spec."""
    rules: dict[str, str] = {}
    for text in render_rules(spec, "prometheus").values():
        for group in yaml.safe_load(text)["groups"]:
            rules.update({r["record"]: r["expr"] for r in group["rules"] if "record" in r})
    return rules


def variables(spec: dict[str, Any], per_node: bool) -> list[Builder[model.VariableModel]]:
    """datasource, job, the peer-group labels beyond job, and (per node) node."""
    build_info = "gpunode_exporter_build_info"
    node, peers = spec["labels"]["node"], [p for p in spec["labels"]["peer_group"] if p != "job"]
    found = [gd.DatasourceVariable("datasource").label("Data source").type("prometheus")]

    def query_variable(name: str, label: str, matchers: list[str], multi: bool) -> gd.QueryVariable:
        values = f"label_values({selector(spec, build_info, 'gpunode', *matchers)}, {label})"
        var = gd.QueryVariable(name).label(label).datasource(DATASOURCE).query(values)
        var.refresh(model.VariableRefresh.ON_TIME_RANGE_CHANGED).sort(model.VariableSort.ALPHABETICAL_ASC)
        return var.multi(multi).include_all(multi)

    scope = ['job=~"$job"']
    found.append(query_variable("job", "job", [], True))
    for label in peers:
        found.append(query_variable(label, label, list(scope), True))
        scope.append(f'{label}=~"${label}"')
    if per_node:
        found.append(query_variable("node", node, scope, False))
    return found


_VARIABLE = re.compile(r"\$(?:\{(\w+)(?::\w+)?\}|(\w+))")


def expand(expr: str, values: dict[str, str], rate_interval: str) -> str:
    """expr as Grafana sends it with one value selected per variable."""
    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        return rate_interval if name == "__rate_interval" else values[name]
    return _VARIABLE.sub(value, expr)
