"""The plan: which step each node gets, from its alerts, the scheduler's view, the history and the time."""

from __future__ import annotations

from gpunode_remediate.alerts import Alert
from gpunode_remediate.plan import MARKER, History, NodeView, Record, Step, counted, plan
from gpunode_remediate.policy import build
from tests.remediation import alert

NODES = [f"gpu{i:03d}" for i in range(1, 41)]
POLICY = build({"mode": "enforce", "requeue": {"enabled": True}})


def idle(**changed: NodeView) -> dict[str, NodeView]:
    return {name: changed.get(name, NodeView(name, "idle")) for name in NODES}


def xid79(node: str = "gpu003", starts: float = 100.0):
    return alert("GpuXidHardwareFault", node, starts, xid="79", action="RESTART_BM", gpu="3")


def steps(firing, views=None, records=None, history=None, now=1000.0, resolved=None, policy=POLICY) -> list[Step]:
    by_node: dict = {}
    for a in firing:
        by_node.setdefault(POLICY.node(a.labels), []).append(a)
    return plan(now, policy, views or idle(), by_node, resolved or {}, records or {}, history or History())


def ours(name: str, action: str, state: str = "idle", *flags: str) -> NodeView:
    return NodeView(name, state, frozenset({"drain", *flags}), f"{MARKER} {action} X")


def test_xid79_reboots_once_idle_through_the_scheduler_with_our_reason() -> None:
    [step] = steps([xid79()])
    assert (step.node, step.kind, step.phase, step.new_drain) == ("gpu003", "reboot", "reboot_wait", True)
    assert step.reason == "gpunode: reboot GpuXidHardwareFault xid=79 action=RESTART_BM gpu=3"


def test_a_second_xid79_within_the_window_holds_the_node_for_a_person() -> None:
    [step] = steps([xid79()], history=History(reboots={"gpu003": 1}))
    assert (step.kind, step.phase, step.action) == ("drain", "held", "hold")
    assert step.reason.startswith("gpunode: hold ") and "second reboot fault" in step.reason


def test_reset_gpu_drains_then_resets_once_idle_then_returns_after_the_quiet_period() -> None:
    reset = alert("GpuXidHardwareFault", "gpu005", xid="119", action="RESET_GPU", gpu="2")
    [drain] = steps([reset])
    assert (drain.kind, drain.phase, drain.gpus) == ("drain", "reset_wait", ("2",))
    record = Record("gpu005", "reset_wait", "reset", "x", 900.0, ("2",))
    busy = idle(gpu005=ours("gpu005", "reset", "allocated"))
    assert steps([reset], busy, {"gpu005": record}) == []
    [do] = steps([reset], idle(gpu005=ours("gpu005", "reset")), {"gpu005": record})
    assert (do.kind, do.phase, do.gpus) == ("reset", "reset_done", ("2",))
    done = {"gpu005": Record("gpu005", "reset_done", "reset", "x", 950.0, ("2",))}
    view = idle(gpu005=ours("gpu005", "reset"))
    assert steps([reset], view, done) == []  # still firing
    assert steps([], view, done, now=1000.0, resolved={"gpu005": 960.0}) == []  # quiet for 40 s only
    [back] = steps([], view, done, now=960.0 + 900, resolved={"gpu005": 960.0})
    assert (back.kind, back.phase, back.health) == ("resume", None, True)


def test_hardware_that_needs_a_person_is_held_and_never_returned() -> None:
    failure = alert("GpuRowRemapFailure", "gpu007", gpu="1")
    [step] = steps([failure])
    assert (step.kind, step.phase) == ("drain", "held")
    held = {"gpu007": Record("gpu007", "held", "hold", "x", 0.0)}
    assert steps([], idle(gpu007=ours("gpu007", "hold")), held, now=1e9, resolved={"gpu007": 1.0}) == []


def test_application_xids_are_recorded_not_acted_on() -> None:
    assert steps([alert("GpuXidApplicationFault", "gpu002", xid="94", action="RESTART_APP")]) == []


def test_an_operators_drain_down_or_reservation_is_left_alone() -> None:
    for view in (NodeView("gpu003", "idle", frozenset({"drain"}), "bad DIMM [alice]"),
                 NodeView("gpu003", "down", frozenset(), "Not responding"),
                 NodeView("gpu003", "idle", frozenset({"reserved"}), "")):
        [step] = steps([xid79()], idle(gpu003=view))
        assert step.kind == "note" and not step.calls and "left alone" in step.why


def test_a_node_the_scheduler_does_not_list_gets_no_call() -> None:
    [step] = steps([xid79("login1")])
    assert step.kind == "note" and "no such node" in step.why


def test_a_storm_stops_at_the_budget_and_opens_the_breaker() -> None:
    storm = [alert("GpuNvLinkDegraded", node, starts=100.0 + n) for n, node in enumerate(NODES[:30])]
    out = steps(storm)
    assert [s.node for s in out if s.kind == "drain"] == ["gpu001", "gpu002"]  # 5 % of 40, first alerted first
    assert sum(s.kind == "block" for s in out) == 28
    assert all(s.kind == "block" for s in steps(storm, history=History(breaker_open=True)))


def test_the_budget_counts_what_was_drained_in_the_window() -> None:
    out = steps([xid79()], history=History(budget_used=2))
    assert [s.kind for s in out] == ["block"]


def test_the_third_drain_in_a_week_holds_a_repeat_offender() -> None:
    [step] = steps([alert("GpuNodeClockThrottled", "gpu009")], history=History(drains={"gpu009": 2}))
    assert step.phase == "held" and "repeat offender" in step.why
    [step] = steps([alert("GpuNodeClockThrottled", "gpu009")], history=History(drains={"gpu009": 1}))
    assert step.phase == "drained"


def test_a_drained_node_escalates_to_a_reboot_without_new_budget() -> None:
    record = {"gpu003": Record("gpu003", "drained", "drain", "x", 500.0)}
    [step] = steps([xid79()], idle(gpu003=ours("gpu003", "drain")), record, History(budget_used=2))
    assert (step.kind, step.phase, step.new_drain) == ("reboot", "reboot_wait", False)


def test_a_reboot_completes_when_the_scheduler_shows_the_node_down_and_no_longer_rebooting() -> None:
    record = {"gpu003": Record("gpu003", "reboot_wait", "reboot", "x", 500.0)}
    rebooting = ours("gpu003", "reboot", "idle", "reboot_requested")
    assert steps([xid79()], idle(gpu003=rebooting), record) == []
    [step] = steps([xid79()], idle(gpu003=NodeView("gpu003", "down", frozenset(), f"{MARKER} reboot X")), record)
    assert (step.kind, step.phase) == ("note", "rebooted")


def test_a_node_a_person_resumed_is_theirs() -> None:
    record = {"gpu003": Record("gpu003", "held", "hold", "x", 500.0)}
    [step] = steps([], idle(), record)
    assert step.kind == "release" and step.phase is None


def test_a_node_drained_with_our_marker_but_no_record_is_taken_back() -> None:
    [step] = steps([], idle(gpu004=ours("gpu004", "reboot", "idle", "reboot_requested")))
    assert (step.kind, step.phase, step.action) == ("adopt", "reboot_wait", "reboot")


def test_a_stragglers_jobs_are_requeued_with_backoff_then_the_node_is_held() -> None:
    record = {"gpu010": Record("gpu010", "drained", "drain", "x", 500.0)}
    view = idle(gpu010=NodeView("gpu010", "allocated", frozenset({"drain"}), f"{MARKER} drain X", ("77",)))
    slow = [alert("GpuNodeClockThrottled", "gpu010")]
    [first] = steps(slow, view, record)
    assert (first.kind, first.job) == ("requeue", "77")
    assert steps(slow, view, record, History(requeues={"77": (1, 1000.0)}), now=1000.0 + 599) == []
    [second] = steps(slow, view, record, History(requeues={"77": (1, 1000.0)}), now=1000.0 + 600)
    assert second.kind == "requeue"
    [last] = steps(slow, view, record, History(requeues={"77": (4, 1000.0)}), now=1e6)
    assert (last.kind, last.phase) == ("hold", "held")


def test_requeue_is_off_by_default() -> None:
    record = {"gpu010": Record("gpu010", "drained", "drain", "x", 500.0)}
    view = idle(gpu010=NodeView("gpu010", "allocated", frozenset({"drain"}), f"{MARKER} drain X", ("77",)))
    assert steps([alert("GpuNodeClockThrottled", "gpu010")], view, record, policy=build({})) == []


def test_a_wait_for_jobs_to_end_is_held_after_idle_timeout() -> None:
    policy = build({"mode": "enforce", "idle_timeout": "2h"})
    for phase, action, flags in (("reset_wait", "reset", ()), ("reboot_wait", "reboot", ("reboot_requested",))):
        record = {"gpu005": Record("gpu005", phase, action, "x", 1000.0)}
        busy = idle(gpu005=ours("gpu005", action, "allocated", *flags))
        assert steps([], busy, record, now=1000.0 + 7200, policy=policy) == []
        [held] = steps([], busy, record, now=1000.0 + 7201, policy=policy)
        assert (held.kind, held.phase, held.action) == ("hold", "held", "hold")
        assert held.reason == "gpunode: hold idle_timeout: jobs still running after 2.0 h"


def test_a_reboot_that_never_completes_is_held_after_reboot_timeout() -> None:
    policy = build({"mode": "enforce", "reboot_timeout": "30m"})
    waiting = {"gpu003": Record("gpu003", "reboot_wait", "reboot", "x", 500.0)}
    issued = idle(gpu003=ours("gpu003", "reboot", "down", "reboot_issued"))
    [started] = steps([], issued, waiting, now=600.0, policy=policy)
    assert (started.kind, started.phase) == ("note", "rebooting")
    rebooting = {"gpu003": Record("gpu003", "rebooting", "reboot", "x", 600.0)}
    assert steps([], issued, rebooting, now=600.0 + 1800, policy=policy) == []
    [held] = steps([], issued, rebooting, now=600.0 + 1801, policy=policy)
    assert (held.kind, held.phase) == ("hold", "held") and "reboot_timeout" in held.reason
    # Slurm gave up first (ResumeTimeout): its own reason replaced ours, and the node is still ours to hold.
    # Slurm 22.05 appends to our reason (tests/test_slurm_reboot_behaviour.py).
    slurms = "gpunode: reboot X : reboot issued : reboot timed out"
    timed_out = idle(gpu003=NodeView("gpu003", "down", frozenset(), slurms))
    [held] = steps([], timed_out, rebooting, now=700.0, policy=policy)
    assert (held.kind, held.phase) == ("hold", "held") and "the scheduler gave up on it" in held.reason
    assert "reboot timed out" not in held.reason  # Slurm would replace a reason holding its own words


def test_nodes_outside_include_and_exclude_are_left_alone_and_not_counted() -> None:
    policy = build({"mode": "enforce", "nodes": {"include": "gpu0[0-3][0-9]", "exclude": "gpu00[1-9]"}})
    [left] = steps([xid79("gpu004")], policy=policy)
    assert left.kind == "note" and "nodes.include/exclude" in left.why
    assert counted(policy, idle()) == 30  # gpu010-gpu039 of gpu001-gpu040
    # Nodes already down by someone else are no part of the fleet the budget is a share of.
    down = {n: NodeView(n, "down", frozenset(), "Not responding") for n in NODES[10:30]}
    assert counted(build({}), idle(**down)) == 20
    # For seconds after slurmctld restarts every node is UNKNOWN: the budget must not collapse to 1.
    unknown = {n: NodeView(n, "unknown", frozenset({"not_responding"})) for n in NODES}
    assert counted(build({}), unknown) == 40


def test_the_budget_has_an_absolute_maximum() -> None:
    storm = [alert("GpuNvLinkDegraded", node, starts=100.0 + n) for n, node in enumerate(NODES[:30])]
    big = {n: NodeView(n, "idle") for n in (f"gpu{i:04d}" for i in range(1000))} | idle()
    assert sum(s.kind == "drain" for s in steps(storm, big, policy=build({"mode": "enforce"}))) == 30  # 5 % of 1040
    capped = build({"mode": "enforce", "budget": {"maximum": 3, "in_care": 1.0}})
    out = steps(storm, big, policy=capped)
    assert [s.node for s in out if s.kind == "drain"] == ["gpu001", "gpu002", "gpu003"]
    assert "3 of 3 nodes drained in 24h" in next(s.why for s in out if s.kind == "block")


def test_nodes_in_care_at_once_are_capped_held_nodes_included() -> None:
    """A week of 5 % a day piles up held nodes: past budget.in_care (10 % of 40: 4) nothing more is taken."""
    held = {n: Record(n, "held", "hold", "x", 0.0) for n in NODES[:4]}
    views = idle(**{n: ours(n, "hold") for n in NODES[:4]})
    [block] = steps([xid79("gpu020")], views, held)
    assert block.kind == "block" and "4 of 4 nodes in the service's care (budget.in_care 0.1 of 40)" in block.why
    three = {n: held[n] for n in NODES[:3]}
    [taken] = steps([xid79("gpu020")], idle(**{n: ours(n, "hold") for n in three}), three)
    assert (taken.kind, taken.node) == ("reboot", "gpu020")


def test_a_pause_blocks_new_drains_with_the_persons_reason() -> None:
    [block] = steps([xid79()], history=History(breaker_open=True, paused="switch maintenance"))
    assert (block.kind, block.why) == ("block", "paused by a person (switch maintenance)")


def test_a_node_the_scheduler_returns_after_its_reboot_is_taken_back_and_a_persons_resume_is_not() -> None:
    """ReturnToService=2: back IDLE with no reason once its slurmd (started after the reboot call) registers."""
    record = {"gpu003": Record("gpu003", "reboot_wait", "reboot", "x", 500.0)}
    returned = idle(gpu003=NodeView("gpu003", "idle", started=560.0))
    [step] = steps([], returned, record)
    assert (step.kind, step.phase, step.new_drain) == ("drain", "rebooted", False)
    assert step.reason.startswith("gpunode: rebooted")
    [adopted] = steps([], idle(gpu003=NodeView("gpu003", "idle", frozenset({"drain"}), step.reason)))
    assert (adopted.kind, adopted.phase) == ("adopt", "rebooted")  # after a restart: the same phase
    resumed = idle(gpu003=NodeView("gpu003", "idle", started=400.0))  # its slurmd older than the reboot call
    [step] = steps([], resumed, record)
    assert step.kind == "release"
    # Rebooted, waiting for its checks, and back in service: a person's resume, unless the scheduler
    # is known to return rebooted nodes itself.
    done = {"gpu003": Record("gpu003", "rebooted", "reboot", "x", 600.0)}
    assert [s.kind for s in steps([], returned, done)] == ["release"]
    [step] = plan(1000.0, POLICY, returned, {}, {}, done, History(), returns_rebooted=True)
    assert (step.kind, step.phase) == ("drain", "rebooted")


def fabric(starts: float, gpu: str = "0") -> Alert:
    return alert("GpuFabricNotReady", "gpu003", starts, cause="not_started", gpu=gpu, uuid=f"GPU-{gpu}")


def test_a_reboot_alert_that_fires_again_after_the_reboot_holds_the_node_one_from_before_does_not() -> None:
    """Rebooted at 600 (its slurmd started then; the service saw it at 615): an alert from before the
    reboot that Alertmanager has not resolved yet waits; the fabric alert again 5 min after the boot holds."""
    view = idle(gpu003=NodeView("gpu003", "down", frozenset({"drain"}), f"{MARKER} reboot X", started=600.0))
    done = {"gpu003": Record("gpu003", "rebooted", "reboot", "x", 615.0)}
    assert steps([fabric(300.0)], view, done, now=700.0) == []  # stale: began before the reboot
    assert steps([fabric(300.0), fabric(320.0, "1")], view, done, now=5000.0) == []  # still only stale ones
    [step] = steps([fabric(300.0), fabric(910.0, "5")], view, done, now=920.0)
    assert (step.kind, step.phase, step.action, step.gpus) == ("hold", "held", "hold", ("5",))
    assert step.reason == ("gpunode: hold GpuFabricNotReady cause=not_started gpu=5 fired again after its reboot: "
                           "the NVLink fabric is not ready: a reboot brings it up")
    assert step.why.startswith("GpuFabricNotReady fired again after its reboot")
    # Another reboot fault after the reboot holds as well; a weaker alert (a drain) waits for its quiet period.
    [xid] = steps([xid79(starts=700.0)], view, done, now=720.0)
    assert xid.kind == "hold" and "GpuXidHardwareFault xid=79" in xid.reason
    throttled = alert("GpuNodeClockThrottled", "gpu003", 700.0, gpu="1")
    assert steps([throttled], view, done, now=720.0) == []


def test_the_reboot_is_dated_by_the_boot_or_else_by_when_the_service_saw_it() -> None:
    # Adopted after a restart of the service long after the boot: its `since` is late, the boot is not.
    adopted = {"gpu003": Record("gpu003", "rebooted", "reboot", "x", 2000.0)}
    booted = idle(gpu003=NodeView("gpu003", "down", frozenset({"drain"}), f"{MARKER} reboot X", started=600.0))
    assert [s.kind for s in steps([fabric(910.0)], booted, adopted, now=2100.0)] == ["hold"]
    assert steps([fabric(500.0)], booted, adopted, now=2100.0) == []
    # A scheduler that does not say when the node started: when the service saw the reboot done.
    unknown = idle(gpu003=ours("gpu003", "reboot", "down"))
    assert steps([fabric(910.0)], unknown, adopted, now=2100.0) == []
    [step] = steps([fabric(2050.0)], unknown, adopted, now=2100.0)
    assert step.kind == "hold"


def test_a_reset_alert_that_fires_again_after_the_reset_holds_the_node() -> None:
    """Rows pending remap again after the reset that applied the last ones: the GPU needs a person."""
    pending = alert("GpuRowRemapPending", "gpu005", 100.0, gpu="2")
    view = idle(gpu005=ours("gpu005", "reset"))
    done = {"gpu005": Record("gpu005", "reset_done", "reset", "x", 950.0, ("2",))}
    assert steps([pending], view, done, now=1000.0) == []  # the alert that asked for the reset, not yet resolved
    again = alert("GpuRowRemapPending", "gpu005", 1900.0, gpu="2")
    [step] = steps([again], view, done, now=1910.0)
    assert (step.kind, step.phase, step.gpus) == ("hold", "held", ("2",))
    assert step.reason == ("gpunode: hold GpuRowRemapPending gpu=2 fired again after its reset: "
                           "row remaps wait for a GPU reset")
    # The node's slurmd start says nothing of a reset: a node booted after the alert began still waits.
    booted = idle(gpu005=NodeView("gpu005", "idle", frozenset({"drain"}), f"{MARKER} reset X", started=50.0))
    assert steps([pending], booted, done, now=1000.0) == []
