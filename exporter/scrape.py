"""Runs the enabled collectors for one scrape, each within a time budget.

A collector that raises, lacks permission or overruns its budget is reported as
failed (gpunode_scrape_collector_success 0); the others are still served. A
collection already in flight is joined, not repeated, so a hung collector holds
one thread at most and overlapping scrapes don't pile work up.
"""

from __future__ import annotations

import logging
import platform
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

from exporter import __version__
from exporter.collector.base import Collector, Family, MetricSpec

log = logging.getLogger(__name__)

SUCCESS = MetricSpec("gpunode_scrape_collector_success", "gauge",
                     "1 if the collector's last scrape succeeded, 0 if it failed or timed out.",
                     ("collector",))
DURATION = MetricSpec("gpunode_scrape_collector_duration_seconds", "gauge",
                      "How long the collector took in this scrape.", ("collector",))
BUILD_INFO = MetricSpec("gpunode_exporter_build_info", "gauge",
                        "The exporter's version and the Python it runs on.",
                        ("version", "python_version"))
EXPORTER_METRICS = (SUCCESS, DURATION, BUILD_INFO)

_Result = tuple[list[Family], float]


def _run(collector: Collector) -> _Result:
    start = time.perf_counter()
    families = list(collector.collect())
    return families, time.perf_counter() - start


class Scraper:
    """Collects one scrape's families from our collectors."""

    def __init__(self, collectors: Sequence[Collector], timeout: float) -> None:
        self.collectors = list(collectors)
        self.timeout = timeout
        self._pool = ThreadPoolExecutor(max_workers=max(2, 2 * len(self.collectors)),
                                        thread_name_prefix="collector")
        self._lock = threading.Lock()
        self._in_flight: dict[str, Future[_Result]] = {}

    def _start(self, collector: Collector) -> Future[_Result]:
        with self._lock:
            future = self._in_flight.get(collector.name)
            if future is None or future.done():
                future = self._pool.submit(_run, collector)
                self._in_flight[collector.name] = future
            return future

    def collect(self) -> Iterator[Family]:
        started = time.perf_counter()
        deadline = started + self.timeout
        futures = [(c, self._start(c)) for c in self.collectors]
        success, duration = SUCCESS.family(), DURATION.family()
        for collector, future in futures:
            try:
                families, took = future.result(timeout=max(0.0, deadline - time.perf_counter()))
            except FutureTimeout:
                log.error("collector %s: still running after %.1fs", collector.name, self.timeout)
                families, took, ok = [], time.perf_counter() - started, 0
            except Exception as err:
                log.error("collector %s failed: %s: %s", collector.name, type(err).__name__, err)
                families, took, ok = [], time.perf_counter() - started, 0
            else:
                ok = 1
            yield from families
            success.add((collector.name,), ok)
            duration.add((collector.name,), took)
        yield success
        yield duration
        info = BUILD_INFO.family()
        info.add((__version__, platform.python_version()), 1)
        yield info

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
