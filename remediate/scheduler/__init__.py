"""Scheduler adapters: list nodes (and their jobs), drain, reboot once idle, resume, requeue."""

from __future__ import annotations

from typing import Protocol

from gpunode_remediate.plan import NodeView
from gpunode_remediate.policy import Policy


class Scheduler(Protocol):
    def nodes(self, with_jobs: bool = False) -> dict[str, NodeView]: ...
    def drain(self, node: str, reason: str) -> None: ...
    def reboot(self, node: str, reason: str) -> None: ...
    def resume(self, node: str) -> None: ...
    def requeue(self, job: str) -> None: ...
    def returns_rebooted(self) -> bool: ...  # does it return a rebooted node to service by itself?


def build(policy: Policy) -> Scheduler:
    if policy.scheduler.kind == "slurm":
        from gpunode_remediate.scheduler.slurm import Slurm

        return Slurm(policy.scheduler.scontrol, policy.scheduler.squeue, policy.scheduler.timeout)
    from gpunode_remediate.scheduler.commands import Commands

    return Commands(policy.scheduler.commands, policy.scheduler.timeout)
