"""The node dashboard: one node's GPUs, XIDs, checkpoint data path (seed 000's Figure 9 order),
NFS operations and storage network."""

from __future__ import annotations

from typing import Any

from grafana_foundation_sdk.builders import statetimeline, table, timeseries

from exporter.dashboards.board import DCGM, NFS_MOUNT, PFC, Board


def build(b: Board) -> None:
    spec = b.spec
    nfs_bytes_filter = [spec["checkpoint"]["mounts"]] if spec["checkpoint"]["mounts"] else []

    def rate(metric: str, source: str = "gpunode", *matchers: str) -> str:
        return f"rate({b.sel(metric, source, *matchers)}[$__rate_interval])"

    b.row("GPUs")
    b.panel(timeseries.Panel(), "Remapped rows per GPU",
            "Rows each GPU remapped to spare rows, by cause. Uncorrectable steps come with XID 94/95 (gpu122); "
            "correctable ones accelerating precede a lost GPU (gpu124).", "short",
            [(b.sel("gpunode_gpu_remapped_rows_total"), "GPU {{gpu}} {{cause}}")])
    b.panel(timeseries.Panel(), "Spare-row banks per GPU",
            "Memory banks by how many spare rows they have left (max, high, partial, low, none). A bank with "
            "none cannot remap again: GpuRowRemapBanksExhausted.", "short",
            [(b.sel("gpunode_gpu_remap_banks", "gpunode", 'availability!="max"'), "GPU {{gpu}} {{availability}}")])
    b.panel(statetimeline.Panel(), "GPU up, remap pending, remap failed",
            "Per GPU: up (0 = lost: GPU_IS_LOST or config space all-ones), a remap pending the next reset, a "
            "failed remap (replace the GPU).", "short",
            [(b.sel("gpunode_gpu_up"), "up GPU {{gpu}}"),
             (b.sel("gpunode_gpu_row_remap_pending"), "pending GPU {{gpu}}"),
             (b.sel("gpunode_gpu_row_remap_failure"), "failed GPU {{gpu}}")])
    b.panel(timeseries.Panel(), "PCIe link width against its maximum",
            "Each GPU's current PCIe link width and its maximum; narrower for long fires GpuPcieLinkDegraded "
            "(no XID is logged; host transfers slow down).", "short",
            [(b.sel("gpunode_gpu_pcie_link_width"), "GPU {{gpu}} {{kind}}")])

    b.row("XID errors")
    b.panel(timeseries.Panel(), "XID events per GPU and code",
            "XIDs logged in the interval per GPU and code, with NVIDIA's action. increase() misses the first "
            "XID of a new series: the table lists every code seen.", "short",
            [(f"sum by (gpu, xid, action) (increase({b.sel('gpunode_xid_errors_total')}[$__rate_interval]))",
              "GPU {{gpu}} Xid {{xid}} {{action}}")])
    b.panel(table.Panel(), "XIDs since boot, with the last time each was logged",
            "Every GPU and XID code logged since the node booted (counts survive exporter restarts), and when "
            "it was last logged.", "short",
            [(b.sel("gpunode_xid_errors_total"), ""),
             (f"{b.sel('gpunode_xid_last_event_timestamp_seconds')} * 1000", "")], instant=True)

    b.row("Checkpoint data path (seed 000, Figure 9: save from top to bottom)")
    b.panel(timeseries.Panel(), "1. GPU utilisation",
            "dcgm-exporter's utilisation per GPU: it dips while a save copies tensors out, and stays low while "
            "a restart loads.", "percent",
            [(b.sel("DCGM_FI_DEV_GPU_UTIL", "dcgm"), f"GPU {{{{{spec['labels']['dcgm_gpu']}}}}}")],
            width=8, needs=DCGM)
    b.panel(timeseries.Panel(), "2. Staging used",
            "Bytes used on the staging filesystems (default /dev/shm): a save lands here before it goes to NFS.",
            "bytes", [(b.sel("gpunode_staging_used_bytes"), "{{path}}")], width=8)
    b.panel(timeseries.Panel(), "3. GPU processes' write() and read() bytes",
            "Bytes the processes holding GPUs pass to write() and read() (rchar/wchar), monotonic across "
            "process exits: what the job itself moves.", "Bps",
            [(rate("gpunode_gpu_process_write_bytes_total"), "write()"),
             (rate("gpunode_gpu_process_read_bytes_total"), "read()")], width=8)
    b.panel(timeseries.Panel(), "4. Dirty and writeback page cache",
            "node_exporter's Dirty and Writeback bytes: written data waiting for, and being sent to, NFS.",
            "bytes", [(b.sel("node_memory_Dirty_bytes", "node"), "dirty"),
                      (b.sel("node_memory_Writeback_bytes", "node"), "writeback")], width=8)
    write = rate("gpunode_nfs_rpc_sent_bytes_total", "gpunode", 'op="WRITE"', *nfs_bytes_filter)
    read = rate("gpunode_nfs_rpc_received_bytes_total", "gpunode", 'op="READ"', *nfs_bytes_filter)
    b.panel(timeseries.Panel(), "5. NFS WRITE and READ bytes, and RPC backlog",
            "Bytes sent by WRITE and received by READ requests, summed over mounts; and requests queued for "
            "an RPC slot per send (right axis in your head: a count). A save is a WRITE burst; a backlog above 0 "
            "means the slot table is full.", "Bps",
            [(f"sum({write})", "WRITE"), (f"sum({read})", "READ"),
             (f"max by (mountpoint) ({b.sel(b.recorded('gpunode:nfs_transport_backlog:'))})",
              "backlog per send {{mountpoint}}")], width=8)
    nfs = 'fstype=~"nfs.*"'
    b.panel(timeseries.Panel(), "6. Storage used",
            "Bytes used on the node's NFS filesystems (node_exporter): where the save ends.", "bytes",
            [(f"{b.sel('node_filesystem_size_bytes', 'node', nfs)} - "
              f"{b.sel('node_filesystem_avail_bytes', 'node', nfs)}", "{{mountpoint}}")],
            width=8, needs=NFS_MOUNT)

    b.row("NFS operations")
    b.panel(timeseries.Panel(), "Time per request by operation: slot wait against network + server",
            "Per mount and operation, the mean slot wait (queue) and network + server time (rtt) per request.",
            "s", [(b.sel(b.recorded("gpunode:nfs_rpc_queue_seconds_per_request:")), "wait {{op}} {{mountpoint}}"),
                  (b.sel(b.recorded("gpunode:nfs_rpc_rtt_seconds_per_request:")), "rtt {{op}} {{mountpoint}}")])
    b.panel(timeseries.Panel(), "Requests per second by operation",
            "NFS requests per second per mount and operation (the operations in spec nfs.ops).", "reqps",
            [(b.sel(b.recorded("gpunode:nfs_rpc_operations:")), "{{op}} {{mountpoint}}")])

    b.row("Storage network")
    b.panel(timeseries.Panel(), "RoCE congestion: ECN marks and CNPs",
            "Per RDMA port: packets arriving ECN-marked, congestion notifications sent and handled. They "
            "surge on a PCIe-downgraded or congested node (Minder).", "pps",
            [(rate("gpunode_rdma_ecn_marked_packets_total"), "ECN marked {{device}}"),
             (rate("gpunode_rdma_cnp_sent_total"), "CNP sent {{device}}"),
             (rate("gpunode_rdma_cnp_handled_total"), "CNP handled {{device}}")], width=8)
    b.panel(timeseries.Panel(), "PFC pause frames",
            "Priority flow control pause frames per interface, direction and priority: a lossless RoCE fabric "
            "pausing this node.", "pps",
            [(rate("gpunode_network_pfc_pause_frames_total"), "{{device}} {{direction}} prio {{priority}}")],
            width=8, needs=PFC)
    b.panel(timeseries.Panel(), "Storage link utilisation",
            "Bytes per second through each storage interface (kernel and RDMA counters) over its link speed. "
            "Slot wait dominating at a low utilisation is NfsBandwidthParadox (seed 000: 1.4 % during saves).",
            "percentunit", [(b.sel(b.recorded("gpunode:storage_link_utilization:")), "{{device}}")], width=8)


def describe(_spec: dict[str, Any]) -> tuple[str, str, str]:
    return ("gpunode-node", "GPU nodes: node",
            "One GPU node: GPU memory health, XIDs, the checkpoint data path, NFS and the storage network.")
