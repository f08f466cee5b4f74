"""One backend's run: input and history written, rules loaded and warmed up, every group
evaluation during the measurement recorded, then each group alone; the same steps for each
backend, so that their figures compare."""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import math
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import requests
from benchlib import BenchError, percentile, summarize  # benchmarks/ is on sys.path when run as a script

from .backends import Backend
from .backfill import backfill_plan, do_backfill, prewrite, recorded_backfill_after
from .generator import Generator
from .pack import file_key, parse_duration, rule_groups

POLL_SECONDS = 5.0
ALONE_REPEATS = 3  # each group's rules run alone at the end, this many times


def snapshot_inputs(backend: Backend, names: set[str], nodes: int, path: Path) -> int:
    """What the fleet tier reads, as the backend holds it now: the input of a later --tier fleet run."""
    series = {name: [(r["metric"], float(r["value"][1])) for r in backend.query(f'{{__name__="{name}"}}')]
              for name in sorted(names)}
    with gzip.open(path, "wt") as f:
        json.dump({"nodes": nodes, "taken": time.time(), "backend": backend.key, "series": series}, f)
    return sum(len(v) for v in series.values())


def alone(backend: Backend, repeats: int = ALONE_REPEATS) -> dict[str, dict[str, Any]]:
    """Each group's rules as instant queries, with the rules stopped and nothing else running: what
    a group costs on its own, beside what its evaluations took among all the others. work_s: one
    after another (the sum); p50_s: as the engine runs them, side by side where the group has a
    `concurrency` (vmalert), else the same. (The queries of alert templates are not in it; an HTTP
    query also pays for its JSON.)"""
    backend.stop_rules()
    time.sleep(2)
    at = time.time() - 5  # the recordings of the last evaluations are there
    session = requests.Session()

    def query(rule: dict[str, Any], client: Any = requests) -> int:
        r = client.get(f"{backend.query_url}/api/v1/query", timeout=120,
                       params={"query": rule["expr"], "time": f"{at:.3f}", "step": "5m"})
        return len(r.json().get("data", {}).get("result") or []) if r.ok else 0

    out = {}
    for path in sorted(backend.rules.glob("*.yml")):
        for g in rule_groups(path):
            rules, width = g.get("rules") or [], int(g.get("concurrency") or 1)
            totals, walls, series = [], [], 0
            for _ in range(repeats):
                total = 0.0
                for rule in rules:
                    begin = time.perf_counter()
                    series += query(rule, session)
                    total += time.perf_counter() - begin
                totals.append(total)
                if width > 1:
                    begin = time.perf_counter()
                    with ThreadPoolExecutor(width) as pool:
                        list(pool.map(query, rules))
                    walls.append(time.perf_counter() - begin)
            out[f"{file_key(path)}/{g['name']}"] = {"p50_s": percentile(walls or totals, 0.5),
                                                   "work_s": percentile(totals, 0.5), "series": series // repeats}
    return out


def poll_until(backend: Backend, end: float, record: bool) -> None:
    """Poll the backend's evaluations until time.monotonic() reaches end, its processes checked alive."""
    while time.monotonic() < end:
        for p in backend.procs:
            p.check_running()
        backend.poll(record=record)
        time.sleep(POLL_SECONDS)


def run_backend(backend: Backend, gen: Generator, reads: dict[str, float], recorded: dict[str, float],
                recorded_from: dict[str, float],
                args: argparse.Namespace) -> dict[str, Any]:
    renders_before = len(gen.renders)
    posts_before = gen.posts
    plan = backfill_plan(reads, recorded, args, recorded_from) if args.backfill else {}
    backend.start()
    out: dict[str, Any] = {"label": backend.label, "input": args.input,
                           "groups_interval_overridden": backend.overridden, "rule_files_rejected": backend.rejected,
                           "executables": {p.key: p.exe() for p in backend.procs}}
    if args.input == "prewritten":
        out["prewritten"] = prewrite(backend, gen.fleet, plan, args)
        history_starts = gen.fleet.epoch
    else:
        gen.fleet.epoch = time.time()  # every backend sees the same values, relative to its start
    backend.load_rules()
    out["executables"] = {p.key: p.exe() for p in backend.procs}
    t0 = backend.started
    if args.input == "scrape":
        history_starts = t0 - max((p["span_s"] for p in plan.values() if p["tier"] == "raw"), default=0.0)
    print(f"  {backend.label}: rules loaded; warm-up {args.warmup:g} s", flush=True)
    backfill: dict[str, Any] = {"plan": plan}
    # Raw history first (a rule that reads it may only then record what the long tier needs; the
    # prewritten input has it), the long tier once Prometheus has loaded the first blocks (it
    # looks every minute). Recorded history once the rules have recorded a value to hold.
    todo, retried, written = dict(plan), False, {}
    # Recordings from an evaluation of every group recording them whose range starts after the
    # rules have settled (RULES_SETTLE_SECONDS), so none holds the rules' first minutes (e.g. a
    # fail-slow median of basis="self" from before the peers' ratios existed: a second baseline
    # per node that no node in a job has); then every 30 s the series that have appeared since
    # (vmalert's groups, a baseline once it has its history), until the measurement.
    recorded_due = t0 + recorded_backfill_after(plan)
    due = {"raw": t0 + 2 * args.scrape_interval + 15 if args.input == "scrape" else math.inf,
           "long": t0 + 75 if args.input == "prewritten" else math.inf, "recorded": recorded_due}
    while time.time() < t0 + args.warmup:
        for p in backend.procs:
            p.check_running()
        backend.poll(record=False)
        for tier in ("raw", "long", "recorded"):
            if time.time() < due[tier]:
                continue
            due[tier] = math.inf
            if any(p["tier"] == tier for p in todo.values()):
                # Before what the backend holds, so no series has two samples at one time: the raw
                # input's start, or the rules' first evaluation.
                end = {"raw": t0 - 60, "long": history_starts - 60, "recorded": t0 - 1}[tier]
                done = do_backfill(backend, todo, tier, end, written if tier == "recorded" else None)
                first = tier not in backfill
                found = {n: v["series"] for n, v in done.items() if not n.startswith("_")}
                backfill.setdefault(tier, {}).update({n: v for n, v in done.items() if first or found.get(n)})
                if first or any(found.values()):  # not every retry that finds nothing
                    print(f"  {backend.label}: backfilled ({tier}) {found} in {done['_seconds']} s", flush=True)
                # A long-tier metric vmalert has not written yet: once more, a minute later.
                todo = {n: p for n, p in todo.items() if p["tier"] != tier or tier == "recorded" or found.get(n) == 0}
                if tier == "long" and any(p["tier"] == "long" for p in todo.values()) and not retried:
                    retried, due["long"] = True, time.time() + 60
                if tier == "recorded" and time.time() + 30 < t0 + args.warmup:
                    due["recorded"] = time.time() + 30
            if tier == "raw":
                due["long"] = time.time() + 75
        time.sleep(POLL_SECONDS)
    # Not tried, or tried in vain (a baseline that is not there yet).
    missed = sorted(name for name, p in todo.items()
                    if (not written.get(name) if p["tier"] == "recorded" else due[p["tier"]] != math.inf))
    backfill["recorded_series_written"] = {name: len(labels) for name, labels in written.items()}
    if missed:
        print(f"  {backend.label}: WARNING: no history backfilled for {', '.join(missed)} within the warm-up",
              flush=True)
    backfill["not_done"] = missed

    # Did the history arrive? The samples of each backfilled metric within its reach, now.
    visible = {}
    for name, p in plan.items():
        with contextlib.suppress(BenchError, requests.RequestException, IndexError, KeyError):
            r = backend.query(f'sum(count_over_time({{__name__="{name}"}}[{int(p["span_s"] + 7200)}s]))')
            visible[name] = float(r[0]["value"][1]) if r else 0.0
    backfill["samples_visible_at_measure_start"] = visible
    # Those queries read up to weeks of history: the evaluations that ran beside them end, and
    # every group starts one after them, before any is measured (in earlier runs the first
    # measured evaluation of a few groups took up to 10 times their others).
    poll_until(backend, time.monotonic() + args.eval_interval, record=False)

    print(f"  {backend.label}: measuring {args.measure:g} s", flush=True)
    counters0, cpu0, wall0 = backend.counters(), backend.cpu(), time.monotonic()
    backend.poll(record=False)
    poll_until(backend, time.monotonic() + args.measure, record=True)
    backend.poll(record=True)
    counters1, cpu1, wall1 = backend.counters(), backend.cpu(), time.monotonic()
    out["cpu_cores"] = {k: round((cpu1[k] - cpu0[k]) / (wall1 - wall0), 3) for k in cpu1}
    out["memory_mib"] = {k: {kk: round(v / 1024, 1) for kk, v in mem.items()} for k, mem in backend.memory().items()}
    out["counters_start"], out["counters_end"] = counters0, counters1
    out["tsdb"] = counters1.get("_tsdb", {})

    intervals = {f"{file_key(path)}/{g['name']}": parse_duration(g.get("interval"), args.eval_interval)
                 for path in backend.rules.glob("*.yml") for g in rule_groups(path)}  # as run here
    groups = {}
    for key, durations in backend.evals.groups.items():
        c0, c1 = counters0.get(key, {}), counters1.get(key, {})
        groups[key] = {
            "evaluations": len(durations), "last_s": durations[-1], "p50_s": percentile(durations, 0.5),
            "max_s": max(durations), "summary_ms": summarize(durations), "durations_s": durations,
            "iterations_missed_during_measure": c1.get("missed", 0) - c0.get("missed", 0),
            "iterations_missed_total": c1.get("missed", 0),
            "evaluation_failures_during_measure": c1.get("failures", 0) - c0.get("failures", 0),
            # when in its interval the group starts (both engines spread groups over it, Prometheus
            # by a hash of file and name): groups that start together share the CPUs
            "start_phase_s": round(percentile([t % intervals[key] for t in backend.evals.starts[key]], 0.5), 2)
            if backend.evals.starts.get(key) else None,
            **{k: v for k, v in c1.items() if k.startswith("summary_q")}}
        if key in backend.evals.rules:
            per_rule = {name: {"p50_s": percentile(d, 0.5), "max_s": max(d)}
                        for name, d in backend.evals.rules[key].items() if d}
            groups[key]["rules_slowest"] = dict(sorted(per_rule.items(), key=lambda kv: -kv[1]["p50_s"])[:5])
    for key, c in counters1.items():  # groups that never evaluated during the measurement
        if not key.startswith("_") and key not in groups:
            groups[key] = {"evaluations": 0, "iterations_missed_total": c.get("missed", 0)}
    out["groups"] = dict(sorted(groups.items()))
    out["rule_errors"] = backend.evals.errors
    out["vmalert_polls_with_several_iterations"] = backend.evals.multi

    if args.tier != "fleet" and backend.key == args.snapshot_from:
        n = snapshot_inputs(backend, args.fleet_input_names, args.nodes, args.fleet_inputs)
        print(f"  {backend.label}: the fleet tier's input ({n:,} series) saved to {args.fleet_inputs}", flush=True)
    # What the input and the rules produced.
    scraped = backend.query('scrape_samples_scraped{job="synthetic"}')
    out["samples_per_scrape"] = (float(scraped[0]["value"][1]) if scraped
                                 else out.get("prewritten", {}).get("series"))
    recorded = backend.query('count by (__name__) ({__name__=~"gpunode:.+"})')
    out["recorded_series"] = dict(sorted((r["metric"]["__name__"], int(float(r["value"][1]))) for r in recorded))
    alerts = requests.get(f"{getattr(backend, 'alert_url', backend.url)}/api/v1/alerts", timeout=60).json()
    states: dict[str, dict[str, int]] = {}
    for a in alerts["data"]["alerts"] or []:  # vmalert: null when none
        name = a["labels"]["alertname"]
        states.setdefault(name, {}).setdefault(a["state"], 0)
        states[name][a["state"]] += 1
    out["alerts"] = dict(sorted(states.items()))
    out["notifications_received"] = gen.posts - posts_before
    renders = [r for r in gen.renders[renders_before:] if r[0] >= t0]
    out["generator"] = {"scrapes_served": len(renders),
                        "render_s": summarize([r[1] for r in renders]) if renders else {},
                        "body_mib": round(renders[-1][2] / 2**20, 1) if renders else None}
    out["backfill"] = backfill
    print(f"  {backend.label}: each group alone ({ALONE_REPEATS} times)", flush=True)
    out["alone"] = alone(backend)
    for key, a in out["alone"].items():
        if key in out["groups"]:
            out["groups"][key]["alone_p50_s"] = a["p50_s"]
            out["groups"][key]["alone_work_s"] = a["work_s"]
    return out

