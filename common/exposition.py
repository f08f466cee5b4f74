"""Prometheus text exposition (format 0.0.4) of our metric families, fast.

A scrape can hold tens of thousands of samples (32 mounts x 60 ops x 9 metrics),
and their label sets repeat from scrape to scrape, so each rendered label set is
cached; values are formatted with str()/repr().
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator

from gpunode_common.family import Family

_MAX_CACHED = 200_000  # label sets; a churn of label values beyond this starts afresh


def _escape_label(value: str) -> str:
    if not value.isascii():
        value = valid_utf8(value)
    if "\\" in value or '"' in value or "\n" in value:
        value = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return value


def valid_utf8(value: str) -> str:
    """Names from the kernel may be any bytes; Python hands them over as lone surrogates
    (os.listdir's surrogateescape, JSON's \\udXXX), which no UTF-8 output can carry.
    Each becomes U+FFFD; one bad name never costs the whole scrape."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "".join("\ufffd" if "\ud800" <= c <= "\udfff" else c for c in value)
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
    """Renders families family by family, so a scrape never holds two copies of its text."""

    def __init__(self) -> None:
        # label names -> label values -> '{name="value",...}'; shared by every family with
        # those label names (the nine per-op NFS families share one entry per op).
        self._label_sets: dict[tuple[str, ...], dict[tuple[str, ...], str]] = {}
        self._cached = 0

    def _labels(self, names: tuple[str, ...], values: tuple[str, ...]) -> str:
        if self._cached >= _MAX_CACHED:
            self._label_sets.clear()
            self._cached = 0
        pairs = ",".join(f'{k}="{_escape_label(v)}"' for k, v in zip(names, values, strict=True))
        text = f"{{{pairs}}}" if names else ""
        self._label_sets.setdefault(names, {})[values] = text
        self._cached += 1
        return text

    def chunks(self, families: Iterable[Family]) -> Iterator[bytes]:
        for family in families:
            if not family.rows:
                continue
            spec = family.spec
            name = spec.name
            out = [f"# HELP {name} {_escape_help(spec.help)}\n# TYPE {name} {spec.kind}\n"]
            append = out.append
            if spec.kind == "histogram":  # rows begin with the sample's suffix; a bucket's end with le
                for (suffix, *values), value in family.rows:
                    names = (*spec.labels, "le") if suffix == "_bucket" else spec.labels
                    append(f"{name}{suffix}{self._labels(names, tuple(values))} {format_value(value)}\n")
                yield "".join(out).encode()
                continue
            cache = self._label_sets.get(spec.labels, {})
            for values, value in family.rows:
                labels = cache.get(values) or self._labels(spec.labels, values)
                append(f"{name}{labels} {value if type(value) is int else format_value(value)}\n")
            yield "".join(out).encode()

    def render(self, families: Iterable[Family]) -> bytes:
        return b"".join(self.chunks(families))
