"""What a backend holds before its rules are measured: the input written ahead (so that only
the rules run while measured), and the history a run of minutes lacks (week-long windows, the
baselines' hours of medians), so that the rules cost what they will in service."""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import requests
from benchlib import BenchError  # benchmarks/ is on sys.path when run as a script

from fleet import remote_write

from .synthetic import Fleet

if TYPE_CHECKING:
    from .backends import Backend

PREWRITE_SLICE = 900.0  # seconds of every series per pass
PREWRITE_LEAD = 360.0  # seconds of input before the rules start: full 5 min windows at the first evaluation
# From the first values to the ratios to the peers: a chain of peer rules, on vmalert a step per
# evaluation (value, in_peer_group, median, count, ratio: five at 30 s) and a margin.
RULES_SETTLE_SECONDS = 180.0
# A recording rule that reads further back than this reads the backfilled history, not the
# rules' first minutes (a baseline over 3 hours of medians).
RECENT_READ_SECONDS = 900.0


def recorded_backfill_after(plan: dict[str, dict[str, Any]]) -> float:
    """Seconds after the rules start when every recorded-history group has evaluated past the
    rules' first minutes: the settling, how far back its rule reads (if recent), and one interval
    as run here (at least a minute) for it to run; plus 15 s for the writes to be readable."""
    return 15 + max([RULES_SETTLE_SECONDS + (p["reads_s"] if p["reads_s"] <= RECENT_READ_SECONDS else 0.0)
                     + max(60.0, p["run_step_s"]) for p in plan.values() if p["tier"] == "recorded"], default=0.0)


def warmup_for_recorded_history(reads: dict[str, float], recorded: dict[str, float],
                                recorded_from: dict[str, float], args: argparse.Namespace) -> float:
    """The warm-up that lets the recorded history be written and read by one more evaluation of
    every group: at least --warmup. (Which recordings need history depends on the warm-up.)"""
    warmup = args.warmup
    for _ in range(5):
        plan = backfill_plan(reads, recorded, argparse.Namespace(**{**vars(args), "warmup": warmup}), recorded_from)
        steps = [max(60.0, p["run_step_s"]) for p in plan.values() if p["tier"] == "recorded"]
        needed = max(args.warmup, math.ceil(recorded_backfill_after(plan) + max(steps) + 30) if steps else 0)
        if needed == warmup:
            break
        warmup = needed
    return float(warmup)


def backfill_plan(reads: dict[str, float], recorded: dict[str, float], args: argparse.Namespace,
                  recorded_from: dict[str, float]) -> dict[str, dict[str, Any]]:
    """What history a short run lacks, per metric: "long" (read over >= 1 day, raw or recorded):
    hourly points up to --backfill-days; "raw" (a scraped metric read further back than the
    warm-up, < 1 day): points every scrape interval over that reach plus the 5 min lookback;
    "recorded" (a recording read further back than the warm-up, < 1 day: the fail-slow
    baseline's 3 hours of medians): points every interval of the group recording it, over that reach
    ("reads_s": how far back its own rule reads, from recorded_from)."""
    plan = {}
    for name, reach in reads.items():
        if not name or name in ("ALERTS", "ALERTS_FOR_STATE"):
            continue
        if reach >= 86400 and args.backfill_days > 0:
            plan[name] = {"tier": "long", "reach_s": reach, "step_s": 3600.0,
                          "span_s": min(reach, args.backfill_days * 86400) + 3600}
        elif args.warmup * 0.8 < reach < 86400:
            step = recorded[name] if name in recorded else float(args.scrape_interval)
            plan[name] = {"tier": "recorded" if name in recorded else "raw", "reach_s": reach, "step_s": step,
                          "span_s": reach + 300}
            if name in recorded:  # groups slower than --max-group-interval run every --eval-interval here
                plan[name]["reads_s"] = recorded_from.get(name, 0.0)
                plan[name]["run_step_s"] = step if step <= args.max_group_interval else args.eval_interval
    return plan


def _series_key(labels: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in labels.items() if k != "__name__"))


def do_backfill(backend: Backend, plan: dict[str, dict[str, Any]], tier: str, end: float,
                written: dict[str, set[tuple[tuple[str, str], ...]]] | None = None) -> dict[str, Any]:
    """Each planned metric's series as the backend holds them now (the smallest value seen in the
    last 10 min: a counter's earliest, so the history does not look like a reset; of a recording,
    the series of each recording group's latest evaluation, as a node in service has one basis
    for hours), up to end. With written (name -> the label sets written so far, updated here):
    only the series not written yet."""
    out: dict[str, Any] = {}
    start = time.perf_counter()
    for name, p in plan.items():
        if p["tier"] != tier:
            continue
        selector = f'{{__name__="{name}"}}'
        # A recording's current series: each group that records it (a group per proxy) evaluated
        # within one interval of the newest sample; a series its rules stopped is a step older.
        query = (f"{selector} and timestamp({selector}) > scalar(max(timestamp({selector}))) - {p['step_s']:g}"
                 if tier == "recorded" else f"min_over_time({selector}[10m])")
        found = [(r["metric"], float(r["value"][1])) for r in backend.query(query)]
        if written is not None:  # by labels without the name: the writer names every series itself
            seen = written.setdefault(name, set())
            found = [(labels, value) for labels, value in found if _series_key(labels) not in seen]
            seen.update(_series_key(labels) for labels, _ in found)
        points = backend.backfill({name: found}, end - p["span_s"], end, p["step_s"]) if found else 0
        out[name] = {**p, "series": len(found), "samples": points}
    out["_seconds"] = round(time.perf_counter() - start, 1)
    return out


def prewrite(backend: Backend, fleet: Fleet, plan: dict[str, dict[str, Any]],
             args: argparse.Namespace) -> dict[str, Any]:
    """Every series of the fleet, every scrape interval, from its lead before now (the 5 min
    windows, or the raw tier's reach) to past the end of the measurement, by remote write: the
    backend then only evaluates rules while it is measured. Samples after an evaluation's time
    are never read by it."""
    began = time.time()
    step = float(args.eval_interval if args.tier == "fleet" else args.scrape_interval)  # recordings: per evaluation
    until = began + args.write_allowance + args.warmup + args.measure + 60
    lead = {name: max(PREWRITE_LEAD, p["span_s"]) for name, p in plan.items() if p["tier"] == "raw"}
    fleet.epoch = began - max([PREWRITE_LEAD, *lead.values()])  # counters start at their base here
    series = samples = 0
    session = requests.Session()
    first = {name: math.ceil((began - lead.get(name, PREWRITE_LEAD)) / step) * step for name in fleet.families}
    # In time order, a slice of every series at a time: Prometheus' head takes no sample older
    # than an hour before the newest it holds.
    slices = np.arange(min(first.values()), until, PREWRITE_SLICE)
    seen: set[str] = set()
    for since in slices:
        def encoded(since: float = since) -> Iterator[bytes]:
            nonlocal series, samples
            for fam in fleet.families.values():
                times = np.arange(max(first[fam.name], since), min(since + PREWRITE_SLICE, until), step)
                if not times.size:
                    continue
                labels, values = fleet.matrix(fam, times)
                if fam.name not in seen:
                    seen.add(fam.name)
                    series += len(labels)
                samples += values.size
                yield from remote_write.encode(labels, values, np.round(times * 1000))

        remote_write.send(session, backend.write_url, encoded())
    seconds = time.time() - began
    if seconds > args.write_allowance:
        raise BenchError(f"{backend.label}: writing the input took {seconds:.0f} s, more than --write-allowance "
                         f"{args.write_allowance:g} s: the input would end before the measurement does")
    print(f"  {backend.label}: wrote {series:,} series, {samples:,} samples in {seconds:.0f} s", flush=True)
    return {"series": series, "samples": samples, "seconds": round(seconds, 1), "until_s_after_write": until - began,
            "lead_s": {"default": PREWRITE_LEAD, **lead}}
