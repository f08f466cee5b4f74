"""XID events: the kernel log's NVRM Xid records and NVML's XID events."""
