"""Hardware events per node from the exporter's series: each Xid (with NVIDIA's action), a GPU
lost, a row-remap failure, an uncorrectable remap; and the one blamed for each abnormal job end."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpunode_report.goodput import gpu_hours
from gpunode_report.jobs import Job
from gpunode_report.source import Labels, rfc3339

# A failed GPU can leave its job's other ranks waiting in a collective until the NCCL watchdog
# aborts them (PyTorch's default timeout: 10 min), so the job may end that long after the event.
BLAME_BEFORE = 600.0
# A lost GPU or a remap is seen at the first sample without the job, an Xid to the second before it.
BLAME_AFTER_SCRAPES = 2


@dataclass(frozen=True)
class Failure:
    node: str
    time: float
    kind: str  # xid, gpu_lost, remap_failure, uncorrectable_remap
    xid: int | None = None
    action: str = ""
    gpu: str = ""


def xids(series: dict[Labels, np.ndarray], node_label: str, start: float, end: float) -> list[Failure]:
    """From gpunode_xid_last_event_timestamp_seconds: each value it takes within [start, end] is an
    event at that time (the counter may have been reset by a reboot; the timestamp is exact)."""
    out = set()
    for labels, values in series.items():
        d = dict(labels)
        if not d.get("xid", "").isdigit():
            continue
        for stamp in np.unique(values[~np.isnan(values)]):
            if start <= stamp <= end and math.isfinite(stamp):
                out.add(Failure(d.get(node_label, ""), float(stamp), "xid", int(d["xid"]), d.get("action", ""),
                                d.get("gpu", "")))
    return sorted(out, key=lambda f: (f.time, f.node, f.xid or 0))


def onsets(series: dict[Labels, np.ndarray], node_label: str, times: np.ndarray, kind: str) -> list[Failure]:
    """An event at each sample where the series (a query true only at the event: `== 0`, `> 0`)
    has a value and had none the sample before."""
    out = []
    for labels, values in series.items():
        d = dict(labels)
        present = ~np.isnan(values)
        # from the second sample on: a series there at the range's start began before it
        starts = np.flatnonzero(present & ~np.concatenate([[True], present[:-1]]))
        out += [Failure(d.get(node_label, ""), float(times[i]), kind, None, "", d.get("gpu", "")) for i in starts]
    return sorted(out, key=lambda f: (f.time, f.node))


def concentration(failures: list[Failure], nodes: int, top: int = 3) -> dict[str, object]:
    """How concentrated hardware events are: the top nodes' share of the nodes with any."""
    per_node: dict[str, int] = {}
    for f in failures:
        per_node[f.node] = per_node.get(f.node, 0) + 1
    ranked = sorted(per_node.items(), key=lambda kv: (-kv[1], kv[0]))
    total = sum(per_node.values())
    return {"nodes_with_events": len(per_node), "nodes": nodes, "top": [n for n, _ in ranked[:top]],
            "top_share": sum(c for _, c in ranked[:top]) / total if total else None}


def blame(found: list[Failure], nodes: list[str], end: float, step: float) -> Failure | None:
    """The event an attempt that ended at `end` (the sample after its last) on `nodes` is blamed
    on: the one on its nodes nearest the end, from BLAME_BEFORE and a step before it to
    BLAME_AFTER_SCRAPES after; on that node its Xid nearest the end where it logged one (an Xid 79
    comes with a lost GPU, seen a sample later; the first listed wins a tie). None: no culprit."""
    lo, hi = end - BLAME_BEFORE - step, end + BLAME_AFTER_SCRAPES * step
    near = [f for f in found if f.node in nodes and lo <= f.time <= hi]
    if not near:
        return None
    node = min(near, key=lambda f: abs(f.time - end)).node
    mine = [f for f in near if f.node == node]
    return min([f for f in mine if f.kind == "xid"] or mine, key=lambda f: abs(f.time - end))


def retries(job: Job, found: list[Failure], grid_start: float, step: float, gpus_per_node: int) -> dict[str, Any]:
    """report.json's failed_attempts (each attempt but the last: the event its end is blamed on)
    and failed_gpu_hours (the GPU-hours those attempts ran)."""
    failed = job.attempts[:-1]
    out = []
    for a in failed:
        end = grid_start + (a.last + 1) * step
        f = blame(found, a.nodes, end, step)
        out.append({"end": rfc3339(end), "node": f.node if f else None, "kind": f.kind if f else None,
                    "xid": f.xid if f else None})
    return {"failed_attempts": out,
            "failed_gpu_hours": round(sum(gpu_hours(a.seconds(step), len(a.nodes), gpus_per_node) for a in failed), 2)}
