"""The node dashboard: one node's alerts, GPUs, Xids, kernel events, fabric, checkpoint data path (in the
order the Lablup B200 operations report traced it), NFS operations, storage network and checkpoints."""

from __future__ import annotations

from typing import Any

from gpunode_rulepack import duration
from gpunode_rulepack.dashboards.board import (
    FABRIC_HEALTHY,
    FABRIC_STATES,
    GPU_FABRIC,
    KERNEL_EVENTS,
    NFS_MOUNT,
    NFS_SILENT,
    NVSWITCHES_EXPECTED,
    PEER_ADAPTERS,
    PFC,
    PHYSICAL_STATES,
    PORT_STATES,
    PORTS_EXPECTED,
    RDMA_PORTS,
    RESPONDING,
    SAVES,
    SXIDS,
    Board,
    Query,
    events,
    named_values,
    phases,
    state_timeline,
    table_panel,
    time_series,
)

UID = "gpunode-node"  # the cluster dashboard links here
PEER_RATE = "gpunode:fabric_port_rate_bytes:peer_median"  # per adapter model (hca_type, board_id), fleet-wide


def build(b: Board) -> None:
    spec = b.spec
    mounts = [spec["checkpoint"]["mounts"]] if spec["checkpoint"]["mounts"] else []

    def rate(metric: str, *matchers: str) -> str:
        return f"rate({b.q(metric, *matchers)}[$__rate_interval])"

    b.row("Alerts")
    b.panel(table_panel(), "Firing alerts on this node",
            "The rule pack's alerts firing now on this node (and its peer group's, which name no node), with "
            "their labels; each alert's runbook_url annotation leads to its runbook (docs/runbooks/).", "short",
            [Query(b.alerts())], width=24, instant=True)

    b.row("GPUs")
    b.panel(time_series(), "Remapped rows per GPU",
            "Rows each GPU remapped to spare rows, by cause. Uncorrectable steps come with Xid 94/95 (gpu122; "
            "GpuRowRemapUncorrectableIncrease); correctable ones accelerating precede a lost GPU (gpu124; "
            "GpuRowRemapCorrectableAcceleration).", "short",
            [Query(b.q("gpunode_gpu_remapped_rows_total"), "GPU {{gpu}} {{cause}}")])
    b.panel(time_series(), "Memory banks short of spare rows, per GPU",
            "Memory banks by how many spare rows they have left: high, partial, low, none (banks with all "
            "their spares, max, are most and left out). A bank with none cannot remap again: "
            "GpuRowRemapBanksExhausted.", "short",
            [Query(b.q("gpunode_gpu_remap_banks", 'availability!="max"'), "GPU {{gpu}} {{availability}}")])
    b.panel(state_timeline(), "GPU up, remap pending, remap failed, recovery action",
            "Per GPU: up (0 = lost: GPU_IS_LOST or config space all-ones; GpuDown), a remap pending the next "
            "reset (GpuRowRemapPending), a failed remap (replace the GPU; GpuRowRemapFailure), and the recovery "
            "action the driver asks for (Xid 154: 1 GPU reset, 2 node reboot, 3 drain P2P, 4 drain and reset, "
            "5 recover the IMEX domain, 6 bus reset, 7 system reboot; "
            "GpuRecoveryActionRequired).", "short",
            [Query(b.q("gpunode_gpu_up"), "up GPU {{gpu}}"),
             Query(b.q("gpunode_gpu_row_remap_pending"), "pending GPU {{gpu}}"),
             Query(b.q("gpunode_gpu_row_remap_failure"), "failed GPU {{gpu}}"),
             Query(b.q("gpunode_gpu_recovery_action"), "recovery GPU {{gpu}}")])
    b.panel(time_series(), "PCIe link against its maximum",
            "Each GPU's current PCIe link width and generation against their maximum. Narrower (or, while "
            "busy, slower) for long fires GpuPcieLinkDegraded: no Xid is logged, host transfers slow down "
            "(Minder's PCIe downgrade). An idle GPU may lower its generation to save power.", "short",
            [Query(b.q("gpunode_gpu_pcie_link_width"), "width GPU {{gpu}} {{kind}}"),
             Query(b.q("gpunode_gpu_pcie_link_generation"), "generation GPU {{gpu}} {{kind}}")])

    b.row("Xid errors")
    b.panel(time_series(), "Xid events per GPU and code",
            "Xids logged in the interval per GPU and code, with NVIDIA's action (GpuXidHardwareFault, "
            "GpuXidApplicationFault). increase() misses the first Xid of a new series: the table lists every "
            "code seen.", "short",
            [Query(f"sum by (gpu, xid, action) (increase({b.q('gpunode_xid_errors_total')}[$__rate_interval]))",
                   "GPU {{gpu}} Xid {{xid}} {{action}}")])
    b.panel(table_panel(), "Xids since boot, with the last time each was logged",
            "Every GPU and Xid code logged since the node booted (counts survive exporter restarts), and when "
            "it was last logged.", "short",
            [Query(b.q("gpunode_xid_errors_total")),
             Query(f"{b.q('gpunode_xid_last_event_timestamp_seconds')} * 1000", unit="dateTimeAsIso")], instant=True)

    kernel_events(b)
    fabric(b)

    b.row("Checkpoint data path, in the order a save flows (Lablup B200 operations report)")
    b.panel(time_series(), "1. GPU utilization",
            "dcgm-exporter's utilization per GPU: it dips while a save copies tensors out, and stays low while "
            "a restart loads (the load phase needs it).", "percent",
            [Query(b.q("DCGM_FI_DEV_GPU_UTIL"), f"GPU {{{{{spec['labels']['dcgm_gpu']}}}}}")], width=8)
    b.panel(time_series(), "2. Staging used",
            "Bytes used on the staging filesystems (default /dev/shm, which node_exporter hides): a save lands "
            "here before it goes to NFS.", "bytes",
            [Query(b.q("gpunode_staging_used_bytes"), "{{path}}")], width=8)
    b.panel(time_series(), "3. GPU processes' write() and read() bytes",
            "Bytes the processes holding GPUs pass to write() and read() (wchar/rchar), monotonic across "
            "process exits: what the job itself moves. A load first fills the page cache from NFS with few "
            "read() calls, then read()s surge.", "Bps",
            [Query(rate("gpunode_gpu_process_write_bytes_total"), "write()"),
             Query(rate("gpunode_gpu_process_read_bytes_total"), "read()")], width=8)
    b.panel(time_series(), "4. Dirty and writeback page cache",
            "node_exporter's Dirty and Writeback bytes: written data waiting for, and being sent to, NFS.",
            "bytes", [Query(b.q("node_memory_Dirty_bytes"), "dirty"),
                      Query(b.q("node_memory_Writeback_bytes"), "writeback")], width=8)
    write = rate("gpunode_nfs_rpc_sent_bytes_total", 'op="WRITE"', *mounts)
    read = rate("gpunode_nfs_rpc_received_bytes_total", 'op="READ"', *mounts)
    b.panel(time_series(), "5. NFS WRITE and READ bytes, and RPC backlog",
            "Bytes sent by WRITE and received by READ requests, summed over the mounts the checkpoint phases "
            "count (checkpoint.mounts); and, on the right axis, requests waiting for an RPC slot per send: "
            "above 0 the slot table is full (NfsSlotTableSaturated).", "Bps",
            [Query(f"sum({write})", "WRITE"), Query(f"sum({read})", "READ"),
             Query(f"max by (mountpoint) ({b.rec('gpunode:nfs_transport_backlog:')})", "backlog {{mountpoint}}",
                   unit="short", right=True)], width=8)
    nfs = 'fstype=~"nfs4?"'
    b.panel(time_series(), "6. Storage used",
            "Bytes used on the node's NFS filesystems (node_exporter): where the save ends.", "bytes",
            [Query(f"{b.q('node_filesystem_size_bytes', nfs)} - {b.q('node_filesystem_avail_bytes', nfs)}",
                   "{{mountpoint}}")], width=8, needs=(NFS_MOUNT,))

    b.row("NFS operations")
    b.panel(time_series(), "Time per request by operation: slot wait against network + server",
            "Per mount and operation, the mean slot wait (queue) and network + server time (rtt) per request. "
            "Queue above rtt: more slots, not a faster link, would help (NfsSlotWaitDominates, "
            "NfsBandwidthParadox).", "s",
            [Query(b.rec("gpunode:nfs_rpc_queue_seconds_per_request:"), "slot wait {{op}} {{mountpoint}}"),
             Query(b.rec("gpunode:nfs_rpc_rtt_seconds_per_request:"), "network+server {{op}} {{mountpoint}}")])
    b.panel(time_series(), "Requests per second by operation",
            "NFS requests per second per mount and operation (the operations in spec nfs.ops).", "reqps",
            [Query(b.rec("gpunode:nfs_rpc_operations:"), "{{op}} {{mountpoint}}")], width=6)
    b.panel(time_series(), "RPC slot table saturation",
            "Per transport, mean requests in flight per send over its slots (max_slots, or the sunrpc limit for "
            "rdma); near 1 with a backlog fires NfsSlotTableSaturated ("
            "the Lablup B200 operations report's loads: 128 slots full).",
            "percentunit",
            [Query(b.rec("gpunode:nfs_transport_slot_saturation:"), "{{mountpoint}} {{transport}}")], width=6)

    b.row("Storage network")
    b.panel(time_series(), "RoCE congestion: ECN marks and CNPs",
            "Per RDMA port: packets arriving ECN-marked, congestion notifications sent and handled. They "
            "surge on a PCIe-downgraded or congested node (Minder); precursor signals roce_ecn and roce_cnp.",
            "pps",
            [Query(rate("gpunode_rdma_ecn_marked_packets_total"), "ECN marked {{device}} {{port}}"),
             Query(rate("gpunode_rdma_cnp_sent_total"), "CNP sent {{device}} {{port}}"),
             Query(rate("gpunode_rdma_cnp_handled_total"), "CNP handled {{device}} {{port}}")], width=8)
    b.panel(time_series(), "PFC pause frames",
            "Priority flow control pause frames per interface, direction and priority: rx, the switch asks this "
            "node to stop; tx, this node asks it (Minder: PFC Tx was the most sensitive signal).", "pps",
            [Query(rate("gpunode_network_pfc_pause_frames_total"), "{{device}} {{direction}} prio {{priority}}")],
            width=8, needs=(PFC,))
    b.panel(time_series(), "Storage link utilization",
            "Bytes per second through each storage interface (kernel and RDMA counters) over its link speed. "
            "Slot wait dominating at a low utilization is NfsBandwidthParadox ("
            "the Lablup B200 operations report: 1.4 % during saves).",
            "percentunit", [Query(b.rec("gpunode:storage_link_utilization:"), "{{device}}")], width=8)

    b.row("Checkpoints")
    window = duration(spec["checkpoint"]["interval_window"])
    b.panel(phases(state_timeline()), "Checkpoint phase",
            "Training, saving or loading, as the rule pack classifies this node (after "
            "the Lablup B200 operations report); "
            "CheckpointLoadSlow fires on a load longer than checkpoint.load_slow_seconds.", "short",
            [Query(b.rec("gpunode:checkpoint_phase:node"), "phase")], width=8)
    b.panel(time_series(), "Checkpoint interval and save duration against Young/Daly",
            "This node's mean time between saves and its Young/Daly optimum sqrt(2 x save duration x MTBF), "
            "and the mean save duration, all over checkpoint.interval_window.", "s",
            [Query(b.rec(f"gpunode:checkpoint_interval_seconds:avg{window}"), "interval"),
             Query(b.rec("gpunode:checkpoint_interval_seconds:young_daly"), "optimum"),
             Query(b.rec(f"gpunode:checkpoint_save_duration_seconds:avg{window}"), "save duration")],
            width=8, needs=(SAVES,))
    b.panel(time_series(), "Checkpoint cost against Young/Daly",
            "delta/T + T/(2 MTBF): the share of training time this node's checkpointing costs at its interval, "
            "and at the optimum.", "percentunit",
            [Query(b.rec(f"gpunode:checkpoint_cost_ratio:avg{window}"), "now"),
             Query(b.rec("gpunode:checkpoint_cost_ratio:young_daly"), "at the optimum")], width=8, needs=(SAVES,))


def kernel_events(b: Board) -> None:
    """The kernel log past Xid (docs/kernel-events.md): what broke on the host around the GPUs."""
    b.row("Kernel events")
    kernel = b.q("gpunode_kernel_events_total")
    b.panel(time_series(), "Kernel events by kind",
            "Kernel log events past Xid in each interval, by kind (docs/kernel-events.md lists the lines of each): "
            "hung tasks, lockups, memory, disk, NFS, PCIe AER, NIC and GPU driver faults, OOM kills, segfaults. "
            "nfs_ok and nic_link_up are recoveries. A series born in the interval counts whole.", "short",
            [Query(f"sum by (kind) ({events(kernel, '$__rate_interval')})", "{{kind}}")], needs=(KERNEL_EVENTS,))
    b.panel(table_panel(), "Kernel events: count and last time, by kind and device",
            "Every kind and device (block device, NVMe controller, PCI address, interface, NFS server, memory "
            "controller; empty where the line names none) counted on this node, and when it was last logged. "
            "The counts survive exporter restarts and reboots (the exporter's state file).", "short",
            [Query(kernel),
             Query(f"{b.q('gpunode_kernel_event_last_timestamp_seconds')} * 1000", unit="dateTimeAsIso")],
            instant=True, needs=(KERNEL_EVENTS,))
    b.panel(time_series(), "NVSwitch SXids by switch, code and severity",
            "NVSwitch errors (SXids) in each interval per switch and code, with their severity: fatal as the line "
            "says or NVIDIA's SXid tables give (docs/sxid-catalog.md), nonfatal, or unknown. A fatal SXid "
            "takes the NVLink fabric down for every GPU of the node. A series born in the interval counts whole.",
            "short",
            [Query(f"sum by (switch, sxid, severity) ({events(b.q('gpunode_sxid_errors_total'), '$__rate_interval')})",
                   "switch {{switch}} SXid {{sxid}} {{severity}}")], needs=(SXIDS,))
    b.panel(named_values(state_timeline(), RESPONDING), "NFS servers: responding or not",
            "Per NFS server this node's kernel named: not responding from its `nfs: server S not responding` line "
            "until its `nfs: server S OK` line. Tasks blocked on a server that stopped answering are that "
            "server's fault, not this node's; the cluster dashboard counts the nodes reporting each server.",
            "short", [Query(b.q("gpunode_nfs_server_responding"), "{{server}}")], needs=(NFS_SILENT,))


def fabric(b: Board) -> None:
    """The node's RDMA ports (node_exporter's infiniband collector, InfiniBand and RoCE alike) and its
    NVLink fabric (NVML, and the NVSwitches on the PCI bus): docs/runbooks/fabric.md."""
    spec, node = b.spec["fabric"], b.node
    ports = [spec["ports"]] if spec["ports"] else []  # the ports the rules watch

    def port(metric: str, *matchers: str) -> str:
        return b.q(metric, *ports, *matchers)

    def per_port(expr: str) -> str:  # one series per port, whichever exporter's job it has
        return f"max by ({node}, device, port) ({expr})"

    legend, lookback = "{{device}} {{port}}", duration(spec["rate_lookback"])
    flaps, window = b.rec("gpunode:fabric_port_flaps:", *ports), duration(spec["flap_window"])
    b.row("Fabric")
    b.panel(state_timeline(), "RDMA ports: state and physical state",
            "Per RDMA port (device and port), its state (DOWN, INIT, ARMED, ACTIVE, ACTIVE_DEFER) and physical "
            "state (Polling: no link partner, a cable out or the far end down; Disabled; LinkUp; "
            "LinkErrorRecovery: retraining). A port ACTIVE within fabric.up_lookback and not now fires "
            f"GpuNodeFabricPortDown after {duration(spec['down_for'])}; one never ACTIVE (never cabled) "
            "stays silent.", "short",
            [Query(port("node_infiniband_state_id"), legend, names=PORT_STATES),
             Query(port("node_infiniband_physical_state_id"), f"physical {legend}", names=PHYSICAL_STATES)],
            needs=(RDMA_PORTS,))
    # What GpuNodeFabricPortDegraded compares: the rate while ACTIVE, its highest within the lookback, and
    # the median of the same adapters' ports across the fleet (a fleet-wide series: no node to select).
    active = b.rec("gpunode:fabric_port_rate_bytes:active", *ports)
    peers = f"max by ({node}, device, port) (0 * {active} + on (hca_type, board_id) group_left () {PEER_RATE})"
    b.panel(time_series(), f"RDMA port rate against its highest over {lookback} and its peers",
            "Each port's link rate as trained (400 Gb/s: 50 GB/s); while ACTIVE, the highest it had within "
            "fabric.rate_lookback, and the median of the ACTIVE ports of the same adapters (hca_type, board_id) "
            f"on other nodes, where {spec['peer_min_nodes']} nodes or more have them. An ACTIVE port below either "
            "(trained down after a reseat, a dirty connector, a bad lane) for "
            f"{duration(spec['degraded_for'])} fires GpuNodeFabricPortDegraded.", "Bps",
            [Query(port("node_infiniband_rate_bytes_per_second"), legend),
             Query(b.rec("gpunode:fabric_port_rate_bytes:max", *ports), f"highest {legend}"),
             Query(peers, f"peer median {legend}")], needs=(RDMA_PORTS, PEER_ADAPTERS))
    b.panel(time_series(), f"RDMA port flaps over {window}",
            f"Per port, the most down-events any one source counted over {window} (fabric.flap_window): the "
            "HCA's link_downed counter, carrier down changes and the kernel's link-down lines of its netdev. "
            "A flap shorter than a scrape shows there only, the state reading ACTIVE at every scrape. "
            f"{spec['flaps']} or more on an ACTIVE port fires GpuNodeFabricPortFlapping. On the right, the "
            "link_downed counter itself: 8 bits, it holds at 255, and then only the netdev's counts move.",
            "short",
            [Query(flaps, legend),
             Query(port("node_infiniband_link_downed_total"), f"link_downed {legend}", unit="short", right=True)],
            needs=(RDMA_PORTS,))
    b.panel(table_panel(), "RDMA ports now: netdev, PCI address, state, rate, flaps",
            "Each RDMA port with its netdev (RoCE's, or InfiniBand's IPoIB interface: where carrier changes and "
            "the kernel's link lines land), link layer and the PCI function of its adapter (the address the "
            "mlx5 driver's firmware and command errors name), beside its state, physical state, rate and "
            f"flaps over {window} now.", "short",
            [Query(f"max by ({node}, device, port, netdev, link_layer, pci_address) "
                   f"({port('gpunode_rdma_port_info')})"),
             Query(per_port(port("node_infiniband_state_id")), names=PORT_STATES),
             Query(per_port(port("node_infiniband_physical_state_id")), names=PHYSICAL_STATES),
             Query(per_port(port("node_infiniband_rate_bytes_per_second")), unit="Bps"),
             Query(per_port(flaps))], instant=True, needs=(RDMA_PORTS,))
    b.panel(time_series(), "RDMA ports ACTIVE against expected",
            "Ports ACTIVE (or ACTIVE_DEFER) on this node, against fabric.ports_expected of the exporter's "
            "configuration (the ports cabled in this node's design). Fewer for "
            f"{duration(spec['down_for'])} fires GpuNodeFabricPortDown with an empty port label: it catches a "
            "port down since before the lookback, or one whose device vanished.", "short",
            [Query(f"sum by ({node}) ({port('node_infiniband_state_id')} >= bool 4)", "ACTIVE"),
             Query(b.q("gpunode_fabric_ports_expected"), "expected")], width=6, needs=(RDMA_PORTS, PORTS_EXPECTED))
    b.panel(time_series(), "NVSwitches visible against expected",
            "NVSwitches on the PCI bus (NVIDIA bridge functions, class 0x0680) against gpu.nvswitches_expected "
            "(four on an HGX H100 baseboard). One missing takes the NVLink fabric down: GpuFabricNotReady "
            "with cause nvswitch_missing.", "short",
            [Query(b.q("gpunode_nvswitches_visible", 'source="pci"'), "visible"),
             Query(b.q("gpunode_nvswitches_expected"), "expected")], width=6, needs=(NVSWITCHES_EXPECTED,))
    b.panel(state_timeline(), "GPU NVLink fabric: state and health",
            "Per GPU, NVML's fabric state: not started, in progress (the fabric manager is training the NVLinks "
            "and programming the switches; CUDA answers error 802, system not yet initialized) or completed; "
            "and its health: unhealthy where the fabric status is an error or the driver reports degraded "
            "bandwidth, route recovery, an unhealthy route, an access timeout recovery or an incorrect "
            f"configuration. Not completed or unhealthy for {duration(spec['not_ready_for'])} fires "
            "GpuFabricNotReady: every GPU not started is the fabric manager's, some GPUs unhealthy a switch's "
            "or a link's (docs/runbooks/fabric.md).", "short",
            [Query(b.q("gpunode_gpu_fabric_state"), "GPU {{gpu}}", names=FABRIC_STATES),
             Query(b.q("gpunode_gpu_fabric_healthy"), "health GPU {{gpu}}", names=FABRIC_HEALTHY)],
            width=12, needs=(GPU_FABRIC,))


def describe(_spec: dict[str, Any]) -> tuple[str, str, str]:
    return (UID, "GPU nodes: node",
            "One GPU node: alerts, GPU memory health, Xids, kernel events past Xid, the fabric (RDMA ports, "
            "NVLink), the checkpoint data path, NFS, the storage network and checkpoints.")
