"""The fleet simulator follows a synchronous job's physics (docs/fleet.md): a straggler slows every
node of its job alike, its waiting peers keep their GPUs busy at lower power, and only its cause
names it; a job slowed as a whole shows on every node alike."""

from __future__ import annotations

import numpy as np
import pytest
import yaml

from fleet import physics, scenario
from fleet.simulate import Fleet

STEP = 30
ONSET, END = 7200, 10800  # the fault's window in the scenarios below: samples 240 to 360
BEFORE, DURING = slice(150, 230), slice(250, 350)


def _fleet(tmp_path, faults: list[dict], distractors: list[dict] | None = None, drift: float = 0.0) -> Fleet:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({
        "nodes": 6, "duration": "4h", "step": STEP, "seed": 5, "daily_drift": drift,
        "jobs": [{"name": "train", "kind": "training", "nodes": "0-5", "checkpoint_every": "1d", "load": "5m"}],
        "faults": faults, "distractors": distractors or []}))
    return Fleet(scenario.load(str(path)), 0.0)


class _Series:
    """(name, node, gpu or device) -> values: the first such series, or the one whose labels also match
    (`s[name, node, gpu, {"type": "replay"}]`)."""

    def __init__(self, fleet: Fleet) -> None:
        self.all = [(s.name, dict(s.labels), s.values) for s in fleet.series()]

    def __getitem__(self, key: tuple) -> np.ndarray:
        name, node, where, *more = key
        wanted = more[0] if more else {}
        for series, labels, values in self.all:
            if (series == name and labels.get("instance", "") == node
                    and labels.get("gpu", labels.get("device", "")) == where
                    and all(labels.get(k) == v for k, v in wanted.items())):
                return values
        raise KeyError(key)


def _series(fleet: Fleet) -> _Series:
    return _Series(fleet)


def _rate(counter: np.ndarray) -> np.ndarray:
    return np.diff(counter) / STEP


def _change(values: np.ndarray) -> float:
    """During the fault against before it, as a ratio of means."""
    return float(np.nanmean(values[DURING]) / np.nanmean(values[BEFORE]))


def test_the_pace_helpers_invert_each_other() -> None:
    for slowdown in (0.03, 0.05, 0.15):
        assert 1 / physics.work_at(np.float64(physics.speed_for(slowdown))) == pytest.approx(1 - slowdown)
        assert 1 / (1 + physics.delay_for(slowdown)) == pytest.approx(1 - slowdown)


def test_a_throttled_gpu_slows_every_node_alike_and_only_its_clock_and_reason_name_it(tmp_path) -> None:
    fleet = _fleet(tmp_path, [{"kind": "throttle", "reason": "thermal", "node": 2, "gpu": 3, "at": ONSET,
                               "lasts": END - ONSET, "slowdown": 0.05}])
    s = _series(fleet)
    for n in range(6):
        node = f"gpu{n:03d}"
        rdma = _rate(s[("node_infiniband_port_data_received_bytes_total", node, "mlx5_0")])
        assert _change(rdma) == pytest.approx(0.95, abs=0.01), node  # the job's rate, on every node alike
        assert _change(s[("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", node, "0")]) == pytest.approx(0.95, abs=0.01)
        assert np.nanmean(s[("DCGM_FI_DEV_GPU_UTIL", node, "0")][DURING]) > 98  # spinning in the collective
    for n in (0, 1, 3, 4, 5):  # the waiting peers: lower power, same clock, no reason
        node = f"gpu{n:03d}"
        assert 0.95 < _change(s[("DCGM_FI_DEV_POWER_USAGE", node, "3")]) < 0.975, node
        assert _change(s[("DCGM_FI_DEV_SM_CLOCK", node, "3")]) == pytest.approx(1.0, abs=0.003)
        thermal = s["gpunode_gpu_clock_event_active", node, "3", {"reason": "sw_thermal_slowdown"}]
        assert np.nansum(thermal[DURING]) == 0
        capped = s["gpunode_gpu_clock_event_active", node, "3", {"reason": "sw_power_cap"}]
        assert 0.1 < np.nanmean(capped[DURING]) < 0.5  # at its power cap now and then, as under any heavy load
    culprit = "gpu002"
    assert _change(s[("DCGM_FI_DEV_SM_CLOCK", culprit, "3")]) == pytest.approx(physics.speed_for(0.05), abs=0.005)
    assert _change(s[("DCGM_FI_DEV_POWER_USAGE", culprit, "3")]) == pytest.approx(1.0, abs=0.01)  # did not fall
    assert _change(s[("DCGM_FI_DEV_POWER_USAGE", culprit, "0")]) < 0.975  # its other GPUs wait too
    assert np.nanmean(s[("DCGM_FI_DEV_GPU_TEMP", culprit, "3")][DURING]) > 80
    thermal = s["gpunode_gpu_clock_event_active", culprit, "3", {"reason": "sw_thermal_slowdown"}]
    assert thermal[DURING].min() == 1 and thermal[BEFORE].max() == 0
    spent = s["gpunode_gpu_clock_violation_seconds_total", culprit, "3", {"policy": "thermal"}]
    assert np.mean(_rate(spent)[DURING]) == pytest.approx(1.0)


def test_a_starved_host_leaves_its_gpus_idle_while_its_peers_stay_busy(tmp_path) -> None:
    s = _series(_fleet(tmp_path, [{"kind": "host_starved", "node": 4, "at": ONSET, "lasts": END - ONSET,
                                   "slowdown": 0.05}]))
    assert _change(s[("DCGM_FI_DEV_GPU_UTIL", "gpu004", "0")]) == pytest.approx(0.95, abs=0.01)
    assert _change(s[("DCGM_FI_DEV_GPU_UTIL", "gpu001", "0")]) == pytest.approx(1.0, abs=0.005)
    waiting = _rate(s[("node_pressure_cpu_waiting_seconds_total", "gpu004", "")])
    assert np.mean(waiting[DURING]) > 0.25 > 0.06 > np.mean(waiting[BEFORE])


def test_a_job_slowed_as_a_whole_moves_every_node_alike(tmp_path) -> None:
    s = _series(_fleet(tmp_path, [{"kind": "job_slowdown", "node": 0, "at": ONSET, "lasts": END - ONSET,
                                   "slowdown": 0.05}]))
    utils = [_change(s[("DCGM_FI_DEV_GPU_UTIL", f"gpu{n:03d}", "0")]) for n in range(6)]
    powers = [_change(s[("DCGM_FI_DEV_POWER_USAGE", f"gpu{n:03d}", "0")]) for n in range(6)]
    assert max(utils) - min(utils) < 0.01 and np.mean(utils) == pytest.approx(0.95, abs=0.01)
    assert max(powers) - min(powers) < 0.01 and np.mean(powers) < 0.97


@pytest.mark.parametrize(("fault", "series", "gpu_or_device"), [
    ({"kind": "nvlink_degraded", "gpu": 1}, "gpunode_gpu_nvlink_errors_total", "1"),
    ({"kind": "fabric_link", "fabric": "infiniband", "port": 2}, "node_infiniband_symbol_error_total", "mlx5_2"),
    ({"kind": "fabric_link", "fabric": "roce"}, "gpunode_rdma_out_of_sequence_packets_total", "mlx5_4"),
    ({"kind": "pcie_downgrade", "gpu": 6}, "gpunode_network_pfc_pause_frames_total", "eth1"),
])
def test_a_link_cause_slows_the_job_and_shows_on_the_culprit_alone(tmp_path, fault: dict, series: str,
                                                                   gpu_or_device: str) -> None:
    s = _series(_fleet(tmp_path, [{**fault, "node": 3, "at": ONSET, "lasts": END - ONSET, "slowdown": 0.05}]))
    for n in range(6):
        traffic = _rate(s[("node_infiniband_port_data_received_bytes_total", f"gpu{n:03d}", "mlx5_0")])
        assert _change(traffic) == pytest.approx(0.95, abs=0.01)
    which = {"gpunode_gpu_nvlink_errors_total": {"link": "all", "type": "recovery"},
             "gpunode_network_pfc_pause_frames_total": {"direction": "tx"}}.get(series, {})
    counters = {node: _rate(s[series, node, gpu_or_device, which]) for node in ("gpu003", "gpu001")}
    assert np.mean(counters["gpu003"][DURING]) > 10 * max(np.mean(counters["gpu001"][DURING]), 0.001)


def test_distractors_slow_no_one_or_from_the_start(tmp_path) -> None:
    fleet = _fleet(tmp_path, [], [{"kind": "gc_pauses", "node": 0, "at": 0, "pause": 0.05},
                                  {"kind": "pipeline_stage", "node": 4, "nodes": "4-5", "at": 0, "extra": 0.06},
                                  {"kind": "warm_room", "node": 1, "at": ONSET, "lasts": END - ONSET}],
                   drift=0.0)
    s = _series(fleet)
    # The busier last stage never waits; the others do, at lower power, from the job's start.
    last, other = (np.nanmean(s[("DCGM_FI_DEV_POWER_USAGE", node, "0")][BEFORE]) for node in ("gpu005", "gpu002"))
    assert 0.93 < other / last < 0.97
    # A warm room: hotter, not slower.
    assert _change(s[("DCGM_FI_DEV_GPU_TEMP", "gpu001", "0")]) > 1.1
    assert _change(s[("DCGM_FI_DEV_SM_CLOCK", "gpu001", "0")]) == pytest.approx(1.0, abs=0.003)
    # Garbage collection moves between ranks: each node pauses now and then, none for long.
    for n in range(6):
        util = s[("DCGM_FI_DEV_GPU_UTIL", f"gpu{n:03d}", "0")][BEFORE]
        assert (util < 98).mean() < 0.4 and np.nanmean(util) > 97


def test_the_rooms_drift_moves_every_clock_alike(tmp_path) -> None:
    s = _series(_fleet(tmp_path, [], drift=0.01))
    clocks = np.array([s[("DCGM_FI_DEV_SM_CLOCK", f"gpu{n:03d}", "0")] for n in range(6)])
    ratio = clocks[:, 60:] / clocks[:, 60:].mean(axis=1, keepdims=True)
    assert np.ptp(np.nanmean(clocks[:, 60:], axis=0) / np.nanmean(clocks[:, 60:])) > 0.004  # it moves
    assert np.nanstd(ratio - ratio.mean(axis=0)) < 0.004  # every node with the others
