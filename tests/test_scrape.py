"""The collector framework: failures and overruns are reported, the rest is served."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpunode_exporter.collector.base import Collector, Family, MetricSpec
from gpunode_exporter.collector.nfs import NFSCollector
from gpunode_exporter.scrape import Scraper
from tests.helpers import nfs_context, parse_exposition, render

OK = MetricSpec("test_ok", "gauge", "A value.")
EDGE = Path(__file__).parent / "fixtures" / "procfs" / "edge"


class Fake(Collector):
    description = "test"
    metrics = (OK,)

    def __init__(self, name: str, behaviour: str, release: threading.Event | None = None) -> None:
        self.name = name
        self.behaviour = behaviour
        self.release = release
        self.calls = 0

    def collect(self) -> Iterator[Family]:
        self.calls += 1
        if self.behaviour == "raise":
            raise RuntimeError("boom")
        if self.behaviour == "hang":
            assert self.release is not None
            self.release.wait(10)
        fam = OK.family()
        fam.add((), self.calls)
        yield fam


def samples(scraper: Scraper) -> dict[tuple[str, str], float]:
    return {(name, dict(labels).get("collector", "")): value
            for name, series in parse_exposition(render(scraper.collect())).items()
            for labels, value in series.items()}


def test_failing_collector_is_reported_and_others_served() -> None:
    scraper = Scraper([Fake("bad", "raise"), Fake("good", "ok")], timeout=2)
    got = samples(scraper)
    assert got[("gpunode_scrape_collector_success", "bad")] == 0
    assert got[("gpunode_scrape_collector_success", "good")] == 1
    assert got[("test_ok", "")] == 1
    assert ("gpunode_scrape_collector_duration_seconds", "good") in got


def test_permission_denied_is_a_failure_not_a_crash(monkeypatch: pytest.MonkeyPatch) -> None:
    def deny(*_args: object, **_kwargs: object) -> str:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "read_text", deny)
    scraper = Scraper([NFSCollector(nfs_context(EDGE)), Fake("good", "ok")], timeout=2)
    got = samples(scraper)
    assert got[("gpunode_scrape_collector_success", "nfs")] == 0
    assert got[("gpunode_scrape_collector_success", "good")] == 1


@pytest.mark.alone  # times a scrape
def test_hung_collector_times_out_and_is_not_started_twice() -> None:
    release = threading.Event()
    hung = Fake("slow", "hang", release)
    scraper = Scraper([hung, Fake("good", "ok")], timeout=0.2)
    try:
        start = time.monotonic()
        first = samples(scraper)
        assert time.monotonic() - start < 2
        assert first[("gpunode_scrape_collector_success", "slow")] == 0
        assert first[("gpunode_scrape_collector_success", "good")] == 1
        second = samples(scraper)
        assert second[("gpunode_scrape_collector_success", "slow")] == 0
        assert hung.calls == 1  # the second scrape joined the collection in flight
    finally:
        release.set()
    time.sleep(0.1)
    assert samples(scraper)[("gpunode_scrape_collector_success", "slow")] == 1


def test_exposition_has_build_info_and_no_timestamps() -> None:
    text = render(Scraper([NFSCollector(nfs_context(EDGE))], timeout=5).collect())
    assert 'gpunode_exporter_build_info{version="' in text
    parsed = [s for fam in text_string_to_metric_families(text) for s in fam.samples]
    assert parsed and all(s.timestamp is None for s in parsed)


class Timed(Collector):
    """Spins for `seconds` of CPU, recording when it ran."""

    description = "test"
    metrics = (OK,)

    def __init__(self, name: str, seconds: float) -> None:
        self.name, self.seconds, self.spans = name, seconds, []

    def collect(self) -> Iterator[Family]:
        start = time.perf_counter()
        while time.perf_counter() - start < self.seconds:
            pass
        self.spans.append((start, time.perf_counter()))
        fam = OK.family()
        fam.add((), 1)
        yield fam


def test_quick_collectors_run_one_after_another() -> None:
    # Python threads running at once contend for the GIL: quick collectors are not started together.
    collectors = [Timed(f"c{i}", 0.03) for i in range(4)]  # longer than the GIL switch interval
    scraper = Scraper(collectors, timeout=5)
    try:
        samples(scraper)
    finally:
        scraper.close(wait=True)
    spans = sorted(span for c in collectors for span in c.spans)
    assert len(spans) == 4 and all(a[1] <= b[0] for a, b in itertools.pairwise(spans))


class Where(Collector):
    """Records the thread it ran on."""

    description = "test"
    metrics = (OK,)

    def __init__(self, name: str) -> None:
        self.name, self.threads = name, []

    def collect(self) -> Iterator[Family]:
        self.threads.append(threading.get_ident())
        yield OK.family()


def test_quick_collectors_share_one_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    # A handoff between threads costs more than a quick collector: a scrape's run in turn on one.
    monkeypatch.setattr("gpunode_exporter.scrape._STAGGER_SECONDS", 5.0)  # a busy machine's pause is no slow collector
    collectors = [Where(f"c{i}") for i in range(6)]
    scraper = Scraper(collectors, timeout=5)
    try:
        for _ in range(3):
            samples(scraper)
    finally:
        scraper.close(wait=True)
    for scrape in range(3):
        assert len({c.threads[scrape] for c in collectors}) == 1
        assert collectors[0].threads[scrape] != threading.get_ident()


@pytest.mark.alone  # times a scrape
def test_a_slow_collector_holds_up_the_next_briefly_only() -> None:
    release = threading.Event()
    stuck, quick = Fake("stuck", "hang", release), Timed("quick", 0)
    scraper = Scraper([stuck, quick], timeout=1)
    try:
        started = time.perf_counter()
        got = samples(scraper)
        assert got[("gpunode_scrape_collector_success", "quick")] == 1
        assert got[("gpunode_scrape_collector_success", "stuck")] == 0
        assert quick.spans[0][0] - started < 0.5  # it started after the stagger, not after the timeout
    finally:
        release.set()
        scraper.close(wait=True)


def test_a_scrape_that_joins_another_gets_what_that_one_moved_to_a_thread_of_its_own() -> None:
    # The second scrape joins the first's collections; the first moves `quick`, stuck behind
    # `stuck`, to a thread of its own: the second still gets its result.
    release = threading.Event()
    stuck, quick = Fake("stuck", "hang", release), Timed("quick", 0)
    scraper = Scraper([stuck, quick], timeout=1)
    first: dict[tuple[str, str], float] = {}
    try:
        other = threading.Thread(target=lambda: first.update(samples(scraper)))
        other.start()
        time.sleep(0.01)
        second = samples(scraper)
        other.join()
    finally:
        release.set()
        scraper.close(wait=True)
    for got in (first, second):
        assert got[("gpunode_scrape_collector_success", "quick")] == 1
        assert got[("gpunode_scrape_collector_success", "stuck")] == 0
    assert stuck.calls == 1 and len(quick.spans) == 1
