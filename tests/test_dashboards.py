"""The Grafana dashboards: drift against the code, the panel conventions, queries that parse, the spec
carried through, the CLI. (The queries run against a real Prometheus in tests/test_demo.py.)"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from exporter import dashboards, rulepack
from exporter.dashboards.board import expand

promql_parser = pytest.importorskip("promql_parser")
ROOT = Path(__file__).parent.parent
DOCS = ROOT / "docs" / "dashboards.md"
SHIPPED = dashboards.build(rulepack.load_spec())
RANGE = re.compile(r"\[([^\]]+)\]")


def test_committed_files_are_what_the_code_renders() -> None:
    committed = {p.name: p.read_text() for p in (ROOT / "dashboards").glob("*.json")}
    assert committed == dashboards.render(rulepack.load_spec()), "dashboards/ is stale: run `make dashboards`"


def test_importable_with_a_datasource_input_and_stable_uids() -> None:
    assert [b.dashboard["uid"] for b in SHIPPED] == ["gpunode-cluster", "gpunode-node"]
    for built in SHIPPED:
        board = built.dashboard
        assert board["__inputs"][0]["pluginId"] == "prometheus"
        names = [v["name"] for v in board["templating"]["list"]]
        assert names[:2] == ["datasource", "job"]
        assert ("node" in names) == (board["uid"] == "gpunode-node")
        ids = [p["id"] for p in board["panels"]]
        assert len(ids) == len(set(ids))


@pytest.mark.parametrize("built", SHIPPED, ids=lambda b: b.filename)
def test_every_panel_has_a_description_a_unit_and_the_datasource_variable(built: dashboards.Built) -> None:
    panels = [p for p in built.dashboard["panels"] if p["type"] != "row"]
    assert len(panels) >= 10
    for panel in panels:
        assert len(panel.get("description", "")) > 40, panel["title"]
        assert panel["fieldConfig"]["defaults"].get("unit"), panel["title"]
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"] and all(t["expr"] and t["refId"] for t in panel["targets"]), panel["title"]


@pytest.mark.parametrize("built", SHIPPED, ids=lambda b: b.filename)
def test_every_query_parses_and_ranges_are_rate_interval_or_spec_windows(built: dashboards.Built) -> None:
    spec = rulepack.load_spec()
    remap = spec["remap"]
    windows = {"$__rate_interval", *(rulepack.duration(remap[k]) for k in
                                     ("acceleration_short_window", "acceleration_long_window"))}
    for query in dashboards.panel_queries(built.dashboard):
        promql_parser.parse(expand(query.expr, {"job": "gpunode", "node": "n1"}, "1m"))
        assert set(RANGE.findall(query.expr)) <= windows, (query.panel_title, query.expr)


def test_every_metric_exists() -> None:
    """Names in the queries are the exporter's (README's table), recording rules of the pack, or the
    few node_exporter and dcgm-exporter series the panels read."""
    readme = (ROOT / "README.md").read_text()
    recorded = set(dashboards.board.recording_rules(rulepack.load_spec()))
    others = {"ALERTS", "DCGM_FI_DEV_GPU_UTIL", "node_memory_Dirty_bytes", "node_memory_Writeback_bytes",
              "node_filesystem_size_bytes", "node_filesystem_avail_bytes"}
    for built in SHIPPED:
        for query in dashboards.panel_queries(built.dashboard):
            for name in re.findall(r"([A-Za-z_:][\w:]*)\{", query.expr):
                assert name in recorded or name in others or f"`{name}`" in readme, (query.panel_title, name)


def test_a_spec_override_reaches_every_query(tmp_path: Path) -> None:
    override = tmp_path / "mine.yaml"
    override.write_text("selectors: {gpunode: 'job=\"gpu\"', node: 'job=\"nodes\"'}\n"
                        "labels: {node: host, peer_group: [job, session]}\nnfs: {window: 60}\n")
    spec = rulepack.load_spec(override)
    for built in dashboards.build(spec):
        variables = {v["name"]: v for v in built.dashboard["templating"]["list"]}
        assert "session" in variables
        for query in dashboards.panel_queries(built.dashboard):
            assert 'job="gpunode"' not in query.expr and 'job="node"' not in query.expr
            assert "instance" not in query.expr and "rate5m" not in query.expr, query.expr
            if 'job="gpu"' in query.expr:
                assert 'session=~"$session"' in query.expr
        if built.dashboard["uid"] == "gpunode-node":
            assert variables["node"]["query"] == ('label_values(gpunode_exporter_build_info{job="gpu", '
                                                  'job=~"$job", session=~"$session"}, host)')


def test_docs_list_the_panels_with_needs() -> None:
    table = "\n".join(f"| {b.dashboard['uid']} | {title} | {need} |"
                      for b in SHIPPED for title, need in b.needs.items())
    assert table in DOCS.read_text(), "docs/dashboards.md: update the generated needs table"


def test_cli_renders_the_same_files(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "exporter", "dashboards", "render", "--out", str(tmp_path)],
                         capture_output=True, text=True, check=True, cwd=ROOT)
    assert sorted(Path(line).name for line in out.stdout.split()) == ["gpunode-cluster.json", "gpunode-node.json"]
    for name, text in dashboards.render(rulepack.load_spec()).items():
        assert (tmp_path / name).read_text() == text
        json.loads(text)


def test_cli_rejects_a_bad_spec_in_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("labels: {nod: host}\n")
    out = subprocess.run([sys.executable, "-m", "exporter", "dashboards", "render", "--spec", str(bad),
                          "--out", str(tmp_path)], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 2 and "spec.labels.nod: unknown key" in out.stderr
    assert not list(tmp_path.glob("*.json"))
