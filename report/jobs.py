"""Training jobs from the workloads the nodes ran (gpunode_node_workload_info): each workload's
attempts, and attempts joined into jobs.

A failed job restarts as a new workload (a requeued Slurm job, a new session; on Kubernetes the
same owner with new pods) on nearly the same nodes minutes later: an attempt that starts within
`restart_within` of another's end, on at least half of that one's nodes, is its next attempt,
and the end before it was abnormal. Pure functions of arrays on the report's time grid.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

MISSED_SCRAPES = 2  # a workload absent this many samples in a row still runs (a missed scrape)


@dataclass
class Attempt:
    key: str  # the workload, or for Kubernetes pods the owner (namespace/kind/name)
    workloads: list[str]  # the ids the nodes reported (Kubernetes: pod UIDs)
    nodes: list[str]
    first: int  # grid index of its first sample
    last: int  # grid index of its last sample
    present: dict[str, np.ndarray] = field(repr=False, default_factory=dict)  # node -> bool on [first, last]

    def seconds(self, step: float) -> float:
        return (self.last - self.first + 1) * step


@dataclass
class Job:
    name: str
    attempts: list[Attempt]

    @property
    def nodes(self) -> list[str]:
        return sorted({n for a in self.attempts for n in a.nodes})


def runs(mask: np.ndarray, bridge: int) -> list[tuple[int, int]]:
    """(first, last) of each run of True, runs apart by at most `bridge` False samples joined."""
    where = np.flatnonzero(mask)
    if where.size == 0:
        return []
    breaks = np.flatnonzero(np.diff(where) > bridge + 1)
    starts = np.concatenate([[where[0]], where[breaks + 1]])
    ends = np.concatenate([where[breaks], [where[-1]]])
    return list(zip(starts.tolist(), ends.tolist(), strict=True))


def attempts(presence: dict[tuple[str, str, str], np.ndarray]) -> list[Attempt]:
    """presence: (key, workload id, node) -> bool per sample. An attempt is a run of samples in
    which any node runs the key, gaps of up to MISSED_SCRAPES bridged."""
    by_key: dict[str, list[tuple[str, str, np.ndarray]]] = {}
    for (key, workload, node), mask in presence.items():
        by_key.setdefault(key, []).append((workload, node, mask))
    out = []
    for key, members in by_key.items():
        anyone = np.logical_or.reduce([m for _w, _n, m in members])
        for first, last in runs(anyone, MISSED_SCRAPES):
            present: dict[str, np.ndarray] = {}
            workloads = set()
            for workload, node, mask in members:
                part = mask[first:last + 1]
                if part.any():
                    present[node] = present.get(node, np.zeros(part.size, bool)) | part
                    workloads.add(workload)
            out.append(Attempt(key, sorted(workloads), sorted(present), first, last, present))
    return sorted(out, key=lambda a: (a.first, a.key))


def join(found: list[Attempt], restart_within: int) -> list[Job]:
    """Attempts into jobs; restart_within in samples."""
    jobs: list[Job] = []
    for attempt in found:
        mine = set(attempt.nodes)
        best = None
        for job in jobs:
            last = job.attempts[-1]
            gap = attempt.first - last.last
            if 0 < gap <= restart_within and len(mine & set(last.nodes)) * 2 >= len(last.nodes) and (
                    best is None or last.last > best.attempts[-1].last):
                best = job
        if best is not None:
            best.attempts.append(attempt)
        else:
            jobs.append(Job(attempt.key, [attempt]))
    return jobs


def phases(save: np.ndarray, load: np.ndarray) -> np.ndarray:
    """A node's phase per sample as the rule pack records it (gpunode:checkpoint_phase:node): 1
    where it saves, else 2 where it loads, else 0 (build.py: the thresholds)."""
    return np.where(save, 1, np.where(load, 2, 0)).astype(np.int8)


def majority(phase_by_node: list[np.ndarray]) -> np.ndarray:
    """The phase more than half of the nodes are in, else 0 (training)."""
    stacked = np.vstack(phase_by_node)
    half = stacked.shape[0] / 2
    return np.where((stacked == 1).sum(axis=0) > half, 1,
                    np.where((stacked == 2).sum(axis=0) > half, 2, 0)).astype(np.int8)
