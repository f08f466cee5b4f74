"""`python -m fleet [--scenario NAME|FILE] [--backend B] [--spec FILE] [--out FILE] [--remediation]
[--report DIR]`: simulate, replay, score."""

from __future__ import annotations

import argparse
import functools
import json
import math
import time
from dataclasses import asdict
from pathlib import Path

from fleet import harness, remediation, report_score, scenario, score
from fleet.simulate import Fleet, Truth, node_name
from gpunode_report.source import rfc3339


def _cell(value: float, unit: str = "") -> str:
    return "n/a" if math.isnan(value) else f"{value:.2f}{unit}" if not unit else f"{value / 60:+.1f} min"


def report(name: str, results: dict[str, tuple[harness.Run, score.Score]], nodes: int, days: float,
           truth: list[Truth]) -> str:
    lines = [f"### {name}: {nodes} nodes x {days:g} days", "",
             "| backend | fault class | faults | detected | recall | precision | lead median | lead p90 "
             "| false (per 1,000 healthy node-days) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for backend, (_run, s) in results.items():
        for c in s.classes:
            median, p90 = score.lead_summary(c.leads)
            per = 1000 * c.false_alerts / s.healthy_node_days if s.healthy_node_days else float("nan")
            lines.append(f"| {backend} | {c.kind} | {c.faults} | {c.detected} | {_cell(c.recall)} | "
                         f"{_cell(c.precision)} | {_cell(median, 'min')} | {_cell(p90, 'min')} | "
                         f"{c.false_alerts} ({_cell(per)}) |")
        lines.append(f"| {backend} | **all** | {sum(c.faults for c in s.classes)} | "
                     f"{sum(c.detected for c in s.classes)} | **{_cell(s.recall)}** | **{_cell(s.precision)}** | | | "
                     f"{len(s.false_alerts)} ({_cell(s.false_per_1000_node_days)}) |")
    lines += ["", "| backend | alert episodes | false | false per 1,000 healthy node-days | load s | replay s "
              "| samples |",
              "|---|---|---|---|---|---|---|"]
    for backend, (run, s) in results.items():
        lines.append(f"| {backend} | {s.episodes} | {len(s.false_alerts)} | {_cell(s.false_per_1000_node_days)} | "
                     f"{run.seconds_load:.0f} | {run.seconds_replay:.0f} | {run.samples:,} |")
    falses = sorted({(backend, f.alertname) for backend, (_r, s) in results.items() for f in s.false_alerts})
    if falses:
        lines += ["", "False alerts by name: " + ", ".join(f"{b}: {a}" for b, a in falses)]
    stragglers = [t for t in truth if t.detail]
    if stragglers:
        backends = list(results)
        lines += ["", "Stragglers and slowed jobs, one by one: minutes from the onset to the first detecting alert "
                  "(- where none came)", "", "| fault | node | " + " | ".join(backends) + " |",
                  "|---|---|" + "---|" * len(backends)]
        for t in sorted(stragglers, key=lambda t: t.onset):
            leads = [score.first_detection(results[b][0].firing, t) for b in backends]
            cells = " | ".join("-" if lead is None else f"{lead / 60:+.1f}" for lead in leads)
            lines.append(f"| {t.kind} ({t.detail}) | {t.node or ', '.join(t.workloads)} | {cells} |")
    return "\n".join(lines) + "\n"


def _dump(path: Path, run: harness.Run, s: score.Score) -> None:
    """Every alert episode, the false ones marked: for finding what set them off."""
    false = {id(f) for f in s.false_alerts}
    path.write_text(json.dumps([{**asdict(f), "false": id(f) in false} for f in run.firing], indent=1))


def score_report(fleet: Fleet, url: str, out: Path, spec: Path | None, results: list[report_score.Result]) -> None:
    """The report of the fleet's whole range from the backend at url, written to out, scored into results."""
    from gpunode_report.cli import run

    began = time.monotonic()
    run(url, rfc3339(fleet.timestamps[0]), rfc3339(fleet.timestamps[-1] + fleet.s.step), out, spec)
    result = report_score.score(fleet, json.loads((out / "report.json").read_text()))
    (out / "score.txt").write_text("\n".join(result.lines) + "\n")
    print(f"report written to {out} in {time.monotonic() - began:.0f} s", flush=True)
    results.append(result)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m fleet", description=__doc__)
    parser.add_argument("--scenario", action="append", metavar="NAME|FILE",
                        help="fleet/scenarios/NAME.yaml or a scenario file (docs/fleet.md); repeat it for several "
                        "scenarios, each run in turn (default: standard)")
    parser.add_argument("--backend", action="append", choices=harness.BACKENDS,
                        help="the backend that stores the series and runs the rules through vmalert's replay; "
                        "repeat it for both (default: both, prometheus then victoriametrics)")
    parser.add_argument("--spec", type=Path, help="spec overrides, as for `rules render --spec`")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/gpunode-fleet"),
                        help="where each run keeps its backend's data, rules, logs and alerts.json, in "
                        "SCENARIO/BACKEND/ (default: /tmp/gpunode-fleet)")
    parser.add_argument("--out", type=Path, help="write the results table here (e.g. docs/fleet-results.md)")
    parser.add_argument("--report", type=Path, metavar="DIR",
                        help="after each replay, run `gpunode-exporter report` over the scenario's whole range into "
                        "DIR (one scenario on one backend) or DIR/SCENARIO/BACKEND/ (several), and score it against "
                        "the simulator's truth (fleet/report_score.py)")
    parser.add_argument("--remediation", action="store_true",
                        help="also replay each run's alerts through gpunode-remediate's policy (fleet/remediation.py)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    sections = []
    failed = 0
    names, backends = args.scenario or ["standard"], args.backend or harness.BACKENDS
    several = len(names) * len(backends) > 1
    for name in names:
        sc = scenario.load(name)
        start = (time.time() // 3600) * 3600 - sc.duration - 3600
        fleet = Fleet(sc, start)
        results = {}
        remedies = []
        for backend in backends:
            began = time.monotonic()
            scored: list[report_score.Result] = []
            then = None if args.report is None else functools.partial(
                score_report, fleet, out=args.report / sc.name / backend if several else args.report, spec=args.spec,
                results=scored)
            run = harness.run(backend, fleet, args.workdir / sc.name / backend, spec_path=args.spec, then=then)
            for result in scored:
                print("\n".join(result.lines), flush=True)
                failed += result.failed
                print(f"{sc.name} {backend}: report scored, {result.failed} of {len(result.lines)} checks failed",
                      flush=True)
            s = score.score(run.firing, fleet.truth(), [node_name(n) for n in range(sc.nodes)], sc.duration)
            results[backend] = (run, s)
            _dump(args.workdir / sc.name / backend / "alerts.json", run, s)
            print(f"{sc.name} {backend}: recall {s.recall:.2f} precision {s.precision:.2f} "
                  f"false/1000 node-days {s.false_per_1000_node_days:.2f} in {time.monotonic() - began:.0f} s",
                  flush=True)
            if args.remediation:
                began = time.monotonic()
                text, data = remediation.section(sc.name, backend, run.firing, fleet.truth(),
                                                 [node_name(n) for n in range(sc.nodes)], start, start + sc.duration)
                (args.workdir / sc.name / backend / "remediation.json").write_text(json.dumps(data, indent=1))
                remedies.append(text)
                print(f"{sc.name} {backend}: remediation replay in {time.monotonic() - began:.0f} s", flush=True)
        sections.append("\n".join([report(sc.name, results, sc.nodes, sc.duration / 86400, fleet.truth()),
                                   *remedies]))
    text = "\n".join(sections)
    print(text)
    if args.out:
        args.out.write_text("# Detection quality: the rule pack on simulated fleets\n\n"
                            "Written by `make fleet` (`python -m fleet --out docs/fleet-results.md`); "
                            "how it is measured: docs/fleet.md.\n\n" + text)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
