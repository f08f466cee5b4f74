"""The rule pack: Prometheus/vmalert rule files rendered from spec.yaml with jinja2 templates.

spec.yaml names every selector, label, threshold and window; a user's spec file
overrides any of its keys (merged key by key; a key the shipped spec lacks is an
error, so a typo cannot pass silently). The templates use [[ ]] and [% %] so that
Prometheus' own {{ $labels }} templating stays literal in them.
"""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpunode_common.config import ConfigError, load_yaml

if TYPE_CHECKING:
    import jinja2

TARGETS = ("prometheus", "vmalert")
TIERS = ("all", "local", "fleet")  # rules render --tier: the whole pack, or one tier (tiers.py)
# One series per node in service with a workload, value the time it was recorded: what peered() joins.
PEER_WORKLOAD = "gpunode:node_peer_workload:timestamp"
_PACKAGE = resources.files(__package__)


def shipped_spec() -> dict[str, Any]:
    import yaml  # importing this package for TARGETS must stay cheap (`serve`)

    return yaml.safe_load(_PACKAGE.joinpath("spec.yaml").read_text())


def merge(base: Any, override: Any, where: str = "spec") -> Any:
    """override's values over base's, recursively for mappings; lists and scalars are replaced."""
    if not isinstance(base, dict):
        _check_type(base, override, where)
        return override
    if not isinstance(override, dict):
        raise ConfigError(f"{where}: want a mapping, got {type(override).__name__}")
    merged = dict(base)
    for key, value in override.items():
        if key not in base:
            raise ConfigError(f"{where}.{key}: unknown key (known: {', '.join(sorted(base))})")
        merged[key] = merge(base[key], value, f"{where}.{key}")
    return merged


_NULLABLE = ("spec.precursor.signals.",)  # null leaves a signal out (spec.yaml says so there)


def _check_type(base: Any, value: Any, where: str) -> None:
    """A value keeps the kind of the shipped one: a number stays a number >= 0 (windows,
    thresholds, counts), a string a string, a list a list of the same kind of items."""
    if value is None and where.startswith(_NULLABLE):
        return
    if isinstance(base, bool) or base is None:
        ok = isinstance(value, type(base))
        want = "true or false" if isinstance(base, bool) else "null"
    elif isinstance(base, int | float):
        ok = isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value < float("inf")
        want = "a number >= 0"
    elif isinstance(base, str):
        ok, want = isinstance(value, str), "a string"
    elif isinstance(base, list):
        ok, want = isinstance(value, list), "a list"
        if ok and base:
            for i, item in enumerate(value):
                _check_type(base[0], item, f"{where}[{i}]")
    else:  # pragma: no cover - a new kind of value in spec.yaml needs a branch here
        ok, want = False, type(base).__name__
    if not ok:
        raise ConfigError(f"{where}: want {want}, got {value!r:.60}")


def load_spec(path: Path | None = None) -> dict[str, Any]:
    """The shipped spec with the user's file (if any) merged over it."""
    spec = shipped_spec()
    return spec if path is None else load_yaml(path, lambda override: merge(spec, override))


def selector(spec: dict[str, Any], metric: str, source: str, *matchers: str) -> str:
    """metric{<the source's selector>, matchers...}: every series selector of the rules and
    dashboards goes through here; source is gpunode, node or dcgm (spec.selectors)."""
    parts = [p for p in (spec["selectors"][source], *matchers) if p]
    return f"{metric}{{{', '.join(parts)}}}"


def _environment(spec: dict[str, Any], target: str) -> jinja2.Environment:
    import jinja2  # importing this package for TARGETS must stay cheap (`serve`)

    env = jinja2.Environment(
        loader=jinja2.FunctionLoader(lambda name: _PACKAGE.joinpath("templates", name).read_text()),
        undefined=jinja2.StrictUndefined, keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True,
        variable_start_string="[[", variable_end_string="]]", block_start_string="[%", block_end_string="%]",
        comment_start_string="[#", comment_end_string="#]")

    def m(metric: str, source: str, *matchers: str) -> str:
        return selector(spec, metric, source, *matchers)

    def in_service(expr: str) -> str:
        """expr without the nodes spec.out_of_service marks (drained, cordoned): they are no peers."""
        marked = spec["out_of_service"]
        return f"({expr} unless on ({spec['labels']['node']}) ({marked}))" if marked else expr

    def newest(selector: str) -> str:
        """selector's series (one per node and workload), one workload per node: the one that
        started last. Where no staleness marker ends a node's old workload (federation, remote
        write, a backfill), it lingers beside the new one for the lookback delta, and a join on
        the node would fail for every node.

        Prometheus: of the series with a sample within peers.workload_fresh, the one with the
        fewest samples over peers.workload_history (timestamp() costs ~25x as much in its range
        queries). vmalert: the one with the newest sample (MetricsQL's bottomk over a range
        whose series change drops them all)."""
        node = spec["labels"]["node"]
        if target == "vmalert":
            return f"({selector} and on ({node}, workload) topk by ({node}) (1, timestamp({selector})))"
        fresh, history = (duration(spec["peers"][key]) for key in ("workload_fresh", "workload_history"))
        age = f"(count_over_time({selector}[{history}]) and present_over_time({selector}[{fresh}]))"
        return f"({selector} and on ({node}, workload) bottomk by ({node}) (1, {age}))"

    def peered(expr: str) -> str:
        """expr (one series per node) as peers compare it: nodes in service, each given its workload
        label from PEER_WORKLOAD (recorded once per evaluation by gpunode-peers, so no peer rule pays
        for newest() again); idle nodes, which have none, drop out. Its value is the time it was
        recorded: where no staleness marker ends a series (a replay, a backfill), one not recorded
        within peers.workload_fresh is over, and of two workloads topk keeps the one recorded last.
        The out-of-service marker is applied here too, so that a node leaves its peers at once."""
        if not spec["peers"]["workload"]:
            return in_service(expr)
        node = spec["labels"]["node"]
        fresh = f"{PEER_WORKLOAD} > time() - {spec['peers']['workload_fresh']:g}"
        return f"({in_service(expr)} * on ({node}) group_left (workload) (0 * topk by ({node}) (1, {fresh}) + 1))"

    env.globals.update(spec=spec, target=target, m=m, in_service=in_service, peered=peered, newest=newest,
                       PEER_WORKLOAD=PEER_WORKLOAD,
                       node=spec["labels"]["node"], peer=", ".join(peer_key(spec)),
                       label_peer=", ".join(spec["labels"]["peer_group"]))  # checkpoint, NFS: no workload join
    env.globals["events"] = events
    env.filters["duration"] = duration
    env.filters["window"] = lambda seconds: f"[{duration(seconds)}]"  # a range selector's [5m]
    return env


def peer_key(spec: dict[str, Any]) -> list[str]:
    """The labels a peer group is keyed by: spec labels.peer_group, and the workload when peers follow it."""
    return [*spec["labels"]["peer_group"], *(["workload"] if spec["peers"]["workload"] else [])]


def duration(seconds: float) -> str:
    """A Prometheus duration for a number of seconds: 240 -> 4m."""
    seconds = int(seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % size == 0 and seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def events(counter: str, window: str) -> str:
    """Events a counter counted over `window` (a PromQL duration): its rise, or all of it where the
    series was born inside the window (increase() misses a new series' first events, and a kernel
    event is most often the first of its series) or the counter restarted (a reboot starts the
    node's counts again)."""
    return f"({counter} - {counter} offset {window} >= 0 or {counter})"


def render(spec: dict[str, Any], target: str = "prometheus") -> dict[str, str]:
    """File name -> rule file text, one file per template."""
    if target not in TARGETS:
        raise ConfigError(f"target: want one of {', '.join(TARGETS)}, got {target!r}")
    env = _environment(spec, target)
    files = {}
    for template in sorted(t.name for t in _PACKAGE.joinpath("templates").iterdir() if t.name.endswith(".j2")
                           and not t.name.startswith("_")):
        text = env.get_template(template).render()
        name = template.removesuffix(".j2")  # xid.rules.yml
        if target != "prometheus":  # a name of its own, so the two targets' files are never mixed up
            name = name.replace(".rules.yml", f".{target}.rules.yml")
        text = re.sub(r"\n{3,}", "\n\n", text)
        if target == "vmalert":
            text = side_by_side(text, spec["vmalert_concurrency"])
        files[name] = _HEADER + text
    return files


def concurrency(rules: int, most: int) -> int | None:
    """vmalert's `concurrency` for a group of this many rules (spec vmalert_concurrency); None: one at a time."""
    n = min(rules, int(most))
    return n if n > 1 else None


def side_by_side(text: str, most: int) -> str:
    """A vmalert rule file with `concurrency` under each group's interval (see concurrency())."""
    import yaml

    sizes = {group["name"]: len(group["rules"]) for group in yaml.safe_load(text)["groups"]}
    seen = set()

    def add(match: re.Match[str]) -> str:
        seen.add(match["name"])
        n = concurrency(sizes[match["name"]], most)
        return match[0] + (f"{match['indent']}  concurrency: {n}\n" if n else "")

    text = re.sub(r"^(?P<indent> *)- name: (?P<name>\S+)\n(?P=indent)  interval: \S+\n", add, text, flags=re.M)
    if seen != set(sizes):  # pragma: no cover - a template wrote a group header another way
        raise ValueError(f"groups without an interval line: {sorted(set(sizes) - seen)}")
    return text


_HEADER = "# Generated by `gpunode-exporter rules render` from spec.yaml and templates/; do not edit.\n"


def write(files: dict[str, str], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (out / name).write_text(text)
