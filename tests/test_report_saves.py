"""A save's duration in the report: from the nodes' own clocks where they keep one, else the
estimate from the samples (report/goodput.py)."""

from __future__ import annotations

import numpy as np
import pytest

from gpunode_report import goodput

NAN = np.nan


def test_a_counter_increase_reads_a_fall_as_a_restart() -> None:
    assert goodput.increase(np.array([5.0, NAN, 7.0, 12.0])) == 7.0
    assert goodput.increase(np.array([40.0, 3.0, 10.0])) == 10.0  # restarted at 0, then 3 and 7 more
    assert goodput.increase(np.array([NAN, 4.0, NAN])) is None


def test_each_save_is_the_median_of_its_nodes_clocks_short_of_its_neighbours() -> None:
    # grid samples 0..19; saves in samples 5 and 12-13 (the job's phase); three nodes' clocks
    took = goodput.AttemptTime(saves=[(5, 5), (12, 13)], save_seconds=[0.0, 30.0])
    clocks = [np.array([0.0] * 5 + [12.0] * 7 + [60.0] * 8),
              np.array([0.0] * 5 + [13.0] * 7 + [62.0] * 8),
              np.array([NAN] * 20)]  # an older exporter: no clock
    goodput.time_saves(took, clocks)
    assert took.save_seconds == [12.5, 48.5] and took.timed == 2
    assert goodput.checkpoint([took], 30.0, 7200.0)["save_clock"] == "node"


def test_without_clocks_the_estimate_stays_and_the_report_says_so() -> None:
    took = goodput.AttemptTime(saves=[(5, 5), (12, 13)], save_seconds=[0.0, 30.0])
    goodput.time_saves(took, [np.full(20, NAN)])
    assert took.save_seconds == [0.0, 30.0] and took.timed == 0
    found = goodput.checkpoint([took], 30.0, 7200.0)
    assert found["save_clock"] == "scrapes" and found["save_seconds"] == pytest.approx(15.0)
    assert goodput.checkpoint([goodput.AttemptTime()], 30.0, 7200.0)["save_clock"] is None
