"""A job's pace and the episodes it ran slower: stragglers as a synchronous job shows them.

Every step of a synchronous job ends in a collective, so a node that slows holds back every
node: the job's traffic falls with its pace (the rule pack's GpuJobSlowedDown reads the same).
Here the pace is the NVLink bandwidth of the job's nodes (the median node, its mean GPU) against
the job's typical level while it trains (saves and loads left out) with no cause alert on its
nodes. An episode is a run where the 5-minute median of that ratio stays more than `fraction`
below 1 for `least` seconds;
its cost is the time lost, the sum of (1 - ratio) over its samples. The node and cause come from
the rule pack's cause alerts on the job's nodes during the episode; with none, the job slowed as
a whole (its input pipeline or storage, or a cause with no alert).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from exporter.report.jobs import runs

SMOOTH = 10  # samples of the rolling median (5 minutes at 30 s)
CALM_LEAST = 12 * SMOOTH  # an hour at 30 s: enough of a job's pace without a cause alert to judge it by
# The rule pack's cause alerts (docs/runbooks/failslow.md, gpu.md) and the cause each names.
CAUSES = {"GpuNodeClockThrottled": "clock_throttled", "GpuNvLinkDegraded": "nvlink_degraded",
          "GpuNodeFabricLinkErrors": "fabric_link_errors", "GpuPcieLinkDegraded": "pcie_link_degraded",
          "GpuNodeHostStarved": "host_starved"}
JOB_WIDE = "job_wide"


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


def calm(alerts: dict[tuple[str, str], np.ndarray], nodes: list[str], span: slice) -> np.ndarray:
    """Per sample of `span`: no cause alert on any of the nodes."""
    out = np.ones(span.stop - span.start, bool)
    for (name, node), active in alerts.items():
        if name in CAUSES and node in nodes:
            out &= ~active[span]
    return out


def typical(pace: np.ndarray, training: np.ndarray, quiet: np.ndarray | None = None) -> float | None:
    """A job's typical pace: the 90th percentile of its 5-minute medians while it trains, from the
    samples with no cause alert on its nodes (`quiet`) where there are CALM_LEAST of them. Not the
    median: a straggler that stays (a link trained down) may hold back most of a job's life; with
    its alert left out, even all but the first hour of it."""
    smooth = rolling_median(np.where(training, pace, np.nan), SMOOTH)
    if quiet is not None and np.count_nonzero(quiet & ~np.isnan(smooth)) >= CALM_LEAST:
        smooth = np.where(quiet, smooth, np.nan)
    smooth = smooth[~np.isnan(smooth)]
    return float(np.quantile(smooth, 0.9)) if smooth.size >= SMOOTH else None


def episodes(pace: np.ndarray, training: np.ndarray, base: float, fraction: float, least: int, step: float,
             alerts: dict[tuple[str, str], np.ndarray], nodes: list[str], offset: int) -> list[Episode]:
    """Runs where the job's 5-minute median pace stays more than `fraction` below `base` for at
    least `least` samples (saves and loads within a run do not end it), each split by its culprit.
    alerts: (alertname, node) -> active per sample on the grid; offset: the grid index of pace[0]."""
    use = training & ~np.isnan(pace)
    ratio = np.where(use, pace / base, np.nan)
    with np.errstate(invalid="ignore"):
        slow = rolling_median(ratio, SMOOTH) < 1 - fraction
    out = []
    for first, last in runs(slow, SMOOTH):
        if last - first + 1 >= least:
            out += _by_culprit(ratio, first, last, step, alerts, nodes, offset)
    return out


def _by_culprit(ratio: np.ndarray, first: int, last: int, step: float, alerts: dict[tuple[str, str], np.ndarray],
                nodes: list[str], offset: int) -> list[Episode]:
    """One slow run as episodes per culprit: each sample goes to the cause alert on the job's nodes
    that began last among those active then (a second cause that makes a slow job slower owns the
    time from its start); samples with none go to the culprit before them (or after: an alert
    fires only after its `for`). With no cause alert at all, the job slowed as a whole."""
    span = slice(offset + first, offset + last + 1)
    causes = [(key, active[span]) for key, active in sorted(alerts.items())
              if key[1] in nodes and key[0] in CAUSES and active[span].any()]
    owner = np.full(last - first + 1, -1)
    began = [int(np.argmax(active)) for _key, active in causes]
    for i in range(owner.size):
        live = [k for k, (_key, active) in enumerate(causes) if active[i]]
        if live:
            owner[i] = max(live, key=lambda k: began[k])
    if causes:
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
        node, cause = ("", JOB_WIDE) if k < 0 else (causes[k][0][1], CAUSES[causes[k][0][0]])
        out.append(Episode(first + int(mine[0]), first + int(mine[-1]), float(1 - part.mean()),
                           float(np.clip(1 - part, 0, None).sum() * step), node, cause))
    return out
