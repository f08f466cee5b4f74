"""`gpunode-exporter report`: its pure parts on known inputs, and its errors against real servers.
The report scored against simulated fleets on a real backend: tests/test_report_fleet.py."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import threading
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpunode_report import failures, goodput, jobs, markdown, pace, source
from gpunode_report.source import ReportError, Source, _number, _numbers, parse_time

NOW = 1_800_000_000.0


def test_times() -> None:
    assert parse_time("now", NOW) == NOW
    assert parse_time("-7d", NOW) == NOW - 7 * 86400
    assert parse_time("-1d12h", NOW) == NOW - 36 * 3600
    assert parse_time("2026-11-21T00:00:00Z", NOW) == 1795219200.0
    assert parse_time("2026-11-21T01:00:00+01:00", NOW) == 1795219200.0
    for bad in ("yesterday", "-7x", "2026-11-21T00:00:00", "", "7d"):
        with pytest.raises(ReportError):
            parse_time(bad, NOW)


@given(st.text(max_size=12))
def test_sample_values_are_numbers_or_refused(text: str) -> None:
    try:
        value = _number(text)
    except ValueError:
        return
    assert text.strip() == text and (math.isnan(value) or isinstance(value, float))


_VALUES = st.lists(st.one_of(st.sampled_from(["1.5", "NaN", "+Inf", "-Inf", ".5", "7e-3", "12"]),
                             st.text(max_size=6), st.none(), st.integers()), max_size=8)


@given(_VALUES)
def test_a_series_values_are_read_as_each_value_is(values: list[object]) -> None:
    """One check over a series' values refuses what the check of each value refuses, and reads
    the same numbers."""
    try:
        each = [_number(value) for value in values]
    except ValueError:
        with pytest.raises(ValueError):
            _numbers(values)
        return
    assert np.array_equal(_numbers(values), np.array(each, dtype=np.float64), equal_nan=True)


def test_young_daly_gives_the_operations_reports_figures() -> None:
    """The Lablup B200 operations report: 4K saves 18 s every 133.5 min, 32K 31.7 s every 199 min,
    100K 30 s every 81.5 min; MTBF 56.2 h. Optima 44.9 / 59.7 / 58.1 min; costs 2.20 / 3.22 / 1.82 %;
    1.72 % at the 100K optimum."""
    mtbf = 56.2 * 3600
    for delta, interval, best, cost in ((18, 133.5, 44.9, 0.0220), (31.7, 199, 59.7, 0.0322), (30, 81.5, 58.1, 0.0182)):
        yd = goodput.young_daly(delta, interval * 60, mtbf)
        assert yd["optimal_interval_seconds"] / 60 == pytest.approx(best, abs=0.1)  # inputs published rounded
        assert yd["cost_fraction"] == pytest.approx(cost, abs=0.00005)
    assert goodput.young_daly(30, 81.5 * 60, mtbf)["optimal_cost_fraction"] == pytest.approx(0.0172, abs=0.00005)
    assert goodput.young_daly(0.0, 600, mtbf)["optimal_interval_seconds"] is None  # saves within one scrape


def _mask(size: int, *spans: tuple[int, int]) -> np.ndarray:
    out = np.zeros(size, bool)
    for a, b in spans:
        out[a:b] = True
    return out


def test_attempts_are_joined_into_jobs_by_time_and_nodes() -> None:
    """Workload 7 fails at 100 and restarts as 8 on three of its four nodes 20 samples later (one
    node's GPU was lost); workload 9 starts on the same nodes 200 samples after 8 ends: a new job.
    A missed scrape does not end an attempt."""
    size = 600
    presence = {("7", "7", f"n{i}"): _mask(size, (0, 100)) for i in range(4)}
    presence |= {("8", "8", f"n{i}"): _mask(size, (120, 300)) for i in range(3)}
    presence[("8", "8", "n0")][150] = False  # a missed scrape
    presence |= {("9", "9", f"n{i}"): _mask(size, (500, 600)) for i in range(3)}
    presence |= {("x", "x", "n9"): _mask(size, (110, 130))}  # elsewhere
    found = jobs.join(jobs.attempts(presence), restart_within=90)
    assert [(j.name, [(a.key, a.first, a.last) for a in j.attempts]) for j in found] == [
        ("7", [("7", 0, 99), ("8", 120, 299)]), ("x", [("x", 110, 129)]), ("9", [("9", 500, 599)])]
    assert found[0].nodes == ["n0", "n1", "n2", "n3"]


def test_each_failed_attempt_is_blamed_on_the_event_nearest_its_end_and_costed() -> None:
    """A job of three attempts at 30 s scrapes: the first (n0-n3, samples 0-99) ends with n3's GPU
    fallen off the bus (Xid 79 and 145 in the last scrape interval, the lost GPU at the sample
    after); the second (n0-n2, 120-199) with no event of its own near its end: n1's Xid 13 is 15
    minutes before it, another job's node n9 logs one at it, n0's remap comes 3 scrapes after. Its
    failed attempts ran 100 samples on 4 nodes and 80 on 3: (3000 x 4 + 2400 x 3) s x 8 GPUs."""
    step, size = 30.0, 400
    presence = {("7", "7", f"n{i}"): _mask(size, (0, 100)) for i in range(4)}
    presence |= {("8", "8", f"n{i}"): _mask(size, (120, 200)) for i in range(3)}
    presence |= {("9", "9", f"n{i}"): _mask(size, (220, 300)) for i in range(3)}
    [job] = jobs.join(jobs.attempts(presence), restart_within=90)
    assert len(job.attempts) == 3
    first_end, second_end = NOW + 100 * step, NOW + 200 * step
    event = failures.Failure
    events = [event("n3", first_end - 18, "xid", 79), event("n3", first_end - 18, "xid", 145),
              event("n3", first_end, "gpu_lost"), event("n1", second_end - 900, "xid", 13),
              event("n9", second_end, "xid", 94), event("n0", second_end + 3 * step, "uncorrectable_remap")]
    found = failures.retries(job, events, NOW, step, 8)
    assert found["failed_attempts"] == [
        {"end": "2027-01-15T08:50:00Z", "node": "n3", "kind": "xid", "xid": 79},
        {"end": "2027-01-15T09:40:00Z", "node": None, "kind": None, "xid": None}]
    assert found["failed_gpu_hours"] == round((3000 * 4 + 2400 * 3) * 8 / 3600, 2) == 42.67
    assert ", ".join(markdown._blamed(a) for a in found["failed_attempts"]) == "n3 (Xid 79), none"
    # the lost GPU alone (an exporter without the Xid): blamed on it, a sample after the last
    assert failures.blame(events[2:3], job.attempts[0].nodes, first_end, step) == events[2]
    # ranks left waiting for a failed node: the job ends up to the NCCL watchdog's 10 minutes later
    assert failures.blame([event("n1", second_end - 570, "xid", 13)], job.attempts[1].nodes, second_end, step) == \
        event("n1", second_end - 570, "xid", 13)
    assert failures.retries(jobs.Job("x", job.attempts[:1]), events, NOW, step, 8) == {
        "failed_attempts": [], "failed_gpu_hours": 0}


def test_phases_and_the_split_of_an_attempt() -> None:
    """An attempt that loads for 10 samples, saves twice (2 and 1 samples in the save phase:
    30 s and 0 s by the report's estimate) and fails 20 samples after its last save ends."""
    step, size = 30.0, 100
    save, load = np.zeros(size, bool), np.zeros(size, bool)
    load[:10] = load[41] = True
    save[[40, 41, 78]] = True
    phase = jobs.phases(save, load)
    assert phase[:10].tolist() == [2] * 10 and phase[40:42].tolist() == [1, 1] and phase[10] == 0
    t = goodput.attempt_time(jobs.majority([phase, phase, np.zeros(size, np.int8)]), 1000, step, 4, True, [])
    assert (t.load, t.saves, t.save_seconds) == (300.0, [(1040, 1041), (1078, 1078)], [30.0, 0.0])
    assert t.lost == (100 - 79) * step


def test_a_slow_episode_its_cost_and_its_culprits() -> None:
    """A job 5 % slower from sample 200 (node n3's clock throttled, its alert from 210) and 8 %
    slower from 260 to 300 (node n4's host starved, its alert from 265); saves (phase) ignored."""
    step, size = 30.0, 400
    speed = np.ones(size) * (1 + 0.002 * np.sin(np.arange(size)))
    speed[200:300] *= 0.95
    speed[260:300] *= 0.97
    training = np.ones(size, bool)
    training[::50] = False  # saves
    base = pace.typical(speed, training)
    assert base == pytest.approx(1.0, abs=0.003)
    alerts = {("GpuNodeClockThrottled", "n3", "clock_thermal"): _mask(1000, (510, 600)),
              ("GpuNodeHostStarved", "n4", "host_starved"): _mask(1000, (565, 600)),
              ("GpuNodeHostStarved", "n9", "host_starved"): _mask(1000, (500, 600))}  # another job's node
    found = pace.episodes(speed, training, base, 0.02, 20, step, alerts, ["n3", "n4"], 300)
    assert [(e.node, e.cause) for e in found] == [("n3", "clock_thermal"), ("n4", "host_starved")]
    throttled, starved = found
    assert throttled.first == pytest.approx(200, abs=2) and starved.last == pytest.approx(299, abs=2)
    assert starved.first == 265  # the newer cause owns the time from its alert on
    assert throttled.slowdown == pytest.approx(0.05, abs=0.01) and starved.slowdown == pytest.approx(0.078, abs=0.01)
    assert throttled.lost + starved.lost == pytest.approx((100 * 0.05 + 40 * 0.95 * 0.03) * step, rel=0.15)
    assert [(e.node, e.cause) for e in pace.episodes(speed, training, base, 0.02, 20, step, {}, ["n3"], 0)] == [
        ("", pace.JOB_WIDE)]
    assert pace.episodes(np.ones(size), training, 1.0, 0.02, 20, step, alerts, ["n3"], 300) == []


def test_a_straggler_for_most_of_a_jobs_life_is_measured_from_its_pace_before() -> None:
    """A job 8 % slower from its second hour to its end (a PCIe link trained down on n3, its alert
    from 4 minutes in): all of its 5-minute medians but the first hour's are slow, so their 90th
    percentile is the slow pace; the hour before it, and the samples without a cause alert, give
    the pace before."""
    step, size = 30.0, 2400
    speed = np.ones(size) * (1 + 0.002 * np.sin(np.arange(size)))
    speed[120:] *= 0.92
    training = np.ones(size, bool)
    alerts = {("GpuPcieLinkDegraded", "n3", "pcie_link_degraded"): _mask(size, (128, size)),
              ("GpuNodeHostStarved", "n9", "host_starved"): _mask(size, (0, size)),  # another job's node
              ("GpuJobSlowedDown", "n3", ""): _mask(size, (0, size))}  # no cause
    quiet = pace.calm(alerts, ["n3", "n4"], slice(0, size))
    assert quiet[:128].all() and not quiet[128:].any()
    assert np.quantile(pace.rolling_median(speed, pace.SMOOTH), 0.9) == pytest.approx(0.92, abs=0.003)
    assert pace.typical(speed, training) == pytest.approx(1.0, abs=0.003)  # no alert: the hour before
    base = pace.typical(speed, training, quiet)
    assert base == pytest.approx(1.0, abs=0.003)
    [found] = pace.episodes(speed, training, base, 0.025, 30, step, alerts, ["n3", "n4"], 0)
    assert (found.node, found.cause, found.slowdown) == ("n3", "pcie_link_degraded", pytest.approx(0.08, abs=0.005))
    # too little time without an alert (half an hour) to judge the pace by: all samples, of which
    # the first hour ran at the pace before
    early = pace.calm({("GpuPcieLinkDegraded", "n3", "pcie_link_degraded"): _mask(size, (60, size))}, ["n3"],
                      slice(0, size))
    assert pace.typical(speed, training, early) == pytest.approx(1.0, abs=0.003)
    # the pace before for less than half of the hour (20 minutes), alerts or not: the slow pace
    short = speed.copy()
    short[40:120] *= 0.92
    assert pace.typical(short, training) == pytest.approx(0.92, abs=0.003)
    assert pace.typical(short, training, early) == pytest.approx(0.92, abs=0.003)


def test_a_job_slowed_for_most_of_its_range_with_its_alert_missing_for_part_keeps_its_pace() -> None:
    """pretrain-b of the 14-day lablup benchmark, small: a 59-node job trains 14 h at its pace,
    saving every 100 minutes and failing twice (its restarts load for 25 minutes), then a PCIe
    link trained down on n45 slows it 10 % and a power brake on n33 15 % more, to its end 10 days
    later: slow for 94 % of its training. Its daily drift (1 %) and noise stay. The 90th percentile
    of its 5-minute medians is the slow pace, with no cause alert (no rules replayed) or with the
    PCIe alert only for its first day (the rest of the samples calm but slow); the hour before is
    not."""
    step = 30.0
    size = 11 * 2880  # 11 days at 30 s
    rng = np.random.default_rng(7)
    t = np.arange(size) * step
    slow_from, brake_from = 14 * 120, 30 * 120
    speed = (1 - 0.01 * np.cos(2 * np.pi * (t - 4 * 3600) / 86400)) * (1 + 0.001 * rng.standard_normal(size))
    speed[slow_from:] *= 0.905
    speed[brake_from:] *= 0.87 * (1 + 0.03 * rng.standard_normal(size - brake_from))
    training = np.ones(size, bool)
    for save in range(0, size, 200):
        training[save:save + 3] = False
    for load in (0, 6 * 120, 20 * 120):  # its start and two restarts
        training[load:load + 50] = False
    assert np.quantile(pace.rolling_median(np.where(training, speed, np.nan), pace.SMOOTH)[training], 0.9) < 0.92
    pcie = _mask(size, (slow_from + 10, slow_from + 2880))  # its alert, from 5 minutes in, for a day
    for quiet in (None, np.ones(size, bool), ~pcie):
        base = pace.typical(speed, training, quiet)
        assert base == pytest.approx(1.0, abs=0.012)  # the top of its day, as a healthy job's
        assert base * (1 - 0.025) > speed[slow_from + 120:].max()  # the slow pace reads slow
        found = pace.episodes(speed, training, base, 0.025, 30, step, {}, [], 0)  # one per attempt here
        assert found[0].first == pytest.approx(slow_from, abs=10) and found[-1].last == size - 1


def test_a_neighbours_alert_that_leaves_the_pace_as_it_was_names_no_culprit() -> None:
    """A 4-node job 5 % slower from sample 200 to 320 (n1's GPU power-braked, its alert firing from
    208); its neighbour n2, against its own past, fires from 230 to 260 while the job's pace stays
    as it was: an effect of n1, not a second cause. Under the rule that the newest alert owns the
    time, n2 took those samples and, by the nearest culprit before, the rest after them."""
    step, size = 30.0, 500
    speed = np.ones(size) * (1 + 0.002 * np.sin(np.arange(size)))
    speed[200:320] *= 0.95
    training = np.ones(size, bool)
    alerts = {("GpuNodeClockThrottled", "n1", "clock_power_brake"): _mask(size, (208, 322)),
              ("GpuNodeHostStarved", "n2", "host_starved"): _mask(size, (230, 260))}
    [found] = pace.episodes(speed, training, 1.0, 0.02, 20, step, alerts, ["n0", "n1", "n2", "n3"], 0)
    assert (found.node, found.cause) == ("n1", "clock_power_brake")
    assert found.first == pytest.approx(200, abs=3) and found.last == pytest.approx(319, abs=3)
    # The same alert on n2 where the job does slow further from its start: a second cause, from then on.
    speed[230:320] *= 0.96
    found = pace.episodes(speed, training, 1.0, 0.02, 20, step, alerts, ["n0", "n1", "n2", "n3"], 0)
    assert [(e.node, e.cause, e.first) for e in found][1:] == [("n2", "host_starved", 230)]
    assert found[0].node == "n1"


def test_a_second_cause_on_a_much_slower_job_is_read_in_step_time() -> None:
    """The lablup scenario's pretrain-b: a power brake costs the job 23 % (its step 1.298 of its
    typical one) from sample 100; a starved host adds 3 % of a step from 300 (1.328): its pace falls
    from 0.770 to 0.753, 2.3 %, less than the 2.5 % a straggler takes, yet it is a second cause."""
    step, size = 30.0, 600
    steps = np.ones(size)
    steps[100:] += 0.298
    steps[300:] += 0.03
    speed = (1 + 0.002 * np.sin(np.arange(size))) / steps
    alerts = {("GpuNodeClockThrottled", "n1", "clock_power_brake"): _mask(size, (108, 600)),
              ("GpuNodeHostStarved", "n2", "host_starved"): _mask(size, (308, 600))}
    found = pace.episodes(speed, np.ones(size, bool), 1.0, 0.025, 30, step, alerts, ["n1", "n2", "n3"], 0)
    assert [(e.node, e.cause) for e in found] == [("n1", "clock_power_brake"), ("n2", "host_starved")]
    assert found[1].first == pytest.approx(308, abs=2)


def test_cause_alerts_are_keyed_by_their_cause_label() -> None:
    """The cause is the alert's `cause` label; an alert of a rule pack from before the label: its
    alert's cause."""
    assert pace.key({"alertname": "GpuNodeClockThrottled", "instance": "n1", "cause": "clock_power_brake"},
                    "instance") == ("GpuNodeClockThrottled", "n1", "clock_power_brake")
    assert pace.key({"alertname": "GpuNodeFabricLinkErrors", "instance": "n1"}, "instance") == (
        "GpuNodeFabricLinkErrors", "n1", "fabric_link_errors")


def _report(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpunode_exporter", "report", *args], capture_output=True, text=True,
                          timeout=120)


def test_an_unreachable_backend_is_one_line_and_exit_2(tmp_path) -> None:
    from gpunode_common.http import free_port

    done = _report("--prometheus.url", f"http://127.0.0.1:{free_port()}", "--output", str(tmp_path))
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "cannot reach http://127.0.0.1:" in done.stderr
    done = _report("--prometheus.url", "http://127.0.0.1:1", "--from=-1d", "--to=-2d", "--output", str(tmp_path))
    assert (done.returncode, done.stderr.strip()) == (2, "gpunode-exporter report: error: --from -1d is not before "
                                                         "--to -2d")


@pytest.fixture
def query_api() -> Iterator[tuple[str, list[tuple[float, float]]]]:
    """A query API whose one series' value at each step is that step's time (the query `refuse`:
    HTTP 422): its URL, and the (start, end) of each range asked."""
    asked: list[tuple[float, float]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            params = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query)
            q = {k: float(params[k][0]) for k in ("start", "end", "step")}
            asked.append((q["start"], q["end"]))
            steps = np.arange(q["start"], q["end"] + q["step"] / 2, q["step"])
            refused = params["query"] == ["refuse"]
            body = json.dumps({"status": "error", "error": "no"} if refused else {
                "status": "success", "data": {"resultType": "matrix", "result": [
                    {"metric": {"instance": "n1"}, "values": [[t, repr(float(t))] for t in steps]}]}}).encode()
            self.send_response(422 if refused else 200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", asked
    finally:
        server.shutdown()
        server.server_close()


def test_a_query_is_asked_over_its_spans_in_chunks_and_read_onto_the_grid(query_api, monkeypatch) -> None:
    url, asked = query_api
    monkeypatch.setattr(source, "CHUNK_POINTS", 4)
    src = Source(url, NOW, NOW + 30 * 29, 30.0)
    [(labels, values)] = src.range("q", spans=[slice(2, 3), slice(10, 19)]).items()
    assert labels == (("instance", "n1"),) and src.queries == 4
    assert sorted(asked) == [(NOW + 30 * a, NOW + 30 * b) for a, b in ((2, 2), (10, 13), (14, 17), (18, 18))]
    inside = np.zeros(src.size, bool)
    inside[[2, *range(10, 19)]] = True
    assert np.array_equal(values[inside], src.times[inside]) and np.isnan(values[~inside]).all()
    asked.clear()
    assert [part for part, _chunk in src.chunks("q")] == [slice(k, min(30, k + 4)) for k in range(0, 30, 4)]
    assert len(asked) == 8
    with pytest.raises(ReportError, match=f"{url} refused 'refuse': HTTP 422: no"):
        src.range("refuse")
