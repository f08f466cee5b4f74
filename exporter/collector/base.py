"""What every collector is: a name, the metrics it may emit, and collect()."""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Literal

from prometheus_client.metrics_core import Metric

if TYPE_CHECKING:
    from exporter.config import Config


@dataclass(frozen=True)
class MetricSpec:
    """One metric family: the single place its name, type, help and labels are written."""

    name: str
    kind: Literal["counter", "gauge"]
    help: str
    labels: tuple[str, ...] = ()

    def family(self) -> Family:
        return Family(self)


class Family(Metric):
    """A metric family built fresh for one scrape."""

    def __init__(self, spec: MetricSpec) -> None:
        base = spec.name.removesuffix("_total") if spec.kind == "counter" else spec.name
        super().__init__(base, spec.help, spec.kind)
        self.spec = spec

    def add(self, label_values: Iterable[str], value: float) -> None:
        self.add_sample(self.spec.name, dict(zip(self.spec.labels, label_values, strict=True)), value)


@dataclass(frozen=True)
class Context:
    """What a collector may read: the host's paths, the config, and injectable lookups."""

    procfs: Path
    sysfs: Path
    config: Config
    route_lookup: Callable[[str], str | None]


class Collector(abc.ABC):
    name: ClassVar[str]
    description: ClassVar[str]
    default_enabled: ClassVar[bool] = True
    metrics: ClassVar[tuple[MetricSpec, ...]]

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    @abc.abstractmethod
    def collect(self) -> Iterable[Metric]:
        """Yield this scrape's metric families; raise to report the collector as failed."""


COLLECTORS: dict[str, type[Collector]] = {}


def register(cls: type[Collector]) -> type[Collector]:
    COLLECTORS[cls.name] = cls
    return cls
