"""The fleet simulator's shared fleets: jobs expanded into attempts, and what a node emits for each kind
of job. No backend needed."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from fleet import jobs, scenario
from fleet.scenario import _build
from fleet.simulate import Fleet, node_name
from gpunode_common.config import ConfigError

DAY = 86400.0


def _scenario(**data: object) -> scenario.Scenario:
    return _build("t", {"nodes": 8, "duration": "1d", **data})


def _series(fleet: Fleet, node: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], np.ndarray]:
    return {(s.name, s.labels): s.values for s in fleet.series(range(node, node + 1))}


def test_a_failure_ends_the_attempt_on_every_node_and_a_lost_gpu_leaves_the_next() -> None:
    sc = _scenario(jobs=[{"name": "big", "kind": "training", "nodes": "0-5", "failures": ["2h"],
                          "restart_gap": "11m"},
                         {"name": "other", "kind": "training", "nodes": [6, 7], "start": "1h", "end": "5h"}],
                   faults=[{"kind": "xid79_collapse", "node": 2, "at": "6h"},
                           {"kind": "throttle", "node": 3, "at": "8h"}])  # a straggler kills nothing
    attempts = Fleet(sc, 0.0).attempts
    big = [a for a in attempts if a.job.name == "big"]
    assert [(a.start, a.end, a.nodes) for a in big] == [
        (0.0, 7200.0, (0, 1, 2, 3, 4, 5)), (7860.0, 21600.0, (0, 1, 2, 3, 4, 5)), (22260.0, DAY, (0, 1, 3, 4, 5))]
    assert [a.workload for a in attempts] == ["1000", "1001", "1002", "1003"]
    assert big[2].checkpoint_origin == 22260.0 + 25 * 60  # saves count from the end of the attempt's load


def test_restart_gaps_are_drawn_around_the_reports_median() -> None:
    failures = [f"{h}h" for h in range(1, 200)]
    sc = _build("t", {"nodes": 2, "duration": "10d", "jobs": [
        {"kind": "training", "nodes": "0-1", "failures": failures, "load": 0}]})
    attempts = Fleet(sc, 0.0).attempts
    gaps = [b.start - a.end for a, b in itertools.pairwise(attempts)]
    assert 540 < float(np.median(gaps)) < 800 and min(gaps) >= 180 and max(gaps) <= 2400


def test_sessions_are_one_job_over_every_node_saving_on_the_fleet_cadence() -> None:
    sc = _scenario(sessions=[[0, "10h"], ["12h", "1d"]],
                   faults=[{"kind": "xid79_collapse", "node": 2, "at": "5h"}])  # no restart in the older form
    attempts = Fleet(sc, 0.0).attempts
    assert [(a.workload, a.start, a.end, len(a.nodes), a.checkpoint_origin) for a in attempts] == [
        ("1000", 0.0, 36000.0, 8, 0.0), ("1001", 43200.0, DAY, 8, 0.0)]


@pytest.mark.parametrize(("data", "message"), [
    ({"sessions": [[0, "1d"]], "jobs": []}, "not both"),
    ({"jobs": [{"kind": "training", "nodes": "0-3"}, {"kind": "single", "nodes": 3}]}, "both run on node 3"),
    ({"jobs": [{"kind": "single", "nodes": "0-1"}]}, "one node"),
    ({"jobs": [{"kind": "cooking", "nodes": 0}]}, "kind"),
    ({"jobs": [{"kind": "training", "nodes": "0-9"}]}, "from 0 to 7"),
    ({"jobs": [{"kind": "training", "nodes": "x"}]}, "node numbers"),
    ({"jobs": [{"kind": "training", "nodes": 0, "start": "2h", "end": "1h"}]}, "start before end"),
    ({"gpu_spread": {"memory": 0.1}}, "gpu_spread"),
])
def test_bad_jobs_are_refused(data: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Fleet(_scenario(**data), 0.0)


def test_each_kind_of_job_shows_in_the_series() -> None:
    sc = _scenario(step=60, gpu_spread={"power": 0.02}, jobs=[
        {"name": "train", "kind": "training", "nodes": "0-1", "checkpoint_every": "2h", "load": "10m"},
        {"name": "serve", "kind": "inference", "nodes": 2, "source": "kubernetes"},
        {"name": "gpu-burn", "kind": "burnin", "nodes": 3, "end": "6h", "source": "systemd"},
        {"name": "solo", "kind": "single", "nodes": 4, "start": "12h"}])
    fleet = Fleet(sc, 1.7e9)
    t = fleet.t

    def one(node: int, name: str, **labels: str) -> np.ndarray:
        found = [v for (n, ls), v in _series(fleet, node).items() if n == name and labels.items() <= dict(ls).items()]
        assert len(found) == 1, (node, name, labels)
        return found[0]

    util = one(0, "DCGM_FI_DEV_GPU_UTIL", gpu="0")
    assert util[t < 600].max() < 10 and util[(t > 3600) & (t < 7000)].min() > 95  # the load, then training
    assert util[(t >= 7200 + 600) & (t < 7200 + 660)].max() < 50  # a save, 2 h after the load ended
    serve = one(2, "DCGM_FI_DEV_GPU_UTIL", gpu="0")
    assert serve.max() - serve.min() > 50  # the daily curve
    assert one(3, "DCGM_FI_DEV_GPU_UTIL", gpu="0")[t < 6 * 3600].min() > 95
    solo = one(4, "gpunode_node_workload_info", source="slurm")
    assert np.isnan(solo[t < 12 * 3600]).all() and not np.isnan(solo[t >= 12 * 3600]).any()
    assert not [name for (name, _ls) in _series(fleet, 5) if name == "gpunode_node_workload_info"]  # idle
    assert dict(next(ls for (n, ls) in _series(fleet, 3) if n == "gpunode_node_workload_info"))["workload"] == \
        "gpu-burn.service"
    # Kubernetes: the node names its pod's UID; kube-state-metrics joins it to the pod's owner.
    uid = dict(next(ls for (n, ls) in _series(fleet, 2) if n == "gpunode_node_workload_info"))["workload"]
    pods = [dict(s.labels) for s in fleet.series(range(0, 1)) if s.name == "kube_pod_info"]
    assert [(p["uid"], p["node"]) for p in pods] == [(uid, node_name(2))]
    # GPUs differ persistently in power, far beyond the samples' noise.
    power = [one(0, "DCGM_FI_DEV_POWER_USAGE", gpu=str(g))[(t > 3600) & (t < 7000)].mean() for g in range(8)]
    assert np.std(power) / np.mean(power) > 0.005


def test_shipped_scenarios_load() -> None:
    for path in sorted(scenario.SHIPPED.glob("*.yaml")):
        if path.name.startswith("jobs-"):  # the job recovery replay's (fleet/jobreplay.py), another format
            continue
        sc = scenario.load(path.stem)
        assert Fleet(sc, 0.0).attempts, path.name
    assert jobs.RETRY_GAP_MEDIAN == 660.0
