"""The detection harness on a scaled-down fleet (fleet/scenarios/selftest.yaml), on both real backends:
a known fault is found at a known time, and known healthy nodes stay silent. Also the simulator's truth
and the scorer, without a backend."""

from __future__ import annotations

import argparse
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import requests

from fleet import harness, scenario, score
from fleet.harness import Firing
from fleet.simulate import Fleet, Truth, node_name, workload_label
from tests.helpers import free_port, skip_without_fleet_tools, wait_for_port

# A rule replay runs one vmalert per CPU (fleet/harness.py): one replay at a time.
pytestmark = pytest.mark.xdist_group("replay")

SELFTEST = scenario.load("selftest")
HEALTHY = {node_name(n) for n in (0, 1, 3, 5)}


def _fleet() -> Fleet:
    return Fleet(SELFTEST, (time.time() // 3600) * 3600 - SELFTEST.duration - 3600)


def test_truth_and_series() -> None:
    fleet = _fleet()
    truth = {t.kind: t for t in fleet.truth()}
    assert truth["xid79_collapse"].onset == fleet.start + 2 * 3600 and truth["xid79_collapse"].node == "gpu004"
    series = {(s.name, s.labels): s for s in fleet.series()}
    intr = next(s for (name, labels), s in series.items()
                if name == "node_intr_total" and ("instance", "gpu004") in labels)
    rate = (intr.values[1:] - intr.values[:-1]) / SELFTEST.step
    before, during = rate[: int(6000 / SELFTEST.step)], rate[int(6700 / SELFTEST.step): int(7100 / SELFTEST.step)]
    assert before.mean() > 9000 > 3500 > during.mean()  # gpu071's interrupt collapse, from 10 min before


def test_scorer() -> None:
    truth = [Truth("throttle", "gpu002", 1000.0, 1000.0, 5000.0, ("4242",)),
             Truth("job_slowdown", "", 20000.0, 20000.0, 25000.0, ("4243",))]
    firing = [Firing("GpuNodeClockThrottled", {"instance": "gpu002", "severity": "warning"}, 1300.0, 4000.0),
              Firing("GpuNodeClockThrottled", {"instance": "gpu001", "severity": "warning"}, 1300.0, 1400.0),
              Firing("GpuJobSlowedDown", {"workload": "4242", "severity": "warning"}, 1500.0, 4000.0),
              Firing("GpuJobSlowedDown", {"workload": "4243", "severity": "warning"}, 20400.0, 21000.0),
              Firing("GpuJobSlowedDown", {"workload": "4244", "severity": "warning"}, 20400.0, 21000.0),
              Firing("GpuNodeHostStarved", {"instance": "gpu001", "severity": "warning"}, 20500.0, 21000.0),
              Firing("CheckpointIntervalTooLong", {"instance": "gpu001", "severity": "info"}, 0.0, 9000.0)]
    s = score.score(firing, truth, ["gpu001", "gpu002"], 86400.0)
    # The throttled node found; its job's alert a consequence; the job-wide slowdown found by its
    # workload's alert; another job's alert and any node alert during a job-wide slowdown are false.
    assert (s.recall, len(s.false_alerts)) == (1.0, 3)
    assert s.precision == pytest.approx(3 / 6)
    assert [c.leads for c in s.classes] == [(400.0,), (300.0,)]
    assert s.false_per_1000_node_days == pytest.approx(1000 * 3 / ((2 * 86400 - 4000) / 86400))
    assert score.first_detection(firing, truth[0]) == 300.0


def test_scorer_wants_a_stragglers_node_named_with_its_cause() -> None:
    """A straggler is detected by the alert that names its node with its cause, not by its job's
    alert, nor by a cause alert naming another cause (the fault's truth carries the word)."""
    fleet = Fleet(scenario.load("small-jobs"), 0.0)
    power_cap = next(t for t in fleet.truth() if t.node == "gpu005")
    assert (power_cap.kind, power_cap.cause) == ("throttle", "clock_power_cap")
    at = power_cap.onset + 270

    def firing(*alerts: tuple[str, dict[str, str]]) -> list[Firing]:
        return [Firing(name, {"severity": "warning", **labels}, at, at + 600) for name, labels in alerts]

    job = ("GpuJobSlowedDown", {"workload": power_cap.workloads[0]})
    for alerts, lead in [([job], None),
                         ([job, ("GpuNodeClockThrottled", {"instance": "gpu005", "cause": "clock_thermal"})], None),
                         ([job, ("GpuNodeClockThrottled", {"instance": "gpu005", "cause": "clock_power_cap"})], 270),
                         ([("GpuNodeClockThrottled", {"instance": "gpu005"})], 270)]:  # a pack without `cause`
        assert score.first_detection(firing(*alerts), power_cap) == lead


@pytest.mark.parametrize("backend", harness.BACKENDS)
def test_harness_finds_the_known_fault_and_keeps_healthy_nodes_silent(backend: str, tmp_path: Path) -> None:
    skip_without_fleet_tools()
    fleet = _fleet()
    held: list[dict[str, Any]] = []
    run = harness.run(backend, fleet, tmp_path, free_port(), then=lambda url: held.extend(requests.get(
        f"{url}/api/v1/query", params={"query": "ALERTS_FOR_STATE[1d]", "time": fleet.timestamps[-1] + 60},
        timeout=60).json()["data"]["result"]))
    # An alert held across the replay's range queries keeps its start (the value): replayed in one
    # query per 240 evaluations, it started afresh at each query's first, and Prometheus refused the
    # second sample at the evaluation two queries shared as a duplicate.
    assert held
    for series in held:
        points = [(float(t), float(v)) for t, v in series["values"]]
        pairs = zip(points[1:], points[:-1], strict=True)
        assert all(v == pv for (t, v), (pt, pv) in pairs if t - pt == 30), series["metric"]
    xid = fleet.start + 2 * 3600
    on_faulty = [f for f in run.firing if f.labels.get("instance") == "gpu004"]
    # The Xid alert fires at the Xid's evaluation; GpuDown after its `for` (1m); the interrupt and
    # process collapse 10 min earlier makes the precursor alert fire after its continuity (4m).
    assert {(f.alertname, f.start - xid) for f in on_faulty if f.alertname == "GpuXidHardwareFault"} == {
        ("GpuXidHardwareFault", 0.0)}
    assert any(f.alertname == "GpuDown" and f.start - xid == 60 for f in on_faulty)
    assert any(f.alertname == "GpuNodePrecursorMultiSignal" and -600 < f.start - xid < 0 for f in on_faulty)
    # One hardware-fault episode (Xid 79 + 145 at once) is no repeat: MetricsQL's changes() counts
    # a series' first value, so the vmalert target's rule must not add it again.
    assert not [f for f in on_faulty if f.alertname == "GpuXidRepeatedHardwareFaults"]
    # GPU 3 of node 2 is thermally throttled at 1h30m, its clock 6 % low: the node's 1m average crosses
    # 98 % of its job's median at the onset's own evaluation (half the window throttled: 97 %), so
    # GpuNodeClockThrottled fires its 4m `for` later. Its peers' traffic and power fell with the job's.
    throttled = [f.start - (fleet.start + 5400) for f in run.firing
                 if f.alertname == "GpuNodeClockThrottled" and f.labels.get("instance") == "gpu002"]
    assert throttled and min(throttled) == 240
    assert [f for f in run.firing if f.labels.get("instance") in HEALTHY and f.labels.get("severity") != "info"] == []


@pytest.mark.parametrize("backend", harness.BACKENDS)
def test_shared_fleet_names_the_throttled_node_and_blames_no_node_for_a_job_wide_slowdown(
        backend: str, tmp_path: Path) -> None:
    """fleet/scenarios/shared-selftest.yaml: job a ends at 2h and its six nodes idle; job b fails at 1h
    and restarts 11 minutes later, and slows as a whole by 5 % at 4h45m; node 12 runs alone and a GPU
    of it is throttled at 4h30m."""
    skip_without_fleet_tools()
    shared = scenario.load("shared-selftest")
    fleet = Fleet(shared, (time.time() // 3600) * 3600 - shared.duration - 3600)
    assert [(a.job.name, a.number) for a in fleet.attempts] == [("a", 0), ("b", 0), ("b", 1), ("solo", 0)]
    restarted_b, solo = (workload_label(a) for a in fleet.attempts[2:])
    run = harness.run(backend, fleet, tmp_path, free_port())
    alerts = [f for f in run.firing if f.labels.get("severity") != "info"]
    # Node alerts only on node 12: no node of job b is blamed for b's slowdown.
    assert [f for f in alerts if "instance" in f.labels and f.labels["instance"] != "gpu012"] == []
    onset = fleet.start + 4.5 * 3600
    # No peers: against its own past. The 1m level crosses 98 % of the baseline within a minute of
    # the onset, then `for: 4m`.
    throttled = [f.start - onset for f in alerts if f.alertname == "GpuNodeClockThrottled"]
    assert throttled and 240 <= min(throttled) <= 300
    assert all(f.start >= onset for f in alerts)
    # Job b: its level's 5m median crosses 97 % of its past ~2.5 minutes after the onset, then `for: 4m`.
    jobs = {f.labels["workload"]: f.start for f in alerts if f.alertname == "GpuJobSlowedDown"}
    assert 6 * 60 <= jobs[restarted_b] - (onset + 900) <= 10 * 60
    assert set(jobs) == {restarted_b, solo}  # solo slowed too: its throttled GPU holds it back


def test_replays_run_side_by_side_but_never_before_what_they_read() -> None:
    import threading

    def rule(expr: str, record: str = "") -> dict[str, object]:
        named = {"record": record} if record else {"alert": "A"}
        return {"groups": [{"name": "g", "rules": [{"expr": expr, **named}]}]}

    singles = [rule("up", "a:x"), rule("node_load1", "b:y"), rule("a:x > 1"), rule("a:x / b:y", "c:z"),
               rule("c:zz")]  # c:zz is another name: no input
    assert harness._inputs(singles) == [set(), set(), {0}, {0, 1}, set()]
    lock, events, running, most = threading.Lock(), [], set(), [0]

    def work(i: int) -> None:
        with lock:
            events.append(("start", i))
            running.add(i)
            most[0] = max(most[0], len(running))
        time.sleep(0.05)
        with lock:
            running.discard(i)
            events.append(("end", i))

    harness._in_order(harness._inputs(singles), work, 2)
    order = {e: n for n, e in enumerate(events)}
    for i, needs in enumerate(harness._inputs(singles)):
        assert all(order["end", j] < order["start", i] for j in needs)
    assert most[0] == 2
    assert sorted(i for kind, i in events if kind == "end") == list(range(5))


# Two replays at once, each one vmalert per CPU: with other tests beside them, one wrote alert
# states in chunks Prometheus refused as duplicates.
@pytest.mark.alone
@pytest.mark.parametrize("backend", harness.BACKENDS)
def test_runs_side_by_side_score_as_one_alone(backend: str, tmp_path: Path) -> None:
    """Each run starts its own server on a free port and checks that the server answering is its
    own: two runs at once (a second `make fleet`, the test suite beside one) each score their own
    data, the same alert episodes as a run alone."""
    skip_without_fleet_tools()
    start = _fleet().start

    def episodes(name: str) -> list[tuple[str, tuple[tuple[str, str], ...], float, float]]:
        # A fleet of its own, as each `make fleet` process has: a Fleet draws its noise from one
        # generator as it emits, so two threads emitting from one Fleet interleave their draws.
        run = harness.run(backend, Fleet(SELFTEST, start), tmp_path / name)
        return sorted((f.alertname, tuple(sorted(f.labels.items())), f.start, f.end) for f in run.firing)

    alone = episodes("alone")
    with ThreadPoolExecutor(2) as pool:
        side_by_side = list(pool.map(episodes, ["left", "right"]))
    assert alone and side_by_side == [alone, alone]


def test_a_run_refuses_a_server_it_did_not_start(tmp_path: Path) -> None:
    """What a fixed port allowed: another run's server answering in place of this run's."""
    skip_without_fleet_tools()
    port = free_port()
    other = subprocess.Popen(["victoria-metrics", f"-storageDataPath={tmp_path / 'other'}",
                              f"-httpListenAddr=127.0.0.1:{port}"], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        wait_for_port(port, lambda: other.poll() is None)
        with pytest.raises(RuntimeError, match="another server holds the port"):
            harness._ours("victoriametrics", f"http://127.0.0.1:{port}", tmp_path / "run")
        # The run's own server either fails to bind first or the other answers first: refused either way.
        with pytest.raises(RuntimeError, match=r"another server holds the port|exited with"):
            harness.run("victoriametrics", _fleet(), tmp_path / "run", port)
    finally:
        other.terminate()
        other.wait(20)


def test_every_flag_of_the_harness_says_what_it_does() -> None:
    from fleet.__main__ import build_parser

    actions = [a for a in build_parser()._actions if a.option_strings]
    assert {a.option_strings[-1] for a in actions} >= {"--scenario", "--backend", "--workdir", "--remediation"}
    assert [a.option_strings for a in actions if not a.help] == []
    repeats = [a.option_strings[-1] for a in actions if isinstance(a, argparse._AppendAction)]
    assert all("repeat" in a.help for a in actions if a.option_strings[-1] in repeats), repeats
