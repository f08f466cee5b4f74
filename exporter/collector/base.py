"""What every collector is: a name, the metrics it may emit, and collect()."""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from gpunode_common.family import Family, MetricSpec
from gpunode_exporter.nvml import Session

if TYPE_CHECKING:
    from gpunode_exporter.config import Config


@dataclass(frozen=True)
class Context:
    """What a collector may read: the host's paths, the config, and injectable lookups."""

    procfs: Path
    sysfs: Path
    config: Config
    route_lookup: Callable[[str], str | None]
    nvml: Session = field(default_factory=Session)  # shared by the collectors that use NVML
    kmsg: Path = Path("/dev/kmsg")
    state_dir: Path | None = None  # where counts kept across restarts live (None: nowhere)
    persist_state: bool = True  # False: read state_dir, never write it (dump)


class Collector(abc.ABC):
    name: ClassVar[str]
    description: ClassVar[str]
    default_enabled: ClassVar[bool] = True
    metrics: ClassVar[tuple[MetricSpec, ...]]

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    @abc.abstractmethod
    def collect(self) -> Iterable[Family]:
        """Yield this scrape's metric families; raise to report the collector as failed.

        Families yielded before the exception are still served: a collector can report
        what it could read (say, GPUs on the PCI bus) when its main source (NVML) fails.
        """

    def close(self) -> None:
        """Stop what the collector runs in the background (threads); save what it keeps."""
        return None


COLLECTORS: dict[str, type[Collector]] = {}


def register(cls: type[Collector]) -> type[Collector]:
    COLLECTORS[cls.name] = cls
    return cls
