"""The checkpoint collector's clock: saves timed on the node, whatever the scrape interval."""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpunode_exporter.collector.base import Context
from gpunode_exporter.collector.checkpoint import CheckpointCollector, SaveClock, written_bytes
from gpunode_exporter.config import CheckpointConfig, Config
from tests.helpers import collect_samples

FIXTURES = Path(__file__).parent / "fixtures"
REAL = FIXTURES / "procfs" / "real" / "self" / "mountstats"
MOUNT = ("/mnt/ckpt", "server:/ckpt")


def play(rates: list[float], threshold: float = 100.0, gap: float = 5.0, step: float = 1.0) -> SaveClock:
    """A clock fed one mount whose WRITE bytes grow at rates[i] bytes/s during second i."""
    clock, sent = SaveClock(threshold, gap), 0
    for i, rate in enumerate([0.0, *rates]):
        sent += int(rate * step)
        clock.feed(i * step, {MOUNT: sent})
    return clock


@pytest.mark.parametrize("seconds", [5, 18, 30, 200])
def test_a_save_is_timed_to_the_second(seconds: int) -> None:
    clock = play([0] * 7 + [1000] * seconds + [0] * 20)
    assert (clock.seconds, clock.saves) == (seconds, 1)


def test_a_dip_within_a_save_is_part_of_it_and_a_longer_pause_ends_it() -> None:
    clock = play([1000] * 10 + [0] * 3 + [1000] * 10 + [0] * 20, gap=5)
    assert (clock.seconds, clock.saves) == (23, 1)
    clock = play([1000] * 10 + [0] * 8 + [1000] * 10 + [0] * 20, gap=5)
    assert (clock.seconds, clock.saves) == (20, 2)


def test_writes_below_the_threshold_are_no_save() -> None:
    clock = play([99] * 100)
    assert (clock.seconds, clock.saves, clock.samples) == (0, 0, 101)


def test_a_mount_that_goes_or_restarts_adds_nothing() -> None:
    clock = SaveClock(100.0, 5.0)
    clock.feed(0, {MOUNT: 10**12})
    clock.feed(1, {MOUNT: 5})  # remounted: its counters start again
    clock.feed(2, {})
    clock.feed(3, {MOUNT: 10**12})
    assert (clock.seconds, clock.saves) == (0, 0)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.floats(0.001, 10), st.integers(-(2**64), 2**64)), max_size=60),
       st.floats(1, 1e9), st.floats(0, 30))
def test_the_counters_never_fall_and_never_exceed_the_time(feeds: list[tuple[float, int]], threshold: float,
                                                          gap: float) -> None:
    clock, now, seen = SaveClock(threshold, gap), 0.0, (0.0, 0)
    for advance, sent in feeds:
        now += advance
        clock.feed(now, {MOUNT: sent})
        assert clock.seconds >= seen[0] and clock.saves >= seen[1]
        seen = (clock.seconds, clock.saves)
    assert clock.seconds <= now + 1e-9 and clock.saves <= clock.samples


def test_written_bytes_sums_each_mounts_writes_once() -> None:
    text = REAL.read_text()
    every = written_bytes(text, [])
    assert every and all(v >= 0 for v in every.values())
    first = next(iter(every))
    assert written_bytes(text, [re.compile("^" + re.escape(first[0]) + "$")]) == {first: every[first]}
    # a section without per-op lines: its mount counts, with nothing written
    assert written_bytes("device x mounted on /y with fstype nfs4 statvers=1.1\n\tbogus\n", []) == {("/y", "x"): 0}


def collector(procfs: Path) -> CheckpointCollector:
    config = Config(checkpoint=CheckpointConfig(save_write_bytes=1.0, sample_seconds=3600.0))
    return CheckpointCollector(Context(procfs=procfs, sysfs=procfs.parent / "sys", config=config,
                                       route_lookup=lambda _a: None))


def test_the_collector_counts_a_save_and_reports_an_unreadable_mountstats(tmp_path: Path) -> None:
    (tmp_path / "self").mkdir()
    stats = tmp_path / "self" / "mountstats"
    text = REAL.read_text()
    stats.write_text(text)
    c = collector(tmp_path)
    try:
        deadline = time.monotonic() + 20  # the thread's first read, however busy the machine
        while collect_samples(c)["gpunode_checkpoint_samples_total"][()] < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        c.sample()
        # replaced whole, as the kernel serves it: the collector's own thread may read at any time
        fresh = tmp_path / "mountstats.new"
        fresh.write_text(text.replace("WRITE: 4 4 0 2098144", "WRITE: 9 9 0 92098144", 1))
        fresh.replace(stats)
        c.sample()
        got = collect_samples(c)
        assert got["gpunode_checkpoint_saves_total"][()] == 1
        assert got["gpunode_checkpoint_save_seconds_total"][()] > 0
        assert got["gpunode_checkpoint_samples_total"][()] >= 3  # the thread's first, and ours
        shutil.rmtree(tmp_path / "self")
        c.sample()
        with pytest.raises(RuntimeError, match="mountstats"):
            list(c.collect())
    finally:
        c.close()
