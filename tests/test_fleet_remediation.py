"""The remediation replay (fleet/remediation.py): gpunode-remediate's engine and plan fed hand-made alert
episodes against the simulated scheduler, and scored against a hand-made truth. No backend."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

import fleet.__main__ as fleet_main
from fleet import harness, remediation
from fleet.alertmanager import Matcher, fingerprint, inhibitions, matcher, muted
from fleet.harness import Firing
from fleet.remediation import POLICY, replay, score, storm
from fleet.simulate import Truth
from gpunode_remediate.policy import Budget

T = 1_700_000_000.0
NODES = [f"gpu{n:03d}" for n in range(40)]
NO_BREAKER = replace(POLICY, budget=Budget(1.0, 1, 86400.0, in_care=1.0))


def episode(alertname: str, node: str, start: float, end: float, **labels: str) -> Firing:
    """As the harness reads them from ALERTS: the alert's labels, its name among them."""
    return Firing(alertname, {"alertname": alertname, "instance": node, "job": "gpunode",
                              "severity": "critical", **labels}, T + start, T + end)


def xid(node: str, code: str, action: str, start: float, end: float, gpu: str = "3") -> Firing:
    return episode("GpuXidHardwareFault", node, start, end, xid=code, action=action, gpu=gpu)


def kinds(result: remediation.Replay, node: str) -> list[tuple[float, str]]:
    return [(e.at - T, e.kind) for e in result.timeline.get(node, [])]


def test_xid79_reboots_its_node_and_keeps_it_out_while_the_gpu_is_lost() -> None:
    # The simulator's Xid 79: Xid 79 (RESTART_BM) and 145 (RESET_GPU) at once, GpuDown a minute later
    # for as long as the GPU is lost.
    firing = [xid("gpu007", "79", "RESTART_BM", 3600, 3600 + 840), xid("gpu007", "145", "RESET_GPU", 3600, 3600 + 840),
              episode("GpuDown", "gpu007", 3660, 6 * 3600, gpu="3")]
    result = replay(firing, NODES, POLICY, T, T + 6 * 3600)
    assert kinds(result, "gpu007") == [(3600.0, "reboot"), (3660.0, "note")]  # rebooted one step later
    assert result.timeline["gpu007"][0].alerts == ("GpuXidHardwareFault",)
    assert result.out == {"gpu007": [(T + 3600, T + 6 * 3600)]}  # never returned: GpuDown fires on
    # The reset Xid never reached the service: the reboot Xid's inhibition mutes it.
    assert {f.labels["xid"] for f in result.sent if f.alertname == "GpuXidHardwareFault"} == {"79"}
    truth = [Truth("xid79_collapse", "gpu007", T + 3600, T, T + 7200)]
    [outcome] = score(result, truth, firing).faults
    assert (outcome.taken, outcome.delay, outcome.actions) == (T + 3600, 0.0, ("reboot",))
    assert score(result, truth, firing).healthy_hours == 0.0  # the lost GPU keeps the node faulty


def test_a_second_reboot_fault_within_the_window_holds_the_node_for_a_person() -> None:
    firing = [xid("gpu001", "79", "RESTART_BM", 600, 1500), xid("gpu001", "79", "RESTART_BM", 86400, 87300, gpu="5")]
    result = replay(firing, NODES, POLICY, T, T + 2 * 86400)
    assert kinds(result, "gpu001") == [(600.0, "reboot"), (660.0, "note"), (2400.0, "resume"), (86400.0, "hold")]
    assert "second reboot fault" in result.timeline["gpu001"][-1].why
    assert result.out["gpu001"] == [(T + 600, T + 2400), (T + 86400, T + 2 * 86400)]  # held: waits for a person


def test_a_storm_on_30_of_40_nodes_drains_2_with_the_breaker_and_30_without() -> None:
    bad = storm(NODES, T + 600, fraction=0.75, lasts=3600)
    assert len(bad) == 30 and len({f.labels["instance"] for f in bad}) == 30
    guarded = replay(bad, NODES, POLICY, T, T + 4 * 3600)
    assert (guarded.budget, len(guarded.taken()), len(guarded.blocked() - guarded.taken())) == (2, 2, 28)
    assert guarded.breaker is not None and guarded.breaker[0] == T + 600
    assert "2 of 2 nodes drained in 24h" in guarded.breaker[1]
    free = replay(bad, NODES, NO_BREAKER, T, T + 4 * 3600)
    assert (free.budget, len(free.taken()), free.blocked(), free.breaker) == (40, 30, set(), None)
    # Every drained node returns once the alerts have been resolved for the quiet period.
    assert all(spans == [(T + 600, T + 600 + 3600 + 900)] for spans in free.out.values())
    assert free.out_hours() == pytest.approx(30 * 1.25)
    # Healthy nodes all: each drain is one of a healthy node.
    assert len(score(guarded, []).healthy_takes) == 2 and score(free, []).healthy_hours == pytest.approx(37.5)


def test_the_open_breaker_blocks_a_real_fault_after_the_storm() -> None:
    bad = storm(NODES, T + 600, fraction=0.75, lasts=3600)
    calm = min(set(NODES) - {f.labels["instance"] for f in bad})
    firing = [*bad, xid(calm, "79", "RESTART_BM", 7200, 8100)]
    truth = [Truth("xid79_collapse", calm, T + 7200, T + 3600, T + 10800)]
    [blocked] = score(replay(firing, NODES, POLICY, T, T + 4 * 3600), truth, firing).faults
    assert (blocked.taken, blocked.blocked) == (None, True)
    [taken] = score(replay(firing, NODES, NO_BREAKER, T, T + 4 * 3600), truth, firing).faults
    assert taken.delay == 0.0


def test_an_application_xid_and_alerts_without_a_rule_do_nothing() -> None:
    firing = [episode("GpuXidApplicationFault", "gpu013", 600, 1500, xid="94", action="RESTART_APP", gpu="1"),
              episode("GpuNodeGpuVisibilityMismatch", "gpu013", 300, 900)]
    result = replay(firing, NODES, POLICY, T, T + 3 * 3600)
    assert (result.timeline, result.out, result.breaker) == ({}, {}, None)
    assert [f.alertname for f in result.sent] == ["GpuXidApplicationFault"]  # routed, but its rule is "none"
    [outcome] = score(result, [Truth("correctable_acceleration", "gpu013", T + 7200, T, T + 10800)], firing).faults
    assert outcome.taken is None and not outcome.blocked
    assert outcome.unruled == ("GpuNodeGpuVisibilityMismatch", "GpuXidApplicationFault")


def test_a_precursor_holds_the_node_before_the_loss() -> None:
    """The report's gpu124: correctable remaps accelerate for days before the GPU is lost."""
    firing = [episode("GpuRowRemapCorrectableAcceleration", "gpu013", 0, 7200, gpu="1")]
    result = replay(firing, NODES, POLICY, T, T + 3 * 3600)
    [event] = result.timeline["gpu013"]
    assert (event.kind, event.phase, event.at) == ("hold", "held", T)
    [outcome] = score(result, [Truth("correctable_acceleration", "gpu013", T + 7200, T, T + 10800)], firing).faults
    assert outcome.taken is not None and outcome.delay is not None and outcome.delay < 0  # before the loss


def test_a_straggler_is_drained_and_returned_after_the_quiet_period() -> None:
    firing = [episode("GpuNodeClockThrottled", "gpu033", 1800, 1800 + 3 * 3600, severity="warning")]
    result = replay(firing, NODES, POLICY, T, T + 6 * 3600)
    resumed = 1800 + 3 * 3600 + POLICY.quiet_period
    assert kinds(result, "gpu033") == [(1800.0, "drain"), (resumed, "resume")]
    assert result.timeline["gpu033"][0].phase == "drained"
    truth = [Truth("throttle", "gpu033", T + 1560, T + 1560, T + 1800 + 3 * 3600)]  # onset 4 min before
    outcome = score(result, truth, firing)
    assert outcome.faults[0].delay == 240.0 and outcome.isolated == (1, 1)
    assert outcome.healthy_hours == pytest.approx(0.25)  # the quiet period after the fault ended
    assert outcome.healthy_takes == ()


def test_a_straggler_that_comes_back_within_the_quiet_period_stays_drained() -> None:
    firing = [episode("GpuNvLinkDegraded", "gpu002", 600, 1200), episode("GpuNvLinkDegraded", "gpu002", 1500, 2400)]
    result = replay(firing, NODES, POLICY, T, T + 3 * 3600)
    assert kinds(result, "gpu002") == [(600.0, "drain"), (2400.0 + 900, "resume")]


@pytest.mark.parametrize(("policy", "expected"), [
    (POLICY, [(600.0, "drain"), (660.0, "reset"), (1500.0 + 900, "resume")]),
    (replace(POLICY, reset_command=()), [(600.0, "drain"), (660.0, "hold")]),  # the service holds it for a person
])
def test_a_reset_xid_resets_the_gpu_once_idle_or_holds_without_a_reset_command(policy, expected) -> None:
    result = replay([xid("gpu005", "119", "RESET_GPU", 600, 1500, gpu="2")], NODES, policy, T, T + 3 * 3600)
    assert kinds(result, "gpu005") == expected


def test_the_budget_counts_distinct_nodes_per_window_and_the_breaker_stays_open() -> None:
    # 40 nodes: 2 per 24 h. Two faults drain two nodes; a third node on the next day is within the window
    # of neither (25 h later) but the breaker, once open, stays open until a person closes it.
    firing = [episode("GpuNodeHostStarved", "gpu001", 0, 600), episode("GpuNodeHostStarved", "gpu002", 60, 600),
              episode("GpuNodeHostStarved", "gpu003", 120, 600), episode("GpuNodeHostStarved", "gpu004", 90000, 90600)]
    result = replay(firing, NODES, POLICY, T, T + 2 * 86400)
    assert result.taken() == {"gpu001", "gpu002"} and result.blocked() == {"gpu003", "gpu004"}
    assert result.breaker is not None and result.breaker[0] == T + 120
    # Without the storm's third node, the budget frees after 24 h.
    calm = replay([f for f in firing if f.labels["instance"] != "gpu003"], NODES, POLICY, T, T + 2 * 86400)
    assert calm.taken() == {"gpu001", "gpu002", "gpu004"} and calm.breaker is None


def test_alertmanager_matchers_and_inhibitions() -> None:
    assert matcher('alertname=~"A|B"') == Matcher("alertname", "=~", "A|B")
    assert matcher("alertname!=GpuDown") == Matcher("alertname", "!=", "GpuDown")
    rules = inhibitions()
    down = {"alertname": "GpuDown", "instance": "gpu001", "gpu": "3"}
    xid3 = {"alertname": "GpuXidHardwareFault", "instance": "gpu001", "gpu": "3", "action": "RESTART_BM"}
    xid5 = {**xid3, "gpu": "5"}
    assert muted(xid3, [down, xid3], rules) and not muted(xid5, [down, xid5], rules)
    assert not muted(down, [down, xid3], rules)  # GpuDown is no target of its own rule
    reset = {**xid3, "action": "RESET_GPU", "gpu": "4"}
    assert muted(reset, [xid5, reset], rules) and not muted(reset, [reset], rules)
    assert not muted(reset, [{**xid5, "instance": "gpu002"}, reset], rules)  # another node's reboot


def test_fingerprint_is_alertmanagers_fnv1a_over_sorted_labels() -> None:
    assert fingerprint({}) == "cbf29ce484222325"  # FNV-1a 64's offset basis: nothing hashed
    a = fingerprint({"alertname": "GpuDown", "instance": "gpu001", "gpu": "3"})
    assert a == fingerprint({"gpu": "3", "instance": "gpu001", "alertname": "GpuDown"})
    assert a != fingerprint({"alertname": "GpuDown", "instance": "gpu001", "gpu": "4"})
    assert len(a) == 16 and int(a, 16) >= 0


def test_the_fleet_flag_writes_the_remediation_tables(tmp_path: Path, monkeypatch, capsys) -> None:
    """`python -m fleet --remediation` on the self-test scenario, its backend run replaced by hand-made
    episodes at the truth's times."""
    def fake_run(backend, fleet, workdir, port=None, spec_path=None, then=None):
        workdir.mkdir(parents=True, exist_ok=True)
        truth = {t.kind: t for t in fleet.truth()}
        x, th = truth["xid79_collapse"], truth["throttle"]
        firing = [Firing("GpuXidHardwareFault", {"alertname": "GpuXidHardwareFault", "instance": x.node, "xid": "79",
                                                 "action": "RESTART_BM", "gpu": "3", "severity": "critical"},
                         x.onset, x.onset + 840),
                  Firing("GpuNodeClockThrottled", {"alertname": "GpuNodeClockThrottled", "instance": th.node,
                                                   "severity": "warning"}, th.onset + 240, th.end)]
        return harness.Run(backend, firing, 0.0, 0.0, 0)

    monkeypatch.setattr(fleet_main.harness, "run", fake_run)
    assert fleet_main.main(["--scenario", "selftest", "--backend", "victoriametrics", "--remediation",
                            "--workdir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "#### Remediation replay: selftest on victoriametrics" in out
    # 6 nodes: a budget of 1 node per 24 h (5 %, at least 1). The throttled node takes it; the Xid 79
    # half an hour later opens the breaker and is left alone.
    assert "| throttle | gpu002 | 0d1h30m | yes | yes | +4.0 | drain | GpuNodeClockThrottled | - |" in out
    assert "| xid79_collapse | gpu004 | 0d2h00m | yes | blocked by the breaker | - | - | - | - |" in out
    assert "isolated: **1 of 2**" in out and "Circuit breaker: opened at 0d2h00m" in out
    data = json.loads((tmp_path / "selftest" / "victoriametrics" / "remediation.json").read_text())
    assert data["summary"]["taken"] == 1 and data["breaker"][0] == data["start"] + 7200
    # 30 % of 6 nodes: 2 fire, the budget is 1 node (5 %, at least 1): one drained, one blocked.
    alone = [s for s in data["storms"] if s["label"].startswith("storm alone")]
    assert [(s["taken"], s["blocked"], s["breaker"]) for s in alone] == [(1, 1, True), (2, 0, False)]
