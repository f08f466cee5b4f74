"""The service's one worker: takes notifications into the state file, looks at the scheduler, plans
and carries out (or, in a dry run, records) each step. One thread makes every scheduler call, so
two notifications never race to the same node."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import replace

from gpunode_remediate import alertmanager, health
from gpunode_remediate.alerts import Alert, Notification
from gpunode_remediate.command import CommandError, run
from gpunode_remediate.plan import MARKER, NodeView, Record, Step, counted, plan, span
from gpunode_remediate.policy import Policy
from gpunode_remediate.recovery import Recovery
from gpunode_remediate.scheduler import Scheduler
from gpunode_remediate.state import Breaker, State

log = logging.getLogger("gpunode-remediate")


class _DryRun(logging.LoggerAdapter):
    """Every line a dry run logs says so: nothing it reports was done to the scheduler."""

    def process(self, msg: str, kwargs: dict) -> tuple[str, dict]:
        return f"dry run: {msg}", kwargs
_FORGET_AFTER = 35 * 86400.0  # resolved alerts kept this long (longer than any window reading them)


class Engine:
    def __init__(self, policy: Policy, state: State, scheduler: Scheduler,
                 clock: Callable[[], float] = time.time,
                 healthy: Callable[[str, Policy], health.Trouble | None] = health.check,
                 sleep: Callable[[float], None] = time.sleep,
                 mounted: Callable[[str, Policy], frozenset[str] | None] = health.mounted) -> None:
        self.policy = policy
        self.state = state
        self.scheduler = scheduler
        self.clock = clock
        self.healthy = healthy
        self.wake = threading.Event()
        self.lock = threading.Lock()
        # Counters since start, read by /metrics.
        self.actions: Counter[tuple[str, str]] = Counter()
        self.alerts: Counter[str] = Counter()
        self.notifications = 0
        self.webhook_errors: Counter[str] = Counter()
        self.reconciles: Counter[str] = Counter()
        self.decision_seconds = 0.0
        self.decisions = 0
        self.last_decision_seconds = 0.0
        self.last_reconcile = 0.0
        self.listed = 0
        self.counted = 0  # of those, the nodes the budget is a share of
        self._paused = ""  # why a person opened the breaker: every call waits
        self._returns_rebooted: bool | None = None  # the scheduler's ReturnToService=2, read once it answers
        # Alertmanager's list: None until asked (or without alertmanager.url), then 1 or 0.
        self.alertmanager_up: int | None = None
        self.alertmanager_alerts: Counter[str] = Counter()  # taken (never received), stale (resolved), refused
        self._alertmanager_asked = float("-inf")
        self._missing: dict[str, float] = {}  # fingerprint -> since when Alertmanager has not listed it
        self._waiting_since: float | None = None  # the oldest notification not yet acted on
        self.log = log if policy.enforce else _DryRun(log, {})
        if state.last_mode(policy.mode) == "dry-run" and policy.enforce:
            dropped = state.forget_nodes()
            log.warning("the state file was a dry run's: its %d node record(s) are dropped, and the enforced "
                        "budget and breaker start clean", dropped)
        for action in state.interrupted(clock()):
            self._interrupted(action.node, action.kind)
        self.recovery = (Recovery(policy, state, scheduler, self.log, clock, sleep, mounted) if policy.jobs.enabled
                         else None)

    def _interrupted(self, node: str, kind: str) -> None:
        """A call cut short by a restart. The scheduler shows whether a drain, reboot or resume took
        effect; a reset command's outcome cannot be seen, so the node waits for a person."""
        self.log.warning("%s: %s was cut short by a restart; looking at the scheduler before anything else", node,
                         kind)
        if kind == "reset":
            records = self.state.records()
            old = records.get(node)
            self.state.set_record(node, "held", "hold", "reset command cut short by a restart: outcome unknown",
                                  self.clock(), old.gpus if old else ())

    def receive(self, notification: Notification, received: float) -> int:
        """Store a notification's alerts; wake the worker. How many alerts changed what is known."""
        pairs = [(alert, self.policy.node(alert.labels)) for alert in notification.alerts]
        changed = self.state.record_alerts(pairs, received)
        with self.lock:
            self.notifications += 1
            for alert in notification.alerts:
                self.alerts[alert.status] += 1
            if changed and self._waiting_since is None:
                self._waiting_since = received
        self.wake.set()
        return changed

    def count_webhook_error(self, reason: str) -> None:
        with self.lock:  # the HTTP server's threads count at once
            self.webhook_errors[reason] += 1

    def run_forever(self, stop: threading.Event) -> None:
        while not stop.is_set():
            self.wake.wait(self.policy.interval)
            self.wake.clear()
            if stop.is_set():
                break
            self.reconcile()

    def _views(self, records: dict[str, Record]) -> dict[str, NodeView]:
        views = self.scheduler.nodes(with_jobs=self.policy.requeue.enabled)
        if self.policy.enforce:
            return views
        # A dry run changes nothing in the scheduler: the nodes it would have taken are shown to
        # the plan as taken, so it goes on as it would (a reboot done, a reset once idle).
        for node, record in records.items():
            if node in views:
                down = record.phase in ("reboot_wait", "rebooted")
                views[node] = replace(views[node], state="down" if down else "idle", flags=frozenset({"drain"}),
                                      reason=f"{MARKER} {record.action} (dry run)")
        return views

    def ask_alertmanager(self, now: float) -> None:
        """Every alertmanager.interval: alerts it holds for this service's receiver that never arrived
        are taken as received; a firing alert it has not listed in any state for stale_after has
        resolved. While it cannot be reached, nothing is resolved and the absences start again."""
        config = self.policy.alertmanager
        if config.url is None or now - self._alertmanager_asked < config.interval:
            return
        self._alertmanager_asked = now
        try:
            listed, refused = alertmanager.fetch(config.url, min(10.0, config.interval))
        except alertmanager.UnreachableError as err:
            if self.alertmanager_up != 0:
                self.log.error("cannot list Alertmanager's alerts: %s; no alert is taken as resolved meanwhile", err)
            self.alertmanager_up = 0
            self._missing.clear()
            return
        if self.alertmanager_up == 0:
            self.log.info("Alertmanager lists its alerts again")
        self.alertmanager_up = 1
        self.alertmanager_alerts["refused"] += refused
        held = {alert.fingerprint: alert for alerts in self.state.firing().values() for alert in alerts}
        held |= {alert.fingerprint: alert for alert in self.state.firing_unplaced()}  # job recovery's storage waits
        unseen = [item.alert for item in listed if item.state == "active" and config.receiver in item.receivers
                  and item.alert.fingerprint not in held]
        if taken := self.state.record_alerts([(a, self.policy.node(a.labels)) for a in unseen], now):
            self.alertmanager_alerts["taken"] += taken
            self.log.warning("%d alert(s) Alertmanager holds for %s were never received: taken as received",
                             taken, config.receiver)
        seen = {item.alert.fingerprint for item in listed}
        self._missing = {fp: self._missing.get(fp, now) for fp in held if fp not in seen}
        stale = [Alert(fp, "resolved", held[fp].labels, held[fp].starts_at, now)
                 for fp, since in self._missing.items() if now - since >= config.stale_after]
        if stale and self.state.record_alerts([(a, self.policy.node(a.labels)) for a in stale], now):
            self.alertmanager_alerts["stale"] += len(stale)
            for alert in stale:
                where = self.policy.node(alert.labels) or f"server {alert.labels.get('server', '(none)')}"
                self.log.warning("%s: %s no longer listed by Alertmanager for %s: taken as resolved",
                                 where, alert.name, span(config.stale_after))
                del self._missing[alert.fingerprint]

    def reconcile(self) -> list[Step]:
        with self.lock:
            waiting, self._waiting_since = self._waiting_since, None
        self.ask_alertmanager(self.clock())
        records = self.state.records()
        try:
            views = self._views(records)
        except CommandError as err:
            self.reconciles["scheduler_error"] += 1
            self.log.error("cannot list the scheduler's nodes: %s", err)
            return []
        # After the listing, which may take the scheduler's whole timeout: the budget's window ends
        # when the plan is made, not seconds before.
        now = self.clock()
        self.listed = len(views)
        if (nodes := counted(self.policy, views)) != self.counted:
            self.counted = nodes
            self.state.set_counted(nodes)  # for `breaker reset` to say what the budget is
        history = self.state.history(self.policy, now)
        self._paused = history.paused
        if self._returns_rebooted is None:
            try:
                self._returns_rebooted = self.scheduler.returns_rebooted()
            except CommandError as err:
                self.log.warning("cannot read whether the scheduler returns rebooted nodes by itself: %s", err)
        jobs, lemons = None, {}
        if self.recovery is not None:
            try:
                jobs = self.recovery.list_jobs()
            except CommandError as err:
                self.reconciles["scheduler_error"] += 1
                self.log.error("cannot list the scheduler's jobs: %s; no job is requeued meanwhile", err)
            lemons = self.recovery.find_lemons(now)
        steps = plan(now, self.policy, views, self.state.firing(), self.state.last_resolved(), records, history,
                     bool(self._returns_rebooted), lemons)
        for step in steps:
            if waiting is not None and step.calls:
                self._decided(self.clock() - waiting)
                waiting = None
            self._apply(step, records.get(step.node), now)
        if waiting is not None:
            self._decided(self.clock() - waiting)
        if self.recovery is not None and jobs is not None:
            self.recovery.run(now, jobs, views, self._paused)
        self.state.forget_alerts(now - _FORGET_AFTER)
        self.reconciles["ok"] += 1
        self.last_reconcile = now
        return steps

    def _decided(self, seconds: float) -> None:
        self.decision_seconds += seconds
        self.decisions += 1
        self.last_decision_seconds = seconds

    def _apply(self, step: Step, record: Record | None, now: float) -> None:
        if step.kind == "block":
            breaker = self.state.breaker(self.policy.mode)
            # Opened only by a limit this plan reached: a block read from an open breaker (or a pause)
            # that a person closed while the scheduler was listed does not open it again.
            if not breaker.open and step.why.startswith("circuit breaker open:"):
                self.state.set_breaker(self.policy.mode, Breaker(True, False, now, step.why, breaker.budget_from))
                self.log.error("circuit breaker opened: %s; no node is drained until a person runs "
                               "`gpunode-remediate breaker reset`", step.why)
            self._note(step.node, f"not drained: {step.why}", now)
            self.actions[("drain", "blocked")] += 1
        elif step.kind == "note":
            if step.phase is not None and record is not None:
                self.state.set_record(step.node, step.phase, step.action, step.why, now, step.gpus)
                self.log.info("%s: %s (now %s)", step.node, step.why, step.phase)
            else:
                self._note(step.node, step.why, now)
        elif step.kind == "adopt":
            self.state.set_record(step.node, step.phase, step.action, step.why, now, step.gpus)
            self.log.warning("%s: %s (%r); taken back as %s", step.node, step.why, step.reason, step.phase)
        elif step.kind == "release":
            self.state.release(step.node)  # theirs: the same episodes never take it back
            self.log.warning("%s: %s; no longer in this service's care", step.node, step.why)
        else:
            self._call(step, record, now)

    def _note(self, node: str, why: str, now: float) -> None:
        if self.state.note(node, why, now):
            self.log.warning("%s: %s", node, why)

    def _call(self, step: Step, record: Record | None, now: float) -> None:
        if self._paused:
            self._note(step.node, f"not {step.kind}: paused by a person ({self._paused})", now)
            return
        retries = self.policy.scheduler.retries
        failed, last = self.state.failures(step.node, step.kind, now - 86400)
        if failed > retries:
            self._note(step.node, f"{step.kind} failed {failed} times: a person must look", now)
            return
        if failed and now - last < 2.0 ** failed:
            return  # backing off
        if step.kind == "reset" and not self.policy.reset_command:
            step = replace(step, kind="hold", phase="held", action="hold", why="no reset_command configured",
                           reason=f"{MARKER} hold GPU reset needed, no reset_command configured")
        if step.health and self.policy.enforce:
            trouble = self.healthy(step.node, self.policy)
            if trouble is not None:
                waited = self._wait(step.node, trouble, now)
                if waited is None:
                    return
                step = replace(step, kind="hold", phase="held", action="hold", why=waited,
                               reason=f"{MARKER} hold {waited}"[:200])
            else:
                self.state.end_return_wait(step.node)
        if step.kind == "resume" and self.policy.validate_command and self.policy.enforce:
            failed_check = self._validate(step.node)
            if failed_check:
                step = replace(step, kind="hold", phase="held", action="hold", why=failed_check,
                               reason=f"{MARKER} hold {failed_check}"[:200])
        # Stamped when the call is made: an earlier call of this pass may have taken the scheduler's
        # whole timeout, and the budget counts a drain for a window from when it was made.
        action_id = self.state.begin(step, self.clock())
        status, error = "dry_run", ""
        if self.policy.enforce:
            try:
                self._carry_out(step)
                status = "done"
            except CommandError as err:
                status, error = "failed", str(err)
        after: tuple[str, Record | None] | None = None  # the node's record once the call is done
        if status == "failed" and step.kind == "reset":  # did it reset or not? a person looks
            after = (step.node, Record(step.node, "held", "hold", f"reset failed: {error}", now, step.gpus))
        elif status != "failed" and step.kind != "requeue":
            since = record.since if record and record.phase == step.phase else now
            after = (step.node, Record(step.node, step.phase, step.action, step.why, since, step.gpus)
                     if step.phase else None)
        self.state.finish(action_id, status, self.clock(), error, after)
        self.actions[(step.kind, status)] += 1
        if status == "failed" and step.kind == "reset":
            self.log.error("%s: reset failed, held for a person: %s", step.node, error)
            return
        if status == "failed":
            self.log.error("%s: %s failed (try %d of %d): %s", step.node, step.kind, failed + 1, retries + 1, error)
            return
        self.log.info("%s: %s: %s%s", step.node, step.kind, step.why, f" [{step.reason}]" if step.reason else "")
        self.state.note(step.node, None, now)
        if step.kind == "resume" and status == "done":
            taken = self.state.taken_at(step.node, ("done",))
            if taken is not None:
                self.state.returned(step.node, taken, self.clock())

    def _wait(self, node: str, trouble: health.Trouble, now: float) -> str | None:
        """A node not yet fit to return waits (noted); one whose bounded wait (its NVLink fabric, an
        exporter that does not answer) began fabric_wait ago or more: why it is held. The wait's start
        is in the state file: a restart does not start it again."""
        if trouble.bounded:
            since = self.state.return_wait(node, now)
            if now - since >= self.policy.fabric_wait:
                return trouble.why
            deadline = time.strftime("%H:%M:%S", time.localtime(since + self.policy.fabric_wait))
            self._note(node, f"not returned: {trouble.why} (held at {deadline} if it lasts: fabric_wait "
                       f"{span(self.policy.fabric_wait)})", now)
        else:
            self._note(node, f"not returned: {trouble.why}", now)
        return None

    def _validate(self, node: str) -> str | None:
        """The operator's check before a node returns (a DCGM diag, NHC): why it failed, or None."""
        argv = [word.format_map({"node": node}) for word in self.policy.validate_command]
        try:
            run(argv, self.policy.validate_timeout, merge_output=True)
        except CommandError as err:
            return f"validation failed: {err.last_line}"
        return None

    def _carry_out(self, step: Step) -> None:
        if step.kind in ("drain", "hold"):
            self.scheduler.drain(step.node, step.reason)
        elif step.kind == "reboot":
            self.scheduler.reboot(step.node, step.reason)
        elif step.kind == "resume":
            self.scheduler.resume(step.node)
        elif step.kind == "requeue":
            self.scheduler.requeue(step.job)
        elif step.kind == "reset":
            values = {"node": step.node, "gpu": ",".join(step.gpus) or "all"}
            run([word.format_map(values) for word in self.policy.reset_command], self.policy.reset_timeout)
