"""`gpunode-exporter report`: the fleet's operational analysis over a range, from its own
Prometheus-compatible backend (docs/report.md). Writes report.md, its figures (PNG) and report.json.
numpy and matplotlib are imported when the report runs, not with its command line."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from gpunode_common.flags import Parser

PROG = "gpunode-exporter"


def build_parser(command: str = "report") -> argparse.ArgumentParser:
    parser = Parser(prog=f"{PROG} {command}",
                    description="Where the GPU-hours went (goodput per job and each loss named), failures "
                    "and the measured MTBF, checkpoint cost against the Young/Daly optimum, storage during "
                    "saves and loads, stragglers: read from any Prometheus-compatible query API, written as "
                    "DIR/report.md with its figures (PNG) and DIR/report.json (docs/report.md).")
    parser.add_argument("--prometheus.url", dest="prometheus_url", required=True, metavar="URL",
                        help="the query API's base URL (Prometheus, VictoriaMetrics, Thanos, Mimir), "
                             "e.g. http://prometheus:9090")
    parser.add_argument("--from", dest="since", default="-7d", metavar="TIME",
                        help="start: RFC 3339 (2026-11-21T00:00:00Z), now, or relative (-7d, -36h) (default: -7d)")
    parser.add_argument("--to", dest="until", default="now", metavar="TIME", help="end, as --from (default: now)")
    parser.add_argument("--output", type=Path, required=True, metavar="DIR", help="directory to write the report to")
    parser.add_argument("--spec", type=Path, metavar="FILE",
                        help="the rule pack's spec overrides, for your selectors, labels and thresholds")
    return parser


def main(argv: list[str]) -> int:
    """argv: `report` and its flags."""
    args = build_parser(argv[0]).parse_args(argv[1:])
    try:
        from gpunode_report.source import ReportError
    except ImportError:
        sys.stderr.write(f"{PROG} report: error: the report needs numpy and matplotlib: "
                         "pip install 'gpunode-exporter[report]'\n")
        return 2
    try:
        for path in run(args.prometheus_url, args.since, args.until, args.output, args.spec):
            print(path)
    except ReportError as err:
        sys.stderr.write(f"{PROG} report: error: {err}\n")
        return 2
    return 0


def write(report: dict[str, Any], out: Path) -> list[Path]:
    """report.json, the figures and report.md into `out`; the paths written."""
    from gpunode_report import figures, markdown

    out.mkdir(parents=True, exist_ok=True)
    drawn: dict[str, str] = {"goodput": "goodput.png"}
    figures.goodput(report, out / drawn["goodput"])
    if report["failures"]:
        drawn["failures"] = "failures.png"
        figures.failures(report, out / drawn["failures"])
    for n, job in enumerate(report["jobs"]):
        if job["checkpoint"]["optimal_interval_seconds"]:
            drawn[f"young-daly-{n}"] = f"young-daly-{n}.png"
            figures.young_daly(job, out / drawn[f"young-daly-{n}"])
    if any(report["storage"][p]["operations"] for p in ("save", "load")):
        drawn["storage"] = "storage.png"
        figures.storage(report, out / drawn["storage"])
    (out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    (out / "report.md").write_text(markdown.render(report, drawn))
    return [out / "report.md", out / "report.json", *(out / p for p in drawn.values())]


def run(url: str, since: str, until: str, out: Path, spec_path: Path | None = None) -> list[Path]:
    """The report of [since, until] read from url, written to out. ReportError: one line for the user."""
    from gpunode_common.config import ConfigError
    from gpunode_report.build import build
    from gpunode_report.source import ReportError, Source, parse_time, terminal_progress
    from gpunode_rulepack import load_spec

    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ReportError("the report draws its figures with matplotlib: pip install 'gpunode-exporter[report]'") \
            from None
    try:
        spec = load_spec(spec_path)
    except ConfigError as err:
        raise ReportError(str(err)) from None
    now = time.time()
    start, end = parse_time(since, now), parse_time(until, now)
    if not start < end:
        raise ReportError(f"--from {since} is not before --to {until}")
    progress = terminal_progress()
    src = Source(url, start, end, spec["intervals"]["default"], progress)
    try:
        report = build(src, spec, start, end)
    finally:
        if progress:
            sys.stderr.write("\r\033[K")
    report["source"] = url
    report["queries"] = {"count": src.queries, "seconds": {k: round(v, 2) for k, v in src.seconds.items()}}
    report["gpus_per_node"] = spec["goodput"]["gpus_per_node"]
    try:
        return write(report, out)
    except OSError as err:
        raise ReportError(f"cannot write {out}: {err.strerror}") from None
