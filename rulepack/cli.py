"""`gpunode-exporter rules render` and `gpunode-exporter dashboards render`: the rule files and the
Grafana dashboards, written from the spec (the shipped one with the user's overrides merged over it)."""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

import gpunode_rulepack
from gpunode_common.config import ConfigError
from gpunode_common.flags import Parser
from gpunode_rulepack import TARGETS, TIERS

PROG = "gpunode-exporter"
# The libraries each command needs beyond the node agent's install: its extra's (pyproject.toml).
EXTRA_LIBRARIES = {"rules": ("jinja2", "promql_parser"),
                   "dashboards": ("grafana_foundation_sdk", "jinja2", "promql_parser")}


# command -> its description, and the help and description of its `render`.
_ABOUT = {
    "rules": ("The Prometheus/vmalert rule pack (docs/rules.md).", "write the rule files from the spec",
              "Write the rule files, rendered from the shipped spec with your overrides merged over it.",
              "the rule files"),
    "dashboards": ("The Grafana dashboards (docs/dashboards.md).", "write the dashboards' JSON from the spec",
                   "Write the Grafana dashboards, with the selectors, labels and windows of the rule pack's "
                   "spec (your overrides merged over it).", "the dashboards"),
}


def build_parser(command: str) -> argparse.ArgumentParser:
    """The parser of `rules` or `dashboards`."""
    about, short, long, written = _ABOUT[command]
    parser = Parser(prog=f"{PROG} {command}", description=about)
    parser.set_defaults(command=command)
    render = parser.add_subparsers(dest=f"{command}_command", metavar="COMMAND", required=True).add_parser(
        "render", help=short, description=long)
    render.add_argument("--spec", type=Path, metavar="FILE",
                        help="YAML overriding keys of the shipped spec (see rules/spec.yaml)")
    if command == "rules":
        render.add_argument("--target", choices=TARGETS, default="prometheus",
                            help="prometheus, or vmalert (leaves out what vmalert 1.79 rejects) "
                                 "(default: prometheus)")
    render.add_argument("--out", type=Path, default=Path("."), metavar="DIR",
                        help=f"directory to write {written} to (default: .)")
    if command == "rules":
        render.add_argument("--tier", choices=TIERS, default="all",
                            help="all: one server's pack; local: the rules of one node's series, for each "
                                 "server scraping a shard; fleet: the rules that compare nodes, on the server "
                                 "that receives the local tiers' recordings (docs/scaling.md) (default: all)")
    return parser


def missing_extra(command: str) -> str | None:
    """One line saying what to install, where a library of the command's extra is missing."""
    missing = []
    for name in EXTRA_LIBRARIES[command]:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    if not missing:
        return None
    return f"{command} render needs {', '.join(missing)}: pip install 'gpunode-exporter[{command}]'"


def main(argv: list[str]) -> int:
    """argv: `rules` or `dashboards`, then `render` and its flags."""
    parser = build_parser(argv[0])
    args = parser.parse_args(argv[1:])
    if message := missing_extra(args.command):
        parser.error(message)
    # Imported here: `rules render` needs no Grafana SDK, `dashboards render` no jinja2.
    from gpunode_rulepack import check
    try:
        spec = gpunode_rulepack.load_spec(args.spec)
        check.check_spec(spec)
        if args.command == "rules":
            from gpunode_rulepack import tiers

            rendered = gpunode_rulepack.render(spec, args.target)
            check.check_rules(spec, rendered)
            files = tiers.split(rendered, args.tier, spec["labels"]["node"])
        else:
            from gpunode_rulepack import dashboards

            files = check.checked(spec, lambda: dashboards.files(spec))
    except ConfigError as err:
        parser.error(str(err))
    try:
        gpunode_rulepack.write(files, args.out)
    except OSError as err:
        sys.stderr.write(f"{PROG}: error: cannot write {args.out}: {err.strerror}\n")
        return 1
    # One write: a reader that stops early (`| head`) has the whole list in the pipe, not a broken one.
    sys.stdout.write("".join(f"{args.out / name}\n" for name in files))
    if args.command == "rules" and spec["runbook_base_url"] != gpunode_rulepack.shipped_spec()["runbook_base_url"]:
        sys.stderr.write(f"{PROG}: warning: alerts link to {spec['runbook_base_url']}/AREA.md#alertname: keep a "
                         "copy of docs/runbooks/ there, its file names and headings as they are, or the links "
                         "are dead (docs/rules.md)\n")
    return 0
