"""The soak's job checks and figures: doubled, forbidden and past-the-limit requeues, runs on an
excluded node, the job budget (checks.py reads the logs into a Story)."""


from __future__ import annotations

from collections import Counter
from typing import Any

from gpunode_remediate.scheduler.slurm import expand_hostlist
from remediate_soak_bench.checks import COMMENT, LEMON, STAMP_SLACK, Story, read_calls
from remediate_soak_bench.jobs import NEVER, RECOVERED, End


def _latest(events: list[tuple[float, ...]], at: float) -> tuple[float, ...] | None:
    before = [e for e in events if e[0] < at]
    return before[-1] if before else None


def doubled_requeues(story: Story) -> list[str]:
    found = []
    for job in story.run.jobs:
        attempts, ends = story.attempts.get(job.id, []), story.ends[job.id]
        # Every end, normal or abnormal: a requeuehold answers the latest one before it.
        every = sorted([(a.ended, a.attempt, a.code) for a in attempts if a.ended is not None]
                       + [(at, n, -1) for at, n, _ in ends if not any(a.attempt == n and a.ended for a in attempts)])
        answered: dict[int, float] = {}
        for call in (c for c in story.job_calls if c.job == job.id and c.argv[0] == "requeuehold" and c.effective):
            latest = _latest(every, call.at)
            if latest is None or latest[2] == 0:
                continue  # forbidden_requeues says it
            if latest[1] in answered:
                found.append(f"job {job.id} ({job.kind}): requeuehold #{call.seq} at {call.at:.3f} answers attempt "
                             f"{latest[1]}'s end at {latest[0]:.3f}, which the requeuehold at "
                             f"{answered[latest[1]]:.3f} answered")
            answered[latest[1]] = call.at
        # Slurm's records count too: an attempt that failed before its script's first line logged nothing.
        seen = story.run.job_seen.get(job.id, [])
        numbers = sorted({a.attempt for a in attempts} | {restarts for _, _, _, restarts, *_ in seen})
        if numbers != list(range(len(numbers))):
            found.append(f"job {job.id} ({job.kind}): attempts {numbers}: RestartCnt skipped a number")
        for a in attempts[1:]:
            before = sum(1 for at, _, _ in ends if at < a.started)
            if before < a.attempt:
                found.append(f"job {job.id} ({job.kind}): attempt {a.attempt} began at {a.started:.3f} after "
                             f"{before} abnormal ends")
        shown = 0
        for at, state, _, restarts, *_ in seen:
            before = sum(1 for end, _, _ in ends if end < at)
            if restarts > before and restarts > shown:
                shown = restarts
                found.append(f"job {job.id} ({job.kind}): RestartCnt {restarts} ({state}) at {at:.3f} after "
                             f"{before} abnormal ends")
    return found


def forbidden_requeues(story: Story) -> list[str]:
    never = {job.id: job.kind for job in story.run.jobs if job.kind in NEVER}
    never |= {e.sleeper: "episode job" for e in story.run.episodes if e.sleeper}
    found = [f"job {c.job} ({never[c.job]}): {' '.join(c.argv[:2])} #{c.seq} at {c.at:.3f} ({c.fate}, exit {c.rc})"
             for c in story.job_calls if c.job in never]
    for job in story.run.jobs:
        if job.kind in NEVER:
            continue
        attempts = story.attempts.get(job.id, [])
        every = sorted([(a.ended, a.attempt, a.code) for a in attempts if a.ended is not None]
                       + [(at, n, -1) for at, n, _ in story.ends[job.id]])
        for call in (c for c in story.job_calls if c.job == job.id and c.argv[0] == "requeuehold" and c.effective):
            latest = _latest(every, call.at)
            if latest is None:
                found.append(f"job {job.id} ({job.kind}): requeuehold #{call.seq} at {call.at:.3f} before any end")
            elif latest[2] == 0:
                found.append(f"job {job.id} ({job.kind}): requeuehold #{call.seq} at {call.at:.3f} after attempt "
                             f"{latest[1]} completed at {latest[0]:.3f}")
    return found


def _segments(story: Story, job_id: str) -> list[tuple[list[End], float]]:
    """A job's abnormal ends by chain: a person's release of its held chain (after max_attempts ends)
    begins the next; each with the time that chain ended (the release, or never)."""
    limit = story.policy.jobs.max_attempts
    releases = sorted(t for t, j, what in story.run.job_people if j == job_id and what == "release")
    chains: list[tuple[list[End], float]] = []
    current: list[End] = []
    for end in story.ends[job_id]:
        while releases and releases[0] < end[0]:
            released = releases.pop(0)
            if len(current) >= limit:
                chains.append((current, released))
                current = []
        current.append(end)
    chains.append((current, releases[0] if releases else float("inf")))
    return chains


def chains_past_limit(story: Story) -> list[str]:
    limit, found = story.policy.jobs.max_attempts, []
    for job in story.run.jobs:
        if job.kind not in RECOVERED:
            continue
        for chain, until in _segments(story, job.id):
            if len(chain) < limit:
                continue
            held_at = chain[limit - 1][0]
            found += [f"job {job.id}: abnormal end {n} of one chain at {at:.3f} (attempt {attempt}), past "
                      f"max_attempts {limit}" for n, (at, attempt, _) in enumerate(chain[limit:], limit + 1)]
            found += [f"job {job.id}: attempt {a.attempt} began at {a.started:.3f}, after its chain's abnormal end "
                      f"{limit} at {held_at:.3f}, with no person's release" for a in story.attempts.get(job.id, [])
                      if held_at < a.started < until]
            found += [f"job {job.id}: the service released it (#{c.seq} at {c.at:.3f}, {c.fate}) after its chain's "
                      f"abnormal end {limit} at {held_at:.3f}" for c in story.job_calls
                      if c.job == job.id and c.argv[0] == "release" and c.reached_slurm and held_at < c.at < until]
    return found


def miscounted_chains(story: Story) -> list[str]:
    """AdminComments whose attempt number differs from the chain's abnormal ends, or held early."""
    limit, found = story.policy.jobs.max_attempts, []
    for job in story.run.jobs:
        chains = _segments(story, job.id)
        for call in (c for c in story.job_calls if c.job == job.id and c.argv[0] == "update" and c.effective):
            match = COMMENT.match(call.value("AdminComment"))
            if match is None:
                continue
            for chain, until in chains:
                position = sum(1 for at, _, _ in chain if at < call.at)
                if position and chain[0][0] < call.at < until:
                    branch, said = match.group(1), int(match.group(2))
                    if said != position or (branch == "held") != (position >= limit):
                        found.append(f"job {job.id}: {branch} attempt {said} at {call.at:.3f}, the chain's abnormal "
                                     f"end {position}")
                    break
    return found


def excluded_runs(story: Story) -> list[str]:
    found = []
    for job in story.run.jobs:
        updates = [c for c in story.job_calls if c.job == job.id and c.argv[0] == "update" and c.effective
                   and c.value("ExcNodeList")]
        for attempt in story.attempts.get(job.id, []):
            given = {n for c in updates if c.at < attempt.started for n in expand_hostlist(c.value("ExcNodeList"))}
            if on := sorted(given & set(attempt.nodes)):
                found.append(f"job {job.id}: attempt {attempt.attempt} began at {attempt.started:.3f} on "
                             f"{','.join(attempt.nodes)}, excluded {','.join(sorted(given))}: {','.join(on)}")
    return found


def job_budget_exceeded(story: Story) -> list[str]:
    window, budget, found = story.policy.budget.window, story.policy.jobs.budget, []
    requeues = [(at, job, attempt) for at, job, attempt, branch in story.decisions if branch != "held"]
    for at, job, attempt in requeues:
        reset = max((r for r in story.run.breaker_resets if r <= at), default=0.0)
        start = max(at - window + STAMP_SLACK / 2, reset)
        within = [(t, j, n) for t, j, n in requeues if start <= t <= at]
        if len(within) > budget:
            found.append(f"job {job} attempt {attempt} at {at:.3f}: {len(within)} requeues since {start:.3f} "
                         f"(breaker reset {reset:.3f}); jobs.budget {budget}")
    return found


def lemon_blames_beyond_the_docs(story: Story) -> list[str]:
    """Jobs a lemon hold names whose failed attempts on the node are one, and that one not blamed on it
    (a node_fault decision naming it): docs/remediation.md blames a node as a culprit, or as the only
    node two or more culprit-less attempts of one job shared."""
    found = []
    for call in story.calls:
        if not call.reason.startswith(LEMON):
            continue
        for job in story.lemon_cause(call)[0]:
            on = [end for end in story.ends.get(job, []) if call.node in end[2] and end[0] < call.at]
            if len(on) != 1:
                continue
            decision = next((d for d in story.decisions if d[1] == job and d[0] > on[0][0]), None)
            why = next((said for at, said in story.log if decision and at == decision[0]
                        and said.startswith(f"job {job} ")), "")
            if decision and decision[3] == "node_fault" and f"without {call.node}" in why:
                continue
            found.append(f"{call.node}: lemon at {call.at:.3f} names job {job}, whose one failed attempt on it "
                         f"(attempt {on[0][1]}, on {','.join(on[0][2])}) was decided "
                         f"{decision[3] if decision else 'never'}")
    return found


def job_notes(story: Story) -> dict[str, list[str]]:
    """What the figures count, line by line (the results JSON's summary.job_notes)."""
    run = story.run
    return {
        "job_breaker_openings": [f"{at:.3f} {said.split(';')[0]}" for at, said in story.log
                                 if "job requeues in" in said and said.startswith("circuit breaker open")],
        # Neither released nor cancelled by a person, nor cancelled with every job at the end.
        "chains_taken_as_released_by_no_one": [
            f"{at:.3f} {said}" for at, said in story.log if said.endswith("its held chain was released by a person")
            and at < run.driven and not any(j == said.split()[1].rstrip(":") and t <= at
                                            for t, j, _ in run.job_people)],
        "lemon_blames_beyond_the_docs": lemon_blames_beyond_the_docs(story),
    }


def job_figures(story: Story) -> dict[str, Any]:
    run, attempts = story.run, story.attempts
    kinds = {job.id: job.kind for job in run.jobs}
    calls = Counter(c.argv[0] for c in story.job_calls)
    sq = read_calls(run.squeue_calls)
    listings = [c for c in sq if not any(a.startswith("--jobs=") for a in c.argv)]
    by_kind: dict[str, Counter[str]] = {}
    for _, job, _, branch in story.decisions:
        by_kind.setdefault(kinds.get(job, "other"), Counter())[branch] += 1
    culprits = []
    for at, job, _, branch in story.decisions:
        if branch != "node_fault" or kinds.get(job) != "node_fault":
            continue
        alerted = [e.node for e in run.episodes if e.about_job == job and e.fired_at and e.fired_at < at]
        update = next((c for c in story.job_calls if c.job == job and c.argv[0] == "update" and c.effective
                       and c.at >= at), None)
        if alerted:  # its own alert posted (not one of another episode's on its node)
            culprits.append(bool(update and alerted[-1] in expand_hostlist(update.value("ExcNodeList") or "x")))
    final = {}
    for job in run.jobs:
        tried = attempts.get(job.id, [])
        final[job.id] = "completed" if tried and tried[-1].code == 0 else (
            run.job_seen[job.id][-1][1].lower() if run.job_seen.get(job.id) else "never seen")
    return {
        "submitted": dict(Counter(job.kind for job in run.jobs)),
        "attempts": sum(len(a) for a in attempts.values()),
        "abnormal_ends": sum(len(e) for e in story.ends.values()),
        "requeues_by_branch": dict(Counter(branch for _, _, _, branch in story.decisions)),
        "decisions_by_kind": {k: dict(v) for k, v in sorted(by_kind.items())},
        "chains_held": sum(branch == "held" for *_, branch in story.decisions),
        "held_chains_released_by_a_person": sum(what == "release" for _, _, what in run.job_people),
        "cancelled_by_a_person": sum(what == "cancel" for _, _, what in run.job_people),
        "completed_after_failing": sum(1 for job in run.jobs if job.kind in RECOVERED and final[job.id] == "completed"
                                       and len(attempts.get(job.id, [])) > 1),
        "node_fault_requeues_without_the_alerted_node": f"{sum(culprits)} of {len(culprits)}",
        "lemon_holds": sum(1 for c in story.calls if c.reason.startswith(LEMON) and c.reached_slurm),
        "service_calls": dict(calls), "service_calls_failed_or_timed_out":
            sum(1 for c in story.job_calls if not c.effective),
        "squeue_calls": len(sq), "squeue_listings": len(listings),
        "squeue_listings_failed": sum(c.fate == "fail" for c in listings),
        "squeue_listings_timed_out": sum(c.fate in ("hang", "late") for c in listings),
        "job_breaker_openings": sum("job requeues in" in said and said.startswith("circuit breaker open")
                                    for _, said in story.log),
        "chains_taken_as_released_by_no_one": len(job_notes(story)["chains_taken_as_released_by_no_one"]),
        "lemon_blames_beyond_the_docs": len(job_notes(story)["lemon_blames_beyond_the_docs"]),
        "jobs_lost": sum("Slurm no longer holds its record" in said for _, said in story.log),
        "final": dict(Counter(final.values())),
    }


