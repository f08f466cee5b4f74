"""What every dashboard shares: the spec's variables and selectors, and a panel builder that
insists on a title, a description, a unit and the datasource variable, and writes into each
description the exporters its queries need (derived from the queries, not typed by hand).

Built with Grafana's own SDK (grafana-foundation-sdk), so the JSON follows Grafana's schema.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from grafana_foundation_sdk.builders import common, heatmap, prometheus, stat, statetimeline, table, timeseries
from grafana_foundation_sdk.builders import dashboard as gd
from grafana_foundation_sdk.cog.builder import Builder
from grafana_foundation_sdk.models import dashboard as model
from grafana_foundation_sdk.models.common import (
    BigValueColorMode,
    BigValueGraphMode,
    SortOrder,
    TooltipDisplayMode,
    VisibilityMode,
)
from grafana_foundation_sdk.models.heatmap import HeatmapColorMode
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

from gpunode_rulepack import events as events  # the panels' event counts are the rules'
from gpunode_rulepack import selector
from gpunode_rulepack.dashboards.grafana import expand as expand  # where tests/test_demo.py imports it from
from gpunode_rulepack.dashboards.promql import EXPORTERS, Lineage, exporter_of

DATASOURCE_VARIABLE, NODE_VARIABLE = "datasource", "node"  # on both dashboards: links carry them over
DATASOURCE = model.DataSourceRef(type_val="prometheus", uid=f"${{{DATASOURCE_VARIABLE}}}")
PANEL_HEIGHT = 8
# One series per gpunode-exporter target: the variables list its jobs, peer groups and nodes.
BUILD_INFO = "gpunode_exporter_build_info"
# What some panels need beyond the exporters (those are derived from the queries).
PEERS = "at least precursor.min_peers nodes in a peer group"
FAILSLOW_PEERS = "at least failslow.min_peers nodes in a peer group"
FAILSLOW_INPUT = ("dcgm-exporter, or node_exporter's counters of NICs matching failslow.network_devices "
                  "or of RDMA ports")
PFC = "a NIC whose driver reports per-priority pause frames (mlx5, ice)"
JOB_PAST = "a job that has run for failslow.own_coverage of failslow.own_baseline (about 2.5 hours)"
NFS_MOUNT = "an NFS mount that node_exporter sees"
SAVES = "checkpoint.min_saves saves within checkpoint.interval_window"
WORKLOADS = "nodes running a job (gpunode_node_workload_info, docs/workloads.md)"
RESTARTS = "a job restart: a node starting a new workload within goodput.restart_within of another"
MEASURED_MTBF = "goodput.min_failures job restarts within goodput.mtbf_window"
JOB_RECOVERY = "gpunode-remediate's job recovery (policy jobs.enabled)"
KERNEL_EVENTS = "a kernel event past Xid logged (docs/kernel-events.md)"
SXIDS = "an NVSwitch SXid logged (a node with NVSwitches)"
NFS_SILENT = "an NFS server the kernel reported not responding"
# node_exporter reads the host's sysfs: ports only where the host has RDMA devices.
RDMA_PORTS = "an RDMA port node_exporter's infiniband collector sees (InfiniBand or RoCE)"
GPU_FABRIC = "GPUs on an NVLink fabric (NVSwitch systems: HGX and DGX H100 and later)"
PEER_ADAPTERS = "RDMA adapters of one model (hca_type, board_id) on at least fabric.peer_min_nodes nodes"
PORTS_EXPECTED = "fabric.ports_expected set in the exporter's configuration"
NVSWITCHES_EXPECTED = "gpu.nvswitches_expected set in the exporter's configuration"
PORT_ALERTS = "a fabric port alert firing (GpuNodeFabricPortDown, ...Flapping, ...Degraded)"
DCGM = EXPORTERS["dcgm"]
REMEDIATE = EXPORTERS["remediate"]
_ORDER = ("gpunode", "node", "dcgm", "remediate")  # Prometheus' own `up` is always there: never named as a need


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str = ""
    unit: str = ""      # a unit of its own (a count beside bytes per second): on the right axis
    right: bool = False
    # its values' names (value -> (name, colour)), where the panel's queries name the same values differently
    names: dict[str, tuple[str, str]] | None = None


@dataclass(frozen=True)
class PanelInfo:
    """A panel as docs/dashboards.md lists it."""

    title: str
    row: str
    needs: frozenset[str]   # exporters a query of the panel returns nothing without
    reads: frozenset[str]   # exporters any query of the panel reads
    conditions: tuple[str, ...]


@dataclass
class Board:
    """One dashboard under construction, bound to a spec (selectors, labels, recording rule names)."""

    spec: dict[str, Any]
    builder: gd.Dashboard
    lineage: Lineage
    panels: list[PanelInfo] = field(default_factory=list)
    _next_id: int = 1
    _row: str = ""

    @property
    def node(self) -> str:
        return str(self.spec["labels"]["node"])

    @property
    def peer_labels(self) -> list[str]:
        return peer_labels(self.spec)

    def q(self, metric: str, *matchers: str) -> str:
        """metric{its exporter's spec selector, the dashboard's variables, matchers...}.

        A recording rule gets no exporter selector: its series keep the job of whichever
        exporter fed it (a precursor signal from node_exporter has node_exporter's job).
        gpunode-remediate's series get no variables: one service acts for the whole fleet."""
        source = exporter_of(metric)
        if source == "remediate":
            return selector(self.spec, metric, source, *matchers)
        scope = [f'{self.node}=~"${NODE_VARIABLE}"']
        if source == "gpunode":
            scope = ['job=~"$job"', *(f'{label}=~"${label}"' for label in self.peer_labels), *scope]
        if source is None:
            return f"{metric}{{{', '.join([*scope, *matchers])}}}"
        return selector(self.spec, metric, source, *scope, *matchers)

    def rec(self, prefix: str, *matchers: str) -> str:
        """A recording rule of the pack rendered from this spec, by its name up to the window
        (gpunode:nfs_rpc_queue_seconds_per_request: -> ...:rate5m), so spec windows carry over."""
        names = [n for n in self.lineage.records if n.startswith(prefix)]
        if len(names) != 1:
            raise ValueError(f"{prefix!r} matches {len(names)} recording rules of the rule pack: {names}")
        return self.q(names[0], *matchers)

    def alerts(self) -> str:
        """The pack's firing alerts. `$node|` also matches an empty label: alerts of a whole peer
        group (CheckpointIntervalTooLong) carry no node and stay in view. The remediation service's
        carry its own target labels, no node's: the cluster dashboard's Remediation row lists them."""
        return (f'ALERTS{{alertstate="firing", alertname=~"{ALERT_NAMES}", alertname!~"{REMEDIATION_ALERTS}", '
                f'{self.node}=~"${NODE_VARIABLE}|"}}')

    def row(self, title: str) -> None:
        self.builder.with_row(gd.Row(title).id(self._take_id()))
        self._row = title

    def panel(self, kind: Builder[Any], title: str, description: str, unit: str, queries: list[Query],
              width: int = 12, instant: bool = False, needs: tuple[str, ...] = ()) -> None:
        """A panel of `kind` (a panel builder of the SDK) with queries A, B, ...; instant ones as a
        table, joined into one row per series when there are several."""
        reads = [self.lineage.reads(query.expr) for query in queries]
        info = PanelInfo(title, self._row, frozenset().union(*(r.requires for r in reads)),
                         frozenset().union(*(r.sources for r in reads)), needs)
        self.panels.append(info)
        kind.id(self._take_id()).title(title).description(f"{description} {_needs_sentence(info)}")
        kind.unit(unit).datasource(DATASOURCE).height(PANEL_HEIGHT).span(width)
        for ref, query in zip("ABCDEFGH", queries, strict=False):
            target = prometheus.Dataquery().ref_id(ref).expr(query.expr).legend_format(query.legend)
            kind.with_target(target.instant().format(PromQueryFormat.TABLE) if instant else target.range())
            props = [model.DynamicConfigValue("unit", query.unit)] if query.unit else []
            if query.right:
                props.append(model.DynamicConfigValue("custom.axisPlacement", "right"))
            if query.names:
                props.append(model.DynamicConfigValue("mappings", [value_map(query.names)]))
            if props:
                kind.override_by_query(ref, props)
        if instant and len(queries) > 1:
            kind.with_transformation(model.DataTransformerConfig(id_val="merge", options={}))
        self.builder.with_panel(kind)

    def _take_id(self) -> int:
        self._next_id += 1
        return self._next_id - 1


# The panel kinds, each with options set (the SDK leaves a panel's options null otherwise).
def time_series() -> timeseries.Panel:
    """Its tooltip lists every series, largest first: the odd node out among many."""
    tooltip = common.VizTooltipOptions().mode(TooltipDisplayMode.MULTI).sort(SortOrder.DESCENDING)
    return timeseries.Panel().tooltip(tooltip)


def table_panel() -> table.Panel:
    return table.Panel().show_header(True)


def stat_panel() -> stat.Panel:
    """The last value of each query, large, without a sparkline."""
    return stat.Panel().graph_mode(BigValueGraphMode.NONE).color_mode(BigValueColorMode.BACKGROUND).reduce_options(
        common.ReduceDataOptions().calcs(["lastNotNull"]).values(False))


def state_timeline() -> statetimeline.Panel:
    return statetimeline.Panel().show_value(VisibilityMode.AUTO)


def heatmap_panel() -> heatmap.Panel:
    """One row per series (node), coloured by value: the data is not bucketed again."""
    colors = heatmap.HeatmapColorOptions().mode(HeatmapColorMode.SCHEME).scheme("Oranges").steps(64)
    return heatmap.Panel().calculate(False).show_tooltip().color(colors)


# The values of gpunode:checkpoint_phase:node (checkpoint.rules.yml).
PHASES = {"0": ("training", "green"), "1": ("saving", "blue"), "2": ("loading", "orange")}
# gpunode_nfs_server_responding's values.
RESPONDING = {"0": ("not responding", "red"), "1": ("responding", "green")}
# node_exporter's infiniband collector: an RDMA port's logical state (sysfs `state`) and physical
# state (`phys_state`), the numbers of the InfiniBand specification's PortInfo.
PORT_STATES = {"1": ("DOWN", "red"), "2": ("INIT", "orange"), "3": ("ARMED", "yellow"), "4": ("ACTIVE", "green"),
               "5": ("ACTIVE_DEFER", "green")}
PHYSICAL_STATES = {"1": ("Sleep", "red"), "2": ("Polling", "orange"), "3": ("Disabled", "red"),
                   "4": ("PortConfigurationTraining", "yellow"), "5": ("LinkUp", "green"),
                   "6": ("LinkErrorRecovery", "orange"), "7": ("PhyTest", "purple")}
# gpunode_gpu_fabric_state's values (NVML's GPU fabric states), and gpunode_gpu_fabric_healthy's.
FABRIC_STATES = {"1": ("not started", "red"), "2": ("in progress", "orange"), "3": ("completed", "green")}
FABRIC_HEALTHY = {"0": ("unhealthy", "red"), "1": ("healthy", "green")}


def value_map(names: dict[str, tuple[str, str]]) -> model.ValueMap:
    """Values (value -> (name, colour)) shown as their names."""
    return model.ValueMap({value: model.ValueMappingResult(text=text, color=color, index=i)
                           for i, (value, (text, color)) in enumerate(names.items())})


def named_values(panel: Builder[Any], names: dict[str, tuple[str, str]]) -> Builder[Any]:
    """A panel whose values (value -> (name, colour)) show as their names."""
    return panel.mappings([value_map(names)])


def phases(panel: Builder[Any]) -> Builder[Any]:
    """A panel of the phase recording, its values shown as their names."""
    return named_values(panel, PHASES)



def to_node(panel: Builder[Any], node_label: str, node_uid: str) -> Builder[Any]:
    """A panel of per-node series whose values open their node on the node dashboard (uid
    node_uid), keeping the time range and data source. A table's row has its node as a field
    (its query's labels become columns); a series has it as a label."""
    source = "__data.fields" if isinstance(panel, table.Panel) else "__field.labels"
    node = f"${{{source}.{node_label}}}"
    url = (f"/d/{node_uid}?var-{NODE_VARIABLE}={node}&var-{DATASOURCE_VARIABLE}=${{{DATASOURCE_VARIABLE}}}"
           "&${__url_time_range}")
    return panel.data_links([gd.DashboardLink(f"{node} on the node dashboard").url(url)])


# Every alert of the rule pack (tests/test_dashboards.py checks this covers them); those about the
# remediation service (remediate.rules.yml: the service itself, and the job retry chains it held), in a
# table of their own.
ALERT_NAMES = "Gpu.*|Nfs.*|Checkpoint.*"
REMEDIATION_ALERTS = "GpuRemediation.*|GpuJobRetryChainStopped"


def peer_labels(spec: dict[str, Any]) -> list[str]:
    """The peer-group labels that get a variable of their own: job always has one."""
    return [label for label in spec["labels"]["peer_group"] if label != "job"]


def needs_names(sources: frozenset[str], joiner: str = ",") -> str:
    """The exporters' names, in a fixed order: "gpunode-exporter, node_exporter" (or "... and ...")."""
    names = [EXPORTERS[s] for s in _ORDER if s in sources]
    if joiner == "," or len(names) < 2:
        return ", ".join(names)
    return f"{', '.join(names[:-1])} {joiner} {names[-1]}"


def _needs_sentence(info: PanelInfo) -> str:
    """Which exporters the panel needs, from what its queries read (promql.Lineage)."""
    needs, optional = info.needs & set(_ORDER), (info.reads - info.needs) & set(_ORDER)
    parts = []
    if needs:
        parts.append(f"Needs {needs_names(needs, 'and')}.")
        if optional:
            parts.append(f"Reads {needs_names(optional, 'and')} too, where present.")
    elif optional:
        parts.append(f"Needs any of {needs_names(optional, 'or')}: each feeds part of it.")
    if info.conditions:
        parts.append(f"Shows data only with {'; '.join(info.conditions)}.")
    return " ".join(parts)


def variables(spec: dict[str, Any], per_node: bool) -> list[Builder[model.VariableModel]]:
    """datasource; job and the other peer-group labels, among gpunode-exporter's targets (the
    spec's gpunode selector); node, among those targets' nodes: one on the node dashboard, any
    number on the cluster dashboard."""
    node = spec["labels"]["node"]
    found: list[Builder[model.VariableModel]] = [
        gd.DatasourceVariable(DATASOURCE_VARIABLE).label("Data source").type("prometheus")]

    def query_variable(name: str, label: str, scope: list[str]) -> gd.QueryVariable:
        values = f"label_values({selector(spec, BUILD_INFO, 'gpunode', *scope)}, {label})"
        var = gd.QueryVariable(name).label(label).datasource(DATASOURCE).query(values)
        return var.refresh(model.VariableRefresh.ON_TIME_RANGE_CHANGED).sort(model.VariableSort.ALPHABETICAL_ASC)

    every = model.VariableOption(selected=True, text=["All"], value=["$__all"])
    scope: list[str] = []
    for label in ["job", *peer_labels(spec)]:
        # All as .*: these filter gpunode series only (and the node list); a short regex at any size
        var = query_variable(label, label, list(scope)).multi(True).include_all(True).all_value(".*")
        found.append(var.current(every))
        scope.append(f'{label}=~"${label}"')
    nodes = query_variable(NODE_VARIABLE, node, scope)
    if not per_node:  # All lists the nodes, so the job choice reaches every exporter's series
        nodes.multi(True).include_all(True).current(every)
    found.append(nodes)
    return found


def needs_of(panels: list[PanelInfo]) -> dict[str, str]:
    """Panel title -> what it needs beyond gpunode-exporter and node_exporter, for the panels
    that need more (tests/test_demo.py: these, and only these, stay empty in the demo)."""
    found = {}
    for info in panels:
        parts = [EXPORTERS[s] for s in _ORDER if s in info.needs and s not in ("gpunode", "node")]
        if text := "; ".join([*parts, *info.conditions]):
            found[info.title] = text
    return found

