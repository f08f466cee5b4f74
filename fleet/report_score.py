"""The operational report (`gpunode-exporter report`) against what the simulator knows happened:
each job's time split, its attempts, every hardware event and straggler.

Truth, per job: elapsed from its first attempt's start to its last's end; checkpoint loads (each
attempt's load); saves (each save's length); down between attempts; progress redone after each
abnormal end (from the last save's end, or the load's, to the end); time lost to a slower pace
(while a straggler fault acts on the attempt, 1 - nominal/actual step time per sample);
productive the rest. The report passes when each part is within SPLIT_TOLERANCE of the job's
elapsed time, the attempts are exact, and the events and stragglers it lists are exactly the
true ones (by node, kind or cause, and time: an event within one scrape interval).

A training job's checkpoints are held to truth on their own terms, not as a share of elapsed time: the number
of saves, the interval within a scrape, and where the nodes' exporters time the saves, the mean
save within SAVE_TOLERANCE seconds and the Young/Daly optimum within OPTIMUM_TOLERANCE of the
one the true save time gives (with the report's own MTBF, which the attempts check); where no
node of a job keeps the clock, that the report says it estimated them from the scrapes.

A scenario that plays published storage (its `storage: published:`, fleet/nfs.py) has the
report's storage section held to the published figures: per-request time and its split for the
save's WRITEs and the load's READs, request rates, the link's use, the slots named the bottleneck,
each within the tolerance stated beside it below.

A job's retries: each failed attempt blamed on the first event the fault that ended it logs (none
for a failure the scenario lists: an NCCL timeout, a user's error), and the GPU-hours its failed
attempts ran within two of the report's steps of each one's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fleet import causes, nfs
from fleet.jobs import Attempt
from fleet.simulate import SYNCHRONOUS, Fleet, node_name
from gpunode_common.config import seconds
from gpunode_report.goodput import gpu_hours
from gpunode_report.source import parse_time

SPLIT_TOLERANCE = 0.02  # of the job's elapsed time
SAVE_TOLERANCE = 2.0  # seconds per save: the exporter samples once a second, at each end of a save
OPTIMUM_TOLERANCE = 0.03  # of the optimal interval
HOLDS_FOR = 900.0  # seconds a fault's node must hold its job back to be a straggler: goodput.straggler_for
# The Lablup B200 operations report, section 4.2.5 and its Table 13 (per node): a save's WRITEs in
# its 30 s sample, a load's READs over ~23 minutes. Seconds per request, requests/s (the save's in
# its one sample, the load's mean), the storage link's use (mean; the save's peak).
PUBLISHED: dict[str, dict[str, dict[str, Any]]] = {"lablup-table-13": {
    "save": {"op": "WRITE", "execute": 1.621, "queue": 1.495, "rtt": 0.126, "share": 0.922,
             "rate": 600, "rate_of": "peak", "link": 0.014, "link_peak": 0.027},
    "load": {"op": "READ", "execute": 0.059, "queue": 0.0315, "rtt": 0.0273, "share": 0.533,
             "rate": 5400, "rate_of": "mean", "link": 0.104}}}
# Per-request times (total, slot wait, network + server), of the published: the operations report
# sums mountstats' times over its requests, and ours reads the same counters (irate() per 30 s
# sample, summed over the phase's samples), which adds no error of its own for counters that only
# rise. 5 % is the model's grain: a flush drains in whole waves of 128 WRITEs, and a wave more or
# less moves a WRITE's wait by 126 ms / 2, 4 %.
TIME_TOLERANCE = 0.05
# Slot wait's share of a request, in points: it follows the times; 3 points keeps a load's READs
# above nfs.slot_wait_fraction (half), where the operations report has them (53.3 %).
SHARE_TOLERANCE = 0.03
# Requests/s per node, of the published: the operations report rounds them (~600, ~5,400). A save's
# 20.55 GB in its one 30 s sample at 1 MiB a WRITE is 653/s (+9 %). A load: 128 slots at 27.3 ms
# complete at most 4,689 READs/s (Little's law), 13 % under 5,400: the operations report's mean
# rate and its per-request times cannot both hold on one transport of 128 slots. 15 % admits that
# gap and no more.
RATE_TOLERANCE = 0.15
# The link during saves, in points: a save in one sample puts 2.74 % on the link, one that straddles
# two scrapes 1.37 % in each, so the mean over the save samples (1.4 % published) moves by up to 1.37
# points with the saves' phases to the scrapes, and a sample's 2 % noise moves the peak. 0.3 points
# is a fifth of that range.
SAVE_LINK_TOLERANCE = 0.003
# The link during loads, of the published: it follows the READ rate (RATE_TOLERANCE).
LOAD_LINK_TOLERANCE = 0.15
PARTS = ("productive", "checkpoint_save", "checkpoint_load", "down", "slowed", "lost_progress")


@dataclass
class Result:
    lines: list[str] = field(default_factory=list)  # one per check, "ok" or "FAIL"
    failed: int = 0

    def check(self, ok: bool, text: str) -> None:
        self.lines.append(f"{'ok  ' if ok else 'FAIL'} {text}")
        self.failed += not ok


def _stragglers(fleet: Fleet) -> list[tuple[Any, list[Attempt]]]:
    """Straggler faults and the synchronous attempts they slow: those where the fault's node is
    the one its job waits for, for HOLDS_FOR at least. A starved host or a throttled GPU on a node
    that is seldom the slowest of its job (a slower one holds the job back all the while) costs it
    nothing the report could see, nor does a link delay that another link's exceeds."""
    whole = {id(e): hit for e, hit in fleet.job_events("job_slowdown")}  # a job slowed as a whole
    out = []
    for f in fleet.s.faults:
        if f.kind not in causes.CAUSE:
            continue
        end = f.at + f.duration("lasts", fleet.s.duration)
        hit = whole.get(id(f), []) if f.kind == "job_slowdown" else [
            a for a in fleet.attempts if f.node in a.nodes and a.start < end and a.end > f.at
            and _holds_back(fleet, f, a, end)]
        hit = [a for a in hit if a.job.kind in SYNCHRONOUS]
        if hit:
            out.append((f, hit))
    return out


def _holds_back(fleet: Fleet, f: Any, a: Attempt, end: float) -> bool:
    """Whether the fault's node sets its job's step for HOLDS_FOR of the fault's time in the attempt
    (fleet/physics.py: the slowest node's own time, plus the largest link delay)."""
    window = (fleet.t >= max(f.at, a.start)) & (fleet.t < min(end, a.end))
    time, delay, _drained = fleet.node_steps
    part = delay if f.kind in causes.LINK_CAUSES else time
    others = [n for n in a.nodes if n != f.node]
    rest = part[others].max(axis=0) if others else np.zeros(fleet.t.size)
    return int((part[f.node][window] > rest[window]).sum()) * fleet.s.step >= HOLDS_FOR


def truth_jobs(fleet: Fleet) -> dict[str, dict[str, Any]]:
    step, t = fleet.s.step, fleet.t
    slowing: dict[int, np.ndarray] = {}  # per attempt, the samples a straggler fault acts on (each once)
    for f, hit in _stragglers(fleet):
        end = f.at + f.duration("lasts", fleet.s.duration)
        for a in hit:
            busy = (t >= max(f.at, a.start + a.job.load)) & (t < min(end, a.end))
            slowing[id(a)] = slowing.get(id(a), np.zeros(t.size, bool)) | busy
    slowed = {}
    for a in fleet.attempts:
        if id(a) in slowing:
            pace = fleet._pace[0][a.nodes[0]][slowing[id(a)]]
            slowed[id(a)] = float(np.sum(np.clip(1 - 1 / pace, 0, None)) * step)
    out: dict[str, dict[str, Any]] = {}
    events = truth_failures(fleet)
    for name in dict.fromkeys(a.job.name for a in fleet.attempts):
        tries = [a for a in fleet.attempts if a.job.name == name]
        split = dict.fromkeys(PARTS, 0.0)
        split["elapsed"] = tries[-1].end - tries[0].start
        for k, a in enumerate(tries):
            saves = a.saves(step)
            split["checkpoint_load"] += min(a.job.load, a.end - a.start)
            split["checkpoint_save"] += sum(e - b for b, e in saves)
            split["slowed"] += slowed.get(id(a), 0.0)
            if k < len(tries) - 1:
                split["down"] += tries[k + 1].start - a.end
                split["lost_progress"] += a.end - max([e for _, e in saves] + [a.start + a.job.load])
        split["productive"] = split["elapsed"] - sum(split[p] for p in PARTS if p != "productive")
        job = tries[0].job
        out[name] = {"start": fleet.start + tries[0].start,
                     # each failed attempt's culprit: the first event its killing fault logs, at its end
                     "blamed": [next(((n, k, x) for n, at, k, x in events if abs(at - fleet.start - a.end) < 1
                                      and n in {node_name(m) for m in a.nodes}), (None, None, None))
                                for a in tries[:-1]],
                     "failed": [(a.end - a.start, _ran(fleet, a)) for a in tries[:-1]],
                     "nodes": sorted({node_name(n) for a in tries for n in a.nodes}),
                     "attempts": len(tries), "seconds": split,
                     # a single node saves a quarter of the bytes, under the save threshold at any grain, and a
                     # save in the range's first sample has no sample before it to show the writes: neither is seen
                     "saves": [e - b for a in tries for b, e in a.saves(step) if b >= step] if job.kind == "training"
                     else [],
                     "interval": job.checkpoint_every,
                     "clock": "scrapes" if set(job.nodes) <= set(fleet.s.no_save_clock) else "node"}
    return out


def _ran(fleet: Fleet, a: Attempt) -> int:
    """The attempt's nodes that ran it: a node drained all the while left the job (fleet/simulate.py)."""
    _time, _delay, drained = fleet.node_steps
    during = (fleet.t >= a.start) & (fleet.t < a.end)
    return sum(not drained[n][during].all() for n in a.nodes)


def truth_failures(fleet: Fleet) -> list[tuple[str, float, str, int | None]]:
    """(node, time, kind, xid) of each hardware event the exporter reports."""
    out: list[tuple[str, float, str, int | None]] = []
    for f in fleet.s.faults:
        node, at = node_name(f.node), fleet.start + f.at
        if f.kind == "xid79_collapse":
            out += [(node, at, "xid", 79), (node, at, "xid", 145), (node, at, "gpu_lost", None)]
        elif f.kind == "getattr_spike":
            out.append((node, at, "xid", 94))
        elif f.kind == "uncorrectable_steps":
            for s in f.param("steps", [0, 7200, 18000]):
                when = at + seconds(s, "steps")
                out += [(node, when, "xid", 94), (node, when, "uncorrectable_remap", None)]
        elif f.kind == "correctable_acceleration":
            out.append((node, at + f.duration("loss_after", 9 * 86400), "gpu_lost", None))
    return [e for e in out if e[1] < fleet.start + fleet.s.duration]


def _checkpoints(res: Result, name: str, truth: dict[str, Any], got: dict[str, Any], step: float) -> None:
    saves = truth["saves"]
    if not saves:
        return
    res.check(got["saves"] == len(saves), f"job {name}: saves {got['saves']} (true {len(saves)})")
    if len(saves) > 1:
        interval = got["interval_seconds"]
        res.check(interval is not None and abs(interval - truth["interval"]) <= step,
                  f"job {name}: checkpoint interval {interval or 0:.0f} s (true {truth['interval']:.0f} s)")
    res.check(got["save_clock"] == truth["clock"], f"job {name}: saves timed by {got['save_clock']} "
              f"(true {truth['clock']})")
    if truth["clock"] != "node":
        return
    delta, mtbf = float(np.mean(saves)), got["mtbf_seconds"]
    res.check(got["save_seconds"] is not None and abs(got["save_seconds"] - delta) <= SAVE_TOLERANCE,
              f"job {name}: save {got['save_seconds'] or 0:.1f} s (true {delta:.1f} s)")
    optimum = (2 * delta * mtbf) ** 0.5 if mtbf else None
    found = got["optimal_interval_seconds"]
    res.check(optimum is not None and found is not None and abs(found - optimum) <= OPTIMUM_TOLERANCE * optimum,
              f"job {name}: Young/Daly optimum {found or 0:.0f} s (true {optimum or 0:.0f} s for its "
              f"{delta:.1f} s saves)")


def _culprit(event: tuple[str | None, str | None, int | None] | None) -> str:
    if event is None:
        return "(not listed)"
    node, kind, xid = event
    return f"{node} {kind} {xid or ''}".strip() if node else "none"


def _retries(res: Result, name: str, truth: dict[str, Any], got: dict[str, Any], gpus: int, step: float) -> None:
    """Each failed attempt's culprit (node, kind, Xid; none for a failure the scenario lists) and the
    GPU-hours they ran, in the report's own GPUs per node, within two of its steps per attempt (an
    attempt reads from the step its first sample falls in to the one after its last)."""
    if not truth["blamed"]:
        return
    found = [(f["node"], f["kind"], f["xid"]) for f in got["failed_attempts"]]
    for k, true in enumerate(truth["blamed"]):
        mine = found[k] if k < len(found) else None
        res.check(mine == true, f"job {name}: failed attempt {k + 1} blamed on {_culprit(mine)} "
                  f"(true {_culprit(true)})")
    hours = sum(gpu_hours(took, nodes, gpus) for took, nodes in truth["failed"])
    slack = sum(gpu_hours(2 * step, nodes, gpus) for _took, nodes in truth["failed"])
    res.check(abs(got["failed_gpu_hours"] - hours) <= slack,
              f"job {name}: failed attempts' GPU-hours {got['failed_gpu_hours']:.1f} (true {hours:.1f})")


def _storage(res: Result, name: str, got: dict[str, Any]) -> None:
    """The report's storage section against published figures: the tolerances above."""
    for phase, want in PUBLISHED[name].items():
        where, o = f"storage {phase} {want['op']}", got[phase]["operations"].get(want["op"])
        if o is None:
            res.check(False, f"{where}: no requests in the report")
            continue
        for key, entry in (("execute", "execute_seconds"), ("queue", "queue_seconds"), ("rtt", "rtt_seconds")):
            res.check(abs(o[entry] - want[key]) <= TIME_TOLERANCE * want[key],
                      f"{where}: {key} {1000 * o[entry]:.1f} ms per request ({name}: {1000 * want[key]:g} ms)")
        res.check(abs(o["slot_wait_fraction"] - want["share"]) <= SHARE_TOLERANCE,
                  f"{where}: slot wait {100 * o['slot_wait_fraction']:.1f} % ({name}: {100 * want['share']:.1f} %)")
        rate = o["requests_per_second_peak" if want["rate_of"] == "peak" else "requests_per_second"]
        res.check(abs(rate - want["rate"]) <= RATE_TOLERANCE * want["rate"],
                  f"{where}: {rate:,.0f} requests/s per node, {want['rate_of']} ({name}: ~{want['rate']:,})")
        for key, entry in (("link", "link_utilization_mean"), ("link_peak", "link_utilization_peak")):
            if key not in want:
                continue
            use = got[phase][entry]
            slack = SAVE_LINK_TOLERANCE if phase == "save" else LOAD_LINK_TOLERANCE * want[key]
            res.check(use is not None and abs(use - want[key]) <= slack,
                      f"storage {phase}: link at {100 * (use or 0):.2f} % {'peak' if 'peak' in key else 'mean'} "
                      f"({name}: {100 * want[key]:.1f} %)")
    res.check(got["slots_bottleneck"] == list(PUBLISHED[name]),
              f"storage: slots named the bottleneck during {got['slots_bottleneck']} ({name}: {list(PUBLISHED[name])})")


def score(fleet: Fleet, report: dict[str, Any]) -> Result:
    res = Result()
    when = {j["name"]: j for j in report["jobs"]}
    for name, truth in truth_jobs(fleet).items():
        mine = [j for j in report["jobs"] if sorted(j["nodes"]) == truth["nodes"]
                and abs(parse_time(j["start"], 0) - truth["start"]) <= 2 * fleet.s.step]
        if len(mine) != 1:
            res.check(False, f"job {name}: {len(mine)} report jobs on its nodes from its start")
            continue
        j = mine[0]
        when.pop(j["name"], None)
        res.check(j["attempts"] == truth["attempts"],
                  f"job {name}: attempts {j['attempts']} (true {truth['attempts']})")
        elapsed = truth["seconds"]["elapsed"]
        for part in ("elapsed", *PARTS):
            got, true = j["seconds"][part], truth["seconds"][part]
            res.check(abs(got - true) <= SPLIT_TOLERANCE * elapsed,
                      f"job {name}: {part} {got:.0f} s (true {true:.0f} s, off {100 * (got - true) / elapsed:+.2f} %)")
        _checkpoints(res, name, truth, j["checkpoint"], fleet.s.step)
        _retries(res, name, truth, j, report["gpus_per_node"], report["step_seconds"])
    res.check(not when, f"jobs invented: {sorted(when) or 'none'}")
    listed = [(f["node"], parse_time(f["time"], 0), f["kind"], f["xid"]) for f in report["failures"]]
    for node, at, kind, xid in truth_failures(fleet):
        hit = [x for x in listed if x[0] == node and x[2] == kind and x[3] == xid and abs(x[1] - at) <= fleet.s.step]
        res.check(bool(hit), f"event {kind} {xid or ''} on {node} at +{(at - fleet.start) / 3600:.2f} h listed")
        for x in hit[:1]:
            listed.remove(x)
    res.check(not listed, f"events invented: {len(listed)} {listed[:3]}")
    episodes = [(s["node"], parse_time(s["start"], 0), parse_time(s["end"], 0), s["cause"])
                for s in report["stragglers"]]
    for f, _hit in _stragglers(fleet):
        start, end = fleet.start + f.at, fleet.start + f.at + f.duration("lasts", fleet.s.duration)
        node = "" if f.kind == "job_slowdown" else node_name(f.node)
        word = causes.cause(f)
        hit = [e for e in episodes if e[0] == node and e[3] == word and e[1] < end and e[2] > start]
        res.check(bool(hit), f"straggler {f.kind} on {node or 'job of ' + node_name(f.node)} "
                  f"at +{f.at / 3600:.2f} h listed as {word}")
        for e in hit:
            episodes.remove(e)
    res.check(not episodes, f"stragglers invented: {len(episodes)} {episodes[:3]}")
    if fleet.s.storage is not None and fleet.s.storage.published:
        _storage(res, fleet.s.storage.published, report["storage"])
    return res


assert set(PUBLISHED) == set(nfs.PUBLISHED)
assert set(causes.CAUSE) == {*causes.CULPRIT_CAUSES, "job_slowdown"}
