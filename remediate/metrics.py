"""The service's own metrics, built fresh on each scrape from its counters and its state file."""

from __future__ import annotations

from collections.abc import Iterator

from gpunode_common import __version__
from gpunode_common.family import Family, MetricSpec
from gpunode_remediate.engine import Engine
from gpunode_remediate.jobs import BRANCHES
from gpunode_remediate.plan import PHASES

P = "gpunode_remediate_"
BUILD = MetricSpec(P + "build_info", "gauge", "The remediation service's version.", ("version",))
ENFORCING = MetricSpec(P + "enforcing", "gauge", "1 when the policy's mode is enforce, 0 in a dry run.")
ACTIONS = MetricSpec(P + "actions_total", "counter", "Node actions since start, by kind and result "
                     "(done, dry_run, failed, blocked).", ("action", "result"))
NODES = MetricSpec(P + "nodes", "gauge", "Nodes in the service's care, by phase.", ("phase",))
HELD = MetricSpec(P + "node_held_since_timestamp_seconds", "gauge",
                  "When a node held for a person was held, and why.", ("node", "reason"))
BREAKER = MetricSpec(P + "breaker_open", "gauge", "1 while the circuit breaker stops new drains (or, opened by a "
                     "person, every action); a person closes it with `gpunode-remediate breaker reset`.")
BREAKER_INFO = MetricSpec(P + "breaker_info", "gauge", "The circuit breaker's state (closed, open, paused: opened by "
                          "a person) and why, for the policy's mode.", ("state", "reason", "mode"))
BUDGET = MetricSpec(P + "budget_nodes", "gauge", "Nodes the service may drain in the budget window.")
CARE = MetricSpec(P + "care_limit_nodes", "gauge", "Nodes the service may hold in its care at once (budget.in_care).")
COUNTED = MetricSpec(P + "counted_nodes", "gauge", "Nodes the budget is a share of: those the policy selects, less "
                     "those out of service by someone else.")
AM_UP = MetricSpec(P + "alertmanager_up", "gauge", "1 when Alertmanager's list of alerts was read at the last try; "
                   "0 when it could not be, and no alert is taken as resolved meanwhile.")
AM_ALERTS = MetricSpec(P + "alertmanager_alerts_total", "counter", "Alerts taken from Alertmanager's list, by what: "
                       "taken (never received by webhook), stale (no longer listed: resolved), refused (invalid).",
                       ("result",))
RETURN = MetricSpec(P + "return_seconds", "histogram", "Seconds from a node's first action (its drain) to its "
                    "return to service.")
RETURN_BUCKETS = (300.0, 900.0, 1800.0, 3600.0, 7200.0, 14400.0, 43200.0, 86400.0, 259200.0, 604800.0)
USED = MetricSpec(P + "budget_used_nodes", "gauge", "Nodes the service drained in the budget window.")
LISTED = MetricSpec(P + "scheduler_nodes", "gauge", "Nodes the scheduler listed at the last look.")
ALERTS = MetricSpec(P + "alerts_received_total", "counter", "Alerts received in notifications, by status.",
                    ("status",))
NOTIFICATIONS = MetricSpec(P + "notifications_total", "counter", "Webhook notifications taken.")
ERRORS = MetricSpec(P + "webhook_errors_total", "counter", "Webhook requests refused, by reason.", ("reason",))
RECONCILES = MetricSpec(P + "reconciles_total", "counter", "Looks at the scheduler, by result.", ("result",))
LAST = MetricSpec(P + "last_reconcile_timestamp_seconds", "gauge", "When the scheduler was last looked at.")
DECISION = MetricSpec(P + "decision_seconds_total", "counter",
                      "Seconds from a notification's arrival to the first scheduler call it led to, summed.")
DECISIONS = MetricSpec(P + "decisions_total", "counter", "Notifications acted on (the count behind "
                       "decision_seconds_total).")
REQUEUES = MetricSpec(P + "job_requeues_total", "counter", "Abnormal job ends decided since start, by branch: "
                      "app_fault (requeued at once), node_fault (requeued without the culprit), backoff (no "
                      "culprit or the job's own fault: requeued to start after the backoff; an NFS outage: held "
                      "until the server answers, then the backoff), held (the chain stopped for a person).",
                      ("branch",))
CHAINS = MetricSpec(P + "job_chains_held", "gauge", "Retry chains held for a person (scontrol requeuehold).")
CHAIN = MetricSpec(P + "job_chain_held_attempts", "gauge", "A held retry chain's abnormal ends, by Slurm job id "
                   "and the nodes its failed attempts shared.", ("job_id", "nodes"))
LEMONS = MetricSpec(P + "lemon_nodes", "gauge", "Nodes blamed for failed attempts of several different jobs "
                    "(jobs.lemon): left out of every requeue and drained.")
LAST_DECISION = MetricSpec(P + "last_decision_seconds", "gauge",
                           "Seconds from the latest acted-on notification's arrival to its first scheduler call.")


def families(engine: Engine) -> Iterator[Family]:
    def one(spec: MetricSpec, value: float, *labels: str) -> Family:
        family = spec.family()
        family.add(labels, value)
        return family

    policy, state = engine.policy, engine.state
    yield one(BUILD, 1, __version__)
    yield one(ENFORCING, int(policy.enforce))
    actions = ACTIONS.family()
    for (kind, result), count in sorted(engine.actions.items()):
        actions.add((kind, result), count)
    yield actions
    records = state.records()
    nodes = NODES.family()
    for phase in PHASES:
        nodes.add((phase,), sum(1 for r in records.values() if r.phase == phase))
    yield nodes
    held = HELD.family()
    for record in sorted(records.values(), key=lambda r: r.node):
        if record.phase == "held":
            held.add((record.node, record.why), record.since)
    yield held
    breaker = state.breaker(policy.mode)
    yield one(BREAKER, int(breaker.open))
    yield one(BREAKER_INFO, 1, "paused" if breaker.paused else "open" if breaker.open else "closed",
              breaker.why if breaker.open else "", policy.mode)
    yield one(BUDGET, policy.budget.nodes(engine.counted))
    yield one(CARE, policy.budget.care(engine.counted))
    yield one(COUNTED, engine.counted)
    if engine.alertmanager_up is not None:
        yield one(AM_UP, engine.alertmanager_up)
        am = AM_ALERTS.family()
        for result in ("taken", "stale", "refused"):
            am.add((result,), engine.alertmanager_alerts[result])
        yield am
    returns = RETURN.family()
    returns.add_histogram((), RETURN_BUCKETS, state.return_seconds())
    yield returns
    yield one(USED, state.history(policy, engine.clock()).budget_used)
    yield one(LISTED, engine.listed)
    alerts = ALERTS.family()
    for status in ("firing", "resolved"):
        alerts.add((status,), engine.alerts[status])
    yield alerts
    yield one(NOTIFICATIONS, engine.notifications)
    errors = ERRORS.family()
    for reason in ("invalid", "too_large", "unauthorized", "storage"):
        errors.add((reason,), engine.webhook_errors[reason])
    yield errors
    reconciles = RECONCILES.family()
    for result in ("ok", "scheduler_error"):
        reconciles.add((result,), engine.reconciles[result])
    yield reconciles
    yield one(LAST, engine.last_reconcile)
    yield one(DECISION, engine.decision_seconds)
    yield one(DECISIONS, engine.decisions)
    yield one(LAST_DECISION, engine.last_decision_seconds)
    if engine.recovery is not None:
        requeues = REQUEUES.family()
        for branch in BRANCHES:
            requeues.add((branch,), engine.recovery.requeues[branch])
        yield requeues
        held_chains = state.held_chains(engine.recovery.statuses)
        yield one(CHAINS, len(held_chains))
        chains = CHAIN.family()
        for chain in held_chains:
            chains.add((chain.job, ",".join(chain.shared)), chain.attempts)
        yield chains
        yield one(LEMONS, len(engine.recovery.lemons))
