"""The report: the machine and engine versions the figures were measured on, and the tables
printed at the end (per group, each backend side by side; then each backend's totals)."""

from __future__ import annotations

import contextlib
import subprocess
from pathlib import Path
from typing import Any

from benchlib import machine_info  # benchmarks/ is on sys.path when run as a script

from .pack import PROMETHEUS


def machine() -> dict[str, Any]:
    def version(argv: list[str]) -> str:
        with contextlib.suppress(OSError):
            run = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=30)
            text = (run.stdout or run.stderr).strip()
            return text.splitlines()[0] if text else ""
        return ""

    dpkg = {}
    for pkg in ("prometheus", "victoria-metrics"):
        dpkg[pkg] = version(["dpkg-query", "-W", "-f=${Version}", pkg])
    mem = Path("/proc/meminfo").read_text().split("\n", 1)[0].split()[1]
    return machine_info(mem_total_gib=round(int(mem) / 2**20, 1), prometheus_version=version([PROMETHEUS, "--version"]),
                        dpkg_versions=dpkg)


def short(key: str) -> str:
    return key.replace(".rules.yml", "")


def table(results: dict[str, Any]) -> list[str]:
    backends = results["backends"]
    keys = sorted({k for b in backends.values() for k in b["groups"]})
    over = {o["group"]: o for b in backends.values() for o in b["groups_interval_overridden"]}
    head = "| group (file/name) | rules | interval |"
    line = "|---|---:|---|"
    for b in backends.values():
        head += f" {b['label']}: last / p50 / max ms (evals) | alone ms (one by one) | start s | missed |"
        line += "---:|---:|---:|---:|"
    rows = [head, line]
    for key in keys:
        g = results["groups"].get(key, {})
        name = key.rsplit("/", 1)[1]
        interval = f"{g.get('interval_s', 0):g} s"
        if name in over:
            interval = f"{over[name]['pack_interval_s']:g} s in the pack, {over[name]['here_interval_s']:g} s here"
        row = f"| {short(key)} | {g.get('rules', '?')} | {interval} |"
        for b in backends.values():
            x = b["groups"].get(key)
            if not x or not x.get("evaluations"):
                row += " not evaluated | | | |"
                continue
            alone = f"{x['alone_p50_s'] * 1000:.0f}" if "alone_p50_s" in x else "-"
            if x.get("alone_work_s", x.get("alone_p50_s")) != x.get("alone_p50_s"):  # side by side (vmalert)
                alone += f" ({x['alone_work_s'] * 1000:.0f})"
            phase = "-" if x.get("start_phase_s") is None else f"{x['start_phase_s']:.1f}"
            row += (f" {x['last_s'] * 1000:.1f} / {x['p50_s'] * 1000:.1f} / {x['max_s'] * 1000:.1f} "
                    f"({x['evaluations']}) | {alone} | {phase} | {x['iterations_missed_during_measure']:g} |")
        rows.append(row)
    rows.append("")
    rows.append("| | " + " | ".join(b["label"] for b in backends.values()) + " |")
    rows.append("|---|" + "---:|" * len(backends))

    def add(label: str, fn: Any) -> None:
        vals = []
        for b in backends.values():
            try:
                vals.append(fn(b))
            except (KeyError, TypeError, IndexError):
                vals.append("?")
        rows.append(f"| {label} | " + " | ".join(str(v) for v in vals) + " |")

    add("CPU during the measurement (cores)", lambda b: " + ".join(f"{k} {v:.2f}" for k, v in b["cpu_cores"].items()))
    add("RSS at the end (MiB)", lambda b: " + ".join(f"{k} {v['VmRSS']:.0f}" for k, v in b["memory_mib"].items()))
    add("peak RSS (MiB)", lambda b: " + ".join(f"{k} {v['VmHWM']:.0f}" for k, v in b["memory_mib"].items()))
    add("series in the TSDB", lambda b: f"{int(next(iter(b['tsdb'].values()))):,}")
    add("input series (samples per scrape)", lambda b: f"{int(b['samples_per_scrape']):,}")
    if results.get("input") == "prewritten":
        add("input written before the rules start: samples, seconds",
            lambda b: f"{b['prewritten']['samples']:,}, {b['prewritten']['seconds']:g}")
    add("series recorded by the rules", lambda b: f"{sum(b['recorded_series'].values()):,}")
    add("alerts firing / pending", lambda b: f"{sum(v.get('firing', 0) for v in b['alerts'].values())} / "
        f"{sum(v.get('pending', 0) for v in b['alerts'].values())}")
    add("rules with errors", lambda b: len(b["rule_errors"]))
    if results.get("input") == "scrape":
        add("generator render p50 (ms), body (MiB)",
            lambda b: f"{b['generator']['render_s']['p50_ms']:.0f}, {b['generator']['body_mib']}")
    return rows

