"""`gpunode-exporter report`: the fleet's operational analysis over a range, from its own
Prometheus-compatible backend (docs/report.md). Writes report.md, its figures (PNG) and report.json."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from exporter.report.source import ReportError, Source, parse_time, terminal_progress

__all__ = ["ReportError", "run", "write"]


def write(report: dict[str, Any], out: Path) -> list[Path]:
    """report.json, the figures and report.md into `out`; the paths written."""
    from exporter.report import figures, markdown

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
    from exporter.config import ConfigError
    from exporter.report.build import build
    from exporter.rulepack import load_spec

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
