"""report.md: the report's findings for a person, its figures beside them."""

from __future__ import annotations

from typing import Any

from gpunode_report.goodput import gpu_hours


def _h(seconds: float | None) -> str:
    if seconds is None:
        return "n/a"
    if seconds >= 4 * 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 120:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.1f} s" if 0 < seconds < 60 else f"{seconds:.0f} s"


def _pct(x: float | None, digits: int = 1) -> str:
    return "n/a" if x is None else f"{100 * x:.{digits}f} %"


def _blamed(attempt: dict[str, Any]) -> str:
    """A failed attempt's culprit: `gpu003 (Xid 79)`, `gpu060 (gpu lost)`, `none`."""
    if not attempt["node"]:
        return "none"
    what = f"Xid {attempt['xid']}" if attempt["xid"] else attempt["kind"].replace("_", " ")
    return f"{attempt['node']} ({what})"


MAIN_OP = {"save": "WRITE", "load": "READ"}


def _storage(st: dict[str, Any], step: float, figures: dict[str, str]) -> list[str]:
    """Per phase and operation where a request's time went (the Lablup B200 operations report's
    Table 13), the slot table and the link; and what to change where the slots hold it back."""
    lines = ["| phase | op | requests | per node/s (peak) | per request | waiting for a slot | network + server "
             "| slot wait share |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for phase in ("save", "load"):
        for op, o in st[phase]["operations"].items():
            rate = o.get("requests_per_second")
            per_node = "n/a" if rate is None else f"{rate:,.0f} ({o['requests_per_second_peak']:,.0f})"
            lines.append(f"| {phase} | {op} | {o['requests'] * step:,.0f} | {per_node} "
                         f"| {1000 * o['execute_seconds']:.1f} ms "
                         f"| {1000 * o['queue_seconds']:.1f} ms | {1000 * o['rtt_seconds']:.1f} ms "
                         f"| {_pct(o['slot_wait_fraction'])} |")
    for phase in ("save", "load"):
        p = st[phase]
        lines.append(f"\nDuring {phase}s ({_h(p['samples'] * step)} of node time): the slot table was full "
                     f"{_pct(p['slot_table_full_fraction'])} of the time; the storage link ran at "
                     f"{_pct(p['link_utilization_mean'])} on average, {_pct(p['link_utilization_peak'])} at its peak.")
    if "storage" in figures:
        lines += ["", f"![NFS request time split]({figures['storage']})"]
    bound = st["slots_bottleneck"]
    if bound:
        what = "; ".join(f"a {phase}'s {MAIN_OP[phase]}s waited {_pct(_main(st, phase)['slot_wait_fraction'], 0)} "
                         f"of their time for a slot while the link ran at {_pct(st[phase]['link_utilization_mean'])}"
                         for phase in bound)
        during = " and ".join(f"{phase}s" for phase in bound)
        lines += ["", f"**The NFS client's RPC slot table is the bottleneck during {during}**: {what}. "
                  "A faster link would not help. Give the mount more slots, or make the server answer faster (a "
                  "request holds its slot until the server answers): raise `sunrpc.tcp_max_slot_table_entries` "
                  "(over RDMA `sunrpc.rdma_slot_table_entries`) and remount; mount with `nconnect=` for more "
                  "transports, each with a slot table of its own; or ask the storage team for a lower response "
                  "time (docs/runbooks/nfs.md)."]
    for phase in ("save", "load"):
        o = _main(st, phase)
        if phase in bound or not o or not o["execute_seconds"]:
            continue
        server = o["rtt_seconds"] / o["execute_seconds"]
        if server >= 0.5:
            lines += ["", f"During {phase}s a {MAIN_OP[phase]} spent {_pct(server, 0)} of its time on the network "
                      "and in the server: their response time sets how long it takes."]
    return lines


def _main(st: dict[str, Any], phase: str) -> dict[str, Any]:
    return st[phase]["operations"].get(MAIN_OP[phase], {})


def render(r: dict[str, Any], figures: dict[str, str]) -> str:
    gpus = r["gpus_per_node"]
    jobs = r["jobs"]
    lines = [f"# Operations report: {r['from']} to {r['to']}", "",
             f"Read from {r['source']} by `gpunode-exporter report`. Fleet goodput: **{_pct(r['goodput'])}** of the "
             f"GPU-hours of {len(jobs)} jobs on {r['mtbf']['concentration']['nodes']} nodes.", ""]
    total = {k: sum(gpu_hours(j["seconds"][k], len(j["nodes"]), gpus) for j in jobs) for k in jobs[0]["seconds"]}
    lines += ["## Where the GPU-hours went", "",
              "| | GPU-hours | share |", "|---|---:|---:|"]
    for k, v in total.items():
        share = v / total["elapsed"] if total["elapsed"] else None
        lines.append(f"| {k.replace('_', ' ')} | {v:,.1f} | {_pct(share)} |")
    lines += ["", f"![goodput per job]({figures['goodput']})", "",
              "| job | nodes | attempts | elapsed | goodput | saves | loads | down | slowed | progress redone "
              "| failed attempts' GPU-h | failures blamed on |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for j in jobs:
        s = j["seconds"]
        lines.append(f"| {j['name']} | {len(j['nodes'])} | {j['attempts']} | {_h(s['elapsed'])} | {_pct(j['goodput'])} "
                     f"| {_h(s['checkpoint_save'])} | {_h(s['checkpoint_load'])} | {_h(s['down'])} | {_h(s['slowed'])} "
                     f"| {_h(s['lost_progress'])} | {j['failed_gpu_hours']:,.1f} "
                     f"| {', '.join(_blamed(a) for a in j['failed_attempts'])} |")
    m = r["mtbf"]
    conc = m["concentration"]
    lines += ["", "## Failures", "",
              f"{m['abnormal_ends']} abnormal job ends (a job restarted as a new workload on nearly the same nodes) in "
              f"{m['node_hours']:,.0f} node-hours of jobs: a mean time between failures of "
              + (f"**{m['seconds_per_node'] / 3600:,.0f} node-hours** (a job of N nodes fails every that / N hours)."
                 if m["measured"] else "n/a: no abnormal end in the range. The rule pack's `checkpoint.mtbf_seconds` "
                 "stands in for it below."),
              "", f"{len(r['failures'])} hardware events on {conc['nodes_with_events']} nodes"
              + (f"; the top {len(conc['top'])} nodes ({', '.join(conc['top'])}) had "
                 f"{_pct(conc['top_share'], 0)} of them."
                 if conc["top"] else "."), ""]
    if r["failures"]:
        lines += [f"![hardware events per node]({figures['failures']})", "",
                  "| time | node | GPU | event | Xid | NVIDIA's action |", "|---|---|---|---|---|---|"]
        lines += [f"| {f['time']} | {f['node']} | {f['gpu'] or ''} | {f['kind'].replace('_', ' ')} | {f['xid'] or ''} "
                  f"| {f['action'] or ''} |" for f in r["failures"]]
    lines += ["", "## Checkpoints", "",
              "Young/Daly: an interval T costs save/T + T/(2 MTBF) of the time; the optimum is sqrt(2 save MTBF).", "",
              "A save is timed by its nodes' own clock where their exporter keeps one (`node`: "
              "gpunode_checkpoint_save_seconds_total, read every second); else estimated from the samples in the save "
              "phase (`scrapes`: (samples - 1) x the interval, 0 for a save shorter than a scrape, so no optimum).", "",
              "| job | saves | interval | save | timed by | load | job MTBF | cost | optimum | cost at optimum |",
              "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|"]
    for j in jobs:
        c = j["checkpoint"]
        lines.append(f"| {j['name']} | {c['saves']} | {_h(c['interval_seconds'])} | {_h(c['save_seconds'])} "
                     f"| {c.get('save_clock') or ''} | {_h(c['load_seconds'])} | {_h(c['mtbf_seconds'])} "
                     f"| {_pct(c['cost_fraction'], 2)} | {_h(c['optimal_interval_seconds'])} "
                     f"| {_pct(c['optimal_cost_fraction'], 2)} |")
    for name, path in figures.items():
        if name.startswith("young-daly"):
            lines += ["", f"![Young/Daly cost curve]({path})"]
    lines += ["", "## Storage during saves and loads", "", *_storage(r["storage"], r["step_seconds"], figures)]
    lines += ["", "## Stragglers", ""]
    if r["stragglers"]:
        lines += ["| start | end | job | node | cause | slower by | GPU-hours lost |",
                  "|---|---|---|---|---|---:|---:|"]
        lines += [f"| {s['start']} | {s['end']} | {s['job']} | {s['node'] or '(the whole job)'} "
                  f"| `{s['cause']}` | {_pct(s['slowdown'])} | {s['gpu_hours']:,.1f} |"
                  for s in r["stragglers"]]
        lines += ["", "Each cause is the word the rule pack's cause alert carries in its `cause` label; what it "
                  "means and its fix: docs/runbooks/failslow.md."]
    else:
        lines.append("No job ran slower than its own pace for long.")
    rem = r.get("remediation")
    lines += ["", "## Remediation", ""]
    if rem:
        acts = ", ".join(f"{a['count']} {a['action']} ({a['result']})" for a in rem["actions"]) or "none"
        lines.append(f"gpunode-remediate's actions: {acts}. Nodes returned to service: {rem['returns']}, median "
                     f"{_h(rem['return_seconds_median'])} from the first action. The circuit breaker "
                     f"{'opened' if rem['breaker_opened'] else 'stayed closed'}.")
    else:
        lines.append("No gpunode-remediate metrics in this range.")
    return "\n".join(lines) + "\n"
