"""The report's storage section (report/storage.py, report/markdown.py): per phase and operation
the requests per node and where their time went, and what to change only where the slots are
the bottleneck."""

from __future__ import annotations

import numpy as np
import pytest

from gpunode_report import markdown, storage

NAN = np.nan


def _totals(queue: float, rtt: float, link: float) -> dict[int, storage.Totals]:
    """Two nodes, six samples: the first two saving (WRITE), the next three loading (READ)."""
    phase = np.array([1, 1, 2, 2, 2, 0])
    totals = {code: storage.Totals() for code in storage.PHASES}
    for op, rates in (("WRITE", [600.0, 300.0, 0.5, 0.5, 0.5, 0.5]), ("READ", [2.0, 2.0, 4000.0, 5000.0, 4500.0, 2.0])):
        for _node in range(2):
            ops = np.array(rates)
            storage.accumulate(totals, phase, op, "operations", ops)
            storage.accumulate(totals, phase, op, "queue", ops * queue)
            storage.accumulate(totals, phase, op, "rtt", ops * rtt)
            storage.accumulate(totals, phase, op, "execute", ops * (queue + rtt))
    for code, t in totals.items():
        t.samples = 2 * int((phase == code).sum())
        t.link = [link] * t.samples
    return totals


def test_requests_per_node_and_second_mean_and_peak() -> None:
    out = storage.summary(_totals(1.5, 0.126, 0.014), 0.9, 0.2, 0.5)
    write = out["save"]["operations"]["WRITE"]  # type: ignore[index]
    assert write["requests_per_second"] == pytest.approx(450) and write["requests_per_second_peak"] == 600
    read = out["load"]["operations"]["READ"]  # type: ignore[index]
    assert read["requests_per_second"] == pytest.approx(4500) and read["requests_per_second_peak"] == 5000
    assert write["slot_wait_fraction"] == pytest.approx(1.5 / 1.626)
    assert out["slots_bottleneck"] == ["save", "load"]


def _section(queue: float, rtt: float, link: float) -> str:
    st = storage.summary(_totals(queue, rtt, link), 0.9, 0.2, 0.5)
    return "\n".join(markdown._storage(st, 30.0, {}))


def test_where_slots_hold_requests_back_the_report_says_what_to_change() -> None:
    text = _section(1.495, 0.126, 0.014)
    assert "RPC slot table is the bottleneck during saves and loads" in text
    assert "a save's WRITEs waited 92 % of their time for a slot while the link ran at 1.4 %" in text
    assert "A faster link would not help" in text
    for advice in ("sunrpc.tcp_max_slot_table_entries", "nconnect=", "server answer faster"):
        assert advice in text
    assert "| save | WRITE | 54,000 | 450 (600) | 1621.0 ms | 1495.0 ms | 126.0 ms | 92.2 % |" in text


def test_where_the_server_takes_the_time_the_report_says_nothing_of_slots() -> None:
    text = _section(0.005, 0.110, 0.038)
    assert "slot table is the bottleneck" not in text and "nconnect" not in text and "faster link" not in text
    assert "During saves a WRITE spent 96 % of its time on the network and in the server" in text
    # a busy link: slot wait dominates, but the link may be what limits; no advice on slots
    busy = _section(1.495, 0.126, 0.5)
    assert "bottleneck" not in busy and "nconnect" not in busy
