"""Runs the enabled collectors for one scrape, each within a time budget.

A collector that raises, lacks permission or overruns its budget is reported as
failed (gpunode_scrape_collector_success 0); the others are still served, and so
are the families it yielded before it failed. A failure is logged when it starts
or changes, not on every scrape. A collection already in flight is joined, not
repeated, so a hung collector holds one thread at most and overlapping scrapes
don't pile work up.
"""

from __future__ import annotations

import logging
import platform
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from concurrent.futures import TimeoutError as FutureTimeout

from gpunode_common import __version__
from gpunode_exporter.collector.base import Collector, Family, MetricSpec
from gpunode_exporter.problems import Problems

log = logging.getLogger(__name__)

SUCCESS = MetricSpec("gpunode_scrape_collector_success", "gauge",
                     "1 if the collector's last scrape succeeded, 0 if it failed or timed out.",
                     ("collector",))
DURATION = MetricSpec("gpunode_scrape_collector_duration_seconds", "gauge",
                      "How long the collector took in this scrape.", ("collector",))
BUILD_INFO = MetricSpec("gpunode_exporter_build_info", "gauge",
                        "The exporter's version and the Python it runs on.",
                        ("version", "python_version"))
SIMULATED = MetricSpec("gpunode_nvml_simulated", "gauge",
                       "1: GPU data comes from a simulated NVML (--nvml.simulate), not the driver.")
EXPORTER_METRICS = (SUCCESS, DURATION, BUILD_INFO, SIMULATED)

_Result = tuple[list[Family], float, Exception | None]
_STAGGER_SECONDS = 0.05


def _run(collector: Collector) -> _Result:
    start = time.perf_counter()
    families: list[Family] = []
    try:
        for family in collector.collect():
            families.append(family)
    except Exception as err:  # reported by the scrape, with what was yielded so far
        return families, time.perf_counter() - start, err
    return families, time.perf_counter() - start, None


def _fulfil(collector: Collector, future: Future[_Result]) -> None:
    future.set_running_or_notify_cancel()
    try:
        future.set_result(_run(collector))
    except BaseException as err:  # SystemExit and the like: raised where the scrape reads it
        future.set_exception(err)


class _Turns:
    """Collections run one after another on one thread; `since`: when the current one started.
    rest() takes those not started yet away from it (each to a thread of its own)."""

    def __init__(self, queue: list[tuple[Collector, Future[_Result]]]) -> None:
        self.queue = queue
        self.since = time.perf_counter()
        self._lock = threading.Lock()
        self._next = 0

    def _take(self) -> tuple[Collector, Future[_Result]] | None:
        with self._lock:
            if self._next == len(self.queue):
                return None
            self._next += 1
            return self.queue[self._next - 1]

    def rest(self) -> list[tuple[Collector, Future[_Result]]]:
        with self._lock:
            taken, self._next = self.queue[self._next:], len(self.queue)
            return taken

    def run(self) -> None:
        while (item := self._take()) is not None:
            self.since = time.perf_counter()
            _fulfil(*item)


class Scraper:
    """Collects one scrape's families from our collectors."""

    def __init__(self, collectors: Sequence[Collector], timeout: float, simulated: bool = False) -> None:
        self.collectors = list(collectors)
        self.timeout = timeout
        self.simulated = simulated
        self._problems = Problems()  # per collector
        self._pool = ThreadPoolExecutor(max_workers=max(2, 2 * len(self.collectors)),
                                        thread_name_prefix="collector")
        self._lock = threading.Lock()
        self._in_flight: dict[str, Future[_Result]] = {}

    def _claim(self, collector: Collector) -> tuple[Future[_Result], bool]:
        """The collection in flight for this collector, or a new one (True) for this scrape to run."""
        with self._lock:
            future = self._in_flight.get(collector.name)
            if future is not None and not future.done():
                return future, False
            future = self._in_flight[collector.name] = Future()
            return future, True

    def collect(self) -> Iterator[Family]:
        started = time.perf_counter()
        deadline = started + self.timeout
        claimed = [(collector, *self._claim(collector)) for collector in self.collectors]
        futures = [(collector, future) for collector, future, _ in claimed]
        turns = _Turns([(collector, future) for collector, future, new in claimed if new])
        if turns.queue:
            # One after another on one thread while each is quick: Python threads running at once
            # contend for the GIL (a scrape took 1.6x as long), and each handoff between threads
            # costs. One that is slow or stuck holds up the next this long at most: then those
            # not started yet get a thread each.
            self._pool.submit(turns.run)
            last = turns.queue[-1][1]
            while not wait([last], timeout=max(0.0, turns.since + _STAGGER_SECONDS - time.perf_counter())).done:
                if time.perf_counter() - turns.since < _STAGGER_SECONDS:
                    continue
                for collector, future in turns.rest():  # not started: each on a thread of its own
                    self._pool.submit(_fulfil, collector, future)
                    wait([future], timeout=_STAGGER_SECONDS)
                break
        success, duration = SUCCESS.family(), DURATION.family()
        for collector, future in futures:
            try:
                families, took, error = future.result(timeout=max(0.0, deadline - time.perf_counter()))
                failure = f"failed: {type(error).__name__}: {error}" if error else None
            except FutureTimeout:
                families, took = [], time.perf_counter() - started
                failure = f"still running after {self.timeout:g}s"
            else:
                with self._lock:  # done: its families are this scrape's, not to be kept until the next
                    if self._in_flight.get(collector.name) is future:
                        del self._in_flight[collector.name]
            self._report(collector.name, failure)
            yield from families
            success.add((collector.name,), 0 if failure else 1)
            duration.add((collector.name,), took)
        yield success
        yield duration
        info = BUILD_INFO.family()
        info.add((__version__, platform.python_version()), 1)
        yield info
        if self.simulated:
            simulated = SIMULATED.family()
            simulated.add((), 1)
            yield simulated

    def _report(self, name: str, failure: str | None) -> None:
        """Log a failure when it starts or changes, and the recovery; not every scrape."""
        if failure is None:
            if self._problems.solved(name):
                log.info("collector %s: working again", name)
        elif self._problems.new(name, failure):
            log.error("collector %s %s", name, failure)

    def still_running(self) -> list[str]:
        """Collectors whose last collect() has not returned (stuck on a FIFO, a hung NFS read)."""
        with self._lock:
            return sorted(name for name, future in self._in_flight.items() if not future.done())

    def close(self, wait: bool = False) -> None:
        self._pool.shutdown(wait=wait, cancel_futures=True)
        for collector in self.collectors:
            collector.close()
