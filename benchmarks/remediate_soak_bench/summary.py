"""The soak's results: every check of checks.py (the nodes) and jobchecks.py (the jobs) on one run,
with its figures and the evidence of each failed check."""

from __future__ import annotations

from collections import Counter
from typing import Any

from benchlib import percentile

from remediate_soak_bench.checks import (
    Story,
    breaker_after_controller_start,
    budget_exceeded,
    doubled,
    end_state,
    lemon_hours,
    read_calls,
    returns,
    stale_while_firing,
    touched,
    uncaused,
)
from remediate_soak_bench.driver import Run
from remediate_soak_bench.jobchecks import (
    chains_past_limit,
    doubled_requeues,
    excluded_runs,
    forbidden_requeues,
    job_budget_exceeded,
    job_figures,
    job_notes,
    miscounted_chains,
)


def summarize(run: Run) -> dict[str, Any]:
    story = Story(run)
    every = read_calls(run.calls)
    squeue = read_calls(run.squeue_calls)
    taken = returns(story)
    back = [b - t for t, b in taken.values() if b is not None]
    by_id = {e.id: e for e in run.episodes}
    healthy = sum((b or run.finished) - t for eid, (t, b) in taken.items()
                  if by_id[eid].false_alarm or by_id[eid].action == "none")
    people = Counter((run.roles.get(node, "crew"), what) for _, node, what in run.person_took)
    faults = {"service_kills": sum(k == "service_kill" for _, k, _ in run.faults),
              "alertmanager_restarts": sum(k == "alertmanager_restart" for _, k, _ in run.faults),
              "controller_stops": sum(k == "controller_stop" for _, k, _ in run.faults),
              "scheduler_calls_failed": sum(c.fate == "fail" for c in every),
              "scheduler_calls_timed_out": sum(c.fate in ("hang", "late") for c in every),
              "job_listings_failed_or_timed_out": sum(c.fate != "call" for c in squeue),
              "webhooks_dropped": run.counters.get("webhooks_dropped", 0),
              "stuck_reboots": sum(e.role == "stuck_reboot" and e.fired_at > 0 for e in run.episodes),
              "operator_resumes_mid_reset": people[("operator_resume", "resume")],
              "operator_drains": people[("operator_drain", "drain")]}
    states = end_state(story)
    stuck_node = next(n for n, role in run.roles.items() if role == "stuck_reboot")
    found = {"doubled_actions": doubled(story), "operator_nodes_touched": touched(story),
             "budget_exceedances": budget_exceeded(story), "stuck_nodes": states["stuck"],
             "actions_without_cause": uncaused(story), "doubled_requeues": doubled_requeues(story),
             "forbidden_requeues": forbidden_requeues(story), "chains_past_limit": chains_past_limit(story),
             "excluded_node_runs": excluded_runs(story), "job_budget_exceedances": job_budget_exceeded(story),
             "chains_miscounted": miscounted_chains(story)}
    checks = {"no_doubled_actions": not found["doubled_actions"],
              "operator_nodes_untouched": not found["operator_nodes_touched"],
              "budget_never_exceeded": not found["budget_exceedances"], "no_stuck_nodes": not states["stuck"],
              "no_action_without_cause": not found["actions_without_cause"],
              "stuck_reboot_held": run.final.get(stuck_node, ("", ""))[1].startswith("gpunode: hold"),
              "no_doubled_requeues": not found["doubled_requeues"],
              "no_forbidden_requeues": not found["forbidden_requeues"],
              "no_chain_past_its_limit": not found["chains_past_limit"],
              "no_run_on_an_excluded_node": not found["excluded_node_runs"],
              "job_budget_never_exceeded": not found["job_budget_exceedances"],
              "every_fault_injected": all(faults.values()),
              "service_never_died_by_itself": not any(k == "service_died" for _, k, _ in run.faults)}
    episodes = [e for e in run.episodes if e.fired_at]
    return {
        "episodes": {"played": len(episodes), "by_action": dict(Counter(e.action for e in episodes)),
                     "false_alarms": sum(e.false_alarm for e in episodes),
                     "with_a_job": sum(bool(e.job_seconds) for e in episodes),
                     "taken_by_the_service": len(taken), "returned_by_the_service": len(back)},
        "faults_injected": faults,
        "people": {"crew_resumed_held_nodes": people[("crew", "resume")],
                   "breaker_resets": len(run.breaker_resets)},
        "doubled_actions": len(found["doubled_actions"]),
        "operator_nodes_touched": len(found["operator_nodes_touched"]),
        "budget_exceedances": len(found["budget_exceedances"]),
        "actions_without_cause": len(found["actions_without_cause"]),
        "stuck_nodes": len(states["stuck"]),
        "jobs": job_figures(story),
        "job_notes": job_notes(story),
        "doubled_requeues": len(found["doubled_requeues"]),
        "forbidden_requeues": len(found["forbidden_requeues"]),
        "chains_past_limit": len(found["chains_past_limit"]),
        "excluded_node_runs": len(found["excluded_node_runs"]),
        "job_budget_exceedances": len(found["job_budget_exceedances"]),
        "chains_miscounted": len(found["chains_miscounted"]),
        "end_state": {k: len(v) for k, v in states.items()},
        "time_to_return_s": {"p50": round(percentile(back, 0.5), 1) if back else None,
                             "p90": round(percentile(back, 0.9), 1) if back else None, "returns": len(back)},
        "healthy_node_hours_taken": round(healthy / 3600, 4),
        "lemon_node_hours": round(lemon_hours(story), 4),
        "scheduler_calls": len(every), "service_actions": dict(Counter(c.kind for c in story.calls if c.reached_slurm)),
        "gpu_resets": len(story.resets),
        "breaker_opened": [f"{at:.3f} {said.split(';')[0]}" for at, said in story.log
                           if said.startswith("circuit breaker opened")],
        "breaker_opened_after_controller_start": breaker_after_controller_start(story),
        # A pass that read the breaker open, then (a call of it stalled) found it closed by a person's
        # `breaker reset` meanwhile, and opened it again with no new cause.
        "breaker_reopened_without_cause": [f"{at:.3f} {said.split(';')[0]}" for at, said in story.log
                                           if said.startswith("circuit breaker opened: circuit breaker open;")],
        "alerts_taken_as_resolved_while_firing": stale_while_firing(story),
        "service_tracebacks": sum("Traceback" in line for line in
                                  run.service_log.read_text(errors="replace").splitlines()),
        "counters": run.counters,
        "checks": checks,
        "failed": sorted(name for name, ok in checks.items() if not ok),
        "evidence": found,
    }
