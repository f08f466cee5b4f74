"""The report's figures as PNG, drawn with matplotlib (without a display)."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from gpunode_report.goodput import cost_curve, gpu_hours

PARTS = (("productive", "#2e7d32"), ("checkpoint_save", "#1565c0"), ("checkpoint_load", "#64b5f6"),
         ("down", "#9e9e9e"), ("slowed", "#f9a825"), ("lost_progress", "#c62828"))
KIND_MARKERS = {"xid": "o", "gpu_lost": "X", "remap_failure": "s", "uncorrectable_remap": "D"}


def _plt():  # type: ignore[no-untyped-def]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(plt, fig, path: Path) -> None:  # type: ignore[no-untyped-def]
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def goodput(report: dict[str, Any], path: Path) -> None:
    """GPU-hours per job, stacked by where they went."""
    plt = _plt()
    jobs = report["jobs"]
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(jobs) + 2.2))
    left = np.zeros(len(jobs))
    for part, colour in PARTS:
        hours = np.array([gpu_hours(j["seconds"][part], len(j["nodes"]), report["gpus_per_node"]) for j in jobs])
        ax.barh(range(len(jobs)), hours, left=left, color=colour, label=part.replace("_", " "))
        left += hours
    ax.set_yticks(range(len(jobs)), [j["name"] for j in jobs])
    ax.invert_yaxis()
    ax.set_xlabel("GPU-hours")
    ax.set_title("Where each job's GPU-hours went")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12 - 0.6 / (len(jobs) + 3)), ncol=3, fontsize="small")
    _save(plt, fig, path)


def failures(report: dict[str, Any], path: Path) -> None:
    """Hardware events per node over the range, and each job's abnormal ends."""
    plt = _plt()
    nodes = sorted({f["node"] for f in report["failures"]})
    fig, ax = plt.subplots(figsize=(9, 0.35 * len(nodes) + 2))
    for kind, marker in KIND_MARKERS.items():
        points = [(_time(f["time"]), nodes.index(f["node"])) for f in report["failures"] if f["kind"] == kind]
        if points:
            ax.scatter(*zip(*points, strict=True), marker=marker, label=kind.replace("_", " "), s=40, alpha=0.8)
    for f in report["failures"]:
        if f["xid"] is not None:
            ax.annotate(f"Xid {f['xid']}", (_time(f["time"]), nodes.index(f["node"])), textcoords="offset points",
                        xytext=(4, 6 + 8 * (f["xid"] % 2)), fontsize="x-small")
    for job in report["jobs"]:
        for end in job["abnormal_ends"]:
            ax.axvline(_time(end), color="#c62828", alpha=0.25, lw=1)
    ax.set_yticks(range(len(nodes)), nodes)
    ax.set_xlim(_time(report["from"]), _time(report["to"]))
    ax.set_title("Hardware events per node (red lines: abnormal job ends)")
    if nodes:
        ax.legend(loc="upper left", fontsize="small")
    fig.autofmt_xdate()
    _save(plt, fig, path)


def young_daly(job: dict[str, Any], path: Path) -> None:
    """The checkpoint cost curve of one job, today's interval and the optimum marked."""
    plt = _plt()
    c = job["checkpoint"]
    delta, mtbf, now, best = c["save_seconds"], c["mtbf_seconds"], c["interval_seconds"], c["optimal_interval_seconds"]
    top = max(now or 0, best) * 1.6
    t = np.linspace(max(best / 10, 60), top, 400)
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(t / 60, 100 * cost_curve(delta, mtbf, t), color="#1565c0")
    ax.scatter([best / 60], [100 * c["optimal_cost_fraction"]], color="#2e7d32", zorder=3,
               label=f"optimum {best / 60:.1f} min: {100 * c['optimal_cost_fraction']:.2f} %")
    if now:
        ax.scatter([now / 60], [100 * c["cost_fraction"]], color="#c62828", zorder=3,
                   label=f"today {now / 60:.1f} min: {100 * c['cost_fraction']:.2f} %")
    ax.set_xlabel("checkpoint interval (minutes)")
    ax.set_ylabel("% of training time (saves + progress lost)")
    ax.set_title(f"{job['name']}: save {delta:.1f} s, job MTBF {mtbf / 3600:.1f} h")
    ax.legend()
    _save(plt, fig, path)


def storage(report: dict[str, Any], path: Path) -> None:
    """Per operation, a request's time: waiting for an RPC slot against network + server."""
    plt = _plt()
    rows = [(f"{phase} {op}", o["queue_seconds"] * 1000, o["rtt_seconds"] * 1000)
            for phase in ("save", "load") for op, o in report["storage"][phase]["operations"].items()]
    fig, ax = plt.subplots(figsize=(7, 0.5 * len(rows) + 1.6))
    names = [r[0] for r in rows]
    ax.barh(names, [r[1] for r in rows], color="#c62828", label="waiting for an RPC slot")
    ax.barh(names, [r[2] for r in rows], left=[r[1] for r in rows], color="#1565c0", label="network + server")
    ax.invert_yaxis()
    ax.set_xlabel("milliseconds per request")
    ax.set_title("NFS requests during checkpoint saves and loads")
    ax.legend(loc="lower right", fontsize="small")
    _save(plt, fig, path)
