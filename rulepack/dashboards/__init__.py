"""Grafana dashboards built by code from the rule pack's spec: `gpunode-exporter dashboards render`.

The spec gives the selectors, the node and peer-group labels and the windows (so recording
rule names match the rules rendered from the same spec). Each file is importable: a
datasource input (__inputs) and a datasource variable; stable uids; sorted keys, so the same
spec gives the same bytes.

The API for tests against a live Prometheus: render(spec) -> {file name: dashboard},
panel_queries(dashboard, spec) -> the queries with the exporters they read, expand() -> a query
as Grafana sends it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from gpunode_common.config import ConfigError
from gpunode_rulepack import load_spec
from gpunode_rulepack.dashboards.grafana import expand

try:
    from grafana_foundation_sdk.builders import dashboard as gd
    from grafana_foundation_sdk.cog.encoder import JSONEncoder

    from gpunode_rulepack.dashboards import board, cluster, node
    from gpunode_rulepack.dashboards.promql import Lineage
except ImportError:  # optional dependencies: nodes that only serve metrics don't need them
    gd = None

SDK_MISSING = "dashboards need Grafana's SDK and promql-parser: pip install 'gpunode-exporter[dashboards]'"
GRAFANA_VERSION = "10.1.0"  # the SDK's: the JSON follows this version's schema


@dataclass(frozen=True)
class PanelQuery:
    dashboard_uid: str
    panel_title: str
    ref_id: str
    expr: str
    sources: frozenset[str]   # exporters whose series it reads: gpunode, node, dcgm, remediate (prometheus: `up`)
    requires: frozenset[str]  # of those, the ones it returns nothing without
    instant: bool             # an instant query (tables), else a range query


class Dashboard(dict[str, Any]):
    """A dashboard's JSON that remembers the spec it was rendered from: panel_queries() needs
    that spec's rule pack to tell what the recording rules read."""

    spec: dict[str, Any] | None = None


@dataclass(frozen=True)
class Built:
    filename: str
    dashboard: Dashboard
    panels: list[board.PanelInfo]  # in order

    @property
    def needs(self) -> dict[str, str]:
        """Panel title -> what, beyond gpunode-exporter and node_exporter, it needs."""
        return board.needs_of(self.panels)


def build(spec: dict[str, Any]) -> list[Built]:
    if gd is None:
        raise ConfigError(SDK_MISSING)
    lineage = Lineage.of(spec)
    built = []
    for module, per_node in ((cluster, False), (node, True)):
        uid, title, description = module.describe(spec)
        builder = gd.Dashboard(title).uid(uid).description(description).tags(["gpunode"])
        builder.time("now-6h", "now").refresh("30s").timezone("browser").readonly()
        builder.variables(board.variables(spec, per_node))
        b = board.Board(spec, builder, lineage)
        module.build(b)
        data = Dashboard(_importable(json.loads(json.dumps(builder.build(), cls=JSONEncoder))))
        data.spec = spec
        built.append(Built(f"{uid}.json", data, b.panels))
    return built


def _importable(data: dict[str, Any]) -> dict[str, Any]:
    """The import form, which the SDK does not produce: Grafana asks for a Prometheus data
    source (DS_PROMETHEUS) on import and makes it the datasource variable's default."""
    data["__inputs"] = [{"name": "DS_PROMETHEUS", "label": "Prometheus", "type": "datasource",
                         "pluginId": "prometheus", "pluginName": "Prometheus"}]
    data["__requires"] = [{"type": "grafana", "id": "grafana", "name": "Grafana", "version": GRAFANA_VERSION},
                          {"type": "datasource", "id": "prometheus", "name": "Prometheus", "version": "1.0.0"}]
    for variable in data["templating"]["list"]:
        if variable["type"] == "datasource":
            variable["current"] = {"selected": False, "text": "Prometheus", "value": "${DS_PROMETHEUS}"}
    return data


def render(spec: dict[str, Any]) -> dict[str, Dashboard]:
    """File name -> dashboard JSON (a dict)."""
    return {b.filename: b.dashboard for b in build(spec)}


def dumps(dashboard: dict[str, Any]) -> str:
    """A dashboard's file text, stable byte for byte."""
    return json.dumps(dashboard, indent=2, sort_keys=True) + "\n"


def files(spec: dict[str, Any]) -> dict[str, str]:
    """File name -> file text: what `dashboards render` writes."""
    return {name: dumps(board) for name, board in render(spec).items()}


def panel_queries(dashboard: dict[str, Any], spec: dict[str, Any] | None = None) -> list[PanelQuery]:
    """Every query of a dashboard, with the exporters it reads, as the rule pack rendered from
    the dashboard's spec says recording rules read them. The spec: this argument, else the one
    render() used, else (a dashboard read from a file) the shipped spec."""
    if gd is None:
        raise ConfigError(SDK_MISSING)
    spec = spec if spec is not None else getattr(dashboard, "spec", None)
    lineage = Lineage.of(spec if spec is not None else load_spec())
    found = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            reads = lineage.reads(target["expr"])
            found.append(PanelQuery(dashboard["uid"], panel["title"], target["refId"], target["expr"],
                                    reads.sources, reads.requires, bool(target.get("instant"))))
    return found


__all__ = ["SDK_MISSING", "Built", "Dashboard", "PanelQuery", "build", "dumps", "expand", "files", "panel_queries",
           "render"]
