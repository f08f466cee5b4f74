"""The Grafana dashboards: drift against the code, the panel conventions, queries that parse and
name only real series, the spec carried through, the exporters each query reads, the docs' lists,
the CLI. (The queries run against a real Prometheus in tests/test_demo.py.)"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import pytest
import yaml

promql_parser = pytest.importorskip("promql_parser")
pytest.importorskip("grafana_foundation_sdk")

import gpunode_rulepack  # noqa: E402
from gpunode_common.family import MetricSpec  # noqa: E402
from gpunode_common.kernel_families import FAMILIES, RECOVERIES  # noqa: E402
from gpunode_exporter.collector import COLLECTORS  # noqa: E402
from gpunode_exporter.scrape import EXPORTER_METRICS  # noqa: E402
from gpunode_exporter.xid.kernel import KINDS  # noqa: E402
from gpunode_remediate import metrics as remediate_metrics  # noqa: E402
from gpunode_rulepack import dashboards  # noqa: E402
from gpunode_rulepack.dashboards import doc  # noqa: E402
from gpunode_rulepack.dashboards.board import ALERT_NAMES  # noqa: E402
from gpunode_rulepack.dashboards.promql import Lineage  # noqa: E402

ROOT = Path(__file__).parent.parent
DOCS = ROOT / "docs" / "dashboards.md"
SPEC = gpunode_rulepack.load_spec()
SHIPPED = dashboards.build(SPEC)
BOARDS = {b.dashboard["uid"]: b.dashboard for b in SHIPPED}
RANGE = re.compile(r"\[([^\]]+)\]")
OFFSET = re.compile(r"offset (\$?[\w]+)")
# Grafana's range and intervals, as the tests below expand queries with them.
GRAFANA_RANGE = "1h"
# The node_exporter and dcgm-exporter series the rule pack reads (rules/external-metrics.yaml)
# and the few more the dashboards read, checked in node_exporter's e2e fixture.
EXTERNAL = {name for group in yaml.safe_load((ROOT / "rules" / "external-metrics.yaml").read_text()).values()
            for name in group} | {"node_memory_Dirty_bytes", "node_memory_Writeback_bytes",
                                  "node_filesystem_size_bytes", "node_filesystem_avail_bytes",
                                  "node_infiniband_physical_state_id"}
# The remediation service's metrics (remediate/metrics.py), declared as the exporter's are.
REMEDIATE_METRICS = [s for s in vars(remediate_metrics).values() if isinstance(s, MetricSpec)]
# The fabric panels' titles name the spec's windows.
SPEC_LOOKBACK, SPEC_FLAPS = (gpunode_rulepack.duration(SPEC["fabric"][k]) for k in ("rate_lookback", "flap_window"))
# Grafana unit ids the panels use (a typo would show raw numbers).
UNITS = {"short", "bytes", "Bps", "s", "percent", "percentunit", "pps", "reqps", "dateTimeAsIso"}


def panels(board: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in board["panels"] if p["type"] != "row"]


def variables(board: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in board["templating"]["list"]}


def one_value_each(board: dict[str, Any]) -> dict[str, str]:
    return {name: f"{name}-1" for name, v in variables(board).items() if v["type"] == "query"}


def selectors(expr: str) -> list[Any]:
    found: list[Any] = []
    promql_parser.walk(promql_parser.parse(expr), lambda n: found.append(n) if isinstance(
        n, promql_parser.VectorSelector) else None)
    return found


def carries(node: Any, label: str) -> bool:
    """Whether a query's result series carry `label`: an aggregation keeps only what it groups by
    (topk and bottomk keep every label), a binary operation what its vector sides carry (`and` and
    `unless` its left side's), and
    every selector here has the node label (test_variables_scope_every_query_to_the_chosen_nodes)."""
    if isinstance(node, promql_parser.AggregateExpr):
        if str(node.op) in ("topk", "bottomk"):
            return carries(node.expr, label)
        if node.modifier is None:
            return False
        grouped = label in node.modifier.labels
        return grouped if node.modifier.type == promql_parser.AggModifierType.By else \
            not grouped and carries(node.expr, label)
    if isinstance(node, promql_parser.VectorSelector | promql_parser.MatrixSelector):
        return True
    if isinstance(node, promql_parser.BinaryExpr):  # `and`, `unless`: the left side's series only
        return carries(node.lhs, label) or (str(node.op) not in ("and", "unless") and carries(node.rhs, label))
    if isinstance(node, promql_parser.Call):
        return any(carries(arg, label) for arg in node.args)
    if isinstance(node, promql_parser.ParenExpr | promql_parser.UnaryExpr | promql_parser.SubqueryExpr):
        return carries(node.expr, label)
    return False  # literals


def node_links(board: dict[str, Any], spec: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Panel title -> its data links, for the panels whose series or rows are nodes; the others must have none."""
    label, found = spec["labels"]["node"], {}
    for panel in panels(board):
        links = panel["fieldConfig"]["defaults"].get("links", [])
        exprs = [dashboards.expand(t["expr"], one_value_each(board), "1m", range_=GRAFANA_RANGE)
                 for t in panel["targets"]]
        if any(carries(promql_parser.parse(expr), label) for expr in exprs):
            found[panel["title"]] = links
        else:
            assert not links, f"{panel['title']}: its series are no nodes, yet it links to {links}"
    return found


def test_committed_files_are_what_the_code_renders() -> None:
    committed = {p.name: p.read_text() for p in (ROOT / "dashboards").glob("*.json")}
    assert committed == dashboards.files(SPEC), "dashboards/ is stale: run `make dashboards`"
    assert dashboards.files(SPEC) == dashboards.files(gpunode_rulepack.load_spec()), "rendering is not deterministic"


def test_importable_with_a_datasource_input_and_stable_uids() -> None:
    assert list(BOARDS) == ["gpunode-cluster", "gpunode-node"]
    assert [b.filename for b in SHIPPED] == ["gpunode-cluster.json", "gpunode-node.json"]
    for board in BOARDS.values():
        assert board["__inputs"] == [{"name": "DS_PROMETHEUS", "label": "Prometheus", "type": "datasource",
                                      "pluginId": "prometheus", "pluginName": "Prometheus"}]
        assert {(r["type"], r["id"]) for r in board["__requires"]} == {("grafana", "grafana"),
                                                                      ("datasource", "prometheus")}
        ds = variables(board)["datasource"]
        assert (ds["type"], ds["query"], ds["current"]["value"]) == ("datasource", "prometheus", "${DS_PROMETHEUS}")
        ids = [p["id"] for p in board["panels"]]
        assert len(ids) == len(set(ids))


def test_variables_scope_every_query_to_the_chosen_nodes() -> None:
    for uid, board in BOARDS.items():
        found = variables(board)
        assert list(found) == ["datasource", "job", "node"]
        assert found["job"]["query"] == 'label_values(gpunode_exporter_build_info{job="gpunode"}, job)'
        assert found["node"]["query"] == ('label_values(gpunode_exporter_build_info{job="gpunode", job=~"$job"}, '
                                          'instance)')
        assert found["job"]["multi"] and found["job"]["includeAll"] and found["job"]["allValue"] == ".*"
        # one node on the node dashboard; any number on the cluster's, All listing them (no allValue)
        assert found["node"].get("multi", False) == found["node"].get("includeAll", False) == (uid == "gpunode-cluster")
        assert "allValue" not in found["node"]
        for query in dashboards.panel_queries(board):
            if query.sources == {"remediate"}:  # gpunode-remediate: one service for the fleet, no node's
                assert "$node" not in query.expr and "$job" not in query.expr, (query.panel_title, query.expr)
                continue
            assert '=~"$node' in query.expr, (query.panel_title, query.expr)


@pytest.mark.parametrize("uid", BOARDS)
def test_every_panel_has_a_description_a_unit_and_the_datasource_variable(uid: str) -> None:
    found = panels(BOARDS[uid])
    assert len(found) >= 15
    for panel in found:
        assert len(panel.get("description", "")) > 60 and "Needs " in panel["description"], panel["title"]
        assert panel["fieldConfig"]["defaults"].get("unit") in UNITS, panel["title"]
        for override in panel["fieldConfig"]["overrides"]:
            assert all(p["value"] in UNITS for p in override["properties"] if p["id"] == "unit"), panel["title"]
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"] and all(t["expr"] and t["refId"] for t in panel["targets"]), panel["title"]


@pytest.mark.parametrize("uid", BOARDS)
def test_every_query_parses_and_ranges_are_rate_interval_or_spec_windows(uid: str) -> None:
    board = BOARDS[uid]
    remap = SPEC["remap"]
    windows = {"$__rate_interval", *(gpunode_rulepack.duration(remap[k]) for k in
                                     ("acceleration_short_window", "acceleration_long_window"))}
    for query in dashboards.panel_queries(board):
        expr = dashboards.expand(query.expr, one_value_each(board), "1m", range_=GRAFANA_RANGE, dashboard=board)
        assert not re.search(r"\$(?!\d)", expr), expr  # every variable expanded ($1: label_replace's group)
        promql_parser.parse(expr)
        assert set(RANGE.findall(query.expr)) <= windows, (query.panel_title, query.expr)
        # events counted over the interval, or (tables) over the dashboard's time range
        assert set(OFFSET.findall(query.expr)) <= windows | {"$__range"}, (query.panel_title, query.expr)


def test_every_metric_and_label_exists() -> None:
    """Names in the queries are the exporter's, recording rules of the pack, ALERTS, or the few
    node_exporter and dcgm-exporter series listed above; a gpunode series is matched only on its
    own labels and the targets' (job, node, peer group)."""
    specs = {s.name: s for s in EXPORTER_METRICS} | {s.name: s for c in COLLECTORS.values() for s in c.metrics} \
        | {s.name: s for s in REMEDIATE_METRICS}
    # A histogram is read by its samples: _bucket (with le), _sum, _count.
    specs |= {s.name + suffix: replace(s, labels=(*s.labels, "le") if suffix == "_bucket" else s.labels)
              for s in list(specs.values()) if s.kind == "histogram" for suffix in ("_bucket", "_sum", "_count")}
    recorded = set(Lineage.of(SPEC).records)
    target_labels = {"job", SPEC["labels"]["node"], *SPEC["labels"]["peer_group"]}
    for board in BOARDS.values():
        for query in dashboards.panel_queries(board):
            for sel in selectors(dashboards.expand(query.expr, one_value_each(board), "1m", range_=GRAFANA_RANGE)):
                assert sel.name in specs or sel.name in recorded or sel.name in EXTERNAL | {"ALERTS"}, \
                    (query.panel_title, sel.name)
                if sel.name in specs:
                    labels = {m.name for m in sel.matchers.matchers}
                    assert labels <= set(specs[sel.name].labels) | target_labels, (query.panel_title, sel)


def test_cluster_panels_of_nodes_link_each_node_to_the_node_dashboard() -> None:
    """The link names a dashboard uid that exists and that dashboard's own node variable, so
    renaming either without the link fails here; it keeps the time range and the data source."""
    label = SPEC["labels"]["node"]
    linked = node_links(BOARDS["gpunode-cluster"], SPEC)
    assert {"Firing alerts of the rule pack", "GPUs missing or lost", "Checkpoint phase per node",
            "Nodes with the most kernel events", "RDMA ports down, flapping or degraded",
            "NVLink fabric not complete, per node"} <= set(linked)
    unlinked = {p["title"] for p in panels(BOARDS["gpunode-cluster"])} - set(linked)
    assert {"Xids by NVIDIA's action", "NFS time per request: slot wait against network + server",
            "Kernel events by family", "NFS servers not responding", "Fabric alerts firing"} <= unlinked
    for title, links in linked.items():
        assert len(links) == 1, title
        url = urlsplit(links[0]["url"])
        uid = url.path.removeprefix("/d/")
        assert uid in BOARDS and uid != "gpunode-cluster", (title, url)
        target = variables(BOARDS[uid])
        # the target's one-node variable: it lists the node label's values
        node_var = [n for n, v in target.items() if v["type"] == "query" and v["query"].endswith(f", {label})")]
        assert len(node_var) == 1 and not target[node_var[0]].get("multi"), target
        params = dict(parse_qsl(url.query, keep_blank_values=True))
        panel = next(p for p in panels(BOARDS["gpunode-cluster"]) if p["title"] == title)
        # a table's row holds the node as a field (its labels are columns), a series as a label
        value = f"${{__data.fields.{label}}}" if panel["type"] == "table" else f"${{__field.labels.{label}}}"
        assert params.pop(f"var-{node_var[0]}", None) == value, (title, url)
        assert params == {"var-datasource": "${datasource}", "${__url_time_range}": ""}, (title, url)
        assert target["datasource"]["type"] == "datasource"


def test_the_alerts_tables_cover_every_alert_of_the_pack() -> None:
    alerts = Lineage.of(SPEC).alerts
    assert alerts and all(re.fullmatch(ALERT_NAMES, name) for name in alerts)


def query(uid: str, title: str, ref: str = "A") -> dashboards.PanelQuery:
    return next(q for q in dashboards.panel_queries(BOARDS[uid]) if q.panel_title == title and q.ref_id == ref)


def test_sources_follow_recording_rules_to_the_exporters() -> None:
    gpu_util = query("gpunode-node", "1. GPU utilization")
    assert gpu_util.sources == gpu_util.requires == {"dcgm"}
    # any one of seven signals from three exporters makes a score; the peer group's workload comes from
    # gpunode-exporter, joined to its owner by kube-state-metrics for Kubernetes pods
    scores = query("gpunode-cluster", "Precursor peer scores (largest per node)")
    assert scores.sources == {"gpunode", "node", "dcgm", "kube_state_metrics"} and scores.requires == {"gpunode"}
    # bytes from node_exporter over link speeds from gpunode-exporter
    link = query("gpunode-node", "Storage link utilization")
    assert link.sources == link.requires == {"gpunode", "node"}
    # save and training from NFS bytes alone; the load phase also needs GPU utilization
    phase = query("gpunode-node", "Checkpoint phase")
    assert phase.sources == {"gpunode", "dcgm"} and phase.requires == {"gpunode"}
    dirty = query("gpunode-node", "4. Dirty and writeback page cache", "B")
    assert dirty.sources == dirty.requires == {"node"} and not dirty.instant
    assert query("gpunode-cluster", "GPUs with a row remap pending").instant


def test_every_kernel_kind_is_in_one_family_or_a_recovery() -> None:
    """A kind the exporter gains must be given a family, or the cluster dashboard leaves it out."""
    grouped = [kind for kinds in FAMILIES.values() for kind in kinds] + list(RECOVERIES)
    assert sorted(grouped) == sorted(KINDS)


def _series(metric: str, node: str, values: str, **labels: str) -> dict[str, str]:
    pairs = ", ".join(f'{k}="{v}"' for k, v in {"job": "gpunode", "instance": node, **labels}.items())
    return {"series": f"{metric}{{{pairs}}}", "values": values}


def expr(uid: str, title: str, ref: str = "A", node: str = "n.*") -> str:
    """A panel's query as Grafana sends it: a 5m rate interval, a 1h range, job gpunode, nodes `node`."""
    return dashboards.expand(query(uid, title, ref).expr, {"job": "gpunode", "node": node}, "5m",
                             range_=GRAFANA_RANGE)


def samples(**values: float) -> list[dict[str, Any]]:
    """Expected samples, keyed "label=value;label=value" (__name__ too, for a selector's own series)."""
    return [{"labels": "{" + ", ".join(f'{k}="{v}"' for k, v in (pair.split("=") for pair in key.split(";") if pair))
             + "}", "value": value} for key, value in values.items()]


def test_beyond_the_gpu_panels_count_events_in_prometheus(tmp_path: Path) -> None:
    """The kernel-event panels' queries, as Grafana sends them (a 5m rate interval, a 1h range), on
    Prometheus' own engine (promtool): a series born inside the window counts whole, a recovery
    counts in no family, families and nodes add up, and each silent NFS server is counted with the
    nodes that mount it."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (scripts/install-deps.sh --test installs it)")
    kernel, sxid = "gpunode_kernel_events_total", "gpunode_sxid_errors_total"
    series = [  # one sample a minute, minute 0 to 60
        _series(kernel, "n1", "_x30 1x26 2x3", kind="hung_task", device=""),  # born at 30m, again at 58m
        _series(kernel, "n1", "3x39 5x20", kind="oom_kill", device=""),     # 2 more at 40m
        _series(kernel, "n1", "1x60", kind="nic_link_up", device="eth0"),    # a recovery
        _series(kernel, "n2", "_x10 1x50", kind="fs_readonly", device="sdb1"),
        _series(sxid, "n2", "_x50 1x10", switch="0", pci_bus_id="0000:05:00.0", sxid="20034", severity="fatal"),
        *(_series("gpunode_nfs_server_responding", node, f"{v}x60", server="fs1")
          for node, v in (("n1", 0), ("n2", 0), ("n3", 1))),
        _series("gpunode_nfs_server_responding", "n1", "1x60", server="fs2"),
        *(_series("gpunode_nfs_mount_info", node, "1x60", mountpoint="/data", export="fs1:/data", protocol="tcp",
                  server_address="10.0.0.9", device="eth0") for node in ("n1", "n2", "n3", "n4")),
        _series("gpunode_nfs_mount_info", "n1", "1x60", mountpoint="/home", export="fs2:/home", protocol="tcp",
                server_address="10.0.0.8", device="eth0"),
    ]

    cluster, node = "gpunode-cluster", "gpunode-node"
    tests = [
        # at 52m: the SXid born at 50m counts whole; the hung task of 30m is past the 5m window
        (expr(cluster, "Kernel events by family"), "52m",
         samples(**{"family=host hangs": 0, "family=OOM kills": 0, "family=disks and filesystems": 0,
                    "family=NVSwitch": 1})),
        (expr(cluster, "Kernel events by family"), "60m",
         samples(**{"family=host hangs": 1, "family=OOM kills": 0, "family=disks and filesystems": 0,
                    "family=NVSwitch": 0})),
        # over the hour: n1 2 hung tasks (born inside it) + 2 OOM kills, its link's recovery not counted
        (expr(cluster, "Nodes with the most kernel events"), "60m", samples(**{"instance=n1": 4, "instance=n2": 2})),
        (expr(cluster, "NFS servers not responding"), "60m", samples(**{"server=fs1": 2})),
        (expr(cluster, "NFS servers not responding", "B"), "60m", samples(**{"server=fs1": 4})),
        (expr(node, "Kernel events by kind", node="n1"), "60m",
         samples(**{"kind=hung_task": 1, "kind=oom_kill": 0, "kind=nic_link_up": 0})),
        (expr(node, "NVSwitch SXids by switch, code and severity", node="n2"), "52m",
         samples(**{"switch=0;sxid=20034;severity=fatal": 1})),
    ]
    run_promtool(promtool, tmp_path, series, tests)


def test_fabric_panels_show_ports_and_fabrics_in_prometheus(tmp_path: Path) -> None:
    """The Fabric rows' queries, as Grafana sends them, on Prometheus' own engine (promtool): each port's
    states, rate against its highest, flaps and link_downed (saturated at 255 on n2); the port table
    joined per port across node_exporter's and gpunode-exporter's jobs; ports ACTIVE against expected;
    NVSwitches and GPU fabric states per node; the cluster's counts of firing alerts (a pending one left
    out, 0 where none fire), their table with each port's netdev and PCI address, and the nodes whose
    NVLink fabric is not complete."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (scripts/install-deps.sh --test installs it)")
    state, phys, rate = ("node_infiniband_state_id", "node_infiniband_physical_state_id",
                         "node_infiniband_rate_bytes_per_second")
    downed, flaps = "node_infiniband_link_downed_total", "gpunode:fabric_port_flaps:increase1h"
    ports = {("n1", "mlx5_0"): ("4x60", "5x60", "50000000000x60", "0x30 1x10 2x10 3x10"),  # flaps, up
             ("n1", "mlx5_1"): ("4x49 1x11", "5x49 2x11", "50000000000x60", "0x49 1x11"),  # down at 50m
             ("n2", "mlx5_0"): ("4x60", "5x60", "50000000000x29 25000000000x31", "255x60")}  # trained down
    adapter = 'instance="n2", device="mlx5_0", port="1", hca_type="MT4129", board_id="MT_0000000838"'
    series = [
        *(_series(metric, node, values, job="node", device=device, port="1")
          for (node, device), port_values in ports.items()
          for metric, values in zip((state, phys, rate, downed), port_values, strict=True)),
        *({"series": f'{flaps}{{instance="{node}", device="{device}", port="1"}}', "values": values}
          for node, device, values in (("n1", "mlx5_0", "0x30 1x10 2x10 3x10"), ("n1", "mlx5_1", "0x49 1x11"),
                                       ("n2", "mlx5_0", "4x60"))),  # n2: its netdev's carrier counted them
        # the rules' view of n2's rate: while ACTIVE, its highest, and its adapters' median over the fleet
        {"series": f'gpunode:fabric_port_rate_bytes:active{{{adapter}}}', "values": "50000000000x29 25000000000x31"},
        {"series": f'gpunode:fabric_port_rate_bytes:max1d{{{adapter}}}', "values": "50000000000x60"},
        {"series": 'gpunode:fabric_port_rate_bytes:peer_median{hca_type="MT4129", board_id="MT_0000000838"}',
         "values": "50000000000x60"},
        *(_series("gpunode_rdma_port_info", node, "1x60", device=device, port="1", netdev=netdev,
                  link_layer="InfiniBand", pci_address=pci)
          for node, device, netdev, pci in (("n1", "mlx5_0", "ib0", "0000:18:00.0"),
                                            ("n1", "mlx5_1", "ib1", "0000:2a:00.0"),
                                            ("n2", "mlx5_0", "ib0", "0000:18:00.0"))),
        _series("gpunode_fabric_ports_expected", "n1", "2x60"),
        _series("gpunode_nvswitches_visible", "n1", "4x30 3x30", source="pci"),  # a switch gone at 31m
        _series("gpunode_nvswitches_visible", "n3", "4x60", source="pci"),
        *(_series("gpunode_nvswitches_expected", node, "4x60") for node in ("n1", "n3")),
        *(_series("gpunode_gpu_fabric_state", node, values, gpu=gpu, uuid=f"GPU-{node}-{gpu}")
          for node, gpu, values in (("n1", "0", "3x60"), ("n1", "1", "3x60"),
                                    ("n3", "0", "1x60"), ("n3", "1", "2x60"))),  # n3: its fabric manager
        *(_series("gpunode_gpu_fabric_healthy", node, values, gpu=gpu, uuid=f"GPU-{node}-{gpu}")
          for node, gpu, values in (("n1", "0", "1x60"), ("n1", "1", "1x30 0x30"),
                                    ("n3", "0", "1x60"), ("n3", "1", "1x60"))),
        *({"series": "ALERTS{" + ", ".join(f'{k}="{v}"' for k, v in labels.items()) + "}", "values": "1x60"}
          for labels in (
              {"alertname": "GpuNodeFabricPortDown", "alertstate": "firing", "instance": "n1", "device": "mlx5_1",
               "port": "1", "severity": "critical"},
              # n1: one ACTIVE port of the two it should have, no port named
              {"alertname": "GpuNodeFabricPortDown", "alertstate": "firing", "instance": "n1",
               "severity": "critical"},
              {"alertname": "GpuNodeFabricPortDown", "alertstate": "pending", "instance": "n4", "device": "mlx5_0",
               "port": "1", "severity": "critical"},
              {"alertname": "GpuNodeFabricPortFlapping", "alertstate": "firing", "instance": "n2",
               "device": "mlx5_0", "port": "1", "severity": "warning"},
              {"alertname": "GpuNodeFabricPortDegraded", "alertstate": "firing", "instance": "n2",
               "device": "mlx5_0", "port": "1", "severity": "warning"},
              *({"alertname": "GpuFabricNotReady", "alertstate": "firing", "instance": node, "cause": cause,
                 "severity": "critical"} for node, cause in (("n3", "not_started"), ("n3", "in_progress"),
                                                             ("n1", "nvswitch_missing"))))),
    ]
    cluster, node = "gpunode-cluster", "gpunode-node"
    n1, n2 = "instance=n1;device=mlx5_0;port=1", "instance=n2;device=mlx5_0;port=1"
    n1_down = "instance=n1;device=mlx5_1;port=1"
    tests = [
        (expr(node, "RDMA ports: state and physical state", node="n1"), "60m",
         samples(**{f"__name__={state};job=node;{n1}": 4, f"__name__={state};job=node;{n1_down}": 1})),
        (expr(node, "RDMA ports: state and physical state", "B", node="n1"), "60m",
         samples(**{f"__name__={phys};job=node;{n1}": 5, f"__name__={phys};job=node;{n1_down}": 2})),
        # n2 trained down at 30m: below the highest it had, and below its peers
        *((expr(node, f"RDMA port rate against its highest over {SPEC_LOOKBACK} and its peers", ref, node="n2"),
           "60m", samples(**{labels: value})) for ref, labels, value in (
            ("A", f"__name__={rate};job=node;{n2}", 25e9),
            ("B", f"__name__=gpunode:fabric_port_rate_bytes:max1d;{n2};hca_type=MT4129;board_id=MT_0000000838", 50e9),
            ("C", n2, 50e9))),
        (expr(node, f"RDMA port flaps over {SPEC_FLAPS}", node="n1"), "60m",
         samples(**{f"__name__={flaps};{n1}": 3, f"__name__={flaps};{n1_down}": 1})),
        (expr(node, f"RDMA port flaps over {SPEC_FLAPS}", "B", node="n2"), "60m",
         samples(**{f"__name__={downed};job=node;{n2}": 255})),
        # the table: one row per port, whichever job its series come from
        (expr(node, "RDMA ports now: netdev, PCI address, state, rate, flaps", node="n1"), "60m",
         samples(**{f"{n1};netdev=ib0;link_layer=InfiniBand;pci_address=0000:18:00.0": 1,
                    f"{n1_down};netdev=ib1;link_layer=InfiniBand;pci_address=0000:2a:00.0": 1})),
        (expr(node, "RDMA ports now: netdev, PCI address, state, rate, flaps", "B", node="n1"), "60m",
         samples(**{n1: 4, n1_down: 1})),
        (expr(node, "RDMA ports now: netdev, PCI address, state, rate, flaps", "E", node="n2"), "60m",
         samples(**{n2: 4})),
        (expr(node, "RDMA ports ACTIVE against expected", node="n1"), "40m", samples(**{"instance=n1": 2})),
        (expr(node, "RDMA ports ACTIVE against expected", node="n1"), "60m", samples(**{"instance=n1": 1})),
        (expr(node, "RDMA ports ACTIVE against expected", "B", node="n1"), "60m",
         samples(**{"__name__=gpunode_fabric_ports_expected;job=gpunode;instance=n1": 2})),
        (expr(node, "NVSwitches visible against expected", node="n1"), "60m",
         samples(**{"__name__=gpunode_nvswitches_visible;job=gpunode;instance=n1;source=pci": 3})),
        (expr(node, "GPU NVLink fabric: state and health", node="n3"), "60m",
         samples(**{f"__name__=gpunode_gpu_fabric_state;job=gpunode;instance=n3;gpu={g};uuid=GPU-n3-{g}": v
                    for g, v in (("0", 1), ("1", 2))})),
        (expr(node, "GPU NVLink fabric: state and health", "B", node="n1"), "60m",
         samples(**{f"__name__=gpunode_gpu_fabric_healthy;job=gpunode;instance=n1;gpu={g};uuid=GPU-n1-{g}": v
                    for g, v in (("0", 1), ("1", 0))})),
        # the cluster: firing alerts counted (n4's pending one is not), nodes once
        *((expr(cluster, "Fabric alerts firing", ref), "60m", samples(**{"": count}))
          for ref, count in (("A", 2), ("B", 1), ("C", 1), ("D", 2))),
        (expr(cluster, "Fabric alerts firing", node="n9"), "60m", samples(**{"": 0})),
        (expr(cluster, "RDMA ports down, flapping or degraded"), "60m",
         samples(**{f"alertname=GpuNodeFabricPortDown;severity=critical;{n1_down}": 1,
                    "alertname=GpuNodeFabricPortDown;severity=critical;instance=n1": 1,
                    f"alertname=GpuNodeFabricPortFlapping;severity=warning;{n2}": 1,
                    f"alertname=GpuNodeFabricPortDegraded;severity=warning;{n2}": 1})),
        (expr(cluster, "RDMA ports down, flapping or degraded", "B"), "60m",
         samples(**{f"{n1_down};netdev=ib1;pci_address=0000:2a:00.0": 1,
                    f"{n2};netdev=ib0;pci_address=0000:18:00.0": 1})),
        (expr(cluster, "RDMA ports down, flapping or degraded", "C"), "60m", samples(**{n1_down: 1, n2: 4})),
        (expr(cluster, "NVLink fabric not complete, per node"), "60m", samples(**{"instance=n1": 0, "instance=n3": 2})),
        (expr(cluster, "NVLink fabric not complete, per node", "B"), "60m",
         samples(**{"instance=n1": 1, "instance=n3": 0})),
        (expr(cluster, "NVLink fabric not complete, per node", "C"), "60m",
         samples(**{"job=gpunode;instance=n1": 1, "job=gpunode;instance=n3": 0})),
    ]
    run_promtool(promtool, tmp_path, series, tests)


def run_promtool(promtool: str, tmp_path: Path, series: list[dict[str, str]],
                 tests: list[tuple[str, str, list[dict[str, Any]]]]) -> None:
    """Each (expr, eval time, expected samples) on Prometheus' own engine over the input series, one a minute."""
    checks = [{"expr": e, "eval_time": t, "exp_samples": want} for e, t, want in tests]
    unit = {"rule_files": [], "evaluation_interval": "1m",
            "tests": [{"interval": "1m", "input_series": series, "promql_expr_test": checks}]}
    path = tmp_path / "panels.test.yml"
    path.write_text(yaml.safe_dump(unit, sort_keys=False))
    out = subprocess.run([promtool, "test", "rules", path.name], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr


def test_sources_follow_the_spec(tmp_path: Path) -> None:
    """A signal left out of the spec leaves out its exporter."""
    override = tmp_path / "mine.yaml"
    override.write_text("precursor: {signals: {gpu_utilization: null}}\n")
    spec = gpunode_rulepack.load_spec(override)
    board = dashboards.render(spec)["gpunode-cluster.json"]
    scores = next(q for q in dashboards.panel_queries(board, spec) if q.panel_title.startswith("Precursor"))
    assert scores.sources == {"gpunode", "node", "kube_state_metrics"}


def test_a_spec_override_reaches_every_query(tmp_path: Path) -> None:
    override = tmp_path / "mine.yaml"
    override.write_text("selectors: {gpunode: 'job=\"gpu\"', node: 'job=\"nodes\"', remediate: 'job=\"remediation\"'}\n"
                        "labels: {node: host, peer_group: [job, session]}\nnfs: {window: 60}\n")
    spec = gpunode_rulepack.load_spec(override)
    for board in dashboards.render(spec).values():
        found = variables(board)
        assert list(found) == ["datasource", "job", "session", "node"]
        assert found["session"]["query"] == 'label_values(gpunode_exporter_build_info{job="gpu", job=~"$job"}, session)'
        assert found["node"]["query"] == ('label_values(gpunode_exporter_build_info{job="gpu", '
                                          'job=~"$job", session=~"$session"}, host)')
        for query in dashboards.panel_queries(board, spec):
            assert 'job="gpunode"' not in query.expr and 'job="node"' not in query.expr, query.expr
            assert "instance" not in query.expr and "rate5m" not in query.expr, query.expr
            assert 'job="gpunode-remediate"' not in query.expr, query.expr
            if query.sources == {"remediate"}:  # the service's own selector, no node variable
                assert 'job="remediation"' in query.expr or "ALERTS" in query.expr, query.expr
                continue
            assert 'host=~"$node' in query.expr, query.expr
            for sel in selectors(dashboards.expand(query.expr, one_value_each(board), "1m", range_=GRAFANA_RANGE)):
                if sel.name.startswith("gpunode_"):
                    assert {(m.name, m.value) for m in sel.matchers.matchers} >= {
                        ("job", "gpu"), ("job", "job-1"), ("session", "session-1"), ("host", "node-1")}, sel
        assert dashboards.panel_queries(board) == dashboards.panel_queries(board, spec)  # render() kept the spec
        with pytest.raises(ValueError, match="rate1m: not a recording rule"):
            dashboards.panel_queries(dict(board))  # read from a file: the shipped spec's rule pack records rate5m
    # the cluster's links pick the node by the spec's node label
    linked = node_links(dashboards.render(spec)["gpunode-cluster.json"], spec)
    assert linked and all([link["url"].split("&")[0] for link in links] in (
        ["/d/gpunode-node?var-node=${__data.fields.host}"], ["/d/gpunode-node?var-node=${__field.labels.host}"])
        for links in linked.values()), linked


def test_expand_substitutes_as_grafana_does() -> None:
    board = BOARDS["gpunode-cluster"]
    expr = 'rate(x{instance=~"$node", job=~"${job}", a="${node:regex}", b="$1"}[$__rate_interval])'
    assert dashboards.expand(expr, {"node": "n1", "job": "j"}, "2m") == \
        'rate(x{instance=~"n1", job=~"j", a="n1", b="$1"}[2m])'
    # a multi-value variable's value is regex-escaped, backslashes doubled for PromQL's string
    escaped = dashboards.expand('x{instance=~"$node"}', {"node": "10.0.0.1:9100"}, "1m", dashboard=board)
    assert escaped == 'x{instance=~"10\\\\.0\\\\.0\\\\.1:9100"}'
    assert promql_parser.parse(escaped)
    assert dashboards.expand("$__range $__interval", {}, "1m", interval="15s", range_="1h") == "1h 15s"
    with pytest.raises(KeyError):
        dashboards.expand('x{a=~"$nope"}', {}, "1m")


def test_docs_list_the_panels_and_their_exporters() -> None:
    text = DOCS.read_text()
    assert doc.update(text, SHIPPED) == text, "docs/dashboards.md is stale: python -m gpunode_rulepack.dashboards.doc"
    needs, reads = set(), set()
    for uid, board in BOARDS.items():
        for q in dashboards.panel_queries(board):
            (needs if "dcgm" in q.requires else reads if "dcgm" in q.sources else set()).add(f"{uid}: {q.panel_title}")
    block = text.split("<!-- BEGIN GENERATED: dcgm -->")[1].split("<!-- END GENERATED: dcgm -->")[0]
    needed, read = (set(re.findall(r"^- (.+)$", part, re.M)) for part in block.split("showing data without it:"))
    assert needed == needs and needs
    assert read == reads - needs


def test_cli_renders_the_same_files(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "gpunode_exporter", "dashboards", "render", "--out", str(tmp_path)],
                         capture_output=True, text=True, check=True, cwd=ROOT)
    assert sorted(Path(line).name for line in out.stdout.split()) == ["gpunode-cluster.json", "gpunode-node.json"]
    for name, text in dashboards.files(SPEC).items():
        assert (tmp_path / name).read_text() == text
        assert json.loads(text) == dashboards.render(SPEC)[name]


def test_cli_rejects_a_bad_spec_in_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("labels: {nod: host}\n")
    out = subprocess.run([sys.executable, "-m", "gpunode_exporter", "dashboards", "render", "--spec", str(bad),
                          "--out", str(tmp_path)], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 2 and "spec.labels.nod: unknown key" in out.stderr
    assert len(out.stderr.splitlines()) == 1
    assert not list(tmp_path.glob("*.json"))


def test_cli_without_the_sdk_says_how_to_install_it(tmp_path: Path) -> None:
    script = ("import sys; sys.modules['grafana_foundation_sdk'] = None\n"
              "from gpunode_exporter.cli import main\n"
              f"sys.exit(main(['dashboards', 'render', '--out', {str(tmp_path)!r}]))\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.splitlines() == ["gpunode-exporter: error: dashboards render needs grafana_foundation_sdk: "
                                       "pip install 'gpunode-exporter[dashboards]'"]
