"""Where a job's time went, and what its checkpoints cost against the Young/Daly optimum.

A job's elapsed time (first attempt's start to last attempt's end) splits into:
- checkpoint_load: each attempt's start until its nodes leave the load phase;
- checkpoint_save: each save, timed by the node itself where its exporter keeps the clock
  (gpunode_checkpoint_save_seconds_total, read every second: its increase over the save, the
  median over the job's nodes); else estimated as the Lablup B200 operations report did (Table
  10): (samples in the save phase - 1) x the scrape interval, unbiased when saves fall at random
  between scrapes but 0 for every save shorter than a scrape;
- down: between an attempt's end and the next one's start;
- lost_progress: after an abnormal end, the work since the last save (or the load) is redone;
- slowed: progress lost to a slower pace (pace.py);
- productive: the rest.
Young/Daly (Young, "A first order approximation to the optimum checkpoint interval"; Daly, "A
higher order estimate of the optimum checkpoint interval for restart dumps"): for a save lasting
delta and a mean time between failures M, the optimal interval is sqrt(2 delta M) and an interval
T costs delta/T + T/(2M) of the time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from gpunode_report.jobs import Job, runs
from gpunode_report.pace import Episode

LOAD_STARTS_WITHIN = 4  # samples: a load that begins later than this after the attempt's start is none
CLOCK_MARGIN = 2  # samples read of a save clock either side of a save: no second of the save falls outside


@dataclass
class AttemptTime:
    load: float = 0.0
    saves: list[tuple[int, int]] = field(default_factory=list)  # (first, last) grid indices of each save
    save_seconds: list[float] = field(default_factory=list)
    timed: int = 0  # saves of save_seconds timed by the nodes' own clocks (the rest: estimated)
    lost: float = 0.0
    slowed: float = 0.0


def attempt_time(phase: np.ndarray, first: int, step: float, load_gap: int, abnormal: bool,
                 slow: list[Episode]) -> AttemptTime:
    """phase: the job's majority phase over the attempt's samples (index 0 = grid index `first`)."""
    out = AttemptTime()
    loads = runs(phase == 2, load_gap)
    trained_from = 0
    if loads and loads[0][0] < LOAD_STARTS_WITHIN:
        trained_from = loads[0][1] + 1
        out.load = trained_from * step
    for a, b in runs(phase == 1, 0):
        if a >= trained_from:
            out.saves.append((first + a, first + b))
            out.save_seconds.append((b - a) * step)
    if abnormal:
        saved = out.saves[-1][1] + 1 - first if out.saves else trained_from
        out.lost = max(0, phase.size - saved) * step
    out.slowed = sum(e.lost for e in slow)
    return out


def time_saves(attempt: AttemptTime, clocks: list[np.ndarray]) -> None:
    """Each save's duration from the nodes' save clocks (their counter on the whole grid, NaN
    where absent), where any node has one: the median over the nodes of its increase from
    CLOCK_MARGIN samples before the save to as many after, short of the saves either side."""
    saves = attempt.saves
    for i, (first, last) in enumerate(saves):
        lo = max(first - CLOCK_MARGIN, saves[i - 1][1] + 1 if i else 0, 0)
        hi = min(last + CLOCK_MARGIN, saves[i + 1][0] - 1 if i + 1 < len(saves) else last + CLOCK_MARGIN)
        rises = [r for c in clocks if (r := increase(c[lo:hi + 1])) is not None]
        if rises:
            attempt.save_seconds[i] = float(np.median(rises))
            attempt.timed += 1


def increase(values: np.ndarray) -> float | None:
    """A counter's increase over its samples (NaN: none), a fall read as a restart from 0."""
    v = values[~np.isnan(values)]
    if v.size < 2:
        return None
    rise = np.diff(v)
    return float(np.where(rise >= 0, rise, v[1:]).sum())


def young_daly(delta: float | None, interval: float | None, mtbf: float | None) -> dict[str, float | None]:
    """The optimal interval, the cost of `interval` and the cost at the optimum (None where unknown)."""
    if not delta or not mtbf or delta <= 0 or mtbf <= 0:
        return {"optimal_interval_seconds": None, "cost_fraction": None, "optimal_cost_fraction": None}
    cost = delta / interval + interval / (2 * mtbf) if interval else None
    return {"optimal_interval_seconds": math.sqrt(2 * delta * mtbf), "cost_fraction": cost,
            "optimal_cost_fraction": math.sqrt(2 * delta / mtbf)}


def gpu_hours(seconds: float, nodes: int, gpus_per_node: int) -> float:
    """The report's GPU-hours: node-seconds x the spec's goodput.gpus_per_node."""
    return seconds * nodes * gpus_per_node / 3600


def cost_curve(delta: float, mtbf: float, intervals: np.ndarray) -> np.ndarray:
    return delta / intervals + intervals / (2 * mtbf)


def job_split(job: Job, times: list[AttemptTime], step: float) -> dict[str, float]:
    elapsed = (job.attempts[-1].last - job.attempts[0].first + 1) * step
    down = sum((b.first - a.last - 1) * step for a, b in zip(job.attempts, job.attempts[1:], strict=False))
    split = {"elapsed": elapsed, "checkpoint_save": sum(sum(t.save_seconds) for t in times),
             "checkpoint_load": sum(t.load for t in times), "down": down, "slowed": sum(t.slowed for t in times),
             "lost_progress": sum(t.lost for t in times)}
    split["productive"] = max(0.0, elapsed - sum(v for k, v in split.items() if k != "elapsed"))
    return {k: split[k] for k in ("elapsed", "productive", "checkpoint_save", "checkpoint_load", "down", "slowed",
                                  "lost_progress")}


def checkpoint(times: list[AttemptTime], step: float, mtbf: float | None) -> dict[str, float | int | None]:
    gaps = [(b[0] - a[0]) * step for t in times for a, b in zip(t.saves, t.saves[1:], strict=False)]
    saves = [s for t in times for s in t.save_seconds]
    loads = [t.load for t in times if t.load > 0]
    interval = float(np.mean(gaps)) if gaps else None
    delta = float(np.mean(saves)) if saves else None
    timed = sum(t.timed for t in times)
    clock = None if not saves else "node" if timed == len(saves) else "scrapes" if not timed else "node and scrapes"
    return {"saves": len(saves), "interval_seconds": interval, "save_seconds": delta, "save_clock": clock,
            "load_seconds": float(np.mean(loads)) if loads else None, "mtbf_seconds": mtbf,
            **young_daly(delta, interval, mtbf)}
