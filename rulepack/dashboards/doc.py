"""docs/dashboards.md's panel lists, generated from the dashboards so they cannot drift.

python -m gpunode_rulepack.dashboards.doc docs/dashboards.md   rewrites the generated blocks in place.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path

from gpunode_common.docs import fill
from gpunode_rulepack import load_spec
from gpunode_rulepack.dashboards import Built, build
from gpunode_rulepack.dashboards.board import PanelInfo, needs_names


def panels_table(built: list[Built]) -> str:
    rows = []
    for b in built:
        rows += [f"\n`{b.dashboard['uid']}` ({b.filename}):\n", "| row | panel | needs | reads too, where present | "
                 "shows data only with |", "|---|---|---|---|---|"]
        rows += [f"| {p.row} | {p.title} | {needs_names(p.needs)} | {needs_names(p.reads - p.needs)} | "
                 f"{'; '.join(p.conditions)} |" for p in b.panels]
    return "\n".join(rows).lstrip("\n") + "\n"


def dcgm_list(built: list[Built]) -> str:
    def listed(keep: Callable[[PanelInfo], bool]) -> list[str]:
        return [f"- {b.dashboard['uid']}: {p.title}" for b in built for p in b.panels if keep(p)] or ["- none"]

    def needs(p: PanelInfo) -> bool:
        return "dcgm" in p.needs

    return "\n".join(["Empty, or missing a query's series, without dcgm-exporter:", "", *listed(needs), "",
                      "Reading dcgm-exporter where it runs, showing data without it:", "",
                      *listed(lambda p: "dcgm" in p.reads and not needs(p))]) + "\n"


GENERATORS = {"panels": panels_table, "dcgm": dcgm_list}


def update(text: str, built: list[Built] | None = None) -> str:
    built = built if built is not None else build(load_spec())
    return fill(text, {name: partial(generate, built) for name, generate in GENERATORS.items()})


def main(argv: list[str]) -> int:
    path = Path(argv[0] if argv else "docs/dashboards.md")
    path.write_text(update(path.read_text()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
