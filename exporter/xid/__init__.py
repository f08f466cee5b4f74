"""Xid events: the kernel log's NVRM Xid records and NVML's Xid events."""
