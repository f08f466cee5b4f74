"""Reference tables for README.md, generated from the code so they cannot drift.

python -m gpunode_exporter.docs README.md   rewrites the generated blocks in place.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpunode_common.docs import fill
from gpunode_exporter.cli import build_parser
from gpunode_exporter.collector import COLLECTORS
from gpunode_exporter.scrape import EXPORTER_METRICS


def metrics_table() -> str:
    rows = ["| metric | type | labels | meaning |", "|---|---|---|---|"]
    groups = [("exporter", EXPORTER_METRICS)] + [(n, c.metrics) for n, c in sorted(COLLECTORS.items())]
    for group, specs in groups:
        for spec in specs:
            labels = ", ".join(f"`{label}`" for label in spec.labels)
            rows.append(f"| `{spec.name}` | {spec.kind} | {labels} | {spec.help} ({group}) |")
    return "\n".join(rows) + "\n"


def flags_table() -> str:
    parser = build_parser()
    rows = ["| flag | meaning |", "|---|---|"]
    seen: set[str] = set()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for command in _EXPORTER_COMMANDS:
        for action in sub.choices[command]._actions:
            if not action.option_strings or action.dest == "help":
                continue
            flag = " / ".join(f"`{o}`" for o in action.option_strings)
            if flag in seen:
                continue
            seen.add(flag)
            only = "" if command == "dump" or action.dest in _shared(sub) else " (serve only)"
            rows.append(f"| {flag} | {(action.help or '').replace('|', '/')}{only} |")
    return "\n".join(rows) + "\n"


_EXPORTER_COMMANDS = ("serve", "dump")  # `rules render` has its own flags, in docs/rules.md


def _shared(sub: argparse._SubParsersAction) -> set[str]:
    dests = [{a.dest for a in sub.choices[c]._actions} for c in _EXPORTER_COMMANDS]
    return set.intersection(*dests)


GENERATORS = {"metrics": metrics_table, "flags": flags_table}


def render(text: str) -> str:
    return fill(text, GENERATORS)


def main(argv: list[str]) -> int:
    path = Path(argv[0] if argv else "README.md")
    path.write_text(render(path.read_text()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
