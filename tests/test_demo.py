"""End to end: the demo's stack, headless, with a faulty node and four healthy ones side by side.

Real processes throughout: the exporter on simulated nodes, Debian's node_exporter,
Prometheus with the rule pack (demo/spec.yaml), Alertmanager with the example config, and
the webhook receiver. The faulty node's expected alerts must reach the webhook with their
labels within a bound; nothing else may reach it; the healthy node must stay silent.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from demo import scenario as scenarios
from demo.__main__ import matches, missing
from demo.stack import DEMO_SPEC, Ports, Stack, missing_tools
from exporter import dashboards
from exporter.dashboards.board import DCGM, JOB_PAST, NFS_MOUNT, PFC, expand
from exporter.rulepack import load_spec
from tests.helpers import free_port
from tests.netns import netns_unavailable

# The faulty scenario's faults begin by 100 s; its alerts need their `for` and
# Alertmanager's group_wait (30 s) on top.
BOUND_SECONDS = 240


# Four healthy peers: the peer scores need precursor.min_peers (5) nodes in a group.
NODES = ("faulty", "healthy", "healthy", "healthy", "healthy")


def test_the_demo_doc_counts_the_nodes_this_test_runs() -> None:
    healthy = ("no", "one", "two", "three", "four", "five", "six")[NODES.count("healthy")]
    text = (Path(__file__).parent.parent / "docs" / "demo.md").read_text()
    assert f"one `faulty` and {healthy} `healthy` nodes" in text
    assert f"`faulty` beside {healthy} `healthy` nodes" in text


@pytest.fixture(scope="module")
def demo_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    if reason := netns_unavailable():
        pytest.skip(reason)
    if tools := missing_tools():
        pytest.skip(f"not installed: {', '.join(tools)} (scripts/install-deps.sh --test installs them)")
    workdir: Path = tmp_path_factory.mktemp("demo")
    nodes = [scenarios.load(name, workdir) for name in NODES]
    ports = Ports(prometheus=free_port(), alertmanager=free_port(), webhook=free_port())
    with Stack(nodes, workdir, ports) as running:
        deadline = time.monotonic() + BOUND_SECONDS
        while missing(running) and time.monotonic() < deadline and not running.failed():
            time.sleep(1)
        yield running



def test_expected_alerts_arrive_in_time(demo_stack: Stack) -> None:
    assert not demo_stack.failed(), f"exited: {demo_stack.failed()}; logs in {demo_stack.workdir}/logs"
    assert missing(demo_stack) == [], f"not received within {BOUND_SECONDS} s"


def test_nothing_else_arrives(demo_stack: Stack) -> None:
    """Every notification is an expected alert or one the scenario allows (a consequence of its faults)."""
    for got in demo_stack.webhook.alerts():
        node = next(n for n in demo_stack.nodes if n.name == got.labels.get("instance"))
        expected = any(matches(got, want, node.name) for want in node.scenario.expect)
        assert expected or got.labels["alertname"] in node.scenario.also, got.line()


def test_healthy_node_is_silent(demo_stack: Stack) -> None:
    healthy = [n.name for n in demo_stack.nodes if not n.scenario.expect]
    assert healthy
    # Its saves ran through the same rules: at least three by the time the faulty node's alerts are in.
    assert demo_stack.elapsed() > 20 + 2 * 60
    assert [got.line() for got in demo_stack.webhook.alerts() if got.labels.get("instance") in healthy] == []
    assert demo_stack.query(f'ALERTS{{instance=~"{"|".join(healthy)}"}}') == []


def test_xid_alert_names_the_gpu(demo_stack: Stack) -> None:
    """The Xid 79 notification carries the GPU's index and UUID (mapped from the kernel log's bus id)."""
    xid = [got for got in demo_stack.webhook.alerts() if got.labels["alertname"] == "GpuXidHardwareFault"]
    assert xid and all(got.labels["gpu"] == "2" and got.labels["uuid"].startswith("GPU-de302f70") for got in xid)
    assert {got.receiver for got in xid} == {"node-automation", "pager"}  # the example's routes


def test_every_dashboard_panel_query_returns_data(demo_stack: Stack) -> None:
    """Each panel query of the dashboards rendered with the demo's spec returns data from the demo's
    Prometheus, except panels needing what the demo lacks (dcgm-exporter, PFC, an NFS mount node_exporter
    sees, a job's hours of past): those return none, which shows their stated need is real."""
    promql_parser = pytest.importorskip("promql_parser")
    absent_in_demo = {DCGM, PFC, NFS_MOUNT, JOB_PAST}
    empty, lacking = set(), set()
    for built in dashboards.build(load_spec(DEMO_SPEC)):
        lacking |= {title for title, need in built.needs.items() if any(a in need for a in absent_in_demo)}
        for query in dashboards.panel_queries(built.dashboard):
            expr = expand(query.expr, {"job": "gpunode", "node": "node-faulty"}, rate_interval="20s")
            promql_parser.parse(expr)
            if not demo_stack.query(expr):
                empty.add(query.panel_title)
    assert lacking and empty == lacking
