"""The service's own metrics, built fresh on each scrape from its counters and its state file."""

from __future__ import annotations

from collections.abc import Iterator

from exporter import __version__
from exporter.family import Family, MetricSpec
from remediate.engine import Engine

P = "gpunode_remediate_"
BUILD = MetricSpec(P + "build_info", "gauge", "The remediation service's version.", ("version",))
ENFORCING = MetricSpec(P + "enforcing", "gauge", "1 when the policy's mode is enforce, 0 in a dry run.")
ACTIONS = MetricSpec(P + "actions_total", "counter", "Node actions since start, by kind and result "
                     "(done, dry_run, failed, blocked).", ("action", "result"))
NODES = MetricSpec(P + "nodes", "gauge", "Nodes in the service's care, by phase.", ("phase",))
HELD = MetricSpec(P + "node_held_since_timestamp_seconds", "gauge",
                  "When a node held for a person was held, and why.", ("node", "reason"))
BREAKER = MetricSpec(P + "breaker_open", "gauge", "1 while the circuit breaker stops new drains; a person "
                     "closes it with `gpunode-remediate breaker reset`.")
BUDGET = MetricSpec(P + "budget_nodes", "gauge", "Nodes the service may drain in the budget window.")
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
    for phase in ("drained", "reset_wait", "reset_done", "reboot_wait", "rebooted", "held"):
        nodes.add((phase,), sum(1 for r in records.values() if r.phase == phase))
    yield nodes
    held = HELD.family()
    for record in sorted(records.values(), key=lambda r: r.node):
        if record.phase == "held":
            held.add((record.node, record.why), record.since)
    yield held
    yield one(BREAKER, int(state.breaker()[0]))
    yield one(BUDGET, policy.budget.nodes(engine.listed))
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
