"""A metric family: its spec (name, type, help, labels) and one scrape's rows. Shared by the
exporter's collectors and the remediation service, which render them with gpunode_common.exposition."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True, eq=False)
class MetricSpec:
    """One metric family: the single place its name, type, help and labels are written. Each is a
    module constant, so it is itself (eq=False): collectors key a scrape's families by spec, and a
    hash of its fields, help text and all, cost more than the rows added (~180 lookups a scrape)."""

    name: str
    kind: Literal["counter", "gauge", "histogram"]
    help: str
    labels: tuple[str, ...] = ()

    def family(self) -> Family:
        return Family(self)


class Family:
    """A metric family built fresh for one scrape: rows of (label values, value)."""

    __slots__ = ("rows", "spec")

    def __init__(self, spec: MetricSpec) -> None:
        self.spec = spec
        self.rows: list[tuple[tuple[str, ...], float]] = []

    def add(self, label_values: tuple[str, ...], value: float) -> None:
        """label_values in the order of spec.labels (checked when first rendered)."""
        self.rows.append((label_values, value))

    def add_histogram(self, label_values: tuple[str, ...], bounds: tuple[float, ...],
                      observations: list[float]) -> None:
        """A histogram's samples from its observations: a row per bucket (le last), _sum and _count.
        The rows' first value names the sample's suffix."""
        for bound in (*bounds, float("inf")):
            le = "+Inf" if bound == float("inf") else repr(float(bound))
            self.rows.append((("_bucket", *label_values, le), sum(1 for o in observations if o <= bound)))
        self.rows.append((("_sum", *label_values), float(sum(observations))))
        self.rows.append((("_count", *label_values), len(observations)))
