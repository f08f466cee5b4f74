#!/usr/bin/env python3
"""gpunode-remediate under chaos, on real parts, for minutes: does it ever double an action, touch an
operator's node, exceed its budget, or leave a node stuck? With job recovery on: does it ever requeue a
job twice for one end, requeue a job it may not, let a retry chain run past its limit, or run a job on a
node it excluded?

    .venv/bin/python benchmarks/remediate_soak.py [--nodes 30] [--minutes 20] [--seed 1]   (root)

A real Slurm 22.05 cluster (demo/slurm.py: munged, slurmctld, a `slurmd -N NAME` per node), Debian's
Alertmanager with the shipped alertmanager/alertmanager.yml (its remediation route posting through a
proxy to the service, group_wait and group_interval 1 s), and `gpunode-remediate serve` enforcing, on
a compressed clock: quiet_period 4 s, interval 1 s, alertmanager {interval 1 s, stale_after 5 s},
idle_timeout 40 s, reboot_timeout 30 s, budget 25 % of the nodes per 40 s window, the health check
off, reset_command a script logging `TIME NODE GPUS` lines; job recovery on (jobs: select name train-.*,
culprit_wait 2 s, backoff [3 s, 6 s], max_attempts 4, window 1 h, lemon 3 jobs in 3 min, budget 1.25
times the requeues the job mix asks for in a 40 s window: 12 at 12 jobs a minute), Slurm's backfill
pass every 2 s.

A driver plays alert episodes (firing, resolved 6-30 s later; a fifth of the drains and resets are
false alarms of 2-4 s) into Alertmanager's API as Prometheus does (every firing alert again every
2 s, a resolved one for 15 s), in the mix of the default rules (Xid 79 -> reboot, RESET_GPU and
GpuRowRemapPending -> reset, GpuNvLinkDegraded and GpuNodeClockThrottled -> drain,
GpuRowRemapFailure -> hold, GpuXidApplicationFault -> nothing), half the resets and reboots on a
node running an sbatch job (a tenth of those jobs outlasting idle_timeout). A stream of batch jobs
(remediate_soak_bench/jobs.py; nodes / 2.5 a minute, 1-2 nodes, seconds an attempt) fails on cue, by
$SLURM_RESTART_COUNT: `sbatch --requeue` jobs that succeed after 1-2 failures, that keep failing until
the service holds their chain, that fail under GpuXidApplicationFault or a node-fault alert posted on
one of their nodes while they run; and jobs the service must never requeue: --no-requeue, cancelled by
a person, submitted --hold, completed, named notebook-N. People: one closes an open circuit breaker 8 s
after it opened, one resumes a held node 15 s after it was held (a lemon too), one cancels jobs, one
releases half of the held chains 5 s after they were held.

Faults, at moments drawn from the seed: the service killed with SIGKILL (0.6 a minute) and restarted
on its state file 0.5-3 s later; Alertmanager killed (a run's minutes / 6) and restarted 1-3 s later
with its state lost; slurmctld stopped (minutes / 9) for 3 s a minute of run, 8-60 s; 5 % of scheduler
calls failing (2.5 %) or timing out (2.5 %: half before reaching Slurm, half after it answered),
through the policy's scontrol and squeue (its job listing; not its one-job lookups, see rig.py),
wrappers that log every call; 5 % of webhook deliveries answered 200 and dropped; one node whose
reboot never completes; an operator who resumes a node the service has in reset_wait, and one who
drains a node in its care with their own reason.

Checked from the wrappers' call logs, the reset log, what Slurm showed and the service's log
(remediate_soak_bench/checks.py defines each): no doubled action, no operator's node touched, the
budget never exceeded, no action without a cause, the stuck reboot held, and at the end (every alert
resolved, every job cancelled, the cluster settled) no node stuck; from the jobs' own log of every
attempt, too: no doubled requeue, no requeue of a job it may not requeue, no chain past its limit, no
attempt on a node its ExcNodeList named, the job budget never exceeded. Exit 1 when a check fails; the
run's directory (logs, state file) is then kept. Results: benchmarks/results/remediate_soak.json.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from benchlib import cpu_times, end_of_run, finish, git_commit, machine_info, source_fingerprint
from remediate_soak_bench.driver import Run, Settings, soak
from remediate_soak_bench.rig import source_digest
from remediate_soak_bench.summary import summarize

from demo.slurm import slurm_unavailable

ROOT = Path(__file__).resolve().parent.parent


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=30,
                        help="Slurm nodes, each a real slurmd (default 30; at least 10); the last one's reboot "
                        "never completes")
    parser.add_argument("--minutes", type=float, default=20.0,
                        help="how long the driver plays episodes and injects faults, before the settling "
                        "(default 20); the numbers of faults scale with it")
    parser.add_argument("--seed", type=int, default=1,
                        help="seeds the episodes, the faults' moments, the failing scheduler calls and the "
                        "dropped webhooks (default 1)")
    parser.add_argument("--episodes-per-minute", type=float, default=0.0,
                        help="how often a new alert episode starts, on average (default: a fifth of --nodes)")
    parser.add_argument("--jobs-per-minute", type=float, default=0.0,
                        help="how often a new batch job is submitted, on average (default: --nodes / 2.5)")
    parser.add_argument("--workdir", type=Path,
                        help="where the cluster, the logs and the state file go (default: a temporary directory, "
                        "removed unless a check failed)")
    parser.add_argument("--output", type=Path, default=ROOT / "benchmarks" / "results" / "remediate_soak.json",
                        help="the results as JSON (default benchmarks/results/remediate_soak.json)")
    args = parser.parse_args(argv)
    if args.nodes < 10:
        parser.error("--nodes: at least 10 (the scripted parts take three, the budget needs a few)")
    if args.minutes < 1:
        parser.error("--minutes: at least 1")
    return args


def episode_rows(run: Run) -> list[dict[str, object]]:
    return [{"id": e.id, "node": e.node, "alert": e.alertname, "labels": e.labels, "action": e.action,
             "role": e.role, "false_alarm": e.false_alarm, "job_seconds": round(e.job_seconds),
             "fired_at": round(e.fired_at, 3), "resolved_at": e.resolved_at and round(e.resolved_at, 3),
             "closed_at": e.closed_at and round(e.closed_at, 3), "about_job": e.about_job, "notes": e.notes}
            for e in run.episodes]


def job_rows(run: Run) -> list[dict[str, object]]:
    return [{"id": j.id, "name": j.name, "kind": j.kind, "nodes": j.nodes, "seconds": round(j.seconds, 1),
             "fails": j.fails, "code": j.code, "alerts": list(j.alerts), "release": j.release,
             "submitted_at": round(j.submitted_at, 3), "notes": j.notes,
             "seen": [[round(t, 3), *rest] for t, *rest in run.job_seen.get(j.id, [])]} for j in run.jobs]


def report(summary: dict[str, object]) -> None:
    faults = ", ".join(f"{k} {v}" for k, v in summary["faults_injected"].items())
    ret = summary["time_to_return_s"]
    print(f"episodes played: {summary['episodes']['played']} {summary['episodes']['by_action']}")
    print(f"faults injected: {faults}")
    print(f"doubled actions {summary['doubled_actions']}, operator nodes touched {summary['operator_nodes_touched']}, "
          f"budget exceedances {summary['budget_exceedances']}, actions without cause "
          f"{summary['actions_without_cause']}, stuck nodes {summary['stuck_nodes']}")
    print(f"end state: {summary['end_state']}; time to return p50 {ret['p50']} s, p90 {ret['p90']} s "
          f"({ret['returns']} returns); healthy node-hours taken {summary['healthy_node_hours_taken']}, "
          f"as lemons {summary['lemon_node_hours']}")
    jobs = summary["jobs"]
    print(f"jobs submitted: {sum(jobs['submitted'].values())} {jobs['submitted']}; {jobs['attempts']} attempts, "
          f"{jobs['abnormal_ends']} abnormal ends")
    print(f"requeues by branch: {jobs['requeues_by_branch']}; chains held {jobs['chains_held']} (released by a "
          f"person {jobs['held_chains_released_by_a_person']}); cancelled by a person {jobs['cancelled_by_a_person']}; "
          f"lemon holds {jobs['lemon_holds']}; job breaker openings {jobs['job_breaker_openings']}")
    print(f"doubled requeues {summary['doubled_requeues']}, forbidden requeues {summary['forbidden_requeues']}, "
          f"chains past the limit {summary['chains_past_limit']}, runs on an excluded node "
          f"{summary['excluded_node_runs']}, job budget exceedances {summary['job_budget_exceedances']} "
          f"(chains miscounted {summary['chains_miscounted']})")
    for name, ok in summary["checks"].items():
        print(f"  {'PASS' if ok else 'FAIL'}  {name}")
    for name, lines in summary["evidence"].items():
        for line in lines[:10]:
            print(f"    {name}: {line}")


def run_soak(settings: Settings) -> dict[str, object]:
    """The soak and its figures: for this script and for tests/test_remediate_soak.py."""
    run = soak(settings)
    return {"settings": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(settings).items()},
            "policy": run.policy, "remediate_source_sha256": source_digest(settings.base / "source"),
            "summary": summarize(run), "faults": [[round(t, 3), kind, said] for t, kind, said in run.faults],
            "episodes": episode_rows(run), "jobs": job_rows(run),
            "wall": {"driven_s": round(run.driven - run.started, 1), "settled_s": round(run.finished - run.driven, 1)}}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if reason := slurm_unavailable():
        sys.exit(f"remediate soak: {reason}")
    started, cpu_before = time.monotonic(), cpu_times()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="remediate-soak-"))
    results: dict[str, object] = {"machine": machine_info(), "commit": git_commit(ROOT),
                                  "exporter_source_sha256": source_fingerprint()}
    results |= run_soak(Settings(workdir, args.nodes, args.minutes, args.seed, args.episodes_per_minute,
                                 args.jobs_per_minute))
    summary = results["summary"]
    report(summary)
    end_of_run(results, started, cpu_before, ROOT)
    finish(results, args.output, f"{args.nodes} slurmd, seed {args.seed}")
    if summary["failed"]:
        print(f"FAILED: {', '.join(summary['failed'])}; logs and state in {workdir}")
        return 1
    if args.workdir is None:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
