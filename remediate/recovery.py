"""Job recovery carried out: each pass, the jobs Slurm still holds are looked at, every abnormal end
of a selected job is decided (remediate/jobs.py) and its decision written to the state file before
any call. The calls, in order: requeuehold (the job back in the queue, held), update (AdminComment,
ExcNodeList, StartTime), release (not for a held chain). A restart finds the decision pending and
reads the job again: Slurm's RestartCnt says whether the requeue happened, its hold whether the
release did, so no end is requeued twice and no job runs without its exclusion.

A requeue that waits for an NFS server stops after the update, held; the state file keeps the wait,
and the first pass after the server's alert resolves sets its StartTime (the backoff from then) and
releases it."""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import replace

from gpunode_remediate import health
from gpunode_remediate.command import CommandError
from gpunode_remediate.jobs import (
    ENDS,
    STORAGE_ALERT,
    Decision,
    JobView,
    abnormal,
    backoff_delay,
    decide,
    lemons,
    selected,
)
from gpunode_remediate.plan import NodeView, span
from gpunode_remediate.policy import Policy
from gpunode_remediate.state import Breaker, State

RELAUNCH_AFTER = 2.0  # seconds after an end (Slurm's EndTime, whole seconds) before its job is released
# How long a node's NFS mounts, as its exporter listed them, are taken as known: mounts change
# rarely, and an outage ends hundreds of jobs on the same nodes at once. An exporter that did not
# answer is asked again sooner.
MOUNTS_FRESH = 600.0
MOUNTS_RETRY = 60.0


class Recovery:
    def __init__(self, policy: Policy, state: State, scheduler: object, log: logging.Logger | logging.LoggerAdapter,
                 clock: Callable[[], float], sleep: Callable[[float], None] = time.sleep,
                 mounted: Callable[[str, Policy], frozenset[str] | None] = health.mounted) -> None:
        self.policy = policy
        self.state = state
        self.scheduler = scheduler
        self.log = log
        self.clock = clock
        self.sleep = sleep
        self.requeues: Counter[str] = Counter()  # by branch, since start (dry run's decisions included)
        self.lemons: dict[str, str] = {}
        self._told: set[tuple[str, int]] = set()  # ends whose wait was logged once
        self._names: dict[str, str | None] = {}
        self._failed: dict[tuple[str, int], tuple[int, float]] = {}  # end -> failed tries, when the last failed
        self.statuses = policy.done
        self.mounted = mounted
        self._mounts: dict[str, tuple[float, frozenset[str] | None]] = {}  # node -> (asked at, servers)
        self._release_failed: dict[tuple[str, int], tuple[int, float]] = {}  # a storage wait's release
        self._blocked_told: set[tuple[str, int]] = set()
        if (cut := state.interrupt_job_ends()) > 0:
            self.log.warning("%d job requeue(s) were cut short by a restart: the jobs are read again before "
                             "anything else", cut)

    def list_jobs(self) -> dict[str, JobView]:
        return self.scheduler.jobs()  # type: ignore[attr-defined]

    def find_lemons(self, now: float) -> dict[str, str]:
        """Nodes to drain as lemons, for the node plan; kept for every requeue's exclusions."""
        ends = self.state.job_ends(now - self.policy.jobs.lemon.window, self.statuses)
        self.lemons = lemons(self.policy, ends, now, self.state.lemon_taken(self.policy.tried))
        return self.lemons

    def servers(self, node: str) -> frozenset[str] | None:
        """The NFS servers a node mounts (health.mounted), asked at most once per MOUNTS_FRESH."""
        now = self.clock()
        asked, found = self._mounts.get(node, (float("-inf"), None))
        if now - asked >= (MOUNTS_FRESH if found is not None else MOUNTS_RETRY):
            found = self.mounted(node, self.policy)
            self._mounts[node] = (now, found)
        return found

    def run(self, now: float, jobs: Mapping[str, JobView], views: Mapping[str, NodeView], paused: str) -> None:
        self._release_chains(jobs, now)
        self._names = {job: name for job, name in self._names.items() if job in jobs}
        blocked = paused or self._breaker_why(now)
        self._end_waits(now, jobs, blocked)
        for decision in self.state.unfinished_job_ends():
            tries, last = self._failed.get((decision.job, decision.restarts), (0, 0.0))
            if tries > self.policy.scheduler.retries:
                continue  # logged when it gave up: a person looks
            if not blocked and now - last >= 2.0 ** tries:  # a failed call is tried again after 2, 4, 8 ... s
                self._carry_out(decision, jobs.get(decision.job))
        for job in sorted(jobs.values(), key=lambda j: (j.end, len(j.job), j.job)):
            if not abnormal(job, self.policy.jobs) or self.state.decided(job.job, job.restarts):
                continue
            try:
                if not selected(job, self.policy.jobs, self._name):
                    continue
            except CommandError as err:
                self._tell(job, f"its name could not be read: {err}; tried again at the next look")
                continue
            window = self.policy.jobs.window
            chain = [e for e in self.state.job_ends(job.end - window, ("done", "dry_run", "pending", "interrupted",
                                                                        "failed"))
                     if e.job == job.job]
            alerts = self.state.alerts_at(job.nodes, job.end, self.policy.jobs.culprit_wait)
            outages = [a for a in self.state.unplaced_at(job.end, self.policy.jobs.culprit_wait)
                       if a.name == STORAGE_ALERT]
            decision = decide(now, self.policy, job, alerts, views, chain, self.lemons, outages, self.servers)
            if decision is None:
                self._tell(job, f"ended {job.state} (exit {job.code}, signal {job.signal}): waiting up to "
                           f"{span(self.policy.jobs.culprit_wait)} for an alert to name a culprit")
                continue
            blocked = blocked or self._breaker_why(now, opening=decision.branch != "held")
            if blocked:
                self._tell(job, f"not requeued: {blocked}")
                continue
            self.state.begin_job_end(decision, "pending" if self.policy.enforce else "dry_run", self.clock())
            self.requeues[decision.branch] += 1
            evidence = "" if decision.evidence in decision.why else f" [evidence: {decision.evidence}]"
            self.log.warning("job %s (attempt %d, on %s): %s: %s%s", job.job, decision.attempts,
                             ",".join(job.nodes) or "no node", decision.branch, decision.why, evidence)
            if self.policy.enforce:
                self._carry_out(decision, job)

    def _name(self, job: str) -> str | None:
        """Asked once per job id while Slurm lists it: a job left out is not asked again every pass."""
        if job not in self._names:
            detail = self.scheduler.job_detail(job)  # type: ignore[attr-defined]
            self._names[job] = detail[0] if detail else None
        return self._names[job]

    def _tell(self, job: JobView, why: str) -> None:
        if (job.job, job.restarts) not in self._told:
            self._told.add((job.job, job.restarts))
            self.log.warning("job %s: %s", job.job, why)

    def _breaker_why(self, now: float, opening: bool = False) -> str:
        """Why requeues stop: the breaker open, or (opening: about to requeue) the budget spent, which
        opens it, as a drain past the node budget does."""
        breaker = self.state.breaker(self.policy.mode)
        if breaker.open:
            return f"circuit breaker open ({breaker.why})"
        if not opening:
            return ""
        window = self.policy.budget.window
        used = self.state.requeues_since(max(now - window, breaker.budget_from), self.policy.tried)
        if used < self.policy.jobs.budget:
            return ""
        why = f"circuit breaker open: {used} of {self.policy.jobs.budget} job requeues in {window / 3600:g}h"
        self.state.set_breaker(self.policy.mode, Breaker(True, False, now, why, breaker.budget_from))
        self.log.error("%s; no job is requeued and no node drained until a person runs "
                       "`gpunode-remediate breaker reset`", why)
        return why

    def _carry_out(self, decision: Decision, job: JobView | None) -> None:
        """The calls left to make for a decision, judged by the job as Slurm lists it now."""
        d = decision
        if not self.policy.enforce:
            return
        if job is None:
            self.state.finish_job_end(d.job, d.restarts, "lost", self.clock(), "Slurm no longer holds the job")
            self.log.error("job %s: not requeued: Slurm no longer holds its record (MinJobAge)", d.job)
            return
        try:
            if job.restarts == d.restarts and job.state in ENDS:
                self.scheduler.requeuehold(d.job)  # type: ignore[attr-defined]
            elif job.restarts <= d.restarts or not job.requeue_held:
                # Requeued and released before the restart, or no longer ours to touch.
                self.state.finish_job_end(d.job, d.restarts, "done", self.clock())
                return
            detail = self.scheduler.job_detail(d.job)  # type: ignore[attr-defined]
            excluded = tuple(sorted(set(detail[1] if detail else ()) | set(d.exclude)))
            held = d.branch == "held"
            # A held chain's StartTime too: once a person releases it, it starts then, not after the
            # two minutes Slurm's requeue puts on it. A wait's is set when the server answers.
            self.scheduler.update_job(d.job, d.comment, () if held else excluded,  # type: ignore[attr-defined]
                                      None if d.waits_for else d.start_at)
            if not held and not d.waits_for:
                # slurmd refuses to launch a job whose credential is from the second its last attempt was
                # killed in ("Job N already killed, do not launch batch job"): released that soon, the
                # next attempt would fail at once, an abnormal end of its own.
                self.sleep(max(0.0, min(RELAUNCH_AFTER, d.ended_at + RELAUNCH_AFTER - self.clock())))
                self.scheduler.release(d.job)  # type: ignore[attr-defined]
        except CommandError as err:
            self.state.finish_job_end(d.job, d.restarts, "failed", self.clock(), str(err))
            tries = self._failed.get((d.job, d.restarts), (0, 0.0))[0] + 1
            self._failed[(d.job, d.restarts)] = (tries, self.clock())
            last = tries > self.policy.scheduler.retries
            self.log.error("job %s: %s failed (try %d of %d)%s: %s", d.job, "hold" if d.branch == "held" else
                           "requeue", tries, self.policy.scheduler.retries + 1, ": a person must look" if last else "",
                           err)
            return
        self.state.finish_job_end(d.job, d.restarts, "done", self.clock())
        if held:
            self.log.info("job %s: held for a person (%s)", d.job, d.comment)
        elif d.waits_for:
            self.log.info("job %s: requeued held%s, until NFS server %s answers again", d.job,
                          f" without {','.join(excluded)}" if excluded else "", d.waits_for)
        else:
            self.log.info("job %s: requeued%s, to start %s", d.job, f" without {','.join(excluded)}" if excluded
                          else "", "at once" if d.start_at <= self.clock() else f"at {_clock(d.start_at)}")

    def _end_waits(self, now: float, jobs: Mapping[str, JobView], blocked: str) -> None:
        """Jobs held for an NFS server whose alert has resolved: their StartTime the backoff after it
        resolved, and released. A job a person released or cancelled meanwhile is theirs."""
        for d, _ in self.state.storage_waits(self.statuses):
            firing, resolved = self.state.outage(STORAGE_ALERT, d.waits_for)
            if firing:
                continue
            key = (d.job, d.restarts)
            tries, last = self._release_failed.get(key, (0, 0.0))
            if tries > self.policy.scheduler.retries or (tries and now - last < 2.0 ** tries):
                continue  # logged when it gave up; or backing off after a failed call
            if blocked:
                if key not in self._blocked_told:
                    self._blocked_told.add(key)
                    self.log.warning("job %s: NFS server %s answers again; not released: %s", d.job, d.waits_for,
                                     blocked)
                continue
            answered = min(resolved or now, now)
            start_at = answered + backoff_delay(self.policy.jobs, d.attempts)
            why = (f"NFS server {d.waits_for} answered again at {_clock(answered)}: requeued to start "
                   f"{span(start_at - answered)} after")
            if not self.policy.enforce:
                self.state.end_wait(d.job, d.restarts, now)
                self.log.info("job %s: %s", d.job, why)
                continue
            job = jobs.get(d.job)
            if job is None or not job.requeue_held or job.restarts <= d.restarts:
                # Forgotten by Slurm once cancelled, or released by a person: theirs.
                self.state.end_wait(d.job, d.restarts, now, "released or cancelled by a person")
                self.log.info("job %s: no longer held for NFS server %s: released or cancelled by a person",
                              d.job, d.waits_for)
                continue
            try:
                detail = self.scheduler.job_detail(d.job)  # type: ignore[attr-defined]
                # Lemons found while it waited are left out too.
                excluded = tuple(sorted(set(detail[1] if detail else ()) | set(d.exclude) | set(self.lemons)))
                self.scheduler.update_job(d.job, replace(d, why=why).comment, excluded,  # type: ignore[attr-defined]
                                          start_at)
                self.scheduler.release(d.job)  # type: ignore[attr-defined]
            except CommandError as err:
                self._release_failed[key] = (tries + 1, self.clock())
                self.log.error("job %s: release after NFS server %s answered failed (try %d of %d)%s: %s", d.job,
                               d.waits_for, tries + 1, self.policy.scheduler.retries + 1,
                               ": a person must look" if tries + 1 > self.policy.scheduler.retries else "", err)
                continue
            self.state.end_wait(d.job, d.restarts, self.clock())
            self.log.info("job %s: released: %s", d.job, why)

    def _release_chains(self, jobs: Mapping[str, JobView], now: float) -> None:
        """A held chain a person released (or cancelled, and Slurm forgot) starts counting again."""
        for held in self.state.held_chains(self.statuses):
            job = jobs.get(held.job)
            # Held, or still ended as when decided (a dry run's; or listed before the hold was made).
            still = job is not None and (job.requeue_held
                                         or (job.restarts == held.restarts and job.state in ENDS))
            if not still:  # ends after the held one start a new chain, however late this pass saw it
                self.state.release_chain(held.job, held.ended_at)
                self.log.info("job %s: its held chain was released by a person", held.job)


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))
