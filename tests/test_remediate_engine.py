"""The service's worker through the generic command adapter: a scheduler kept in a JSON file by a
script, as an operator's own scripts would keep one. Repeated, regrouped and out-of-order
notifications never double an action; a restart resumes where the last run stopped."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from exporter.exposition import Renderer
from remediate import metrics
from remediate.alerts import parse
from remediate.engine import Engine
from remediate.plan import Step
from remediate.policy import build
from remediate.scheduler import build as scheduler
from remediate.state import State
from tests.remediation import alert_json, notification

SCRIPT = r'''
import json, sys
path, command, *args = sys.argv[1:]
nodes = json.load(open(path))
if command == "nodes":
    print(json.dumps([{"name": n, **v} for n, v in nodes.items()]))
    sys.exit(0)
with open(path + ".log", "a") as log:
    log.write(" ".join([command, *args]) + "\n")
node = args[0]
if command == "drain":
    nodes[node].update(state="drained" if nodes[node]["state"] == "idle" else "draining", reason=args[1])
elif command == "reboot":
    nodes[node].update(state="down", reason=args[1])
elif command == "resume":
    nodes[node].update(state="idle", reason="")
json.dump(nodes, open(path, "w"))
'''


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def cluster(tmp_path: Path) -> Path:
    (tmp_path / "sched.py").write_text(SCRIPT)
    path = tmp_path / "nodes.json"
    path.write_text(json.dumps({f"gpu{i:03d}": {"state": "idle", "reason": ""} for i in range(1, 41)}))
    return path


def engine(tmp_path: Path, cluster: Path, clock: Clock, **policy: object) -> Engine:
    argv = [sys.executable, str(tmp_path / "sched.py"), str(cluster)]
    p = build({"mode": "enforce", "state_path": str(tmp_path / "state.db"), "health_check": {"enabled": False},
               "reset_command": [sys.executable, "-c",
                                 f"open({str(tmp_path / 'resets')!r}, 'a').write('{{node}} {{gpu}}\\n')"],
               "scheduler": {"kind": "commands", "commands": {
                   "nodes": [*argv, "nodes"], "drain": [*argv, "drain", "{node}", "{reason}"],
                   "resume": [*argv, "resume", "{node}"], "reboot": [*argv, "reboot", "{node}", "{reason}"]}},
               **policy})
    return Engine(p, State(p.state_path), scheduler(p), clock=clock)


def calls(cluster: Path) -> list[str]:
    log = cluster.with_suffix(".json.log")
    return log.read_text().splitlines() if log.exists() else []


def deliver(e: Engine, *alerts: dict, clock: Clock) -> None:
    e.receive(parse(notification(*alerts)), clock())
    e.reconcile()


def test_repeated_regrouped_and_out_of_order_notifications_never_double_an_action(
        tmp_path: Path, cluster: Path) -> None:
    clock = Clock()
    e = engine(tmp_path, cluster, clock)
    slow = alert_json("GpuNvLinkDegraded", "gpu004", starts=clock.now - 300)
    deliver(e, slow, clock=clock)
    assert calls(cluster) == ["drain gpu004 gpunode: drain GpuNvLinkDegraded"]
    for _ in range(3):  # repeat_interval, and the same alert regrouped with another
        deliver(e, slow, alert_json("GpuXidApplicationFault", "gpu004", action="RESTART_APP"), clock=clock)
    clock.now += 60
    resolved = alert_json("GpuNvLinkDegraded", "gpu004", status="resolved", starts=clock.now - 360, ends=clock.now)
    deliver(e, resolved, clock=clock)
    deliver(e, slow, clock=clock)  # firing after resolved: the same episode, stale
    assert [a.name for a in e.state.firing()["gpu004"]] == ["GpuXidApplicationFault"]
    clock.now += 899
    e.reconcile()
    assert len(calls(cluster)) == 1  # resolved 899 s ago: not yet quiet for 15 min
    clock.now += 1
    e.reconcile()
    e.reconcile()
    assert calls(cluster) == ["drain gpu004 gpunode: drain GpuNvLinkDegraded", "resume gpu004"]


def test_a_resolved_alert_never_seen_changes_nothing(tmp_path: Path, cluster: Path) -> None:
    clock = Clock()
    e = engine(tmp_path, cluster, clock)
    deliver(e, alert_json("GpuDown", "gpu002", status="resolved", starts=clock.now - 900, ends=clock.now - 5),
            clock=clock)
    deliver(e, alert_json("GpuDown", "gpu002", starts=clock.now - 900), clock=clock)  # its stale firing
    assert calls(cluster) == [] and e.state.firing() == {}


def test_the_reset_command_runs_once_then_the_node_returns(tmp_path: Path, cluster: Path) -> None:
    clock = Clock()
    e = engine(tmp_path, cluster, clock)
    pending = alert_json("GpuRowRemapPending", "gpu006", gpu="5", starts=clock.now - 60)
    for _ in range(3):
        deliver(e, pending, clock=clock)
    assert (tmp_path / "resets").read_text() == "gpu006 5\n"
    assert calls(cluster) == ["drain gpu006 gpunode: reset GpuRowRemapPending gpu=5"]
    clock.now += 30
    deliver(e, {**pending, "status": "resolved", "endsAt": pending["startsAt"][:11] + "00:00:00Z"}, clock=clock)
    clock.now += 901
    e.reconcile()
    assert calls(cluster)[-1] == "resume gpu006" and (tmp_path / "resets").read_text() == "gpu006 5\n"


def test_a_restart_resumes_from_the_state_file(tmp_path: Path, cluster: Path) -> None:
    clock = Clock()
    e = engine(tmp_path, cluster, clock)
    deliver(e, alert_json("GpuXidHardwareFault", "gpu003", xid="79", action="RESTART_BM"), clock=clock)
    assert calls(cluster) == ["reboot gpu003 gpunode: reboot GpuXidHardwareFault xid=79 action=RESTART_BM"]
    e.state.close()
    again = engine(tmp_path, cluster, clock)  # the same state file: the node is known, nothing doubles
    again.reconcile()
    again.reconcile()
    assert again.state.records()["gpu003"].phase == "rebooted"
    assert len(calls(cluster)) == 1


def test_a_dry_run_calls_nothing_and_says_what_it_would_do(tmp_path: Path, cluster: Path) -> None:
    clock = Clock()
    e = engine(tmp_path, cluster, clock, mode="dry-run")
    deliver(e, alert_json("GpuXidHardwareFault", "gpu003", xid="79", action="RESTART_BM"), clock=clock)
    e.reconcile()
    assert calls(cluster) == []
    assert e.actions[("reboot", "dry_run")] == 1 and e.state.records()["gpu003"].phase == "rebooted"


def test_the_breaker_stays_open_until_a_person_resets_it(tmp_path: Path, cluster: Path) -> None:
    clock = Clock()
    e = engine(tmp_path, cluster, clock)
    storm = [alert_json("GpuNodeHostStarved", f"gpu{i:03d}", starts=clock.now - 100 + i) for i in range(1, 31)]
    deliver(e, *storm, clock=clock)
    assert [c.split()[1] for c in calls(cluster)] == ["gpu001", "gpu002"]
    assert e.state.breaker()[0] and e.actions[("drain", "blocked")] == 28
    clock.now += 2 * 86400  # the window has passed, but the breaker waits for a person
    e.reconcile()
    assert len(calls(cluster)) == 2
    e.state.set_breaker(False, clock.now, "reset by a person")
    e.reconcile()
    assert len(calls(cluster)) == 4  # a fresh budget of 2, then open again
    assert e.state.breaker()[0]


def test_a_reset_cut_short_by_a_restart_holds_the_node(tmp_path: Path, cluster: Path) -> None:
    """The scheduler shows whether a drain or reboot took effect; nothing shows whether a reset ran."""
    clock = Clock()
    e = engine(tmp_path, cluster, clock)
    deliver(e, alert_json("GpuRowRemapPending", "gpu006", gpu="5"), clock=clock)
    e.state.set_record("gpu006", "reset_wait", "reset", "x", clock.now, ("5",))
    # Begun, never finished: the service was killed mid-call.
    e.state.begin(Step("gpu006", "reset", "no job runs on it", phase="reset_done"), clock.now)
    e.state.close()
    again = engine(tmp_path, cluster, clock)
    assert again.state.records()["gpu006"].phase == "held"
    again.reconcile()
    assert not (tmp_path / "resets").exists() and again.state.records()["gpu006"].phase == "held"


def test_the_metrics_pass_promtool(tmp_path: Path, cluster: Path) -> None:
    clock = Clock()
    e = engine(tmp_path, cluster, clock)
    deliver(e, alert_json("GpuRowRemapFailure", "gpu001", gpu="1"), clock=clock)
    text = Renderer().render(metrics.families(e)).decode()
    assert 'gpunode_remediate_node_held_since_timestamp_seconds{node="gpu001"' in text
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (scripts/install-deps.sh --test installs it)")
    out = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
