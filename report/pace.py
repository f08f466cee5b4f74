"""A job's pace and the episodes it ran slower: stragglers as a synchronous job shows them.

Every step of a synchronous job ends in a collective, so a node that slows holds back every
node: the job's traffic falls with its pace (the rule pack's GpuJobSlowedDown reads the same).
Here the pace is the NVLink bandwidth of the job's nodes (the median node, its mean GPU) against
the job's typical level while it trains (saves and loads left out) with no cause alert on its
nodes. An episode is a run where the 5-minute median of that ratio stays more than `fraction`
below 1 for `least` seconds;
its cost is the time lost, the sum of (1 - ratio) over its samples. The node and cause come from
the rule pack's cause alerts on the job's nodes during the episode, the cause from the alert's
`cause` label (the throttle reason, the fabric: clock_thermal, fabric_roce, ...); with none, the
job slowed as a whole (its input pipeline or storage, or a cause with no alert).

Only firing alerts name a culprit, and not every firing alert does. In a job too small for peers
each node is compared with its own past, and the culprit's neighbours slow with it (every step
waits for it), so their evidence may cross a threshold too. Where a power-braked GPU held back a
4-node job (fleet/scenarios/small-jobs.yaml), a neighbour's clock alert went pending again and
again, from before the culprit's fired, and never held for its `for`: counted, it took the
episode, while the rule pack's firing alerts named the culprit alone. A neighbour's alert that
does fire comes after the culprit's, while the job is already slow, and leaves its pace as it
was. So an alert that begins while another is on names a culprit only if the job's steps took
longer from its start (a second cause on top of the first: it owns the time from then on); one
that does not is taken for an effect of the first.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpunode_report.jobs import runs

SMOOTH = 10  # samples of the rolling median (5 minutes at 30 s)
WEIGH = 2 * SMOOTH  # samples before and after a cause alert's start that tell whether it slowed the job further
CALM_LEAST = 12 * SMOOTH  # an hour at 30 s: enough of a job's pace without a cause alert to judge it by
HELD_SHARE = 0.75  # of an hour's samples with a pace (saves, loads and alerts left out) for its level to count
# The rule pack's cause alerts (docs/runbooks/failslow.md, gpu.md). Each names its cause in its
# `cause` label (clock_thermal, fabric_roce, ...); an alert of a rule pack from before that label
# has the cause below.
CAUSES = {"GpuNodeClockThrottled": "clock_throttled", "GpuNvLinkDegraded": "nvlink_degraded",
          "GpuNodeFabricLinkErrors": "fabric_link_errors", "GpuPcieLinkDegraded": "pcie_link_degraded",
          "GpuNodeHostStarved": "host_starved"}
JOB_WIDE = "job_wide"
Key = tuple[str, str, str]  # a firing cause alert: (alertname, node, cause)


def key(labels: dict[str, str], node: str) -> Key:
    """A cause alert's key from its labels; node: the node label's name."""
    name = labels.get("alertname", "")
    return name, labels.get(node, ""), labels.get("cause") or CAUSES.get(name, "")


@dataclass
class Episode:
    first: int  # grid indices, relative to the attempt's first sample
    last: int
    slowdown: float  # 1 - the mean ratio to the typical pace
    lost: float  # seconds of progress lost to the slower pace
    node: str = ""
    cause: str = JOB_WIDE


def rolling_median(values: np.ndarray, width: int) -> np.ndarray:
    """The median of the `width` samples centred on each (NaN ignored; NaN where all are)."""
    if values.size == 0:
        return values
    half = width // 2
    padded = np.concatenate([np.full(half, np.nan), values, np.full(width - 1 - half, np.nan)])
    windows = np.lib.stride_tricks.sliding_window_view(padded, width)
    out = np.full(values.size, np.nan)
    has = ~np.isnan(windows).all(axis=1)
    out[has] = np.nanmedian(windows[has], axis=1)
    return out


def calm(alerts: dict[Key, np.ndarray], nodes: list[str], span: slice) -> np.ndarray:
    """Per sample of `span`: no cause alert on any of the nodes."""
    out = np.ones(span.stop - span.start, bool)
    for (name, node, _cause), active in alerts.items():
        if name in CAUSES and node in nodes:
            out &= ~active[span]
    return out


def typical(pace: np.ndarray, training: np.ndarray, quiet: np.ndarray | None = None) -> float | None:
    """A job's typical pace: its 5-minute medians while it trains, from the samples with no cause
    alert on its nodes (`quiet`) where there are CALM_LEAST of them; of those, the higher of their
    90th percentile and the highest median over an hour (CALM_LEAST samples, HELD_SHARE of them
    with a pace). Not the median: a straggler that stays (a link trained down) may hold back most
    of a job's life, with no cause alert or its alert missing for part of it; the 90th percentile
    alone takes the slow pace once it holds the job back for 90 % of its life, the hour it ran
    at its pace before does not. Both read the top of the pace: no fault makes a job faster."""
    smooth = rolling_median(np.where(training, pace, np.nan), SMOOTH)
    if quiet is not None and np.count_nonzero(quiet & ~np.isnan(smooth)) >= CALM_LEAST:
        smooth = np.where(quiet, smooth, np.nan)
    held = None
    if smooth.size >= CALM_LEAST:  # hours starting every SMOOTH samples
        hours = np.lib.stride_tricks.sliding_window_view(smooth, CALM_LEAST)[::SMOOTH]
        hours = hours[np.count_nonzero(~np.isnan(hours), axis=1) >= HELD_SHARE * CALM_LEAST]
        held = float(np.nanmedian(hours, axis=1).max()) if hours.size else None
    smooth = smooth[~np.isnan(smooth)]
    if smooth.size < SMOOTH:
        return None
    top = float(np.quantile(smooth, 0.9))
    return top if held is None else max(top, held)


def episodes(pace: np.ndarray, training: np.ndarray, base: float, fraction: float, least: int, step: float,
             alerts: dict[Key, np.ndarray], nodes: list[str], offset: int) -> list[Episode]:
    """Runs where the job's 5-minute median pace stays more than `fraction` below `base` for at
    least `least` samples (saves and loads within a run do not end it), each split by its culprit.
    alerts: firing cause alerts, (alertname, node, cause) -> firing per sample on the grid; offset:
    the grid index of pace[0]."""
    use = training & ~np.isnan(pace)
    ratio = np.where(use, pace / base, np.nan)
    with np.errstate(invalid="ignore"):
        slow = rolling_median(ratio, SMOOTH) < 1 - fraction
    out = []
    for first, last in runs(slow, SMOOTH):
        if last - first + 1 >= least:
            out += _by_culprit(ratio, first, last, step, fraction, alerts, nodes, offset)
    return out


def _slower(ratio: np.ndarray, since: int, at: int, fraction: float) -> bool:
    """Whether the job's step took more than half of `fraction` of its typical step longer from
    `at` (over WEIGH samples) than in the samples from `since` to it (the last WEIGH of them): a new
    cause that made it slower. In step time, not pace: a second straggler adds its delay to every
    step, which moves the pace of a job already 23 % slower by less than its own share (a 3 %
    starved host on a power-braked one: 0.770 to 0.752 of its pace, 1.298 to 1.330 steps). Half:
    a 3 % cause (the smallest a fleet shows often) is seen over the medians' noise; a neighbour
    that only slowed with the culprit adds nothing."""
    before, after = ratio[max(since, at - WEIGH):at], ratio[at:at + WEIGH]
    before, after = before[~np.isnan(before) & (before > 0)], after[~np.isnan(after) & (after > 0)]
    return bool(before.size and after.size and np.median(1 / after) - np.median(1 / before) > fraction / 2)


def _by_culprit(ratio: np.ndarray, first: int, last: int, step: float, fraction: float,
                alerts: dict[Key, np.ndarray], nodes: list[str], offset: int) -> list[Episode]:
    """One slow run as episodes per culprit. A cause alert on the job's nodes is a culprit if it
    began with no other one on, or if the job's step took longer from its start on (_slower)
    (a second cause that makes a slow job slower); one that begins while a culprit's is on and
    leaves the pace as it was follows from it (a small job's nodes, compared with their own past,
    slow with the culprit). Each sample goes to the culprit that began last among those on; samples
    with none go to the culprit before them (or after: an alert fires only after its `for`). With
    no cause alert at all, the job slowed as a whole."""
    span = slice(offset + first, offset + last + 1)
    causes = [(key, active[span]) for key, active in sorted(alerts.items())
              if key[1] in nodes and key[0] in CAUSES and active[span].any()]
    began = [int(np.argmax(active)) for _key, active in causes]
    culprit = []
    for at in began:
        earlier = [began[j] for j, (_key, other) in enumerate(causes) if began[j] < at and other[at]]
        culprit.append(not earlier or _slower(ratio, first + max(earlier), first + at, fraction))
    owner = np.full(last - first + 1, -1)
    for i in range(owner.size):
        live = [k for k, (_key, active) in enumerate(causes) if active[i] and culprit[k]]
        if live:
            owner[i] = max(live, key=lambda k: began[k])
    if any(culprit):
        known = np.flatnonzero(owner >= 0)
        for i in np.flatnonzero(owner < 0):  # the nearest culprit before, else after
            before = known[known < i]
            owner[i] = owner[before[-1]] if before.size else owner[known[known > i][0]]
    out = []
    for k in sorted(set(owner.tolist())):
        mine = np.flatnonzero(owner == k)
        part = ratio[first + mine]
        part = part[~np.isnan(part)]
        if not part.size:
            continue
        node, cause = ("", JOB_WIDE) if k < 0 else causes[k][0][1:]
        out.append(Episode(first + int(mine[0]), first + int(mine[-1]), float(1 - part.mean()),
                           float(np.clip(1 - part, 0, None).sum() * step), node, cause))
    return out
