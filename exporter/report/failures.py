"""Hardware events per node from the exporter's series: each Xid (with NVIDIA's action), a GPU
lost, a row-remap failure, an uncorrectable remap."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from exporter.report.source import Labels


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
