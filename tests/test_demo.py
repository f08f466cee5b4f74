"""End to end: the demo's stack, headless, with a faulty node and four healthy ones side by side.

Real processes throughout: the exporter on simulated nodes, Debian's node_exporter,
Prometheus with the rule pack (demo/spec.yaml), Alertmanager with the example config, and
the webhook receiver. The faulty node's expected alerts must reach the webhook with their
labels within a bound, and the demo then ends; nothing else may reach it; the healthy node
must stay silent. However `python -m demo` ends, its temporary directory goes with it.
"""

from __future__ import annotations

import re
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from demo import scenario as scenarios
from demo.__main__ import POLL_SECONDS, Ending, bound, main, matches, watch
from demo.stack import DEMO_SPEC, Stack, missing_tools
from gpunode_rulepack import dashboards, load_spec
from gpunode_rulepack.dashboards.board import (
    DCGM,
    JOB_PAST,
    JOB_RECOVERY,
    KERNEL_EVENTS,
    MEASURED_MTBF,
    NFS_MOUNT,
    NFS_SILENT,
    PFC,
    RDMA_PORTS,
    RESTARTS,
    SXIDS,
    expand,
)
from tests.helpers import Install, outside_any_venv
from tests.netns import netns_unavailable

# The fresh installs (conftest.py) are made once per test process: the tests that use them share one.
pytestmark = pytest.mark.xdist_group("fresh_install")

# The faulty scenario's faults begin by 100 s; its alerts need their `for` and
# Alertmanager's group_wait (30 s) on top.
BOUND_SECONDS = 240


# Four healthy peers: the peer scores need precursor.min_peers (5) nodes in a group.
NODES = ("faulty", "healthy", "healthy", "healthy", "healthy")
ROOT = Path(__file__).parent.parent


def test_the_demo_doc_counts_the_nodes_this_test_runs() -> None:
    healthy = ("no", "one", "two", "three", "four", "five", "six")[NODES.count("healthy")]
    text = (ROOT / "docs" / "demo.md").read_text()
    assert f"one `faulty` and {healthy} `healthy` nodes" in text
    assert f"`faulty` beside {healthy} `healthy` nodes" in text


def skip_unless_the_demo_can_run() -> None:
    if reason := netns_unavailable():
        pytest.skip(reason)
    if tools := missing_tools():
        pytest.skip(f"not installed: {', '.join(tools)} (scripts/install-deps.sh --test installs them)")


def test_a_demo_that_cannot_start_leaves_no_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert main(["--scenario", "no-such-scenario"]) == 2
    assert list(tmp_path.iterdir()) == []
    assert main(["--scenario", "no-such-scenario", "--keep"]) == 2
    assert [p.name[:13] for p in tmp_path.iterdir()] == ["gpunode-demo-"]


def start_demo(tmp_path: Path, install: Install, *args: str) -> subprocess.Popen[str]:
    """`python -m demo` as users run it, from a fresh clone with what `make demo` installs alone,
    its temporary directory under tmp_path; killed if still running after two minutes. Free ports,
    and no address outside its own namespaces: it runs beside anything, another demo included."""
    skip_unless_the_demo_can_run()
    proc = subprocess.Popen([str(install.venv / "bin" / "python"), "-m", "demo", *args], cwd=install.tree, text=True,
                            env={**outside_any_venv(), "TMPDIR": str(tmp_path)},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    watchdog = threading.Timer(120, proc.kill)
    watchdog.daemon = True
    watchdog.start()
    return proc


def workdir_of(output: str) -> Path:
    found = re.search(r"files and logs in (\S+)", output)
    assert found, output
    return Path(found.group(1))


def test_without_expected_alerts_the_demo_runs_its_duration_and_removes_its_directory(
        tmp_path: Path, demo_install: Install) -> None:
    started = time.monotonic()
    out, _ = start_demo(tmp_path, demo_install, "--scenario", "healthy", "--duration", "4").communicate(timeout=150)
    # its duration, and a second or more on a machine busy with other tests (5 s beside the suite)
    assert re.fullmatch(r"demo: stopped after [4-9] s; no alert expected", out.splitlines()[-1]), out
    assert time.monotonic() - started >= 4
    assert workdir_of(out).parent == tmp_path and list(tmp_path.iterdir()) == [], out


def test_two_demos_side_by_side_both_succeed(tmp_path: Path, demo_install: Install) -> None:
    """Each its own free ports, namespaces and Slurm cluster; no address on the host (the node
    namespaces have no link to it), so none is taken twice."""
    before = subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True).stdout
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    demos = [start_demo(tmp_path / d, demo_install, "--scenario", "healthy", "--duration", "10") for d in ("a", "b")]
    time.sleep(5)
    during = subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True).stdout
    outs = [demo.communicate(timeout=150)[0] for demo in demos]
    for demo, out in zip(demos, outs, strict=True):
        assert demo.returncode == 0, out
        assert re.fullmatch(r"demo: stopped after 1[0-9] s; no alert expected", out.splitlines()[-1]), out
    assert during == before  # nothing of either demo's on the host's interfaces
    urls = [re.search(r"Prometheus (\S+)", out).group(1) for out in outs]
    assert urls[0] != urls[1]


def test_sigterm_stops_the_demo_and_removes_its_directory(tmp_path: Path, demo_install: Install) -> None:
    demo = start_demo(tmp_path, demo_install, "--scenario", "healthy", "--duration", "0")
    assert demo.stdout is not None
    lines = []
    for line in demo.stdout:  # up to "Ctrl-C stops": the stack is up
        lines.append(line)
        if "Ctrl-C stops" in line:
            break
    workdir = workdir_of("".join(lines))
    assert workdir.is_dir(), "".join(lines)
    time.sleep(2)  # into the wait for alerts
    demo.send_signal(signal.SIGTERM)
    out, _ = demo.communicate(timeout=60)
    assert demo.returncode == 0, out
    assert re.fullmatch(r"demo: stopped after \d+ s; no alert expected", out.splitlines()[-1]), out
    assert not workdir.exists() and list(tmp_path.iterdir()) == []


@dataclass(frozen=True)
class Run:
    stack: Stack
    ending: Ending
    ended_at: float  # time.time() when the demo stopped waiting for alerts


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    skip_unless_the_demo_can_run()
    workdir: Path = tmp_path_factory.mktemp("demo")
    nodes = [scenarios.load(name, workdir) for name in NODES]
    with Stack(nodes, workdir) as running:
        ending = watch(running)  # as `python -m demo` waits: at most the scenarios' duration
        yield Run(running, ending, time.time())


@pytest.fixture(scope="module")
def demo_stack(demo_run: Run) -> Stack:
    return demo_run.stack


def test_expected_alerts_arrive_in_time(demo_run: Run) -> None:
    stack, ending = demo_run.stack, demo_run.ending
    assert not ending.exited, f"exited: {ending.exited}; logs in {stack.workdir}/logs"
    assert ending.missing == [], f"not received within {ending.elapsed:.0f} s"
    assert ending.elapsed < BOUND_SECONDS


def test_the_demo_ends_once_the_expected_alerts_arrived(demo_run: Run) -> None:
    """Not at its duration: within a poll of the last expected alert's arrival."""
    stack, ending = demo_run.stack, demo_run.ending
    assert ending.reason == "arrived", ending
    assert ending.elapsed < BOUND_SECONDS < bound(stack.scenarios, None)
    received = stack.webhook.alerts()
    last = max(min(got.at for got in received if matches(got, want, node.name))
               for node in stack.nodes for want in node.scenario.expect)
    assert 0 <= demo_run.ended_at - last < POLL_SECONDS + 2


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
    # No alert of theirs fired at any evaluation of the run. (A pending one may flicker for an evaluation
    # where a save begins or ends between two nodes' scrapes, 20 s rate windows over 5 s scrapes; the
    # continuity keeps it from firing.)
    run = f"{demo_stack.elapsed():.0f}s"
    assert demo_stack.query(f'ALERTS{{alertstate="firing", instance=~"{"|".join(healthy)}"}}[{run}]') == []
    assert demo_stack.query(f'ALERTS{{alertstate="firing", instance="node-faulty"}}[{run}]')  # the query finds some


def test_xid_alert_names_the_gpu(demo_stack: Stack) -> None:
    """The Xid 79 notification carries the GPU's index and UUID (mapped from the kernel log's bus id)."""
    xid = [got for got in demo_stack.webhook.alerts() if got.labels["alertname"] == "GpuXidHardwareFault"]
    assert xid and all(got.labels["gpu"] == "2" and got.labels["uuid"].startswith("GPU-de302f70") for got in xid)
    assert {got.receiver for got in xid} == {"pager"}  # the example's routes: the service has its own


def test_the_faulty_node_is_taken_out_of_service_in_slurmctld(demo_run: Run) -> None:
    """gpunode-remediate, fed by Alertmanager's remediation route, drained the faulty node in the demo's own
    slurmctld with its marker (escalated to a reboot on the Xid 79, then held for a person once GPU 5's
    correctable remaps accelerate: the GPU wants replacing); no healthy node was touched."""
    drained = demo_run.stack.drained()
    assert set(drained) == {"node-faulty"}, drained
    assert drained["node-faulty"].startswith("gpunode: hold GpuRowRemapCorrectableAcceleration gpu=5"), drained


def test_every_dashboard_panel_query_returns_data(demo_stack: Stack) -> None:
    """Each panel query of the dashboards rendered with the demo's spec returns data from the demo's
    Prometheus, except panels needing what the demo lacks (dcgm-exporter, PFC, an NFS mount node_exporter
    sees, a job's hours of past, job restarts, a node held by gpunode-remediate, job recovery, a kernel
    event past Xid, an SXid, an NFS server not responding, an RDMA port node_exporter sees):
    those return none, which shows their stated need is real. The demo's node_exporter reads the host's
    own sysfs (the simulated tree is the exporter's): on a host without RDMA devices it has no
    node_infiniband series, whatever the demo simulates."""
    promql_parser = pytest.importorskip("promql_parser")
    absent_in_demo = {DCGM, PFC, NFS_MOUNT, JOB_PAST, RESTARTS, MEASURED_MTBF, JOB_RECOVERY, KERNEL_EVENTS, SXIDS,
                      NFS_SILENT, RDMA_PORTS}
    # gpunode-remediate holds the faulty node (GPU 5's remaps accelerate: a precursor) and raises no
    # alert of its own in the demo.
    empty, lacking = set(), {"Remediation alerts firing"}
    for built in dashboards.build(load_spec(DEMO_SPEC)):
        lacking |= {title for title, need in built.needs.items() if any(a in need for a in absent_in_demo)}
        for query in dashboards.panel_queries(built.dashboard):
            expr = expand(query.expr, {"job": "gpunode", "node": "node-faulty"}, rate_interval="20s", range_="5m")
            promql_parser.parse(expr)
            if not demo_stack.query(expr):
                empty.add(query.panel_title)
    assert lacking and empty == lacking
