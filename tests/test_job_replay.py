"""The job recovery replay (fleet/jobreplay.py): gpunode-remediate's job recovery against a fixed 10-minute
retry on the shipped scenarios, each run once (a few seconds) and shared by the tests."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from fleet import jobreplay
from fleet.jobcluster import build
from fleet.jobreplay import Result, gaps, healthy_excluded, lemon_attempts, replay, table
from gpunode_common.config import ConfigError

ROOT = Path(__file__).resolve().parent.parent
CHAINS, CRASH_LOOP = jobreplay.SHIPPED
LONG_CHAIN = "c07-long"  # trained 25.4 h, then failed 30 times in a row under the fixed retry
# The lemon under the 1,024-GPU job is out within this many attempts placed on it.
LEMON_BOUND = 12


@pytest.fixture(scope="module")
def runs() -> dict[str, dict[str, Result]]:
    return {name: replay(jobreplay.load(name)) for name in jobreplay.SHIPPED}


def attempts(r: Result, job: str) -> list[jobreplay.Attempt]:
    return [a for a in r.attempts if a.job == job]


def test_the_fixed_retry_makes_the_reports_chains(runs: dict[str, dict[str, Result]]) -> None:
    """The Lablup B200 operations report's numbers: 12 chains, 73 attempts, 4 recovered, one chain that
    trained 25.4 h and then failed 30 times in a row."""
    fixed = runs[CHAINS]["fixed"]
    assert len(fixed.attempts) == 73
    assert len({a.job for a in fixed.attempts}) == 12
    assert sum(a.outcome == "completed" for a in fixed.attempts) == 4
    first, *rest = attempts(fixed, LONG_CHAIN)
    assert first.outcome == "failed" and first.end - first.start == pytest.approx(25.4 * 3600)
    assert len(rest) == 30 and all(a.outcome == "failed" for a in rest)
    assert all(g == pytest.approx(600, abs=30) for _a, g in gaps(fixed))  # 10 minutes, to the next backfill pass


@pytest.mark.parametrize("name", jobreplay.SHIPPED)
def test_ours_spends_fewer_gpu_hours_on_failed_attempts(runs: dict[str, dict[str, Result]], name: str) -> None:
    fixed, ours = runs[name]["fixed"], runs[name]["ours"]
    assert jobreplay.failed_gpu_hours(ours) < 0.7 * jobreplay.failed_gpu_hours(fixed)
    assert jobreplay.failed_gpu_hours(ours, retries=True) < 0.5 * jobreplay.failed_gpu_hours(fixed, retries=True)


def test_the_30_failure_chain_is_held_at_its_fourth_attempt(runs: dict[str, dict[str, Result]]) -> None:
    ours = runs[CHAINS]["ours"]
    assert ours.holds[LONG_CHAIN] == 4
    chain = attempts(ours, LONG_CHAIN)
    assert len(chain) == 4
    assert [ours.branches[(LONG_CHAIN, a.index)] for a in chain] == ["backoff", "backoff", "backoff", "held"]
    # The backoff: 10, 20, 40 minutes between its failed attempts (to the next backfill pass).
    waits = [b.start - a.end for a, b in itertools.pairwise(chain)]
    assert waits == pytest.approx([600, 1200, 2400], abs=30 + jobreplay.TICK)


def test_an_application_fault_is_requeued_at_once(runs: dict[str, dict[str, Result]]) -> None:
    ours = {a.job: g for a, g in gaps(runs[CHAINS]["ours"]) if a.cause == "app"}
    fixed = {a.job: g for a, g in gaps(runs[CHAINS]["fixed"]) if a.cause == "app"}
    assert set(ours) == set(fixed) == {"c01-xid94", "c03-xid31", "c08-xid13"}
    # The alert reaches the service 60-90 s after the Xid; the job is requeued on it and starts at once.
    assert all(g < 120 for g in ours.values()), ours
    assert all(g >= jobreplay.FIXED_DELAY for g in fixed.values()), fixed


def test_a_node_fault_requeues_without_the_node(runs: dict[str, dict[str, Result]]) -> None:
    """Xid 79: the retry runs at once on the other nodes; the fixed retry goes back to the lost GPU
    until a person reboots the node."""
    first, second = attempts(runs[CHAINS]["ours"], "c05-xid79")
    assert "gpu033" in first.nodes and "gpu033" not in second.nodes
    assert second.outcome == "completed" and second.start - first.end < 120
    fixed = attempts(runs[CHAINS]["fixed"], "c05-xid79")
    assert len(fixed) == 7 and all("gpu033" in a.nodes for a in fixed)


@pytest.mark.parametrize("name", jobreplay.SHIPPED)
def test_no_healthy_node_is_excluded_or_drained(runs: dict[str, dict[str, Result]], name: str) -> None:
    ours = runs[name]["ours"]
    assert healthy_excluded(ours) == set()
    assert ours.excluded or name == CRASH_LOOP  # the Xid 79 chain excluded its node: the check is not vacuous


def test_the_fixed_retry_requeues_the_big_job_onto_the_lemon(runs: dict[str, dict[str, Result]]) -> None:
    """Meta's crash loop: the 1,024-GPU job requeued 35 times onto the same bad node; gpunode-remediate
    holds it at its fourth failure."""
    fixed, ours = runs[CRASH_LOOP]["fixed"], runs[CRASH_LOOP]["ours"]
    big = attempts(fixed, "big-1024")
    assert len(big) == 36 and sum("gpu077" in a.nodes for a in big) >= 34
    assert lemon_attempts(fixed, "gpu077")[1] is None
    assert ours.holds["big-1024"] == 4


def test_the_lemon_is_out_within_a_few_attempts(runs: dict[str, dict[str, Result]]) -> None:
    count, out = lemon_attempts(runs[CRASH_LOOP]["ours"], "gpu077")
    assert out is not None and count <= LEMON_BOUND


def test_the_docs_show_the_replay_as_it_prints(runs: dict[str, dict[str, Result]]) -> None:
    docs = (ROOT / "docs" / "remediation.md").read_text()
    assert "python -m fleet.jobreplay --all" in docs
    for name in jobreplay.SHIPPED:
        assert table(jobreplay.load(name), runs[name]) in docs, f"docs/remediation.md: {name}'s table is stale"


def test_the_replay_is_the_same_every_time(runs: dict[str, dict[str, Result]]) -> None:
    sc = jobreplay.load(CHAINS)
    assert table(sc, replay(sc)) == table(sc, runs[CHAINS])


def test_a_scenario_with_a_wrong_key_names_it() -> None:
    with pytest.raises(ConfigError, match="unknown key"):
        build({"name": "x", "nodes": 4, "duration": "1d", "jobs": [{"name": "a", "nodes": 2, "work": "1h",
                                                                   "gpus": 8}]})
    with pytest.raises(ConfigError, match="no such node"):
        build({"name": "x", "nodes": 4, "duration": "1d", "faults": [{"kind": "lemon", "node": "gpu009"}]})
