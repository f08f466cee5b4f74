"""The report's content from a backend: the queries it asks, and the analysis of their answers
(jobs.py, goodput.py, pace.py, failures.py, storage.py) into report.json's structure."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from gpunode_report import failures, goodput, jobs, pace, storage
from gpunode_report.source import ReportError, Source, rfc3339
from gpunode_rulepack import selector

NFS_OPS = 'op=~"READ|WRITE"'
WRITE, READ, UNCORRECTABLE = 'op="WRITE"', 'op="READ"', 'cause="uncorrectable"'
CONTROLLER = 'owner_is_controller="true"'


def _by_node(series: dict[Any, np.ndarray], node: str) -> dict[str, np.ndarray]:
    return {dict(labels).get(node, ""): values for labels, values in series.items()}


def _owners(src: Source, spec: dict[str, Any]) -> dict[str, str]:
    """Kubernetes pod UID -> its controlling owner, namespace/kind/name (kube-state-metrics)."""
    query = (f"max by (uid, namespace, owner_kind, owner_name) ({selector(spec, 'kube_pod_info', 'kube_state_metrics')}"
             f" * on (namespace, pod) group_left (owner_kind, owner_name) "
             f"{selector(spec, 'kube_pod_owner', 'kube_state_metrics', CONTROLLER)})")
    return {d["uid"]: f"{d.get('namespace', '')}/{d.get('owner_kind', '')}/{d.get('owner_name', '')}"
            for d in (dict(labels) for labels in src.range(query, "pod owners")) if "uid" in d}


def _presence(src: Source, spec: dict[str, Any], node: str) -> dict[tuple[str, str, str], np.ndarray]:
    # Samples within each step, not the value looked back to: where no staleness marker ends a
    # series (remote write, federation) the lookback would stretch every attempt by minutes. A
    # second short of the step: Prometheus 2's ranges include their start.
    info = src.range(f"max by ({node}, workload, source) (count_over_time("
                     f"{selector(spec, 'gpunode_node_workload_info', 'gpunode')}[{max(1, src.step - 1):g}s]))",
                     "workloads")
    owners = _owners(src, spec) if any(dict(k).get("source") == "kubernetes" for k in info) \
        and spec["peers"]["kubernetes_owner"] else {}
    out: dict[tuple[str, str, str], np.ndarray] = {}
    for labels, values in info.items():
        d = dict(labels)
        workload = d.get("workload", "")
        key = owners.get(workload, workload) if d.get("source") == "kubernetes" else workload
        mask = ~np.isnan(values)
        k = (key, workload, d.get(node, ""))
        out[k] = out[k] | mask if k in out else mask
    return out


def build(src: Source, spec: dict[str, Any], start: float, end: float) -> dict[str, Any]:
    node, step, c, r = spec["labels"]["node"], src.step, spec["checkpoint"], spec["goodput"]
    pw = f"[{int(c['phase_window'])}s]"
    mounts = c["mounts"]
    src.check()
    presence = _presence(src, spec, node)
    if not presence:
        raise ReportError(f"no workloads (gpunode_node_workload_info) between {rfc3339(start)} and {rfc3339(end)} "
                          f"at {src.url}: no gpunode-exporter data in that range")
    # Each node's phase as the rule pack records it (gpunode:checkpoint_phase:node): saving while
    # it writes faster than save_write_bytes, else loading while it reads faster than
    # load_read_bytes with its GPUs under load_gpu_utilization %. The server applies the
    # thresholds, and answers with the few samples that pass, not every node's every sample.
    sent = selector(spec, "gpunode_nfs_rpc_sent_bytes_total", "gpunode", WRITE, mounts)
    received = selector(spec, "gpunode_nfs_rpc_received_bytes_total", "gpunode", READ, mounts)
    util = selector(spec, "DCGM_FI_DEV_GPU_UTIL", "dcgm")
    saves = _by_node(src.range(f"sum by ({node}) (irate({sent}{pw})) > {c['save_write_bytes']}", "save phase"), node)
    loads = _by_node(src.range(f"(sum by ({node}) (irate({received}{pw})) > {c['load_read_bytes']}) and on ({node}) "
                               f"(avg by ({node}) ({util}) < {c['load_gpu_utilization']})", "load phase"), node)
    nvlink = selector(spec, "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "dcgm")
    speed = _by_node(src.range(f"avg by ({node}) ({nvlink})", "NVLink traffic"), node)
    # Firing only: a pending alert has not held for its `for`, and on a small job's neighbours of
    # the culprit (which slow with it) one may begin and end within it.
    alerts: dict[pace.Key, np.ndarray] = {}
    for k, v in src.range(f'max by (alertname, {node}, cause) (ALERTS{{alertstate="firing", '
                          f'alertname=~"{"|".join(pace.CAUSES)}"}})', "cause alerts").items():
        key = pace.key(dict(k), node)
        alerts[key] = alerts[key] | ~np.isnan(v) if key in alerts else ~np.isnan(v)
    nan = np.full(src.size, np.nan, np.float64)
    phase = {n: jobs.phases(~np.isnan(saves.get(n, nan)), ~np.isnan(loads.get(n, nan)))
             for n in {k[2] for k in presence}}
    # Saves and loads take a few samples in a hundred: the storage series and the save clocks are
    # asked for around them only, from CLOCK_MARGIN samples before to as many after (the clocks'
    # reach). A range query's value at a step reads the samples before that step alone.
    margin = goodput.CLOCK_MARGIN
    near = [slice(max(0, first - margin), min(src.size, last + margin + 1))
            for first, last in jobs.runs(np.logical_or.reduce([p != 0 for p in phase.values()]), 2 * margin)]
    saving = selector(spec, "gpunode_checkpoint_save_seconds_total", "gpunode")
    clock = _by_node(src.range(f"max by ({node}) ({saving})", "checkpoint save clocks", near), node)

    remapped = selector(spec, "gpunode_gpu_remapped_rows_total", "gpunode", UNCORRECTABLE)
    hardware = failures.xids(src.range(selector(spec, "gpunode_xid_last_event_timestamp_seconds", "gpunode"),
                                       "Xid events"), node, start, end)
    up, failed = selector(spec, "gpunode_gpu_up", "gpunode"), selector(spec, "gpunode_gpu_row_remap_failure", "gpunode")
    # Filtered before grouped: the server groups a few series, not every GPU's at every step.
    for query, kind in ((f"max by ({node}, gpu) ({up} == 0)", "gpu_lost"),
                        (f"max by ({node}, gpu) ({failed} == 1)", "remap_failure"),
                        (f"sum by ({node}, gpu) (idelta({remapped}{pw}) > 0)", "uncorrectable_remap")):
        hardware += failures.onsets(src.range(query, kind.replace("_", " ")), node, src.times, kind)
    hardware.sort(key=lambda f: (f.time, f.node, f.kind))

    found = jobs.join(jobs.attempts(presence), int(r["restart_within"] // step))
    ends = sum(len(j.attempts) - 1 for j in found)
    node_seconds = sum(a.seconds(step) * len(a.nodes) for j in found for a in j.attempts)
    measured = ends > 0
    per_node_mtbf = node_seconds / ends if measured else c["mtbf_seconds"] * max(
        (len(a.nodes) for j in found for a in j.attempts), default=1)

    job_out, straggler_out = [], []
    for job in found:
        times = []
        size = max(len(a.nodes) for a in job.attempts)
        tried = []
        for a in job.attempts:
            part = slice(a.first, a.last + 1)
            job_phase = jobs.majority([np.where(a.present[n], phase[n][part], 0) for n in a.nodes])
            stack = np.vstack([np.where(a.present[n], speed.get(n, nan)[part], np.nan) for n in a.nodes])
            with np.errstate(all="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # samples without NVLink data: NaN
                job_pace = np.nanmedian(stack, axis=0).astype(float)
            tried.append((a, job_phase, job_pace))
        base = pace.typical(np.concatenate([p for _a, _ph, p in tried]),
                            np.concatenate([ph == 0 for _a, ph, _p in tried]),
                            np.concatenate([pace.calm(alerts, a.nodes, slice(a.first, a.last + 1))
                                            for a, _ph, _p in tried]))
        for k, (a, job_phase, job_pace) in enumerate(tried):
            slow = [] if base is None or base <= 0 else pace.episodes(
                job_pace, job_phase == 0, base, r["straggler_fraction"], int(r["straggler_for"] // step), step,
                alerts, a.nodes, a.first)
            for e in slow:
                straggler_out.append({"node": e.node, "start": rfc3339(src.start + (a.first + e.first) * step),
                                      "end": rfc3339(min(end, src.start + (a.first + e.last + 1) * step)),
                                      "cause": e.cause, "slowdown": round(e.slowdown, 4), "job": job.name,
                                      "lost_seconds": round(e.lost, 1), "gpu_hours": round(
                                          goodput.gpu_hours(e.lost, len(a.nodes), r["gpus_per_node"]), 2)})
            took = goodput.attempt_time(job_phase, a.first, step, int(c["load_gap"] // step),
                                        k < len(job.attempts) - 1, slow)
            goodput.time_saves(took, [clock[n] for n in a.nodes if n in clock])
            times.append(took)
        split = goodput.job_split(job, times, step)
        job_out.append({
            "name": job.name, "workloads": sorted({w for a in job.attempts for w in a.workloads}),
            "nodes": job.nodes, "attempts": len(job.attempts),
            "start": rfc3339(src.start + job.attempts[0].first * step),
            "end": rfc3339(src.start + (job.attempts[-1].last + 1) * step),
            "abnormal_ends": [rfc3339(src.start + (a.last + 1) * step) for a in job.attempts[:-1]],
            **failures.retries(job, hardware, src.start, step, r["gpus_per_node"]),
            "seconds": {k: round(v, 1) for k, v in split.items()},
            "goodput": split["productive"] / split["elapsed"] if split["elapsed"] else None,
            "checkpoint": goodput.checkpoint(times, step, per_node_mtbf / size),
            "save_times": [rfc3339(src.start + s * step) for t in times for s, _ in t.saves]})

    weights = [(j["seconds"]["productive"] * len(j["nodes"]), j["seconds"]["elapsed"] * len(j["nodes"]))
               for j in job_out]
    return {
        "from": rfc3339(start), "to": rfc3339(end), "step_seconds": step,
        "jobs": job_out,
        "failures": [{"node": f.node, "time": rfc3339(f.time), "kind": f.kind, "xid": f.xid,
                      "action": f.action or None, "gpu": f.gpu or None} for f in hardware],
        "stragglers": sorted(straggler_out, key=lambda s: s["start"]),
        "goodput": sum(p for p, _ in weights) / sum(e for _, e in weights) if weights else None,
        "mtbf": {"measured": measured, "abnormal_ends": ends, "node_hours": round(node_seconds / 3600, 1),
                 "seconds_per_node": per_node_mtbf,
                 "concentration": failures.concentration(hardware, len({k[2] for k in presence}))},
        "storage": _storage(src, spec, phase, near),
        "remediation": _remediation(src, spec, end - start, end),
    }


def _storage(src: Source, spec: dict[str, Any], phase: dict[str, np.ndarray], near: list[slice]) -> dict[str, Any]:
    """Over the samples each node spent saving or loading; near: spans of the grid that hold them all."""
    node, n = spec["labels"]["node"], spec["nfs"]
    pw = f"[{int(spec['checkpoint']['phase_window'])}s]"
    totals = {code: storage.Totals() for code in storage.PHASES}
    none = np.zeros(src.size, np.int8)
    for what, metric in (("operations", "operations_total"), ("queue", "queue_seconds_total"),
                         ("rtt", "rtt_seconds_total"), ("execute", "execute_seconds_total")):
        rpc = selector(spec, f"gpunode_nfs_rpc_{metric}", "gpunode", NFS_OPS, spec["checkpoint"]["mounts"])
        query = f"sum by ({node}, op) (irate({rpc}{pw}))"
        for part, chunk in src.chunks(query, f"NFS {what}", near):
            for labels, values in chunk.items():
                d = dict(labels)
                storage.accumulate(totals, phase.get(d.get(node, ""), none)[part], d.get("op", ""), what, values)
    in_flight, sends, slots = (selector(spec, f"gpunode_nfs_transport_{m}", "gpunode")
                               for m in ("in_flight_sum_total", "sends_total", "max_slots"))
    saturation = (f"sum by ({node}) (irate({in_flight}{pw})) / sum by ({node}) (irate({sends}{pw}))"
                  f" / max by ({node}) ({slots})")
    for part, chunk in src.chunks(saturation, "NFS slots", near):
        for labels, values in chunk.items():
            p = phase.get(dict(labels).get(node, ""), none)[part]
            for code, t in totals.items():
                t.samples += int((p == code).sum())
                t.saturated += int(((p == code) & (values > n["slot_saturation"])).sum())
    for code, direction in ((1, "transmit"), (2, "receive")):
        link = (f"max by ({node}) (irate({selector(spec, f'node_network_{direction}_bytes_total', 'node')}{pw})"
                f" / on ({node}, device) group_left max by ({node}, device) "
                f"({selector(spec, 'gpunode_network_link_speed_bytes', 'gpunode')}))")
        for part, chunk in src.chunks(link, f"storage link {direction}", near):
            for labels, values in chunk.items():
                p = phase.get(dict(labels).get(node, ""), none)[part]
                totals[code].link += values[(p == code) & ~np.isnan(values)].tolist()
    return storage.summary(totals, n["slot_saturation"], n["paradox_link_fraction"], n["slot_wait_fraction"])


def _remediation(src: Source, spec: dict[str, Any], span: float, end: float) -> dict[str, Any] | None:
    """gpunode-remediate's actions, returns and breaker over the range, where it is scraped by the same backend."""
    window = f"[{int(span)}s]"

    def over(metric: str) -> str:
        return f"{selector(spec, 'gpunode_remediate_' + metric, 'remediate')}{window}"

    actions = src.instant(f"sum by (action, result) (increase({over('actions_total')}))", end)
    if not actions:
        return None
    returns = src.instant(f"sum(increase({over('return_seconds_count')}))", end)
    median = src.instant(f"histogram_quantile(0.5, sum by (le) (increase({over('return_seconds_bucket')})))", end)
    opened = src.instant(f"max(max_over_time({over('breaker_open')}))", end)
    return {"actions": [{"action": d.get("action", ""), "result": d.get("result", ""), "count": round(v)}
                        for d, v in actions if round(v) > 0],
            "returns": round(returns[0][1]) if returns else 0,
            "return_seconds_median": median[0][1] if median and np.isfinite(median[0][1]) else None,
            "breaker_opened": bool(opened and opened[0][1] >= 1)}
