#!/usr/bin/env python3
"""Series the exporter serves for the reference node (reference_node.py), by collector.

    .venv/bin/python benchmarks/series_budget.py [--out benchmarks/results/series_budget.json]

Dumps the reference node twice, with the default configuration and with every NFS operation
and transport series (nfs.operations and nfs.transport_series: all, nfs.per_transport: true, as before they existed),
and counts the series of each collector. docs/series-budget.md shows the table.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from reference_node import STORAGE_NICS, write_reference_node

ROOT = Path(__file__).resolve().parent.parent
BUDGET = 1000
# ethtool's statistics come from the real device, which a fixture cannot give: a storage NIC with
# PFC reports pause frames for 8 priorities in 2 directions.
PFC_PER_NIC = 16


def count(flags: list[str]) -> dict[str, int]:
    """{collector: series} of one dump; the exporter's own series under "exporter"."""
    sys.path.insert(0, str(ROOT))
    from gpunode_exporter.collector import COLLECTORS

    owner = {spec.name: name for name, cls in COLLECTORS.items() for spec in cls.metrics}
    out = subprocess.run([sys.executable, "-m", "gpunode_exporter", "dump", *flags], capture_output=True, text=True,
                         check=True, cwd=ROOT)
    counts: dict[str, int] = {}
    for line in out.stdout.splitlines():
        if line and not line.startswith("#"):
            name = line.split("{")[0].split(" ")[0]
            collector = owner.get(name) or owner.get(name.removesuffix("_total"), "exporter")
            counts[collector] = counts.get(collector, 0) + 1
    counts["storage_network"] = counts.get("storage_network", 0) + PFC_PER_NIC * len(STORAGE_NICS)
    return dict(sorted(counts.items()))


def measure() -> dict[str, dict[str, int]]:
    with tempfile.TemporaryDirectory() as tmp:
        flags = write_reference_node(Path(tmp))
        config = Path(tmp) / "config.yml"
        default = count(flags)
        data = yaml.safe_load(config.read_text())
        data["nfs"].update(operations="all", transport_series="all", per_transport=True)
        config.write_text(yaml.safe_dump(data))
        every = count(flags)
    return {"default": default, "every_nfs_series": every}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, help="write the counts as JSON here")
    args = p.parse_args(argv)
    result = measure()
    print(f"{'collector':<16} {'default':>8} {'every NFS series':>17}")
    for collector in result["every_nfs_series"]:
        print(f"{collector:<16} {result['default'].get(collector, 0):>8} {result['every_nfs_series'][collector]:>17}")
    total = {k: sum(v.values()) for k, v in result.items()}
    print(f"{'total':<16} {total['default']:>8} {total['every_nfs_series']:>17}   (budget {BUDGET})")
    if args.out:
        args.out.write_text(json.dumps({**result, "total": total, "budget": BUDGET,
                                        "pfc_series_added": PFC_PER_NIC * len(STORAGE_NICS)}, indent=2) + "\n")
    return 0 if total["default"] <= BUDGET else 1


if __name__ == "__main__":
    raise SystemExit(main())
