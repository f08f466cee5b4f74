"""What reaches gpunode-remediate through Alertmanager, as the fleet's replays model it: an alert's
fingerprint (as Alertmanager computes it) and the inhibitions of the example configuration
(alertmanager/alertmanager.yml), matcher lists only."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

ALERTMANAGER = Path(__file__).resolve().parent.parent / "alertmanager" / "alertmanager.yml"


def fingerprint(labels: dict[str, str]) -> str:
    """Alertmanager's fingerprint of a label set: FNV-1a 64 over the sorted names and values."""
    h = 0xCBF29CE484222325
    for name in sorted(labels):
        for part in (name, labels[name]):
            for byte in [*part.encode(), 0xFF]:
                h = ((h ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


# --- Alertmanager's inhibitions

@dataclass(frozen=True)
class Matcher:
    name: str
    op: str  # = != =~ !~
    value: str

    def matches(self, labels: dict[str, str]) -> bool:
        got = labels.get(self.name, "")
        if self.op in ("=", "!="):
            return (got == self.value) == (self.op == "=")
        return bool(re.fullmatch(self.value, got)) == (self.op == "=~")


@dataclass(frozen=True)
class Inhibition:
    source: tuple[Matcher, ...]
    target: tuple[Matcher, ...]
    equal: tuple[str, ...]


_MATCHER = re.compile(r'\s*([A-Za-z_]\w*)\s*(=~|!~|!=|=)\s*(?:"((?:[^"\\]|\\.)*)"|(\S*))\s*')


def matcher(text: str) -> Matcher:
    found = _MATCHER.fullmatch(text)
    if found is None:
        raise ValueError(f"not a matcher: {text!r}")
    name, op, quoted, bare = found.groups()
    return Matcher(name, op, bytes(quoted, "utf-8").decode("unicode_escape") if quoted is not None else bare)


def inhibitions(path: Path = ALERTMANAGER) -> tuple[Inhibition, ...]:
    """The inhibit_rules of an Alertmanager configuration (matcher lists only)."""
    rules = yaml.safe_load(path.read_text()).get("inhibit_rules") or []
    return tuple(Inhibition(tuple(matcher(m) for m in r.get("source_matchers", [])),
                            tuple(matcher(m) for m in r.get("target_matchers", [])), tuple(r.get("equal", [])))
                 for r in rules)


def muted(labels: dict[str, str], active: Iterable[dict[str, str]], rules: Sequence[Inhibition]) -> bool:
    """As Alertmanager's inhibitor: a firing source alert with the same `equal` labels mutes a target;
    an alert matching both sides is not muted by a source that matches both too."""
    active = list(active)
    for rule in rules:
        if not all(m.matches(labels) for m in rule.target):
            continue
        both = all(m.matches(labels) for m in rule.source)
        for other in active:
            if other is labels or not all(m.matches(other) for m in rule.source):
                continue
            if both and all(m.matches(other) for m in rule.target):
                continue
            if all(other.get(name, "") == labels.get(name, "") for name in rule.equal):
                return True
    return False
