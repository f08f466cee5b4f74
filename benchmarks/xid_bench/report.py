"""The report: the machine the figures were measured on, each target passed or missed, and the
tables printed at the end."""

from __future__ import annotations

import gc
import subprocess
from typing import Any

import requests
from benchlib import machine_info, ratio  # benchmarks/ is on sys.path when run as a script

RSS_STABLE_MIB_PER_MIN = 1.0
LATENCY_TARGET_MS = 100.0
THROUGHPUT_TARGET = 200_000


def machine() -> dict[str, Any]:
    grep = subprocess.run(["grep", "--version"], capture_output=True, text=True, check=False).stdout
    return machine_info(grep_version=grep.splitlines()[0] if grep else "", requests_version=requests.__version__,
                        gc_enabled=gc.isenabled())


def targets(r: dict[str, Any]) -> list[dict[str, Any]]:
    ours = r["throughput"]["peers"]["ours"]["records_per_s_median"]
    rounds = r["latency"]["followers"]["file"]["rounds"]
    fl = r["flood"]
    f = fl["exporters"]["xid"]
    rss = f["rss_mib"]["slope_mib_per_min"]
    out = [{"target": f"parse >= {THROUGHPUT_TARGET:,} mixed records/s (ours, median)", "value": round(ours),
            "pass": ours >= THROUGHPUT_TARGET}]
    for how, what in (("keepalive", "keep-alive, as specified"), ("new_connection", "a new connection per GET")):
        p99 = rounds[how]["latency"]["p99_ms"]
        out.append({"target": f"append -> /metrics p99 < {LATENCY_TARGET_MS:g} ms (regular file, {what})",
                    "value": round(p99, 2), "pass": p99 < LATENCY_TARGET_MS})
    out += [
        {"target": f"flood: writer reached {fl['rate_wanted']:,} records/s (within 1 %)",
         "value": round(fl["rate_achieved"]), "pass": fl["rate_achieved"] >= 0.99 * fl["rate_wanted"]},
        {"target": "flood: every Xid counted (counted == written, lost 0, malformed 0)",
         "value": f"{f['xids_counted']}/{fl['xids_written']}, lost {f['records_lost']}",
         "pass": f["all_counted"] and f["records_malformed"] == 0},
        {"target": f"flood: RSS stable (|slope| <= {RSS_STABLE_MIB_PER_MIN:g} MiB/min over the last "
                   f"{f['rss_mib']['slope_window_s']:g} s)", "value": round(rss, 3),
         "pass": abs(rss) <= RSS_STABLE_MIB_PER_MIN}]
    return out


def tables(r: dict[str, Any]) -> list[str]:
    t = r["throughput"]
    p = t["peers"]
    lines = [f"| parse: {t['records']:,} mixed records ({t['xids_injected']} Xids), {r['repetitions']} "
             "repetitions | records/s, best | records/s, median | Xids found | median vs ours |",
             "|---|---:|---:|---:|---:|"]
    names = {"ours": f"ours: XidTracker._handle, batches of {t['batch']}",
             "naive_regex": "naive: Python regex on every decoded line",
             "grep": "grep -c 'NVRM: Xid' (C, whole process)"}
    for key, name in names.items():
        best, median = p[key]["records_per_s_best"], p[key]["records_per_s_median"]
        lines.append(f"| {name} | {best:,.0f} | {median:,.0f} | {p[key]['xids_found']} | "
                     f"{ratio(median, p['ours']['records_per_s_median']):.2f}x |")
    lines.append(f"\nparse: all CPUs {t['machine_during']['busy_pct']} % busy, {t['machine_during']['steal_pct']} % "
                 "stolen (this process keeps one of the two busy)")
    la = r["latency"]["followers"]
    cols = [(la[f]["rounds"][how], f"{'file' if f == 'file' else 'FIFO'}, {short}")
            for how, short in (("keepalive", "keep-alive"), ("new_connection", "new conn.")) for f in ("file", "fifo")]
    lines += ["", f"| append -> visible in /metrics, {r['latency']['events']} events each | "
              + " | ".join(name for _, name in cols) + " |", "|---|" + "---:|" * len(cols)]
    for k in ("p50_ms", "p90_ms", "p99_ms", "max_ms", "mean_ms"):
        lines.append(f"| latency {k[:-3]} (ms) | " + " | ".join(f"{c['latency'][k]:.2f}" for c, _ in cols) + " |")
    lines.append("| GETs per event, mean / max | "
                 + " | ".join(f"{c['gets_per_event']['mean']:.2f} / {c['gets_per_event']['max']}" for c, _ in cols)
                 + " |")
    for k in ("p50_ms", "p99_ms"):
        lines.append(f"| a scrape alone, no new event: {k[:-3]} (ms) | "
                     + " | ".join(f"{c['scrape_only'][k]:.2f}" for c, _ in cols) + " |")
    md = r["latency"]["machine_during"]
    lines.append("\nlatency: all CPUs " + "; ".join(f"{md[how]['busy_pct']} % busy, {md[how]['steal_pct']} % stolen "
                                                   f"in the {how} round" for how in md))
    fl = r["flood"]
    fx, fp = fl["exporters"]["xid"], fl["exporters"]["staging"]
    lines += ["", f"| flood: {fl['rate_achieved']:,.0f} records/s achieved ({fl['rate_wanted']:,} wanted) for "
              f"{fl['writer_seconds']:.1f} s; {fl['records_written']:,} records, {fl['xids_written']:,} Xids | "
              "xid collector | staging only (no Xid thread) |", "|---|---:|---:|"]

    def row(label: str, get_value: Any) -> None:
        a, b = get_value(fx), get_value(fp) if "xids_counted" in fp else None
        lines.append(f"| {label} | {a} | {b if b is not None else ''} |")

    def both(label: str, get_value: Any) -> None:
        lines.append(f"| {label} | {get_value(fx)} | {get_value(fp)} |")

    row("Xids counted", lambda d: f"{d['xids_counted']:,}")
    row("records lost / malformed", lambda d: f"{d['records_lost']} / {d['records_malformed']}")
    row("caught up after the writer stopped (s)",
        lambda d: f"{d['catch_up_seconds']:.2f}" if d["catch_up_seconds"] is not None else "never")
    row("lag at 1 s samples, Xids written - counted: p50 / max",
        lambda d: f"{d['lag_xids']['p50']:.0f} / {d['lag_xids']['max']}")
    both("RSS first / last / max (MiB)",
         lambda d: f"{d['rss_mib']['first']:.1f} / {d['rss_mib']['last']:.1f} / {d['rss_mib']['max']:.1f}")
    both(f"RSS slope over the last {fx['rss_mib']['slope_window_s']:g} s (MiB/min)",
         lambda d: f"{d['rss_mib']['slope_mib_per_min']:+.3f}")
    both("exporter CPU, % of one core: mean / p50 / max of 1 s samples",
         lambda d: f"{d['cpu_pct_of_one_core']['mean']:.1f} / {d['cpu_pct_of_one_core']['p50_1s']:.0f} / "
                   f"{d['cpu_pct_of_one_core']['max_1s']:.0f}")
    lines.append(f"\nflood: the writer and sampler (this process) used {fl['bench_process_cpu_pct']:.1f} % of one "
                 f"core; all CPUs {fl['machine_during']['busy_pct']} % busy; "
                 f"{fl['writer_batches_late_over_one_tick']} batches more than one tick late "
                 f"(max {fl['writer_max_late_ms']:.1f} ms)")
    lines += ["", "| target | value | result |", "|---|---:|---|"]
    for x in r["targets"]:
        value = x["value"] if isinstance(x["value"], str) else f"{x['value']:,}"
        lines.append(f"| {x['target']} | {value} | {'PASS' if x['pass'] else 'MISS'} |")
    return lines

