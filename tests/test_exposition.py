"""Our renderer against prometheus_client's generate_latest over the same families: the same metrics
once parsed. Ours omits a family with no samples and carries names that are not UTF-8, where
generate_latest stops; everything else must agree."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from render import client_render, reference_families  # noqa: E402

from gpunode_common.exposition import Renderer, valid_utf8  # noqa: E402
from gpunode_exporter.collector.base import Family, MetricSpec  # noqa: E402

Parsed = list[tuple[str, str, str, list[tuple[str, tuple[tuple[str, str], ...], str]]]]


def parse(text: bytes) -> Parsed:
    """Families with samples, each sample's value as a comparable string (NaN equals NaN)."""
    out = []
    for family in text_string_to_metric_families(text.decode()):
        samples = sorted((s.name, tuple(sorted(s.labels.items())), repr(float(s.value)))
                         for s in family.samples)
        if samples:
            out.append((family.name, family.type, family.documentation, samples))
    return sorted(out)


def family(name: str, kind: str, labels: tuple[str, ...], *rows: tuple[tuple[str, ...], float],
           help_text: str = "A test family.") -> Family:
    f = MetricSpec(name, kind, help_text, labels).family()  # type: ignore[arg-type]
    for values, value in rows:
        f.add(values, value)
    return f


EDGES = [
    family("edge_values", "gauge", ("case",), (("nan",), math.nan), (("inf",), math.inf), (("-inf",), -math.inf),
           (("zero",), 0), (("negative",), -1.5), (("tiny",), 5e-324), (("int64",), 2**63), (("float",), 0.1)),
    family("edge_escapes_total", "counter", ("path", "empty"),
           (('a\\b"c\nd', ""), 1), (("ümlaut ✓", ""), 2), (("", ""), 3),
           help_text='Help with a \\ backslash,\na newline and "quotes"'),
    family("edge_empty", "gauge", ("gpu",)),
    family("edge_no_labels_info", "gauge", (), ((), 1)),
]


def test_the_reference_node_renders_as_generate_latest_renders_it() -> None:
    families = reference_families()
    assert len(families) > 50 and sum(len(f.rows) for f in families) > 500
    assert parse(Renderer().render(families)) == parse(client_render(families))


def test_escapes_special_values_and_empty_families_parse_alike() -> None:
    ours, theirs = Renderer().render(EDGES), client_render(EDGES)
    assert parse(ours) == parse(theirs)
    assert len(parse(ours)) == 3
    # A family with no samples: generate_latest prints its HELP and TYPE, ours nothing.
    assert b"edge_empty" in theirs and b"edge_empty" not in ours


def test_names_that_are_not_utf8_are_served_where_generate_latest_stops() -> None:
    # A mount point or interface name is any bytes; os.fsdecode hands them over as lone surrogates.
    name = b"/mnt/ckpt-\xff\xfe".decode("utf-8", "surrogateescape")
    raw = [family("edge_mount_info", "gauge", ("mountpoint",), ((name,), 1))]
    with pytest.raises(UnicodeEncodeError):
        client_render(raw)
    cleaned = [family("edge_mount_info", "gauge", ("mountpoint",), ((valid_utf8(name),), 1))]
    assert parse(Renderer().render(raw)) == parse(client_render(cleaned))
    assert "/mnt/ckpt-\ufffd\ufffd".encode() in Renderer().render(raw)
