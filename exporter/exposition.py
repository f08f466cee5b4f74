"""Prometheus text exposition (format 0.0.4) of our metric families, fast.

A scrape can hold tens of thousands of samples (32 mounts x 60 ops x 9 metrics),
and their label sets repeat from scrape to scrape, so each rendered
`name{labels} ` prefix is cached; values are formatted with str()/repr().
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from exporter.collector.base import Family, MetricSpec

_MAX_CACHED = 200_000  # prefixes; a churn of label values beyond this starts afresh


def _escape_label(value: str) -> str:
    if "\\" in value or '"' in value or "\n" in value:
        value = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return value


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def format_value(value: float) -> str:
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


class Renderer:
    def __init__(self) -> None:
        self._prefixes: dict[str, dict[tuple[str, ...], str]] = {}
        self._cached = 0

    def _prefix(self, spec: MetricSpec, values: tuple[str, ...]) -> str:
        if self._cached >= _MAX_CACHED:
            self._prefixes.clear()
            self._cached = 0
        if spec.labels:
            pairs = ",".join(f'{k}="{_escape_label(v)}"' for k, v in zip(spec.labels, values, strict=True))
            prefix = f"{spec.name}{{{pairs}}} "
        else:
            prefix = f"{spec.name} "
        self._prefixes.setdefault(spec.name, {})[values] = prefix
        self._cached += 1
        return prefix

    def render(self, families: Iterable[Family]) -> bytes:
        out: list[str] = []
        append = out.append
        for family in families:
            if not family.rows:
                continue
            spec = family.spec
            append(f"# HELP {spec.name} {_escape_help(spec.help)}\n# TYPE {spec.name} {spec.kind}\n")
            cache = self._prefixes.get(spec.name, {})
            for values, value in family.rows:
                prefix = cache.get(values) or self._prefix(spec, values)
                append(f"{prefix}{value if type(value) is int else format_value(value)}\n")
        return "".join(out).encode()
