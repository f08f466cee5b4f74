"""The cluster dashboard: which nodes to look at, and why."""

from __future__ import annotations

from typing import Any

from grafana_foundation_sdk.builders import heatmap, statetimeline, table, timeseries

from exporter.dashboards.board import DCGM, PEERS, Board
from exporter.rulepack import duration


def build(b: Board) -> None:
    spec, node = b.spec, b.node
    pre, fs, remap = spec["precursor"], spec["failslow"], spec["remap"]

    b.row("Alerts")
    b.panel(table.Panel(), "Firing alerts of the rule pack",
            "Alerts of the gpunode rule pack firing now, per node: the place to start. Each alert's runbook "
            "is in its runbook_url annotation (docs/runbooks/).", "short",
            [(f'sum by (alertname, severity, {node}) (ALERTS{{alertstate="firing", '
              'alertname=~"Gpu.*|Nfs.*|Checkpoint.*"})', "")], width=24, instant=True)

    b.row("Nodes against their peers")
    score = b.recorded("gpunode:precursor_signal:score")
    b.panel(heatmap.Panel().calculate(False), "Precursor peer scores (largest per node)",
            "Per node, the largest |robust peer score| of its precursor signals: (value - peer median) / "
            "max(1.4826 MAD, floor). Above the threshold on two or more signals for the continuity window "
            "fires GpuNodePrecursorMultiSignal (seed 000: failing nodes departed from their ~59 peers before "
            "the XID). Needs at least min_peers nodes per peer group.", "short",
            [(f"max by ({node}) (abs({b.sel(score)}))", f"{{{{{node}}}}}")], needs=PEERS)
    b.panel(timeseries.Panel(), "Deviating precursor signals per node",
            f"How many of a node's precursor signals score beyond +-{pre['score_threshold']} (spec "
            f"precursor.score_threshold); GpuNodePrecursorMultiSignal fires at {pre['min_signals']} for "
            f"{duration(pre['continuity'])}.", "short",
            [(f"count by ({node}) (abs({b.sel(score)}) > {pre['score_threshold']}) "
              f"or count by ({node}) ({b.sel(score)}) * 0", f"{{{{{node}}}}}")], needs=PEERS)
    ratio = b.recorded("gpunode:failslow_proxy:ratio_to_peers")
    b.panel(heatmap.Panel().calculate(False), "Fail-slow: throughput against the peer median (lowest proxy)",
            "Per node, its lowest throughput proxy (slowest GPU's utilisation, power, SM clock, NVLink; NIC and "
            f"RDMA bytes) divided by the peer median. Below {1 - fs['fraction']:.2f} on {fs['min_proxies']} "
            f"proxies for {duration(fs['for'])} fires GpuNodeFailSlow (seed 000: fail-slow nodes are 3-15 % "
            "slower; Minder).", "percentunit",
            [(f"min by ({node}) ({b.sel(ratio)})", f"{{{{{node}}}}}")], needs=f"{DCGM}; {PEERS}")

    b.row("XID errors")
    b.panel(timeseries.Panel(), "XIDs by NVIDIA's action",
            "XID events logged in the interval, summed by NVIDIA's immediate action (docs/xid-catalog.md). "
            "increase() misses the first XID of a new series (a GPU's first XID of a code): the table beside "
            "it lists those too.", "short",
            [(f"sum by (action) (increase({b.sel('gpunode_xid_errors_total')}[$__rate_interval]))", "{{action}}")])
    b.panel(table.Panel(), "Latest XID per node, GPU and code",
            "When each node's GPUs last logged each XID code (the kernel log's time), newest first.",
            "dateTimeAsIso",
            [(f"topk(50, {b.sel('gpunode_xid_last_event_timestamp_seconds')} * 1000)", "")], instant=True)

    b.row("GPUs")
    b.panel(table.Panel(), "GPUs with a row remap pending",
            "GPUs whose remapped rows take effect only at the next GPU reset "
            "(gpunode_gpu_row_remap_pending): reset them at the next drain. GpuRowRemapPending fires after "
            f"{duration(remap['pending_for'])}.", "short",
            [(f"{b.sel('gpunode_gpu_row_remap_pending')} == 1", "")], width=8, instant=True)
    rate, short, trend = b.recorded("gpunode:gpu_remapped_rows_correctable:"), remap["acceleration_short_window"], \
        spec["intervals"]["remap_trend"]
    b.panel(table.Panel(), f"Most correctable remaps in the last {duration(short)} (top 10)",
            "GPUs by rows remapped after correctable errors over the short window, and how many times their "
            "rate over the long window before it. Above the factor with at least the floor fires "
            "GpuRowRemapCorrectableAcceleration (gpu124: ~38 to 254 rows in a week, then lost).", "short",
            [(f"topk(10, avg_over_time({b.sel(rate)}[{duration(short)}]) * {short / trend:g} > 0)", "rows"),
             (f"avg_over_time({b.sel(rate)}[{duration(short)}]) / avg_over_time({b.sel(rate)}"
              f"[{duration(remap['acceleration_long_window'])}] offset {duration(short)})", "times the baseline")],
            width=8, instant=True)
    visible = b.sel("gpunode_gpus_visible", "gpunode", 'source="nvml"')
    b.panel(timeseries.Panel(), "GPUs missing or lost",
            "Per node, GPUs expected (gpu.expected_count) minus those the driver enumerates, and GPUs lost "
            "(GPU_IS_LOST or config space all-ones: fell off the bus). GpuNodeGpuMissing, GpuDown.", "short",
            [(f"{b.sel('gpunode_gpus_expected')} - ignoring (source) {visible}", f"missing {{{{{node}}}}}"),
             (f"count by ({node}) ({b.sel('gpunode_gpu_up')} == 0)", f"lost {{{{{node}}}}}")], width=8)

    b.row("NFS")
    b.panel(timeseries.Panel(), "NFS time per request: slot wait against network + server",
            "Per node and operation, the mean time a request waited for an RPC slot (queue) and the time the "
            "network and server took (rtt). Queue above rtt means more slots, not a faster link, would help "
            "(seed 000: save WRITEs waited 1,495 of 1,621 ms). NfsSlotWaitDominates, NfsBandwidthParadox.", "s",
            [(f"max by ({node}, op) ({b.sel(b.recorded('gpunode:nfs_rpc_queue_seconds_per_request:'))})",
              f"slot wait {{{{{node}}}}} {{{{op}}}}"),
             (f"max by ({node}, op) ({b.sel(b.recorded('gpunode:nfs_rpc_rtt_seconds_per_request:'))})",
              f"network+server {{{{{node}}}}} {{{{op}}}}")])
    b.panel(timeseries.Panel(), "NFS slot table saturation",
            "Per node and mount, mean requests in flight per send over the transport's slots; near 1 with a "
            f"backlog for {duration(spec['nfs']['slot_wait_for'])} fires NfsSlotTableSaturated.", "percentunit",
            [(f"max by ({node}, mountpoint) ({b.sel(b.recorded('gpunode:nfs_transport_slot_saturation:'))})",
              f"{{{{{node}}}}} {{{{mountpoint}}}}")])

    b.row("Checkpoints")
    b.panel(statetimeline.Panel(), "Checkpoint phase per node",
            "0 training, 1 saving (writing to NFS faster than checkpoint.save_write_bytes), 2 loading (reading "
            "from NFS with the GPUs idle; needs dcgm-exporter), as the rule pack classifies each node (seed 000 "
            "4.2.1).", "short",
            [(b.sel(b.recorded("gpunode:checkpoint_phase:node")), f"{{{{{node}}}}}")])
    window = duration(spec["checkpoint"]["interval_window"])
    b.panel(timeseries.Panel(), "Checkpoint interval against its Young/Daly optimum",
            f"Per node, the mean time between saves over {window}, and the optimum sqrt(2 x save duration x "
            "MTBF) for its save duration and checkpoint.mtbf_seconds. CheckpointIntervalTooLong fires when the "
            "peer group's interval exceeds interval_factor times the optimum.", "s",
            [(b.sel(b.recorded(f"gpunode:checkpoint_interval_seconds:avg{window}")), f"interval {{{{{node}}}}}"),
             (b.sel(b.recorded("gpunode:checkpoint_interval_seconds:young_daly")), f"optimum {{{{{node}}}}}")])
    b.panel(timeseries.Panel(), "Checkpoint cost: time lost to saves and expected rework",
            "Per node, delta/T + T/(2 MTBF) for its interval T and save duration delta, against the same at the "
            "Young/Daly optimum: the share of training time that checkpointing costs.", "percentunit",
            [(b.sel(b.recorded(f"gpunode:checkpoint_cost_ratio:avg{window}")), f"now {{{{{node}}}}}"),
             (b.sel(b.recorded("gpunode:checkpoint_cost_ratio:young_daly")), f"at the optimum {{{{{node}}}}}")])


def describe(_spec: dict[str, Any]) -> tuple[str, str, str]:
    return ("gpunode-cluster", "GPU nodes: cluster",
            "Which GPU nodes to look at: alerts, peer deviations, XIDs, remaps, NFS slots, checkpoint cost.")
