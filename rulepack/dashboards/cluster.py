"""The cluster dashboard: which nodes to look at, and why."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from grafana_foundation_sdk.builders import dashboard as gd
from grafana_foundation_sdk.cog.builder import Builder
from grafana_foundation_sdk.models import dashboard as model
from grafana_foundation_sdk.models.common import BigValueTextMode

from gpunode_common.kernel_families import FAMILIES, RECOVERIES, SXID_FAMILY
from gpunode_rulepack import duration
from gpunode_rulepack.dashboards.board import (
    DCGM,
    FAILSLOW_INPUT,
    FAILSLOW_PEERS,
    GPU_FABRIC,
    JOB_PAST,
    JOB_RECOVERY,
    KERNEL_EVENTS,
    MEASURED_MTBF,
    NFS_SILENT,
    NVSWITCHES_EXPECTED,
    PEERS,
    PORT_ALERTS,
    RDMA_PORTS,
    REMEDIATION_ALERTS,
    RESTARTS,
    SAVES,
    SXIDS,
    WORKLOADS,
    Board,
    Query,
    events,
    heatmap_panel,
    phases,
    stat_panel,
    state_timeline,
    table_panel,
    time_series,
    to_node,
)
from gpunode_rulepack.dashboards.node import UID as NODE_UID

TOP = 10  # rows of a top-k table, lines of a top-k graph: a cluster has hundreds of nodes


def build(b: Board) -> None:
    spec, node = b.spec, b.node
    pre, fs, remap = spec["precursor"], spec["failslow"], spec["remap"]
    by_node = f"{{{{{node}}}}}"  # a legend: the node's name

    def linked(panel: Builder[Any]) -> Builder[Any]:  # per-node series: each opens its node's dashboard
        return to_node(panel, node, NODE_UID)

    b.row("Alerts")
    b.panel(linked(table_panel()), "Firing alerts of the rule pack",
            "Alerts of the gpunode rule pack firing now, per node (a peer group's alerts have none): the place "
            "to start. Each alert's runbook is in its runbook_url annotation (docs/runbooks/). The remediation "
            "service's alerts are in the Remediation row.", "short",
            [Query(f"sum by (alertname, severity, {node}) ({b.alerts()})")], width=24, instant=True)

    b.row("Nodes against their peers")
    score = b.rec("gpunode:precursor_signal:score")
    b.panel(linked(heatmap_panel()), "Precursor peer scores (largest per node)",
            "Per node, the largest |robust peer score| of its precursor signals: (value - peer median) / "
            f"max(1.4826 MAD, floor). Beyond {pre['score_threshold']} on {pre['min_signals']} signals for "
            f"{duration(pre['continuity'])} fires GpuNodePrecursorMultiSignal ("
            "the Lablup B200 operations report: failing nodes departed "
            "from their ~59 peers before the Xid).", "short",
            [Query(f"max by ({node}) (abs({score}))", by_node)], needs=(PEERS,))
    b.panel(linked(table_panel()), "Largest precursor scores now",
            f"The {TOP * 2} node and signal pairs farthest from their peers now; beyond +-{pre['score_threshold']} "
            f"(precursor.score_threshold) a signal deviates, and {pre['min_signals']} deviating signals of one node "
            f"for {duration(pre['continuity'])} fire GpuNodePrecursorMultiSignal. No single signal dominated "
            "the failures of the Lablup B200 operations report: which ones deviate says where to look.", "short",
            [Query(f"topk({TOP * 2}, abs({score}))")], instant=True, needs=(PEERS,))
    jobs = b.rec("gpunode:failslow_job:ratio_to_own_past")
    b.panel(time_series(), "Jobs against their own past (lowest of power and traffic)",
            "Per job (workload), the lowest of its level of power, NVLink, NIC and RDMA bytes (the median over its "
            f"nodes, over {duration(fs['own_window'])}) divided by its own level of the "
            f"{duration(fs['own_baseline'])} before. A synchronous job moves at its slowest node's pace, so a "
            "straggler lowers every node's traffic and its waiting peers' power alike: below "
            f"{1 - fs['job_fraction']:.2f} on {fs['job_min_proxies']} of them for {duration(fs['job_for'])} fires "
            "GpuJobSlowedDown, which lists the cause alerts on the job's nodes.", "percentunit",
            [Query(f"min by (workload) ({jobs})", "{{workload}}")], needs=(FAILSLOW_INPUT, JOB_PAST))
    ratio = b.rec("gpunode:failslow_proxy:ratio_to_peers")
    b.panel(linked(heatmap_panel()), "Stragglers: slowest GPU's clock and utilization against the job's median",
            "Per node, the lower of its slowest GPU's SM clock and utilization divided by its job's median. "
            "Waiting peers stay busy at their clocks, so a node below is the one they wait for: a clock "
            f"{fs['clock_fraction']:.0%} low with a throttle reason fires GpuNodeClockThrottled, utilization "
            f"{fs['starved_fraction']:.0%} low with its CPUs contended GpuNodeHostStarved (Greyhound, Wu et al., "
            "USENIX ATC '25: one straggler slows every GPU of its job).", "percentunit",
            [Query(f"min by ({node}) ({ratio})", by_node)],
            needs=(FAILSLOW_PEERS, f"{DCGM}'s GPU utilization and SM clock (the ratios of these two only)"))

    b.row("Xid errors")
    xids = b.q("gpunode_xid_errors_total")
    b.panel(time_series(), "Xids by NVIDIA's action",
            "Xid events logged in the interval, summed by NVIDIA's immediate action (docs/xid-catalog.md): "
            "GpuXidHardwareFault for the actions that take a GPU out of service, GpuXidApplicationFault for "
            "RESTART_APP. increase() misses the first Xid of a new series (a GPU's first Xid of a code): the "
            "table beside it lists those too.", "short",
            [Query(f"sum by (action) (increase({xids}[$__rate_interval]))", "{{action}}")])
    b.panel(linked(table_panel()), "Latest Xid per node, GPU and code",
            f"When each node's GPUs last logged each Xid code (the kernel log's time), the {TOP * 5} latest.",
            "dateTimeAsIso", [Query(f"topk({TOP * 5}, {b.q('gpunode_xid_last_event_timestamp_seconds')} * 1000)")],
            instant=True)

    b.row("GPUs")
    b.panel(linked(table_panel()), "GPUs with a row remap pending",
            "GPUs whose remapped rows take effect only at the next GPU reset "
            "(gpunode_gpu_row_remap_pending): reset them at the next drain. GpuRowRemapPending fires after "
            f"{duration(remap['pending_for'])}.", "short",
            [Query(f"{b.q('gpunode_gpu_row_remap_pending')} == 1")], width=8, instant=True)
    # As GpuRowRemapCorrectableAcceleration computes it, from the hourly recording.
    hourly, short = b.rec("gpunode:gpu_remapped_rows_correctable:"), remap["acceleration_short_window"]
    recent = f"avg_over_time({hourly}[{duration(short)}])"
    before = f"avg_over_time({hourly}[{duration(remap['acceleration_long_window'])}] offset {duration(short)})"
    rows = f"topk({TOP}, {recent} * {short / spec['intervals']['remap_trend']:g} > 0)"
    b.panel(linked(table_panel()), f"Most correctable remaps in the last {duration(short)}",
            f"The {TOP} GPUs with most rows remapped after correctable errors over the short window, and how many "
            "times their rate over the long window before it that is. Above acceleration_factor with at least "
            "acceleration_floor rows fires GpuRowRemapCorrectableAcceleration (gpu124: ~38 to 254 rows in a "
            "week, then lost). Windows from the spec (remap.acceleration_*_window), as the alert uses them.",
            "short", [Query(rows), Query(f"{recent} / {before} and on ({node}, uuid) {rows}")], width=8, instant=True)
    visible = b.q("gpunode_gpus_visible", 'source="nvml"')
    b.panel(linked(time_series()), "GPUs missing or lost",
            "Per node: GPUs expected (gpu.expected_count) minus those the driver enumerates "
            "(GpuNodeGpuMissing), and GPUs lost: GPU_IS_LOST or config space all-ones, fell off the bus "
            "(GpuDown).", "short",
            [Query(f"{b.q('gpunode_gpus_expected')} - ignoring (source) {visible}", f"missing {by_node}"),
             Query(f"count by ({node}) ({b.q('gpunode_gpu_up')} == 0)", f"lost {by_node}")], width=8)

    b.row("NFS")
    queue, rtt = b.rec("gpunode:nfs_rpc_queue_seconds_per_request:"), b.rec("gpunode:nfs_rpc_rtt_seconds_per_request:")
    b.panel(time_series(), "NFS time per request: slot wait against network + server",
            "Per operation, the mean over nodes of the time a request waited for an RPC slot (queue) and of the "
            "time the network and server took (rtt). Queue above rtt means more slots, not a faster link, "
            "would help ("
            "the Lablup B200 operations report: save WRITEs waited 1,495 of 1,621 ms). NfsSlotWaitDominates, "
            "NfsBandwidthParadox.", "s",
            [Query(f"avg by (op) ({queue})", "slot wait {{op}}"),
             Query(f"avg by (op) ({rtt})", "network+server {{op}}")])
    b.panel(linked(table_panel()), "Nodes waiting longest for an RPC slot",
            f"The {TOP} node and operation pairs with the longest mean slot wait per request now, beside their "
            "network + server time.", "s",
            [Query(f"topk({TOP}, max by ({node}, op) ({queue}))"),
             Query(f"max by ({node}, op) ({rtt}) and on ({node}, op) topk({TOP}, max by ({node}, op) ({queue}))")],
            width=6, instant=True)
    b.panel(linked(time_series()), "NFS slot table saturation (highest nodes)",
            f"The {TOP} nodes whose transports run fullest: mean requests in flight per send over the "
            "transport's slots. Near 1 with a backlog for "
            f"{duration(spec['nfs']['slot_wait_for'])} fires NfsSlotTableSaturated.", "percentunit",
            [Query(f"topk({TOP}, max by ({node}) ({b.rec('gpunode:nfs_transport_slot_saturation:')}))", by_node)],
            width=6)

    beyond_the_gpu(b, linked)
    fabric(b, linked)

    b.row("Goodput")
    g = spec["goodput"]
    # The records are per job or fleet-wide: the node variable picks the jobs its nodes run.
    running = b.rec("gpunode:node_workload:info")
    per_job = f"max by (workload) (gpunode:job_goodput:ratio) and on (workload) {running}"
    b.panel(stat_panel(), "Goodput now",
            "The share of the selected nodes (all: the fleet) that make progress now: per job, its nodes "
            "training (neither saving nor loading a checkpoint) times its pace against its own past where slower, "
            "weighted by nodes (gpunode:job_goodput:ratio). Time between a failed job's attempts and progress "
            "redone show only in `gpunode-exporter report` (docs/report.md), which joins the attempts.",
            "percentunit",
            [Query(f"sum(gpunode:job_goodput:ratio * on (workload) group_left () count by (workload) ({running}))"
                   f" / sum(count by (workload) ({running}))")], width=6, needs=(WORKLOADS,))
    b.panel(stat_panel(), "Mean time between failures per node (measured)",
            f"Fleet-wide: node-hours running a workload over {duration(g['mtbf_window'])} per job restart (a node "
            f"starting a new workload within {duration(g['restart_within'])} of another: goodput.restart_within), "
            f"from {g['min_failures']} restarts on. A job of N nodes fails N times as often; the Young/Daly optimum "
            "below uses that job MTBF, or checkpoint.mtbf_seconds until there is a measurement.", "s",
            [Query(f"max(gpunode:fleet_mtbf_seconds:per_node) and on () max({running})")], width=6,
            needs=(WORKLOADS, MEASURED_MTBF))
    restarts = b.rec("gpunode:node_job_restart:share")
    b.panel(time_series(), "Job restarts per day",
            "Abnormal job ends over the last 24 h on the selected nodes: each restart of an N-node job counts 1/N on "
            "each of its nodes, so once in all.", "short",
            [Query(f"sum(sum_over_time({restarts}[1d]))", "restarts in 24 h")], width=12, needs=(RESTARTS,))
    b.panel(time_series(), "Goodput per job",
            "Per job (workload) of the selected nodes, the share of its nodes training times its pace against its own "
            "past where slower. A dip to the share of nodes saving is a checkpoint save; a long dip, a load or a "
            "straggler.", "percentunit",
            [Query(per_job, "{{workload}}")], width=24, needs=(WORKLOADS,))

    b.row("Checkpoints")
    b.panel(linked(phases(state_timeline())), "Checkpoint phase per node",
            "Training, saving (writing to NFS faster than checkpoint.save_write_bytes) or loading (reading from "
            "NFS with the GPUs idle), as the rule pack classifies each node (after "
            "the Lablup B200 operations report). The nodes of a job "
            "save together; one that doesn't is worth a look.", "short",
            [Query(b.rec("gpunode:checkpoint_phase:node"), by_node)], width=24)
    window, peers = duration(spec["checkpoint"]["interval_window"]), ", ".join(spec["labels"]["peer_group"])
    group = "{{" + "}} {{".join(spec["labels"]["peer_group"]) + "}}"

    def median(prefix: str) -> str:
        return f"quantile by ({peers}) (0.5, {b.rec(prefix)})"
    b.panel(time_series(), "Checkpoint interval against its Young/Daly optimum",
            f"Per peer group, the median over nodes of the mean time between saves over {window}, and of the "
            "optimum sqrt(2 x save duration x MTBF) for the save duration and the job's MTBF (measured, row "
            "Goodput, else checkpoint.mtbf_seconds). "
            "CheckpointIntervalTooLong fires when the interval exceeds checkpoint.interval_factor times the "
            "optimum (the Lablup B200 operations report: 133.5 min against 44.9).", "s",
            [Query(median(f"gpunode:checkpoint_interval_seconds:avg{window}"), f"interval {group}"),
             Query(median("gpunode:checkpoint_interval_seconds:young_daly"), f"optimum {group}")], needs=(SAVES,))
    b.panel(time_series(), "Checkpoint cost: time lost to saves and expected rework",
            "Per peer group, the median of delta/T + T/(2 MTBF) for the nodes' interval T and save duration "
            "delta, against the same at the Young/Daly optimum: the share of training time checkpointing "
            "costs (the Lablup B200 operations report: 2.20 % against 1.72 %).", "percentunit",
            [Query(median(f"gpunode:checkpoint_cost_ratio:avg{window}"), f"now {group}"),
             Query(median("gpunode:checkpoint_cost_ratio:young_daly"), f"at the optimum {group}")], needs=(SAVES,))

    remediation(b)


def by_family(b: Board, window: str) -> str:
    """Kernel events and SXids over `window`, each series labelled with its family
    (gpunode_common.kernel_families); the recoveries are left out."""
    parts = []
    for family, kinds in FAMILIES.items():
        counted = events(b.q("gpunode_kernel_events_total", f'kind=~"{"|".join(kinds)}"'), window)
        parts.append(f'label_replace({counted}, "family", "{family}", "kind", ".*")')
    counted = events(b.q("gpunode_sxid_errors_total"), window)
    parts.append(f'label_replace({counted}, "family", "{SXID_FAMILY}", "sxid", ".*")')
    return " or ".join(parts)


def beyond_the_gpu(b: Board, linked: Callable[[Builder[Any]], Builder[Any]]) -> None:
    """The kernel log past Xid across the fleet, in the families the failure taxonomies count (docs/coverage.md)."""
    node = b.node
    b.row("Beyond the GPU")
    families = ", ".join([SXID_FAMILY, *FAMILIES])
    b.panel(time_series(), "Kernel events by family",
            "Kernel log events past Xid and NVSwitch SXids on the selected nodes in each interval, by family "
            f"({families}; docs/coverage.md says which kinds each holds and which alert watches it). Recoveries "
            f"({', '.join(RECOVERIES)}) are left out. OOM kills and segfaults are most often the job's own. A series "
            "born in the interval counts whole.", "short",
            [Query(f"sum by (family) ({by_family(b, '$__rate_interval')})", "{{family}}")],
            needs=(f"{KERNEL_EVENTS} or {SXIDS}",))
    b.panel(linked(table_panel()), "Nodes with the most kernel events",
            f"The {TOP} nodes that logged the most kernel events past Xid and SXids over the dashboard's time range "
            "(recoveries left out): open a node for its kinds and devices.", "short",
            [Query(f"topk({TOP}, sum by ({node}) ({by_family(b, '$__range')}))")],
            width=6, instant=True, needs=(f"{KERNEL_EVENTS} or {SXIDS}",))
    silent = f"{b.q('gpunode_nfs_server_responding')} == 0"
    # The server the kernel names is the host part of the mount's export (host:/path).
    mounting = f'label_replace({b.q("gpunode_nfs_mount_info")}, "server", "$1", "export", "(.+?):/.*")'
    b.panel(table_panel(), "NFS servers not responding",
            "Each NFS server the kernel of a selected node reports not responding now: how many nodes report it "
            "(A) and how many of the selected nodes mount it (B). Many of its clients at once is the server's (or "
            "its network's) fault, not theirs: NfsServerNotResponding fires then, and job recovery blames no "
            "node for the jobs it stops.", "short",
            [Query(f"count by (server) ({silent})"),
             Query(f"count by (server) ({mounting}) and on (server) count by (server) ({silent})")],
            width=6, instant=True, needs=(NFS_SILENT,))


def fabric(b: Board, linked: Callable[[Builder[Any]], Builder[Any]]) -> None:
    """RDMA ports and NVLink fabrics across the fleet, from the rule pack's alerts (one definition of a port
    down, flapping or degraded: the rules') and the fabric state of each node's GPUs."""
    node, spec = b.node, b.spec["fabric"]
    by_node = f"{{{{{node}}}}}"

    def firing(alertnames: str) -> str:  # a regex of alert names
        return b.q("ALERTS", 'alertstate="firing"', f'alertname=~"{alertnames}"')

    port_alerts = f"max by (alertname, severity, {node}, device, port) ({firing('GpuNodeFabricPort.*')})"
    b.row("Fabric")
    b.panel(stat_panel(), "Fabric alerts firing",
            "Across the selected nodes: RDMA ports down (GpuNodeFabricPortDown, one per port; a node with fewer "
            "ACTIVE ports than fabric.ports_expected counts once, its port label empty), flapping "
            "(GpuNodeFabricPortFlapping) and trained below their own or their peers' rate "
            "(GpuNodeFabricPortDegraded), and nodes whose NVLink fabric is not ready (GpuFabricNotReady, any "
            "cause). The runbook: docs/runbooks/fabric.md.", "short",
            [Query(f"count({firing(name)}) or vector(0)", legend) for name, legend in (
                ("GpuNodeFabricPortDown", "ports down"), ("GpuNodeFabricPortFlapping", "ports flapping"),
                ("GpuNodeFabricPortDegraded", "ports degraded"))]
            + [Query(f"count(count by ({node}) ({firing('GpuFabricNotReady')})) or vector(0)",
                     "nodes: NVLink fabric not ready")], width=6)
    flaps, switches = b.rec("gpunode:fabric_port_flaps:"), b.q("gpunode_nvswitches_visible", 'source="pci"')
    b.panel(linked(table_panel()), "RDMA ports down, flapping or degraded",
            "Each port alert firing now, with its node, device and port (A), the port's netdev and the PCI "
            "address of its adapter (B), and its flaps over fabric.flap_window (C). Many ports of one leaf "
            "switch's nodes at once are the switch's (or its power's), not the nodes'.", "short",
            [Query(port_alerts),
             Query(f"max by ({node}, device, port, netdev, pci_address) ({b.q('gpunode_rdma_port_info')}) "
                   f"and on ({node}, device, port) {port_alerts}"),
             Query(f"max by ({node}, device, port) ({flaps}) and on ({node}, device, port) {port_alerts}")],
            width=10, instant=True, needs=(RDMA_PORTS, PORT_ALERTS))
    b.panel(linked(time_series()), "NVLink fabric not complete, per node",
            "Per node: GPUs whose NVLink fabric is not completed (not started or in progress) and GPUs whose "
            "fabric is unhealthy, from NVML; NVSwitches expected (gpu.nvswitches_expected) minus those on the PCI "
            f"bus. Above 0 for {duration(spec['not_ready_for'])} fires GpuFabricNotReady. Every GPU of a node "
            "not started: its fabric manager; a few unhealthy, or a switch missing: its baseboard.", "short",
            [Query(f"sum by ({node}) ({b.q('gpunode_gpu_fabric_state')} < bool 3)", f"not completed {by_node}"),
             Query(f"sum by ({node}) ({b.q('gpunode_gpu_fabric_healthy')} == bool 0)", f"unhealthy {by_node}"),
             Query(f"{b.q('gpunode_nvswitches_expected')} - ignoring (source) {switches}",
                   f"NVSwitches missing {by_node}")],
            width=8, needs=(GPU_FABRIC, NVSWITCHES_EXPECTED))


def remediation(b: Board) -> None:
    """gpunode-remediate, one service for the fleet: its series are not per node (no node variable)."""
    spec = b.spec["remediate"]
    runbook = "docs/runbooks/remediation.md"
    b.row("Remediation")
    breaker = stat_panel().mappings([model.ValueMap({
        "0": model.ValueMappingResult(text="closed", color="green", index=0),
        "1": model.ValueMappingResult(text="OPEN", color="red", index=1)})])
    b.panel(breaker, "Remediation circuit breaker",
            "Open while gpunode-remediate drains no new node: a drain was due with its budget spent (more nodes "
            "alerted within its budget window than the budget allows, or more in its care at once than "
            "budget.in_care, which is more often one cause than many faults), or a person paused it "
            "(`breaker open --reason`: no action at all; gpunode_remediate_breaker_info has the reason). A person "
            "closes it with `gpunode-remediate breaker reset` once the cause is found; "
            f"GpuRemediationBreakerOpen pages meanwhile, unless paused ({runbook}).", "short",
            [Query(f"max({b.q('gpunode_remediate_breaker_open')})")], width=6)
    b.panel(stat_panel(), "Remediation drain budget: used and allowed",
            "Nodes gpunode-remediate drained within its policy's budget.window (24 h by default), against the "
            "nodes it may drain in it: budget.fraction of the counted nodes (those nodes.include/exclude select, "
            "less those out of service by someone else), at least budget.minimum, at most budget.maximum. The "
            "next drain past the budget opens the circuit breaker.", "short",
            [Query(f"max({b.q('gpunode_remediate_budget_used_nodes')})", "drained"),
             Query(f"max({b.q('gpunode_remediate_budget_nodes')})", "budget")], width=6)
    returns = b.q("gpunode_remediate_return_seconds_bucket")
    b.panel(time_series(), "Time to return to service",
            "From a node's drain by gpunode-remediate to its return, for the nodes returned in the last 24 h: the "
            "median and the 90th percentile. It takes the quiet period after the alerts resolve, the wait for "
            "jobs to end before a reset or reboot, the reboot, and the checks; a node held for a person is not "
            "counted until a person resumes it.", "s",
            [Query(f"histogram_quantile({q}, sum by (le) (increase({returns}[1d])))", label)
             for q, label in (("0.5", "p50"), ("0.9", "p90"))], width=12)
    b.panel(time_series(), "Nodes in remediation by phase",
            "Nodes in gpunode-remediate's care: drained (back once their alerts have been resolved for the quiet "
            "period), waiting for a GPU reset or a reboot once idle and after it, and held for a person, which "
            f"it never returns itself (GpuRemediationNodeHeld after {duration(spec['held_for'])}).", "short",
            [Query(f"sum by (phase) ({b.q('gpunode_remediate_nodes')})", "{{phase}}")])
    actions = b.q("gpunode_remediate_actions_total")
    b.panel(time_series(), "Remediation actions by kind and result",
            "Actions gpunode-remediate took in the interval (drain, hold, reboot, reset, resume, requeue), by "
            "result: done; dry_run, decided and logged but not carried out (the policy's mode is not enforce); "
            "failed, the scheduler or the reset command refused (GpuRemediationActionsFailing); blocked, drains "
            "the circuit breaker or the budget stopped.", "short",
            [Query(f"sum by (action, result) (increase({actions}[$__rate_interval]))", "{{action}} {{result}}")])
    b.panel(table_panel(), "Remediation alerts firing",
            "The rule pack's alerts about gpunode-remediate firing now: its circuit breaker open, a node held "
            "for a person too long, the scheduler out of its reach, failed actions, a job's retry chain held for "
            "a person. They carry the service's labels, not a GPU node's, so the node-scoped alerts tables leave "
            f"them out ({runbook}).", "short",
            [Query(f'sum by (alertname, severity, node, reason, action, job_id) '
                   f'(ALERTS{{alertstate="firing", alertname=~"{REMEDIATION_ALERTS}"}})')], instant=True)
    held = table_panel().with_transformation(model.DataTransformerConfig(id_val="organize", options={
        "excludeByName": {"Time": True}, "renameByName": {"Value": "held for"}}))
    b.panel(held, "Nodes held for a person",
            "Nodes gpunode-remediate drained and holds for a person, why (a repeat offender, a second reboot "
            "fault, a failed GPU reset, a fault no reset cures) and for how long. Fix the node, then resume it "
            "in the scheduler (scontrol update nodename=NODE state=resume); the service lets it go. "
            f"GpuRemediationNodeHeld fires after {duration(spec['held_for'])} ({runbook}).", "s",
            [Query(f"sum by (node, reason) (time() - {b.q('gpunode_remediate_node_held_since_timestamp_seconds')})")],
            width=24, instant=True)
    requeues = b.q("gpunode_remediate_job_requeues_total")
    b.panel(time_series(), "Job requeues by branch",
            "Abnormal ends of Slurm batch jobs gpunode-remediate decided in the interval (policy jobs.enabled), "
            "by branch: app_fault, requeued at once after an application fault on the job's nodes; node_fault, "
            "requeued at once with the faulty node excluded; backoff, requeued to start after a delay when no node "
            "was to blame; held, the job's retry chain stopped at its jobs.max_attempts-th abnormal end within "
            "jobs.window and held for a person (GpuJobRetryChainStopped).", "short",
            [Query(f"sum by (branch) (increase({requeues}[$__rate_interval]))", "{{branch}}")],
            needs=(JOB_RECOVERY,))
    chains = stat_panel().text_mode(BigValueTextMode.VALUE_AND_NAME).thresholds(
        gd.ThresholdsConfig().mode(model.ThresholdsMode.ABSOLUTE).steps(
            [model.Threshold(None, "green"), model.Threshold(1, "orange")]))
    b.panel(chains, "Retry chains held for a person",
            "Each Slurm job whose retry chain gpunode-remediate stopped and held (scontrol requeuehold), with its "
            "failed attempts and the nodes they shared; and the lemon nodes, blamed for failed attempts of several "
            "different jobs, which the service excludes from every requeue and drains. Look at the job's output "
            "and the nodes, then release it (scontrol release JOBID) or cancel it (scancel JOBID); "
            f"GpuJobRetryChainStopped fires meanwhile ({runbook}).", "short",
            [Query(f"sum by (job_id, nodes) ({b.q('gpunode_remediate_job_chain_held_attempts')})",
                   "job {{job_id}} {{nodes}}"),
             Query(f"max({b.q('gpunode_remediate_lemon_nodes')})", "lemon nodes")], needs=(JOB_RECOVERY,))


def describe(_spec: dict[str, Any]) -> tuple[str, str, str]:
    return ("gpunode-cluster", "GPU nodes: cluster",
            "Which GPU nodes to look at: alerts, peer deviations, Xids, remaps, NFS slots, checkpoint cost; "
            "what the remediation service does with them.")
