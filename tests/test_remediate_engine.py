"""The service's worker through the generic command adapter: a scheduler kept in a JSON file by a
script, as an operator's own scripts would keep one. Repeated, regrouped and out-of-order
notifications never double an action; a restart resumes where the last run stopped."""

from __future__ import annotations

import json
import shlex
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from gpunode_common.exposition import Renderer
from gpunode_remediate import metrics
from gpunode_remediate.alerts import parse
from gpunode_remediate.cli import breaker_command, status_text
from gpunode_remediate.engine import Engine
from gpunode_remediate.plan import Step
from gpunode_remediate.policy import build
from gpunode_remediate.scheduler import build as scheduler
from gpunode_remediate.state import State
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
    assert e.state.breaker("enforce").open and e.actions[("drain", "blocked")] == 28
    clock.now += 2 * 86400  # the window has passed, but the breaker waits for a person
    e.reconcile()
    assert len(calls(cluster)) == 2
    breaker_command(e.policy, e.state, "reset", "", clock.now)
    e.reconcile()
    assert len(calls(cluster)) == 4  # a fresh budget of 2, then open again
    assert e.state.breaker("enforce").open


def test_a_breaker_reset_clears_the_budgets_window(tmp_path: Path, cluster: Path) -> None:
    """Right after the breaker opened, the two drains of the window no longer count once a person
    resets it: two more nodes are drained, not the breaker opened again at once."""
    clock = Clock()
    e = engine(tmp_path, cluster, clock)
    deliver(e, *[alert_json("GpuNodeHostStarved", f"gpu{i:03d}", starts=clock.now - 100 + i) for i in range(1, 31)],
            clock=clock)
    assert len(calls(cluster)) == 2 and e.state.history(e.policy, clock.now).budget_used == 2
    clock.now += 60
    said = breaker_command(e.policy, e.state, "reset", "", clock.now)
    assert "it was open since" in said and "2 of 2 nodes drained in 24h" in said
    assert "may drain 2 node(s) of the 40 counted at the last look in the next 24h" in said
    assert e.state.history(e.policy, clock.now).budget_used == 0
    e.reconcile()
    assert [c.split()[1] for c in calls(cluster)] == ["gpu001", "gpu002", "gpu003", "gpu004"]


@pytest.mark.parametrize(("in_care", "says", "drains"), [
    (1.0, "the service may drain 2 node(s) of the 40 counted at the last look in the next 24h; nodes whose", 2),
    (0.075, "the service may drain 1 node(s) in the next 24h, not the 2 of its budget: 2 node(s) in the "
     "service's care, of 3 allowed (budget.in_care 0.075 of the 40 counted at the last look)", 1),
    (0.05, "Drains before now no longer count, but the nodes in care do: 2 node(s) in the service's care, of 2 "
     "allowed (budget.in_care 0.05 of the 40 counted at the last look), so in effect it may drain 0 nodes: "
     "the next drain opens the breaker again", 0),
], ids=["room", "part", "full"])
def test_a_breaker_reset_says_what_budget_in_care_leaves(tmp_path: Path, cluster: Path, in_care: float, says: str,
                                                         drains: int) -> None:
    """The reset clears the window, not the nodes in care: what it says it may drain is what it drains."""
    clock = Clock()
    e = engine(tmp_path, cluster, clock, budget={"in_care": in_care})
    deliver(e, *[alert_json("GpuNodeHostStarved", f"gpu{i:03d}", starts=clock.now - 100 + i) for i in range(1, 31)],
            clock=clock)
    assert len(calls(cluster)) == 2 and len(e.state.records()) == 2
    clock.now += 60
    said = breaker_command(e.policy, e.state, "reset", "", clock.now)
    assert says in said
    assert ("may drain 2 node(s)" in said) == (drains == 2)
    e.reconcile()
    assert len(calls(cluster)) == 2 + drains
    assert e.state.breaker("enforce").open


def test_a_pause_stops_every_call_until_a_reset(tmp_path: Path, cluster: Path) -> None:
    clock = Clock()
    e = engine(tmp_path, cluster, clock)
    said = breaker_command(e.policy, e.state, "open", "switch maintenance, ticket 4711", clock.now)
    assert said.startswith("circuit breaker opened by a person (it was closed)")
    deliver(e, alert_json("GpuXidHardwareFault", "gpu007", starts=clock.now - 10, xid="79", action="RESTART_BM"),
            clock=clock)
    assert calls(cluster) == []
    assert e.state.notes()["gpu007"][0] == "not drained: paused by a person (switch maintenance, ticket 4711)"
    assert "PAUSED by a person" in status_text(e.policy, e.state, clock.now)
    breaker_command(e.policy, e.state, "reset", "", clock.now)
    e.reconcile()
    assert [c.split()[:2] for c in calls(cluster)] == [["reboot", "gpu007"]]


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


def test_a_dry_run_never_counts_towards_the_enforced_budget_or_breaker(
        tmp_path: Path, cluster: Path, caplog: pytest.LogCaptureFixture) -> None:
    """An operator evaluates in a dry run, then enforces on the same state file: the dry run's
    breaker, records and drains are its own, and every line it logged said it was a dry run."""
    clock = Clock()
    caplog.set_level("INFO", logger="gpunode-remediate")
    dry = engine(tmp_path, cluster, clock, mode="dry-run")
    storm = [alert_json("GpuNodeHostStarved", f"gpu{i:03d}", starts=clock.now - 100 + i) for i in range(1, 31)]
    deliver(dry, *storm, clock=clock)
    assert calls(cluster) == [] and dry.state.breaker("dry-run").open and not dry.state.breaker("enforce").open
    assert caplog.records and all(r.getMessage().startswith("dry run: ") for r in caplog.records)
    assert "circuit breaker (dry run): OPEN" in status_text(dry.policy, dry.state, clock.now)
    assert "gpu001  drained (dry run)" in status_text(dry.policy, dry.state, clock.now)
    dry.state.close()
    caplog.clear()
    real = engine(tmp_path, cluster, clock)
    assert real.state.records() == {} and real.state.history(real.policy, clock.now).budget_used == 0
    assert "dry run's: its 2 node record(s) are dropped" in caplog.text
    real.reconcile()
    assert [c.split()[:2] for c in calls(cluster)] == [["drain", "gpu001"], ["drain", "gpu002"]]
    assert not any(r.getMessage().startswith("dry run") for r in caplog.records)


def test_a_failed_validation_holds_the_node_with_the_checks_last_line(tmp_path: Path, cluster: Path) -> None:
    clock = Clock()
    check = [sys.executable, "-c", "import sys; print('Running diag'); print('GPU 3: diag failed: memory'); "
             "sys.exit(1 if sys.argv[1] == 'gpu004' else 0)", "{node}"]
    e = engine(tmp_path, cluster, clock, validate_command=check)
    for node in ("gpu004", "gpu005"):
        deliver(e, alert_json("GpuNvLinkDegraded", node, starts=clock.now - 300), clock=clock)
        deliver(e, alert_json("GpuNvLinkDegraded", node, status="resolved", starts=clock.now - 300, ends=clock.now),
                clock=clock)
    clock.now += 901
    e.reconcile()
    assert calls(cluster)[2:] == ["drain gpu004 gpunode: hold validation failed: GPU 3: diag failed: memory",
                                  "resume gpu005"]
    assert e.state.records()["gpu004"].phase == "held" and "gpu005" not in e.state.records()
    text = Renderer().render(metrics.families(e)).decode()
    assert "gpunode_remediate_return_seconds_count 1\n" in text
    assert 'gpunode_remediate_return_seconds_bucket{le="900.0"} 0\n' in text  # 901 s from drain to return
    assert 'gpunode_remediate_return_seconds_bucket{le="1800.0"} 1\n' in text


def test_a_node_a_person_resumes_is_not_taken_back_for_the_same_episode(tmp_path: Path, cluster: Path) -> None:
    """Held for a failed remap; a person resumes it (the alert still fires: the GPU is not replaced
    yet, or they know better). The same episode never takes it back; a new one does."""
    clock = Clock()
    e = engine(tmp_path, cluster, clock)
    failure = alert_json("GpuRowRemapFailure", "gpu007", gpu="1", starts=clock.now - 60)
    deliver(e, failure, clock=clock)
    assert calls(cluster) == ["drain gpu007 gpunode: hold GpuRowRemapFailure gpu=1"]
    nodes = json.loads(cluster.read_text())
    nodes["gpu007"] = {"state": "idle", "reason": ""}  # scontrol update nodename=gpu007 state=resume
    cluster.write_text(json.dumps(nodes))
    clock.now += 30
    for _ in range(3):
        deliver(e, failure, clock=clock)  # Alertmanager's repeats, and Alertmanager's list, say it fires
    assert len(calls(cluster)) == 1 and "gpu007" not in e.state.records()
    again = alert_json("GpuRowRemapFailure", "gpu007", gpu="1", starts=clock.now)  # a new episode
    deliver(e, {**again, "fingerprint": failure["fingerprint"]}, clock=clock)
    assert calls(cluster)[1:] == ["drain gpu007 gpunode: hold GpuRowRemapFailure gpu=1"]


def test_a_drain_that_timed_out_counts_against_the_budget(tmp_path: Path, cluster: Path) -> None:
    """The scheduler carried the drain out but answered too late: it may have taken effect, so it
    counts. With a budget of 2 (5 % of 40), a third node is not drained."""
    clock = Clock()
    argv = [sys.executable, str(tmp_path / "sched.py"), str(cluster)]
    slow = tmp_path / "drain-slowly"
    slow.write_text(f'#!/bin/sh\n{shlex.join(argv)} drain "$1" "$2"\n[ "$1" = gpu001 ] && sleep 5\nexit 0\n')
    slow.chmod(0o755)
    e = engine(tmp_path, cluster, clock, scheduler={"kind": "commands", "timeout": "1s", "retries": 0, "commands": {
        "nodes": [*argv, "nodes"], "drain": [str(slow), "{node}", "{reason}"],
        "resume": [*argv, "resume", "{node}"], "reboot": [*argv, "reboot", "{node}", "{reason}"]}})
    for n in (1, 2, 3):
        deliver(e, alert_json("GpuNvLinkDegraded", f"gpu00{n}", starts=clock.now - 100 + n), clock=clock)
    assert e.actions[("drain", "failed")] == 1 and e.actions[("drain", "done")] == 1
    assert [c.split()[1] for c in calls(cluster)] == ["gpu001", "gpu002"]
    assert e.state.breaker("enforce").open and e.state.history(e.policy, clock.now).budget_used == 2


def test_the_budget_counts_a_drain_from_when_it_was_made_not_from_a_slow_passs_start(
        tmp_path: Path, cluster: Path) -> None:
    """A pass whose listing takes long (slurmctld starting again) drains a node minutes after the pass
    began. The window counts that drain from when it was made: 59 min later, with a budget of 2 per
    hour, one more node is drained, not two."""
    clock = Clock()
    e = engine(tmp_path, cluster, clock, budget={"window": "1h"})
    listing = e.scheduler.nodes

    def slow_listing(**kwargs: object) -> object:
        clock.now += 600
        return listing(**kwargs)

    e.scheduler.nodes = slow_listing  # type: ignore[method-assign]
    deliver(e, alert_json("GpuNvLinkDegraded", "gpu001", starts=clock.now - 100), clock=clock)
    drained_at = clock.now
    e.scheduler.nodes = listing  # type: ignore[method-assign]
    clock.now = drained_at + 3540
    deliver(e, *[alert_json("GpuNvLinkDegraded", f"gpu00{n}", starts=clock.now - 100 + n) for n in (2, 3)],
            clock=clock)
    assert [c.split()[1] for c in calls(cluster)] == ["gpu001", "gpu002"]
    assert e.state.history(e.policy, clock.now).budget_used == 2 and e.state.breaker("enforce").open
    clock.now = drained_at + 3601  # an hour after the first drain was made: it no longer counts
    assert e.state.history(e.policy, clock.now).budget_used == 1


def test_a_state_file_of_the_earlier_version_keeps_its_open_breaker(tmp_path: Path) -> None:
    """One breaker for both modes before: `status` reads it as it is, the service takes it as the
    enforced one (closing it silently would be worse), and `breaker reset` closes it."""
    State(tmp_path / "state.db").close()
    old = sqlite3.connect(tmp_path / "state.db")  # as the earlier version left it: its tables, its one breaker
    old.executescript("DROP TABLE breakers; DROP TABLE meta; DROP TABLE returns; "
                      "CREATE TABLE breaker (id INTEGER PRIMARY KEY CHECK (id = 1), open INTEGER NOT NULL, "
                      "since REAL NOT NULL, why TEXT NOT NULL); "
                      "INSERT INTO breaker VALUES (1, 1, 1700000000, 'circuit breaker open: 2 of 2 nodes')")
    old.commit()
    old.close()
    policy = build({"mode": "enforce", "state_path": str(tmp_path / "state.db")})
    read_only = State(policy.state_path, readonly=True)
    assert "circuit breaker: OPEN since" in status_text(policy, read_only, 1_700_000_100.0)
    read_only.close()
    state = State(policy.state_path)
    assert state.breaker("enforce").open and not state.breaker("dry-run").open
    breaker_command(policy, state, "reset", "", 1_700_000_200.0)
    assert not state.breaker("enforce").open


def test_a_node_a_person_resumed_while_the_service_was_down_stays_theirs(tmp_path: Path, cluster: Path) -> None:
    """The chaos soak's case: drained for a reset (a job runs on it), the service killed, a person
    resumes the node meanwhile. Restarted, the service releases it and never drains it again for
    the alert still firing."""
    clock = Clock()
    e = engine(tmp_path, cluster, clock)
    nodes = json.loads(cluster.read_text())
    nodes["gpu011"]["state"] = "allocated"
    cluster.write_text(json.dumps(nodes))
    pending = alert_json("GpuRowRemapPending", "gpu011", gpu="5", starts=clock.now - 30)
    deliver(e, pending, clock=clock)
    assert calls(cluster) == ["drain gpu011 gpunode: reset GpuRowRemapPending gpu=5"]
    assert e.state.records()["gpu011"].phase == "reset_wait"  # written with the call's outcome
    e.state.close()
    nodes = json.loads(cluster.read_text())
    nodes["gpu011"] = {"state": "allocated", "reason": ""}  # scontrol update nodename=gpu011 state=resume
    cluster.write_text(json.dumps(nodes))
    again = engine(tmp_path, cluster, clock)
    again.reconcile()
    for _ in range(2):
        deliver(again, pending, clock=clock)
    assert len(calls(cluster)) == 1 and "gpu011" not in again.state.records()


def test_an_alert_without_a_node_label_is_kept_and_never_acted_on_as_a_node(tmp_path: Path, cluster: Path) -> None:
    """NfsServerNotResponding{server} names a server, not a node: kept for job recovery, no node drained
    (even by a policy rule that would drain one), and resolved by Alertmanager's list like any other."""
    clock = Clock()
    rules = [{"alertname": "NfsServerNotResponding", "action": "drain"}]
    e = engine(tmp_path, cluster, clock, rules=rules)
    server = alert_json("NfsServerNotResponding", "gpu001", server="nfs01", starts=clock.now - 60)
    del server["labels"]["instance"]
    assert e.receive(parse(notification(server)), clock()) == 1
    assert e.reconcile() == [] and calls(cluster) == []
    [kept] = e.state.firing_unplaced()
    assert kept.labels["server"] == "nfs01" and e.state.firing() == {}
    assert e.state.outage("NfsServerNotResponding", "nfs01") == (True, None)
    assert "left alone" not in status_text(e.policy, e.state, clock.now)
