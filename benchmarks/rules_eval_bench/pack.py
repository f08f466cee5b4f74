"""The rule pack as the benchmark runs it: its groups, what its expressions read, and the copy
each engine loads (checked by the engine, slow groups sped up), so that the input follows the
pack as it is now."""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import promql_parser
import yaml
from benchlib import BenchError  # benchmarks/ is on sys.path when run as a script

from . import ROOT

RULES = ROOT / "rules"
PROMETHEUS = "/usr/bin/prometheus"
PROMTOOL = "/usr/bin/promtool"
VICTORIA = "/usr/bin/victoria-metrics"
VMALERT = "/usr/bin/vmalert"
# Where the backends read the pack's files: always the same path, because both engines start each
# group at an offset in its interval hashed from its file's path and its name, and groups that
# start together share the CPUs; from a temporary directory they came out differently every run.
RULES_COPY = Path(tempfile.gettempdir()) / "rules-eval-rules"


@dataclass
class Group:
    file: str  # base name of the rule file
    name: str
    interval: float  # seconds, as in the pack
    rules: int
    records: int
    alerts: int


def parse_duration(text: str | None, default: float) -> float:
    if not text:
        return default
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
    total = 0.0
    for number, unit in re.findall(r"(\d+)(ms|[smhdwy])", str(text)):
        total += int(number) * units[unit]
    return total


RULE_DIRS = {"prometheus": RULES / "prometheus", "vmalert": RULES / "vmalert"}  # --tier local|fleet: rendered


def rule_files(target: str) -> list[Path]:
    return sorted(RULE_DIRS[target].glob("*.yml"))


def render_tier(tier: str, dest: Path) -> dict[str, Path]:
    """The pack's tier per target, rendered by the CLI (the committed files are the `all` tier)."""
    dirs = {}
    for target in RULE_DIRS:
        dirs[target] = dest / tier / target
        run = subprocess.run([sys.executable, "-m", "gpunode_exporter", "rules", "render", "--target", target,
                              "--tier", tier, "--out", str(dirs[target])], capture_output=True, text=True,
                             check=False, cwd=ROOT)
        if run.returncode:
            raise BenchError(f"rules render --tier {tier} failed: {run.stderr[-500:]}")
    return dirs


UNREADABLE: dict[str, str] = {}  # rule file -> why it could not be read (warned once)


def rule_groups(path: Path) -> list[dict[str, Any]]:
    """The groups of one rule file; [] (and a warning, once) when it is not valid YAML."""
    try:
        groups = (yaml.safe_load(path.read_text()) or {}).get("groups") or []
    except (OSError, yaml.YAMLError, AttributeError) as err:
        if path.name not in UNREADABLE:
            UNREADABLE[path.name] = " ".join(str(err).split())[:300]
            print(f"WARNING: {path} is not a readable rule file, left out: {UNREADABLE[path.name]}", flush=True)
        return []
    return groups


def rules_fingerprint() -> str:
    digest = hashlib.sha256()
    for target in ("prometheus", "vmalert"):
        for path in rule_files(target):
            digest.update(f"{target}/{path.name}".encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def file_key(path: str | Path) -> str:
    """A rule file's name without the target: vmalert's xid.vmalert.rules.yml is xid.rules.yml."""
    return Path(path).name.replace(".vmalert.", ".")


def load_groups(target: str, default_interval: float) -> list[Group]:
    groups = []
    for path in rule_files(target):
        for g in rule_groups(path):
            rules = g.get("rules") or []
            groups.append(Group(path.name, g["name"], parse_duration(g.get("interval"), default_interval), len(rules),
                                sum("record" in r for r in rules), sum("alert" in r for r in rules)))
    return groups


def _children(node: Any) -> Iterator[Any]:
    for attr in ("lhs", "rhs", "expr", "param"):
        child = getattr(node, attr, None)
        if child is not None and not isinstance(child, int | float | str):
            yield child
    yield from getattr(node, "args", None) or []


def _name(selector: Any) -> str:
    if selector.name:
        return selector.name
    for matcher in selector.matchers.matchers:
        if matcher.name == "__name__":
            return matcher.value
    return ""


def _offset(node: Any) -> float:
    offset = getattr(node, "offset", None)
    return offset.total_seconds() if offset else 0.0


def selectors(node: Any, reach: float = 0.0) -> Iterator[tuple[str, float]]:
    """(metric name, how far back it is read in seconds: range + offset, 0 for a plain instant
    selector) of every selector in the expression."""
    if isinstance(node, promql_parser.MatrixSelector):
        vs = node.vector_selector
        yield _name(vs), reach + node.range.total_seconds() + _offset(vs) + _offset(node)
        return
    if isinstance(node, promql_parser.VectorSelector):
        yield _name(node), reach + _offset(node)
        return
    if isinstance(node, promql_parser.SubqueryExpr):
        reach += node.range.total_seconds() + _offset(node)
    for child in _children(node):
        yield from selectors(child, reach)


def rule_reads(target: str, default_interval: float, files: list[Path] | None = None
               ) -> tuple[dict[str, float], dict[str, float], dict[str, float], list[str]]:
    """Metric name -> farthest back any rule reads it (range + offset, s); recorded name -> the
    shortest interval of a group recording it (s, as load_groups reads it); recorded name -> the
    farthest back a rule recording it reads (s); expressions that fail to parse."""
    reads: dict[str, float] = {}
    recorded: dict[str, float] = {}
    recorded_from: dict[str, float] = {}
    bad = []
    for path in rule_files(target) if files is None else files:
        for g in rule_groups(path):
            interval = parse_duration(g.get("interval"), default_interval)
            for rule in g.get("rules") or []:
                if "record" in rule:
                    recorded[rule["record"]] = min(recorded.get(rule["record"], interval), interval)
                try:
                    tree = promql_parser.parse(rule["expr"])
                except (ValueError, TypeError) as err:
                    bad.append(f"{path.name}: {rule.get('alert') or rule.get('record')}: {err}")
                    continue
                for name, window in selectors(tree):
                    reads[name] = max(reads.get(name, 0.0), window)
                    if "record" in rule:
                        recorded_from[rule["record"]] = max(recorded_from.get(rule["record"], 0.0), window)
    return reads, recorded, recorded_from, bad


def templates_with_queries(target: str) -> list[str]:
    """Alerts whose annotations run PromQL (`query`): evaluated for every active alert, every evaluation."""
    out = []
    for path in rule_files(target):
        for g in rule_groups(path):
            for rule in g.get("rules") or []:
                text = " ".join(str(v) for v in (rule.get("annotations") or {}).values())
                n = len(re.findall(r"\|\s*query\b", text))
                if n:
                    out.append(f"{g['name']}/{rule.get('alert')}: {n} template queries per active alert")
    return out


def check_argv(target: str, path: Path) -> list[str]:
    """The backend's own check of one rule file."""
    if target == "prometheus":
        return [PROMTOOL, "check", "rules", str(path)]
    return [VMALERT, "-dryRun", f"-rule={path}"]


def copy_rules(target: str, dest: Path, max_interval: float, eval_interval: float,
               ) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """The pack's files into dest; groups slower than max_interval run every eval_interval here.
    A file the backend's own check rejects (another engineer may be half-way through it) is left
    out: (groups whose interval changed, rejected file -> why)."""
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    changed, rejected = [], {}
    for path in rule_files(target):
        data = {"groups": rule_groups(path)}
        if not data["groups"]:
            rejected[path.name] = UNREADABLE.get(path.name, "no groups")
            continue
        for g in data["groups"]:
            interval = parse_duration(g.get("interval"), eval_interval)
            if interval > max_interval:
                g["interval"] = f"{int(eval_interval)}s"
                changed.append({"file": path.name, "group": g["name"], "pack_interval_s": interval,
                                "here_interval_s": eval_interval})
        copy = dest / path.name
        copy.write_text(yaml.safe_dump(data, sort_keys=False, width=10_000, allow_unicode=True))
        check = subprocess.run(check_argv(target, copy), capture_output=True, text=True, check=False, timeout=60)
        if check.returncode:
            why = (check.stderr or check.stdout).strip().splitlines()
            rejected[path.name] = next((line for line in reversed(why) if "rror" in line or "fatal" in line),
                                       why[-1] if why else f"exit {check.returncode}")[-400:]
            copy.unlink()
            print(f"  WARNING: {target} rejects {path.name}, left out: {rejected[path.name]}", flush=True)
    return changed, rejected
