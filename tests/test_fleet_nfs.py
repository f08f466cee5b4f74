"""The simulated NFS client (fleet/nfs.py): slot waits from slots, service times and arrivals, and
the older fixed client left as it was for the scenarios without `storage:`."""

from __future__ import annotations

import numpy as np
import pytest

from fleet import nfs, scenario
from fleet.simulate import Fleet
from gpunode_common.config import ConfigError

STEP = 30.0
LABLUP = nfs.Storage(slots=128, write_rtt=0.126, read_rtt=0.0273, rsize=1 << 19, flush=3.3e9, reads=276)


def test_a_flush_drains_in_waves_of_the_slots() -> None:
    assert nfs.flush_wait(128, 128, 0.1) == 0.0  # one wave: every request finds a slot
    assert nfs.flush_wait(256, 128, 0.1) == pytest.approx(0.05)  # half wait one rtt
    assert nfs.flush_wait(200, 128, 0.1) == pytest.approx(72 * 0.1 / 200)
    # (N/S - 1) rtt / 2 for whole waves: 25 waves of 128 at 126 ms
    assert nfs.flush_wait(25 * 128, 128, 0.126) == pytest.approx(24 * 0.126 / 2)


def _one(storage: nfs.Storage, save_bytes: float = 0.0, load: bool = False) -> nfs.Client:
    save = np.array([save_bytes > 0])
    return nfs.mechanism(storage, STEP, save, np.array([load]), np.array([False]), np.array([save_bytes]))


def test_a_save_in_one_sample_waits_for_slots_and_leaves_the_link_idle() -> None:
    c = _one(LABLUP, save_bytes=20.55e9)
    writes = 20.55e9 / (1 << 20)
    assert c.ops["WRITE"][0] == pytest.approx(writes / STEP + nfs.IDLE["WRITE"])
    assert c.ops["WRITE"][0] == pytest.approx(653, abs=1)
    assert c.queue_ms["WRITE"][0] == pytest.approx(1486, abs=5)  # 3,147 WRITEs a flush: 25 waves
    assert c.rtt_ms["WRITE"][0] == pytest.approx(126)
    # the flushes drain in 19.3 s of the sample: 128 slots at 126 ms, the time they take whatever waits
    assert writes / (128 / 0.126) < STEP
    # nearly every send finds the slots full; the other requests wait behind the backlog too
    assert c.in_flight[0] / c.sends[0] / 128 > 0.9 and c.backlog[0] > 0
    assert 0 < c.queue_ms["GETATTR"][0] < c.queue_ms["WRITE"][0]
    assert c.bytes("sent")[0] / LABLUP.link == pytest.approx(0.0274, abs=0.0005)


def test_a_small_save_never_fills_the_slots() -> None:
    c = _one(nfs.Storage(flush=100e6), save_bytes=20.55e9)  # flushes of 96 WRITEs: one wave each
    assert c.queue_ms["WRITE"][0] == 0.0 and c.backlog[0] == 0.0


def test_a_load_keeps_the_slots_full_at_the_rate_littles_law_allows() -> None:
    c = _one(LABLUP, load=True)
    assert c.ops["READ"][0] == pytest.approx(128 / 0.0273)  # in flight / time on the wire
    assert c.queue_ms["READ"][0] == pytest.approx((276 / 128 - 1) * 27.3)
    assert c.in_flight[0] / c.sends[0] == pytest.approx(128) and c.backlog[0] / c.sends[0] == pytest.approx(148)
    assert c.bytes("received")[0] / LABLUP.link == pytest.approx(0.098, abs=0.001)
    # fewer READs outstanding than slots: no wait, and the rate follows them
    light = _one(nfs.Storage(reads=64, read_rtt=0.0273), load=True)
    assert light.queue_ms["READ"][0] == 0.0 and light.ops["READ"][0] == pytest.approx(64 / 0.0273)
    # nconnect=2: two slot tables, each with half the reads, twice the rate and no wait
    two = _one(nfs.Storage(reads=200, read_rtt=0.0273, transports=2), load=True)
    assert two.queue_ms["READ"][0] == 0.0 and two.ops["READ"][0] == pytest.approx(200 / 0.0273)
    assert nfs.saturates_loads(LABLUP) and not nfs.saturates_loads(two_storage := nfs.Storage(reads=200, transports=2))
    assert not nfs.saturates_loads(None) and two_storage.slots == 128


def test_the_checkpoints_scenario_plays_the_operations_reports_storage() -> None:
    sc = scenario.load("checkpoints")
    assert sc.storage is not None and sc.storage.published == "lablup-table-13"
    fleet = Fleet(sc, 0.0)
    # each load fills the slot table for its 33 minutes: the truth NfsSlotTableSaturated is scored on
    loads = [t for t in fleet.truth() if t.kind == "nfs_saturation"]
    assert len(loads) == 6 * 4 and all(t.end - t.start == 33 * 60 + 7200 for t in loads)
    # the storage link carries NFS alone: idle between saves and loads
    series = {(s.name, dict(s.labels).get("op", "")): s.values for s in fleet.series(range(1))}
    sent = np.diff(series[("node_network_transmit_bytes_total", "")]) / sc.step
    assert np.median(sent) / 2.5e10 < 1e-4 and sent.max() / 2.5e10 == pytest.approx(0.0274, abs=0.002)


def test_scenarios_without_storage_keep_the_fixed_client() -> None:
    sc = scenario.load("selftest")
    assert sc.storage is None
    c = nfs.client(None, STEP, np.array([True, False]), np.array([False, True]), np.array([False, False]),
                   np.array([20.55e9, 0.0]))
    assert list(c.queue_ms["WRITE"]) == [5.0, 1.0] and list(c.rtt_ms["READ"]) == [120.0, 120.0]
    assert list(c.in_flight / c.sends) == [40.0, 30.0]


@pytest.mark.parametrize(("data", "message"), [
    ({"slot": 128}, "unknown key 'slot'"), ({"slots": "many"}, "want numbers"), ({"reads": 0}, "above 0"),
    ({"published": "elsewhere"}, "storage.published")])
def test_a_storage_key_is_checked(data: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        nfs.parse(data)
    parsed = nfs.parse({"link_gbps": 100, "write_rtt_ms": 50})
    assert parsed.link == 12.5e9 and parsed.write_rtt == 0.05 and parsed.slots == 128
