"""fleet/replay_check.py: a replay that wrote less than its range asked for is found, replayed again
where it lost evaluations, and fails the run if that does not help; a rule whose output starts late
or ends early because its inputs do is left alone. The check on hand-made sample timestamps and a
stubbed backend, then a truncated replay on the real backends (fleet/scenarios/selftest.yaml)."""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests

from fleet import harness, remote_write, replay_check, scenario
from fleet.replay_check import Gap, ReplayLostError, Written, ensure, evaluations, lost, written_from_stamps
from fleet.simulate import Fleet
from tests.helpers import free_port, skip_without_fleet_tools

# A rule replay runs one vmalert per CPU (fleet/harness.py): one replay at a time.
pytestmark = pytest.mark.xdist_group("replay")

STEP = 30.0
START = 1_700_000_400.0  # a multiple of 30 s, as the harness's ranges start
END = START + 4 * 86400  # the `mixed` scenario's four days; the range includes its end
HOUR = 3600.0


def grid(a: float, b: float) -> np.ndarray:
    """The evaluations from a to b, both included."""
    return np.arange(a, b + STEP / 2, STEP)


def inputs_from(t0: float, t1: float = END, series: int = 3) -> Callable[[float], int]:
    """The rule's expression: `series` results wherever its inputs exist (t0 to t1), none elsewhere."""
    return lambda t: series if t0 <= t <= t1 else 0


def test_the_evaluations_asked_for_are_the_multiples_of_the_step_in_the_range_ends_included() -> None:
    assert list(evaluations(START, START + 90, STEP)) == [START, START + 30, START + 60, START + 90]
    assert list(evaluations(START + 1, START + 90, STEP)) == [START + 30, START + 60, START + 90]
    assert evaluations(START, END, STEP).size == 4 * 2880 + 1


def test_a_replay_that_lost_its_first_range_query_is_found() -> None:
    """What VictoriaMetrics did on `mixed`: the first of two range queries (10,000 evaluations, 83
    hours) wrote nothing, while the rule's inputs were there from the start."""
    lost_until = START + 10_000 * STEP
    written = written_from_stamps(START, END, STEP, [grid(lost_until, END)] * 4)
    assert (written.first, written.last) == (lost_until, END)
    assert (written.covered, written.samples) == (4 * 2880 + 1 - 10_000, 4 * (4 * 2880 + 1 - 10_000))
    [loss] = lost(written, inputs_from(START))
    assert (loss.gap.first, loss.gap.last, loss.gap.evaluations) == (START, lost_until - STEP, 10_000)
    assert str(written) == (f"asked {replay_check.iso(START)} to {replay_check.iso(END)} every 30 s (11521 "
                            f"evaluations); wrote 6084 samples at 1521 of them, from {replay_check.iso(lost_until)} "
                            f"to {replay_check.iso(END)}")
    assert str(loss).startswith(f"nothing from {replay_check.iso(START)} to {replay_check.iso(lost_until - STEP)} "
                                "(10000 evaluations), where its expression has results (at 5 of 5 evaluations")


def test_a_lost_last_range_query_and_a_lost_stretch_inside_are_found() -> None:
    ends_early = written_from_stamps(START, END, STEP, [grid(START, START + 10_000 * STEP - STEP)])
    [loss] = lost(ends_early, inputs_from(START))
    assert (loss.gap.first, loss.gap.last) == (START + 10_000 * STEP, END)
    # Prometheus' range queries are 240 evaluations: one of them lost in the middle.
    hole = (START + 2400 * STEP, START + 2639 * STEP)
    stamps = [t for t in grid(START, END) if not hole[0] <= t <= hole[1]]
    [loss] = lost(written_from_stamps(START, END, STEP, [stamps]), inputs_from(START))
    assert (loss.gap.first, loss.gap.last, loss.gap.evaluations) == (*hole, 240)


def test_output_that_starts_late_or_ends_early_with_its_inputs_is_legitimate() -> None:
    """A node that joins at 10 h and leaves at 70 h, a rate() whose first evaluation has no earlier
    sample, an alert that holds for an hour: nothing written where the expression has no result."""
    joins, leaves = START + 10 * HOUR, START + 70 * HOUR
    node = written_from_stamps(START, END, STEP, [grid(joins + STEP, leaves)])
    assert [g.evaluations for g in node.gaps()] == [1201, 26 * 120]
    assert lost(node, inputs_from(joins + STEP, leaves)) == []
    alert = written_from_stamps(START, END, STEP, [grid(START + 50 * HOUR, START + 51 * HOUR)])
    assert lost(alert, inputs_from(START + 50 * HOUR, START + 51 * HOUR, series=1)) == []
    assert lost(written_from_stamps(START, END, STEP, []), lambda t: 0) == []  # an alert that never held


def test_a_loss_is_found_inside_a_legitimate_late_start() -> None:
    """Inputs from 10 h, output written only from 83 h: the gap's first probe finds no result, the
    others do."""
    written = written_from_stamps(START, END, STEP, [grid(START + 10_000 * STEP, END)])
    [loss] = lost(written, inputs_from(START + 10 * HOUR))
    assert [n for _, n in loss.probed] == [0, 3, 3, 3, 3]


def test_the_union_of_the_series_counts_and_short_gaps_are_not_looked_into() -> None:
    """One job's series ends where its next attempt's begins: the rule covers the range. A gap of up
    to TOLERANCE evaluations asks nothing of the backend."""
    half = START + 2 * 86400
    union = written_from_stamps(START, END, STEP, [grid(START, half), grid(half + STEP, END)])
    assert union.gaps() == []
    short = written_from_stamps(START, END, STEP, [grid(START, half), grid(half + 3 * STEP, END)])
    assert [g.evaluations for g in short.gaps()] == [2]

    def never(t: float) -> int:
        raise AssertionError("probed a gap within the tolerance")

    assert lost(short, never) == []
    # at most MOST_RUNS gaps probed, the longest first; PROBES evaluations each
    probed: list[float] = []
    flicker = written_from_stamps(START, END, STEP, [grid(START + k * HOUR, START + k * HOUR + 600) for k in range(20)])
    lost(flicker, lambda t: probed.append(t) or 0)
    assert len(probed) == replay_check.MOST_RUNS * replay_check.PROBES


class Replays:
    """A stubbed backend for ensure(): what each read returns, and the gaps replayed."""

    def __init__(self, *reads: Written) -> None:
        self.reads, self.replayed, self.lines = list(reads), [], []

    def read(self) -> Written:
        return self.reads.pop(0) if len(self.reads) > 1 else self.reads[0]

    def replay(self, gaps: list[Gap]) -> None:
        self.replayed.append([(g.first, g.last) for g in gaps])


def test_a_lost_stretch_is_replayed_again_and_only_it() -> None:
    full = written_from_stamps(START, END, STEP, [grid(START, END)])
    truncated = written_from_stamps(START, END, STEP, [grid(START + 10_000 * STEP, END)])
    stub = Replays(truncated, truncated, full)
    assert ensure("gpunode:nfs_transport_slot_saturation:rate5m (rule-053.yml)", stub.read, inputs_from(START),
                  stub.replay, 2, stub.lines.append) is full
    assert stub.replayed == [[(START, START + 9999 * STEP)]]
    [line] = stub.lines
    assert line.startswith("gpunode:nfs_transport_slot_saturation:rate5m (rule-053.yml): asked ")
    assert line.endswith("replaying those again (retry 1 of 2)")
    # A second look first: writes the backend had not made searchable yet are no loss.
    late = Replays(truncated, full)
    assert ensure("r", late.read, inputs_from(START), late.replay) is full and late.replayed == []


def test_a_loss_that_retries_do_not_mend_fails_naming_the_rule_the_range_and_what_was_written() -> None:
    truncated = written_from_stamps(START, END, STEP, [grid(START + 10_000 * STEP, END)] * 2)
    stub = Replays(truncated)
    with pytest.raises(ReplayLostError) as failed:
        ensure("gpunode:nfs_transport_slot_saturation:rate5m (rule-053.yml)", stub.read, inputs_from(START),
               stub.replay, 2, stub.lines.append)
    assert len(stub.replayed) == len(stub.lines) == 2
    message = str(failed.value)
    for part in ["the replay of gpunode:nfs_transport_slot_saturation:rate5m (rule-053.yml)",
                 f"asked {replay_check.iso(START)} to {replay_check.iso(END)} every 30 s (11521 evaluations)",
                 f"wrote 3042 samples at 1521 of them, from {replay_check.iso(START + 10_000 * STEP)}",
                 f"nothing from {replay_check.iso(START)} to {replay_check.iso(START + 9999 * STEP)} (10000 "
                 "evaluations), where its expression has results", "2 retries of those evaluations did not write them"]:
        assert part in message


class Backend:
    """requests' post() for read_written and results: sample counts from sample timestamps per
    series; any other query, the expression's values (a series each) at its range's first
    evaluation and 1.0 at every later one."""

    def __init__(self, stamps: list[np.ndarray], expression: list[float]) -> None:
        self.stamps, self.expression, self.asked = stamps, expression, []

    def post(self, url: str, timeout: float, data: dict[str, str]) -> Any:
        self.asked.append((url.rsplit("/", 1)[1], data))
        at = np.arange(float(data["start"]), float(data["end"]) + 1, float(data["step"].rstrip("s")))
        if not (counted := re.search(r"\[(\S+)s\]\)\)$", data["query"])):
            return _Reply({"resultType": "matrix", "result": [
                {"metric": {"n": str(n)}, "values": [[float(t), str(v if t == at[0] else 1.0)] for t in at]}
                for n, v in enumerate(self.expression)]})
        window = float(counted.group(1))
        counts = [sum(int(((s > t - window - 1e-9) & (s <= t)).sum()) for s in self.stamps) for t in at]
        values = [[float(t), str(c)] for t, c in zip(at, counts, strict=True) if c]
        return _Reply({"resultType": "matrix", "result": [{"metric": {}, "values": values}] if values else []})


class _Reply:
    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    def raise_for_status(self) -> None:
        pass

    def json(self) -> dict[str, Any]:
        return {"status": "success", "data": self.data}


def test_the_backend_is_asked_for_sample_counts_per_evaluation_in_chunks_and_the_expression_where_none() -> None:
    series = [grid(START + 10_000 * STEP, END), grid(START + 10_000 * STEP, START + 10_500 * STEP)]
    backend = Backend(series, [0.5, math.nan, 2.0])
    selector = replay_check.selector({"record": "gpunode:failslow_proxy:value", "expr": "x",
                                      "labels": {"proxy": "power", "t": "{{ $labels.a }}"}})
    assert selector == '{__name__="gpunode:failslow_proxy:value",proxy="power"}'
    written = replay_check.read_written("http://b", selector, START, END, STEP, backend)
    assert np.array_equal(written.counts, written_from_stamps(START, END, STEP, series).counts)
    assert (written.first, written.last) == (START + 10_000 * STEP, END)
    queries = [data for kind, data in backend.asked if kind == "query_range"]
    assert len(queries) == 2  # 11,521 evaluations: 10,000 and 1,521
    assert queries[0]["query"] == f"sum(count_over_time({selector}[29s]))"
    assert replay_check.results("http://b", "x / y", START, STEP, backend) == 2  # NaN is no result
    assert backend.asked[-1] == ("query_range", {"query": "x / y", "start": f"{START:.3f}",
                                                 "end": f"{START + STEP:.3f}", "step": "30s"})
    assert replay_check.selector({"alert": "NfsSlotTableSaturated", "expr": "x > 0.9"}) == (
        '{__name__="ALERTS",alertname="NfsSlotTableSaturated"}')


def test_a_gap_is_replayed_in_one_span_or_one_evaluation_at_a_time_for_a_rule_reading_its_own_past() -> None:
    gap = Gap(START, START + 2 * STEP, STEP)

    def rule(record: str, expr: str) -> dict[str, Any]:
        return {"groups": [{"name": "g", "interval": "30s", "rules": [{"record": record, "expr": expr}]}]}

    assert harness._gap_spans(rule("a:b", "x"), gap) == [(START, START + 2 * STEP + 1)]
    assert harness._gap_spans(rule("a:b", "a:b or x"), gap) == [(START + k * STEP, START + k * STEP + 1)
                                                               for k in range(3)]


def test_an_alert_with_for_is_replayed_in_spans_that_share_no_evaluation() -> None:
    def rule(**alert: str) -> dict[str, Any]:
        return {"groups": [{"name": "g", "interval": "30s", "rules": [{"alert": "A", "expr": "x > 1", **alert}]}]}

    end = START + 3000 * STEP
    spans = harness._spans(rule(**{"for": "4m"}), START, end)
    times = [replay_check.evaluations(begin, until, STEP) for begin, until in spans]
    assert [len(t) for t in times] == [harness.HELD_ALERT_POINTS] * 2 + [3001 - 2 * harness.HELD_ALERT_POINTS]
    assert np.array_equal(np.concatenate(times), replay_check.evaluations(START, end, STEP))  # each once
    assert harness._spans(rule(), START, end) == [(START, end)]  # no for:, no ALERTS_FOR_STATE
    gap = Gap(START, START + 2000 * STEP, STEP)
    assert [len(replay_check.evaluations(b, u, STEP)) for b, u in harness._gap_spans(rule(**{"for": "4m"}), gap)] == [
        harness.HELD_ALERT_POINTS, 2001 - harness.HELD_ALERT_POINTS]


# --- on the real backends: the self-test's fleet, one recording's first replay truncated ----------------------------

NFS = "gpunode:nfs_rpc_major_timeouts:sum"  # in a group evaluated every 30 s (intervals.default)
SELFTEST = scenario.load("selftest")


def _truncate_first_replay(monkeypatch: pytest.MonkeyPatch) -> None:
    """The NFS mounts' major timeouts' replay starts 90 minutes late, as if its first range query had
    come back empty: the first 180 evaluations are never written."""
    spans = harness._spans

    def truncated(rule_file: dict[str, Any], start: float, end: float) -> list[tuple[float, float]]:
        if rule_file["groups"][0]["rules"][0].get("record") == NFS:
            return [(start + 5400, end)]
        return spans(rule_file, start, end)

    monkeypatch.setattr(harness, "_spans", truncated)


@pytest.mark.parametrize("backend", harness.BACKENDS)
def test_a_truncated_replay_is_replayed_again_where_it_lost_evaluations(
        backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    skip_without_fleet_tools()
    fleet = Fleet(SELFTEST, (time.time() // 3600) * 3600 - SELFTEST.duration - 3600)
    _truncate_first_replay(monkeypatch)
    run = harness.run(backend, fleet, tmp_path, free_port())
    start = fleet.timestamps[0]
    [line] = run.retried
    assert line.startswith(f"{NFS} (rule-")
    assert f"nothing from {replay_check.iso(start)} to {replay_check.iso(start + 5370)} (180 evaluations)" in line
    assert "retry 1 of 2" in line
    assert "check\n" + line in (tmp_path / "vmalert-replay.log").read_text()


def test_a_replay_whose_retries_write_nothing_fails_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    skip_without_fleet_tools()
    fleet = Fleet(SELFTEST, (time.time() // 3600) * 3600 - SELFTEST.duration - 3600)
    _truncate_first_replay(monkeypatch)
    monkeypatch.setattr(harness, "_gap_spans", lambda rule_file, gap: [])  # the retries lose it again
    start, end = fleet.timestamps[0], fleet.timestamps[-1] + SELFTEST.step
    with pytest.raises(ReplayLostError) as failed:
        harness.run("victoriametrics", fleet, tmp_path, free_port())
    message = str(failed.value)
    assert message.startswith(f"the replay of {NFS} (rule-")
    assert (f"asked {replay_check.iso(start)} to {replay_check.iso(end)} every 30 s (361 evaluations); wrote "
            in message)
    assert f"from {replay_check.iso(start + 5400)} to {replay_check.iso(end)}" in message
    assert "2 retries of those evaluations did not write them" in message
    assert "(retry 2 of 2)" in (tmp_path / "vmalert-replay.log").read_text()  # written when a run fails too


@pytest.mark.parametrize("backend", harness.BACKENDS)
def test_a_series_first_seen_at_midnight_is_probed_as_the_replays_range_queries_see_it(
        backend: str, tmp_path: Path) -> None:
    """Workload b's first sample falls on 00:00:00 UTC, as a restart scraped on a 30 s grid can.
    The job-restart recording's form (a workload not seen in the 45 minutes before the last
    evaluation) has b at 00:00 and not at 00:00:30, in a range query over the hour around it, as
    the replay writes it; the probe must say the same at each evaluation. (An instant query at
    00:00:30 on VictoriaMetrics, whose window then ends at 00:00 exactly, saw b as new again.)"""
    skip_without_fleet_tools()
    fleet = Fleet(SELFTEST, (time.time() // 3600) * 3600 - SELFTEST.duration - 3600)
    midnight = fleet.timestamps[0] // 86400 * 86400
    stamps = grid(midnight - 1200, midnight + 600)
    values = np.vstack([np.where(stamps <= midnight - 600, 1.0, np.nan), np.where(stamps >= midnight, 1.0, np.nan)])
    labels = [remote_write.labels_bytes([("__name__", "probe_workload"), ("workload", w)]) for w in "ab"]
    expr = "probe_workload unless on (workload) max_over_time(probe_workload[45m] offset 30s)"
    with harness.serve(backend, fleet, tmp_path, free_port()) as url:
        remote_write.send(requests.Session(), f"{url}/api/v1/write",
                          remote_write.encode(labels, values, np.round(stamps * 1000)))
        harness.searchable(backend, url)
        around = requests.post(f"{url}/api/v1/query_range", timeout=60, data={
            "query": f"count({expr})", "start": midnight - HOUR, "end": midnight + HOUR, "step": "30s"})
        seen = {float(t): int(v) for t, v in around.json()["data"]["result"][0]["values"]}
        probed = {t: replay_check.results(url, expr, t, STEP) for t in grid(midnight - 90, midnight + 90)}
        assert probed == {t: seen.get(t, 0) for t in probed}
        assert seen.get(midnight) == 1 and midnight + STEP not in seen
