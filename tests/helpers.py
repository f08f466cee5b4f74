"""Small shared test helpers."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from exporter.collector.base import Collector, Context, Family
from exporter.config import Config
from exporter.exposition import Renderer

Series = dict[str, dict[tuple, float]]


def nfs_context(procfs: Path, route_lookup: Callable[[str], str | None] = lambda _a: None) -> Context:
    return Context(procfs=procfs, sysfs=procfs.parent / "sys", config=Config(), route_lookup=route_lookup)


def parse_exposition(text: str) -> Series:
    """{sample name: {sorted label items: value}}."""
    series: Series = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            series.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return series


def render(families: Iterable[Family]) -> str:
    return Renderer().render(families).decode()


def collect_samples(collector: Collector) -> Series:
    """One collect() call, rendered and parsed back as Prometheus would."""
    return parse_exposition(render(collector.collect()))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, alive: Callable[[], bool] = lambda: True, seconds: float = 20) -> None:
    """Until something accepts on 127.0.0.1:port; fails early if `alive()` turns false."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not alive():
            raise AssertionError("the server exited before it listened")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"nothing listens on port {port} after {seconds}s")
