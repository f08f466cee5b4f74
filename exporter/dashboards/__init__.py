"""Grafana dashboards built by code from the rule pack's spec: `gpunode-exporter dashboards render`.

The spec gives the selectors, the node and peer-group labels and the windows (so recording
rule names match the rules rendered from the same spec). Each file is importable: a
datasource input (__inputs) and a datasource variable; stable uids.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from exporter.config import ConfigError

try:
    from grafana_foundation_sdk.builders import dashboard as gd
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
except ImportError:  # an optional dependency: nodes that only serve metrics don't need it
    gd = None

SDK_MISSING = "dashboards need Grafana's SDK: pip install 'gpunode-exporter[dashboards]'"


@dataclass(frozen=True)
class Built:
    filename: str
    dashboard: dict[str, Any]
    needs: dict[str, str]  # panel title -> what, beyond gpunode-exporter and node_exporter, it needs


@dataclass(frozen=True)
class PanelQuery:
    dashboard_uid: str
    panel_title: str
    ref_id: str
    expr: str
    instant: bool


def build(spec: dict[str, Any]) -> list[Built]:
    if gd is None:
        raise ConfigError(SDK_MISSING)
    from exporter.dashboards import board, cluster, node

    built = []
    for module, per_node in ((cluster, False), (node, True)):
        uid, title, description = module.describe(spec)
        builder = gd.Dashboard(title).uid(uid).description(description).tags(["gpunode"])
        builder.time("now-6h", "now").refresh("30s").timezone("browser").readonly()
        builder.variables(board.variables(spec, per_node))
        b = board.Board(spec, per_node, builder)
        module.build(b)
        data = json.loads(json.dumps(builder.build(), cls=JSONEncoder))
        built.append(Built(f"{uid}.json", _importable(data), b.needs))
    return built


def _importable(data: dict[str, Any]) -> dict[str, Any]:
    """The import form: Grafana asks for a Prometheus datasource (DS_PROMETHEUS) on import."""
    data["__inputs"] = [{"name": "DS_PROMETHEUS", "label": "Prometheus", "type": "datasource",
                         "pluginId": "prometheus", "pluginName": "Prometheus"}]
    data["__requires"] = [{"type": "grafana", "id": "grafana", "name": "Grafana", "version": "10.1.0"},
                          {"type": "datasource", "id": "prometheus", "name": "Prometheus", "version": "1.0.0"}]
    for variable in data["templating"]["list"]:
        if variable["type"] == "datasource":
            variable["current"] = {"selected": False, "text": "Prometheus", "value": "${DS_PROMETHEUS}"}
    return data


def render(spec: dict[str, Any]) -> dict[str, str]:
    """File name -> JSON text, stable byte for byte."""
    return {b.filename: json.dumps(b.dashboard, indent=2, sort_keys=True) + "\n" for b in build(spec)}


def panel_queries(dashboard: dict[str, Any]) -> list[PanelQuery]:
    return [PanelQuery(dashboard["uid"], panel["title"], target["refId"], target["expr"], bool(target.get("instant")))
            for panel in dashboard["panels"] if panel["type"] != "row" for target in panel.get("targets", [])]
