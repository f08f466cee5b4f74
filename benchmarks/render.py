#!/usr/bin/env python3
"""Rendering a scrape: our renderer (common/exposition.py) against prometheus_client's generate_latest.

    .venv/bin/python benchmarks/render.py [--rounds 300]

Both render the same families, the reference node's (reference_node.py, one `dump` parsed back),
in turn, round after round, so a busy moment of the machine costs each alike. One Renderer serves
every round, as one serves every scrape of the exporter (it keeps the label sets it rendered). tests/test_exposition.py
holds that both parse to the same metrics. Results: benchmarks/results/render.json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from prometheus_client import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchlib import git_commit, percentile
from reference_node import write_reference_node

from gpunode_common.exposition import Renderer
from gpunode_exporter.collector.base import Family, MetricSpec

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "render.json"


def families_from_text(text: str) -> list[Family]:
    """Our families back from an exposition: one spec per family, its label names as printed."""
    families = []
    for parsed in text_string_to_metric_families(text):
        name = parsed.samples[0].name if parsed.samples else parsed.name
        labels = tuple(parsed.samples[0].labels) if parsed.samples else ()
        family = MetricSpec(name, parsed.type, parsed.documentation, labels).family()
        for sample in parsed.samples:
            family.add(tuple(sample.labels[k] for k in labels), sample.value)
        families.append(family)
    return families


def client_metrics(families: list[Family]) -> list[Metric]:
    """The same families as prometheus_client's metrics (a counter is named without `_total`)."""
    metrics = []
    for family in families:
        spec = family.spec
        metric = Metric(spec.name.removesuffix("_total") if spec.kind == "counter" else spec.name, spec.help,
                        spec.kind)
        for values, value in family.rows:
            metric.add_sample(spec.name, dict(zip(spec.labels, values, strict=True)), value)
        metrics.append(metric)
    return metrics


class Registry:
    """What generate_latest asks of a registry: collect()."""

    def __init__(self, metrics: list[Metric]) -> None:
        self.metrics = metrics

    def collect(self) -> list[Metric]:
        return self.metrics


def client_render(families: list[Family]) -> bytes:
    return generate_latest(Registry(client_metrics(families)))  # type: ignore[arg-type]


def reference_families() -> list[Family]:
    with tempfile.TemporaryDirectory() as tmp:
        flags = write_reference_node(Path(tmp))
        out = subprocess.run([sys.executable, "-m", "gpunode_exporter", "dump", *flags], capture_output=True, text=True,
                             check=True, cwd=ROOT)
    return families_from_text(out.stdout)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=300)
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    families = reference_families()
    ours, theirs = Renderer(), Registry(client_metrics(families))
    times: dict[str, list[float]] = {"ours": [], "generate_latest": []}
    for _ in range(args.rounds):
        start = time.perf_counter()
        ours.render(families)
        times["ours"].append(time.perf_counter() - start)
        start = time.perf_counter()
        generate_latest(theirs)  # type: ignore[arg-type]
        times["generate_latest"].append(time.perf_counter() - start)
    p50 = {k: percentile(v, 0.5) for k, v in times.items()}
    p90 = {k: percentile(v, 0.9) for k, v in times.items()}
    result = {"rounds": args.rounds, "families": len(families), "samples": sum(len(f.rows) for f in families),
              "git": git_commit(ROOT), "p50_seconds": p50, "p90_seconds": p90}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"the reference node: {result['families']} families, {result['samples']} samples; render p50 "
          f"ours {p50['ours'] * 1000:.3f} ms, generate_latest {p50['generate_latest'] * 1000:.3f} ms "
          f"({p50['generate_latest'] / p50['ours']:.1f}x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
