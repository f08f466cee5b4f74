"""Did a replay write what its range asked for?

vmalert's replay answers each rule with range queries of up to `-replay.maxDatapointsPerQuery`
evaluations and writes the results back by remote write; a query that comes back empty writes
nothing and logs nothing. In one `make fleet` run VictoriaMetrics lost the first 83 hours (the
first of two range queries) of `gpunode:nfs_transport_slot_saturation:rate5m`, and the missed
NFS alert scored as a missed fault. So after each rule's replay the harness reads back, at every
evaluation the range asked for, how many samples the rule wrote (over all its output series:
the union), and for every run of evaluations with none asks the backend whether the rule's
expression has results there. An empty run is legitimate where the expression has none (inputs
that start late or end early, an alert that does not hold, a ratio that is NaN); where it has
some, the replay lost them: that part is replayed again, and still missing after the retries,
the run fails naming the rule, the range asked and what was written.

The check itself is pure (`Written`, `lost`, `ensure`); `read_written` and `results` are the
backend's side, one range query of sample counts per rule and, where nothing was written, a
few of its expression (range queries too, as the replay's: `results`).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
import requests

TOLERANCE = 2  # evaluations: a run of this many or fewer with no sample is not looked into
PROBES = 5  # evaluations probed in a run with no sample: its first, its last and evenly between
MOST_RUNS = 8  # runs probed per rule, the longest first (an alert's quiet periods are many)
CHUNK = 10_000  # evaluations per range query (Prometheus answers at most 11,000 points)


def iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def evaluations(start: float, end: float, step: float) -> np.ndarray:
    """The evaluations a replay of [start, end] asks for: the multiples of step in it (vmalert's
    range queries include both ends; the harness's ranges start on the step)."""
    first = math.ceil(start / step) * step
    return np.arange(first, end + step / 2, step) if first <= end else np.zeros(0)


@dataclass(frozen=True)
class Gap:
    """A run of consecutive evaluations at which the rule wrote no sample at all."""

    first: float
    last: float
    step: float

    @property
    def evaluations(self) -> int:
        return round((self.last - self.first) / self.step) + 1

    def times(self) -> np.ndarray:
        return self.first + self.step * np.arange(self.evaluations)

    def __str__(self) -> str:
        return f"{iso(self.first)} to {iso(self.last)} ({self.evaluations} evaluations)"


@dataclass(frozen=True, eq=False)  # numpy arrays: no ==
class Written:
    """What one rule's replay wrote: at each evaluation asked for, its samples over all its series."""

    start: float
    end: float
    step: float
    times: np.ndarray  # evaluations(start, end, step)
    counts: np.ndarray  # samples written at each

    @property
    def samples(self) -> int:
        return int(self.counts.sum())

    @property
    def covered(self) -> int:
        """Evaluations with at least one sample."""
        return int((self.counts > 0).sum())

    @property
    def first(self) -> float | None:
        at = np.flatnonzero(self.counts > 0)
        return float(self.times[at[0]]) if at.size else None

    @property
    def last(self) -> float | None:
        at = np.flatnonzero(self.counts > 0)
        return float(self.times[at[-1]]) if at.size else None

    def gaps(self) -> list[Gap]:
        """The runs of evaluations with no sample, in time order."""
        empty = np.concatenate([[False], self.counts == 0, [False]]).astype(np.int8)
        edges = np.flatnonzero(np.diff(empty))
        return [Gap(float(self.times[a]), float(self.times[b - 1]), self.step)
                for a, b in zip(edges[::2], edges[1::2], strict=True)]

    def __str__(self) -> str:
        asked = (f"asked {iso(self.start)} to {iso(self.end)} every {self.step:g} s "
                 f"({self.times.size} evaluations)")
        if self.first is None or self.last is None:
            return f"{asked}; wrote nothing"
        return (f"{asked}; wrote {self.samples} samples at {self.covered} of them, "
                f"from {iso(self.first)} to {iso(self.last)}")


def written_from_stamps(start: float, end: float, step: float, stamps: Iterable[Iterable[float]]) -> Written:
    """Written from the timestamps of each output series' samples (each taken at its evaluation:
    the nearest one; samples outside the range asked for are left out)."""
    times = evaluations(start, end, step)
    counts = np.zeros(times.size, dtype=np.int64)
    for series in stamps:
        at = np.asarray(list(series), dtype=float)
        if times.size and at.size:
            index = np.rint((at - times[0]) / step).astype(np.int64)
            np.add.at(counts, index[(index >= 0) & (index < times.size)], 1)
    return Written(start, end, step, times, counts)


@dataclass(frozen=True)
class Loss:
    """A gap where the rule's expression has results: what the replay should have written."""

    gap: Gap
    probed: tuple[tuple[float, int], ...]  # (evaluation, the expression's results there)

    def __str__(self) -> str:
        found = [(t, n) for t, n in self.probed if n]
        t, n = found[0]
        return (f"nothing from {self.gap}, where its expression has results "
                f"(at {len(found)} of {len(self.probed)} evaluations probed; {n} series at {iso(t)})")


def probe_times(gap: Gap, probes: int = PROBES) -> list[float]:
    """The evaluations of a gap to probe: its first and last and evenly between."""
    times = gap.times()
    picked = {round(x) for x in np.linspace(0, times.size - 1, min(probes, times.size))}
    return [float(times[i]) for i in sorted(picked)]


def lost(written: Written, produced: Callable[[float], int], tolerance: int = TOLERANCE, probes: int = PROBES,
         most: int = MOST_RUNS) -> list[Loss]:
    """The gaps longer than `tolerance` evaluations (at most `most`, the longest first) where the
    rule's expression has results (`produced(t)`: how many series it returns at t) at one of the
    probed evaluations. A gap where it has none at every probe is legitimate: inputs that start
    late or end early, an alert that does not hold."""
    gaps = sorted((g for g in written.gaps() if g.evaluations > tolerance), key=lambda g: -g.evaluations)[:most]
    losses = []
    for gap in gaps:
        probed = tuple((t, produced(t)) for t in probe_times(gap, probes))
        if any(n for _, n in probed):
            losses.append(Loss(gap, probed))
    return sorted(losses, key=lambda loss: loss.gap.first)


class ReplayLostError(RuntimeError):
    """A rule's replay left out evaluations where its expression has results, after every retry."""


def ensure(rule: str, read: Callable[[], Written], produced: Callable[[float], int],
           replay: Callable[[list[Gap]], None], retries: int = 2,
           report: Callable[[str], None] = lambda line: None) -> Written:
    """Check one rule's replay: read() what it wrote; where it lost evaluations, look once more
    (a write the backend has not made searchable yet is not a loss), then replay() just those
    gaps, at most `retries` times; lost still, raise ReplayLostError naming the rule, the range
    asked, what was written and what is missing. report() gets a line for each retry."""
    written = read()
    losses = lost(written, produced)
    if losses:
        written = read()
        losses = lost(written, produced)
    for attempt in range(1, retries + 1):
        if not losses:
            return written
        report(f"{rule}: {written}; {'; '.join(map(str, losses))}: replaying those again (retry {attempt} "
               f"of {retries})")
        replay([loss.gap for loss in losses])
        written = read()
        losses = lost(written, produced)
    if losses:
        raise ReplayLostError(f"the replay of {rule} {written}; {'; '.join(map(str, losses))}; "
                              f"{retries} retries of those evaluations did not write them")
    return written


# --- the backend's side (Prometheus or VictoriaMetrics: the same HTTP API) ----------------------------------------

def selector(rule: dict[str, object]) -> str:
    """The series one rule writes: its recording's name (or ALERTS and its alertname) and its
    static labels (rules that share a name differ in them)."""
    matchers = {"__name__": str(rule["record"])} if "record" in rule else {"__name__": "ALERTS",
                                                                           "alertname": str(rule["alert"])}
    labels = rule.get("labels") or {}
    assert isinstance(labels, dict)
    matchers |= {str(k): str(v) for k, v in labels.items() if "{{" not in str(v)}  # templated: not known here
    return "{" + ",".join(f"{k}={json.dumps(v)}" for k, v in matchers.items()) + "}"


def read_written(url: str, series: str, start: float, end: float, step: float,
                 session: requests.Session | None = None) -> Written:
    """The samples of `series` at each evaluation of [start, end]: per evaluation t, the samples
    in the window of one step ending at t (a second short of it: Prometheus 2's windows include
    their start, and the sample one step earlier would be counted twice). One range query per
    CHUNK evaluations: for 500 series over 4 days at 30 s, 0.3 s on VictoriaMetrics and 1.1 s
    on Prometheus (`max(timestamp())` took 276 s there)."""
    get = session or requests
    times = evaluations(start, end, step)
    counts = np.zeros(times.size, dtype=np.int64)
    window = f"{max(step - 1, step / 2):g}s"
    for first in range(0, times.size, CHUNK):
        part = times[first:first + CHUNK]
        reply = get.post(f"{url}/api/v1/query_range", timeout=600, data={
            "query": f"sum(count_over_time({series}[{window}]))", "start": f"{part[0]:.3f}",
            "end": f"{part[-1]:.3f}", "step": f"{step:g}s"})
        reply.raise_for_status()
        for result in reply.json()["data"]["result"]:
            for at, value in result["values"]:
                index = round((float(at) - times[0]) / step)
                if 0 <= index < times.size:
                    counts[index] = round(float(value))
    return Written(start, end, step, times, counts)


def results(url: str, expr: str, at: float, step: float, session: requests.Session | None = None) -> int:
    """How many series `expr` returns at `at`, as an evaluation of the replay at `step` sees it:
    from a range query, as the replay's (VictoriaMetrics' implicit windows follow `step`); NaN
    values are not counted (whether a replay writes them is not asked here).

    Not an instant query: VictoriaMetrics finds series in a per-day index and takes a search's end
    as exclusive there (`TimeRange.DateRange`), so an instant query whose window ends at 00:00 UTC
    (an `offset 30s` at 00:00:30) misses a series first seen at that very instant, which the
    replay's range queries, reaching past it, see. A job restart scraped at midnight was probed as
    a second restart 30 s later, and the run failed on a loss that retries could never mend."""
    get = session or requests
    reply = get.post(f"{url}/api/v1/query_range", timeout=600, data={
        "query": expr, "start": f"{at:.3f}", "end": f"{at + step:.3f}", "step": f"{step:g}s"})
    reply.raise_for_status()
    return sum(1 for result in reply.json()["data"]["result"] for t, value in result["values"]
               if abs(float(t) - at) < 0.001 and not math.isnan(float(value)))
