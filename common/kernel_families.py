"""Kernel event kinds (gpunode_kernel_events_total's `kind`) grouped into the families the
published failure taxonomies count (docs/coverage.md): the one mapping the dashboards and the
docs use. NVSwitch SXids have a metric of their own (gpunode_sxid_errors_total) and form the
family SXID_FAMILY."""

from __future__ import annotations

SXID_FAMILY = "NVSwitch"
# Family -> its kinds. Every kind the exporter counts is in one family or in RECOVERIES
# (tests/test_dashboards.py checks it against the exporter's list).
FAMILIES: dict[str, tuple[str, ...]] = {
    "host hangs": ("hung_task", "rcu_stall", "soft_lockup", "hard_lockup", "kernel_panic"),
    "memory": ("machine_check", "memory_corrected", "memory_uncorrected"),
    "disks and filesystems": ("fs_error", "fs_readonly", "block_io_error", "nvme_timeout", "nvme_failed",
                              "raid_disk_failed"),
    "NFS": ("nfs_not_responding", "nfs_error"),
    "PCIe": ("pcie_aer_corrected", "pcie_aer_uncorrected"),
    "NIC": ("nic_link_down", "nic_fw_error", "nic_hw_error", "nic_cmd_timeout", "nic_cmd_error", "nic_init_failed"),
    "GPU driver": ("gpu_fallen_off_bus", "gpu_init_failed", "gsp_timeout", "gsp_error", "nvlink_error",
                   "peermem_error"),
    "OOM kills": ("oom_kill",),
    "segfaults": ("segfault",),
}
# A fault's end, not a fault: counted by the exporter, left out of every family.
RECOVERIES = ("nfs_ok", "nic_link_up")
