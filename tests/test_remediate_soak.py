"""The remediation service's chaos soak (benchmarks/remediate_soak.py) in short: 12 real slurmds, a real
slurmctld and Alertmanager, the service enforcing with job recovery on, 90 s of alert episodes and of
batch jobs failing on cue (one of each kind first: jobs the service recovers, a chain it holds and a
person releases, jobs it must never requeue), every fault at least once (the service killed,
Alertmanager restarted with its state lost, slurmctld stopped, scheduler calls and job listings failing
and timing out, webhooks dropped, a reboot that never completes, an operator resuming a node mid-reset,
one draining a node in the service's care), then every alert resolved, every job cancelled and the
cluster left to settle. About 2 minutes on 2 cores. Seed 1 fails its 7th scheduler call, times out its
45th, stalls its 7th job listing and drops its 7th webhook, so every fault kind comes early."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from tests.slurm import skip_without_slurm

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from remediate_soak import run_soak  # noqa: E402
from remediate_soak_bench.driver import Settings  # noqa: E402
from remediate_soak_bench.jobs import MIX  # noqa: E402


# The faults fall on a compressed clock: a machine busy with other tests would move them.
@pytest.mark.alone
def test_a_short_soak_doubles_nothing_leaves_operators_nodes_alone_keeps_the_budgets_and_strands_nothing(
        tmp_path: Path) -> None:
    skip_without_slurm()
    if shutil.which("prometheus-alertmanager") is None:
        pytest.skip("prometheus-alertmanager not installed (scripts/install-deps.sh --demo installs it)")
    summary = run_soak(Settings(tmp_path, nodes=12, minutes=1.5, seed=1, episodes_per_minute=6,
                                jobs_per_minute=12))["summary"]
    jobs = summary["jobs"]
    assert all(summary["faults_injected"].values()), summary["faults_injected"]
    assert summary["episodes"]["taken_by_the_service"] >= 3, summary["episodes"]
    assert set(jobs["submitted"]) == {kind for _, kind in MIX}, jobs
    assert jobs["abnormal_ends"] >= 8 and sum(jobs["requeues_by_branch"].values()) >= 4, jobs
    assert jobs["cancelled_by_a_person"] >= 1, jobs
    assert not summary["failed"], (summary["failed"], summary["evidence"], jobs)
