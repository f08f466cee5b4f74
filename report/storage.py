"""The NFS client during checkpoint saves and loads: per operation, the time a request waits for
an RPC slot against the network and server's time (the Lablup B200 operations report, Table 13),
the share of the time the slot table is full, and the storage link's utilization."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

PHASES = {1: "save", 2: "load"}
TIMES = ("operations", "queue", "rtt", "execute")


@dataclass
class Totals:
    """Sums over the samples of one phase: per op, requests and seconds; and per sample counts."""

    ops: dict[str, dict[str, float]] = field(default_factory=dict)  # op -> TIMES -> per-second sums; samples, peak
    samples: int = 0
    saturated: int = 0
    link: list[float] = field(default_factory=list)  # utilization per sample (only phase samples: small)

    def add_op(self, op: str, what: str, values: np.ndarray) -> None:
        entry = self.ops.setdefault(op, dict.fromkeys((*TIMES, "samples", "peak"), 0.0))
        entry[what] += float(np.nansum(values))
        if what == "operations" and (seen := ~np.isnan(values)).any():  # a node's requests/s in each sample
            entry["samples"] += int(seen.sum())
            entry["peak"] = max(entry["peak"], float(np.nanmax(values)))


def accumulate(totals: dict[int, Totals], phase: np.ndarray, op: str, what: str, values: np.ndarray) -> None:
    for code in PHASES:
        totals[code].add_op(op, what, np.where(phase == code, values, np.nan))


def summary(totals: dict[int, Totals], slot_saturation: float, link_fraction: float,
            wait_fraction: float) -> dict[str, object]:
    out: dict[str, object] = {}
    bottleneck = []
    for code, name in PHASES.items():
        t = totals[code]
        ops = {}
        for op, sums in sorted(t.ops.items()):
            n = sums["operations"]
            if n <= 0:
                continue
            ops[op] = {"requests": n, "requests_per_second": n / sums["samples"],
                       "requests_per_second_peak": sums["peak"], "queue_seconds": sums["queue"] / n,
                       "rtt_seconds": sums["rtt"] / n, "execute_seconds": sums["execute"] / n,
                       "slot_wait_fraction": sums["queue"] / sums["execute"] if sums["execute"] > 0 else None}
        link = np.array(t.link) if t.link else np.array([np.nan])
        out[name] = {"samples": t.samples, "operations": ops,
                     "slot_table_full_fraction": t.saturated / t.samples if t.samples else None,
                     "link_utilization_mean": None if np.isnan(link).all() else float(np.nanmean(link)),
                     "link_utilization_peak": None if np.isnan(link).all() else float(np.nanmax(link))}
        main = "WRITE" if name == "save" else "READ"
        wait = ops.get(main, {}).get("slot_wait_fraction")
        mean = out[name]["link_utilization_mean"]  # type: ignore[index]
        if wait is not None and wait > wait_fraction and (mean is None or mean < link_fraction):
            bottleneck.append(name)
    out["slots_bottleneck"] = bottleneck
    out["slot_saturation"] = slot_saturation
    return out
