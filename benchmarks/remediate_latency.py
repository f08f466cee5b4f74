#!/usr/bin/env python3
"""gpunode-remediate on a real Slurm cluster: decision time and a burst of alerts.

    .venv/bin/python benchmarks/remediate_latency.py [--rounds 20] [--burst 1000]   (root: its own slurmctld)

- Decision time: a notification with one Xid 79 alert goes in (an HTTP POST, as Alertmanager
  sends it); out comes `scontrol reboot` (a wrapper notes when it starts). Side by side in the same
  run, the floor: the same scontrol call made directly, and `scontrol -o show node`, which the
  service runs before it decides.
- Job recovery: a batch job (`sbatch --requeue`) on a node where an application Xid fires ends
  with exit 1; out comes its requeue (`scontrol requeuehold`, `update`, `release`: the wrapper notes
  when the release returns), with the service looking every second (policy interval 1 s; the
  default, 15 s, adds up to 15 s). Side by side, the floor: the same three calls and the `squeue`
  listing made directly on another failed job.
- A burst: one notification of --burst alerts over the cluster's 40 nodes (25 per node: every GPU
  and several alert names); the time to answer it, the time until the service has drained what its
  budget allows and blocked the rest, and the service's peak memory (VmHWM).

Results: benchmarks/results/remediate.json.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests
import yaml
from benchlib import (  # benchmarks/ is on sys.path when run as a script; common puts the repository there
    cpu_times,
    end_of_run,
    finish,
    free_port,
    machine_info,
    source_fingerprint,
    summarize,
)

from demo.slurm import SlurmCluster, _tool, slurm_unavailable
from tests.remediation import alert_json, notification

ROOT = Path(__file__).resolve().parent.parent

NODES = tuple(f"gpu{i:03d}" for i in range(1, 41))
ALERTS = ("GpuXidHardwareFault", "GpuRowRemapPending", "GpuNvLinkDegraded", "GpuNodeClockThrottled")


def start_service(base: Path, cluster: SlurmCluster, wrapper: Path, **policy: object) -> tuple[subprocess.Popen, str]:
    data = {"mode": "enforce", "state_path": str(base / "state.db"), "interval": "30s",
            "scheduler": {"kind": "slurm", "scontrol": str(wrapper)}, "health_check": {"enabled": False}, **policy}
    (base / "policy.yml").write_text(yaml.safe_dump(data))
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "gpunode_remediate", "serve",
                             "--config.file", str(base / "policy.yml"),
                             "--web.listen-address", f"127.0.0.1:{port}", "--log.level", "warn"],
                            cwd=ROOT, env=cluster.env, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            requests.get(f"{url}/-/ready", timeout=1)
            return proc, url
        except requests.RequestException:
            time.sleep(0.05)
    raise RuntimeError("the service did not start")


def logging_scontrol(path: Path, cluster: SlurmCluster, log: Path, when: str = "start") -> Path:
    """scontrol behind a wrapper that notes each call in `log` with the time it starts (or returns)."""
    note = f'echo "$(date +%s.%N) $*" >> {log}'
    real = cluster.scontrol_path
    body = f'{note}\nexec {real} "$@"' if when == "start" else f'{real} "$@"; rc=$?\n{note}\nexit $rc'
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return path


def calls_started(log: Path, verb: str) -> list[float]:
    return [float(line.split()[0]) for line in log.read_text().splitlines() if verb in line] if log.exists() else []


def decision_time(base: Path, cluster: SlurmCluster, rounds: int) -> dict[str, object]:
    log = base / "calls.log"
    wrapper = logging_scontrol(base / "scontrol", cluster, log)
    proc, url = start_service(base, cluster, wrapper, budget={"fraction": 1.0, "in_care": 1.0})
    ours, direct, listing = [], [], []
    try:
        for n in range(rounds):
            node = NODES[n]  # the first half for the service, the second for scontrol alone
            before = len(calls_started(log, "reboot"))
            sent = time.time()
            body = notification(alert_json("GpuXidHardwareFault", node, starts=sent - 30 + n, xid="79",
                                            action="RESTART_BM", gpu="3"))
            requests.post(f"{url}/alerts", data=body, timeout=30).raise_for_status()
            while len(calls_started(log, "reboot")) == before:
                time.sleep(0.005)
            ours.append(calls_started(log, "reboot")[-1] - sent)
            began = time.monotonic()
            cluster.scontrol("reboot", "ASAP", "nextstate=DOWN", "reason=the floor, not the service's",
                             NODES[len(NODES) // 2 + n], check=True)
            direct.append(time.monotonic() - began)
            began = time.monotonic()
            cluster.scontrol("-o", "show", "node", check=True)
            listing.append(time.monotonic() - began)
    finally:
        proc.terminate()
        proc.wait()
    return {"notification_to_scontrol_call": summarize(ours), "scontrol_reboot_alone": summarize(direct),
            "scontrol_show_node_alone": summarize(listing)}


def job_decision_time(base: Path, cluster: SlurmCluster, rounds: int) -> dict[str, object]:
    log = base / "job-calls.log"
    wrapper = logging_scontrol(base / "scontrol-jobs", cluster, log, when="return")
    (base / "jobs").mkdir()
    proc, url = start_service(base / "jobs", cluster, wrapper, interval="1s", budget={"fraction": 1.0},
                              jobs={"enabled": True, "budget": 1000})
    now = time.time()
    body = notification(*(alert_json("GpuXidApplicationFault", node, starts=now - 30, xid="13", action="RESTART_APP")
                          for node in NODES[:len(NODES) // 2]))  # the second half: the floor's, no alert
    requests.post(f"{url}/alerts", data=body, timeout=30).raise_for_status()

    def failing_job(node: str, stamp: Path) -> str:
        script = f"sleep 1; date +%s.%N > {stamp}; exit 1"
        out = cluster.run(_tool("sbatch"), "--parsable", "--requeue", "--output=/dev/null", f"--nodelist={node}",
                          f"--wrap=if [ -z \"$SLURM_RESTART_COUNT\" ]; then {script}; fi", check=True).stdout
        return out.strip().split(";")[0]

    ours, floor = [], []
    try:
        for n in range(rounds):
            stamp = base / "jobs" / f"end-{n}"
            job = failing_job(NODES[n], stamp)
            deadline = time.monotonic() + 60
            while not (released := [line for line in (log.read_text().splitlines() if log.exists() else [])
                                    if line.split()[1:] == ["release", job]]):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"job {job} not requeued within 60 s")
                time.sleep(0.01)
            ours.append(float(released[0].split()[0]) - float(stamp.read_text()))
            other = failing_job(NODES[len(NODES) // 2 + n], base / "jobs" / f"floor-{n}")
            cluster._wait(lambda other=other: cluster.job(int(other))["JobState"] == "FAILED", "a failed job", 30)
            began = time.monotonic()
            cluster.run(_tool("squeue"), "--noheader", "--states=all", "--Format=JobID:|,State:|", check=True)
            cluster.scontrol("requeuehold", other, check=True)
            cluster.scontrol("update", f"jobid={other}", "AdminComment=gpunode: bench", "StartTime=now", check=True)
            cluster.scontrol("release", other, check=True)
            floor.append(time.monotonic() - began)
    finally:
        proc.terminate()
        proc.wait()
    return {"job_end_to_requeue_done": summarize(ours), "squeue_and_three_scontrol_calls_alone": summarize(floor),
            "policy_interval_s": 1}


def burst(base: Path, cluster: SlurmCluster, size: int) -> dict[str, object]:
    log = base / "burst-calls.log"
    wrapper = logging_scontrol(base / "scontrol-burst", cluster, log)
    (base / "burst").mkdir()
    proc, url = start_service(base / "burst", cluster, wrapper)
    try:
        now = time.time()
        alerts = [alert_json(ALERTS[n % len(ALERTS)], NODES[n % len(NODES)], starts=now - 60, gpu=str(n // 160),
                             xid="79", action="RESTART_BM", pci_bus_id=f"0000:{n:04x}") for n in range(size)]
        body = notification(*alerts)
        sent = time.monotonic()
        answer = requests.post(f"{url}/alerts", data=body, timeout=120)
        answered = time.monotonic() - sent
        answer.raise_for_status()
        blocked = 0.0
        while time.monotonic() - sent < 120:
            metrics = requests.get(f"{url}/metrics", timeout=10).text
            line = next((x for x in metrics.splitlines() if x.startswith(
                'gpunode_remediate_actions_total{action="drain",result="blocked"}')), "")
            if line and float(line.split()[-1]) >= len(NODES) - 2:
                blocked = time.monotonic() - sent
                break
            time.sleep(0.01)
        status = Path(f"/proc/{proc.pid}/status").read_text()
        hwm = next(int(x.split()[1]) for x in status.splitlines() if x.startswith("VmHWM:"))
        drains = [x for x in log.read_text().splitlines() if "reboot" in x or "state=drain" in x]
    finally:
        proc.terminate()
        proc.wait()
    return {"alerts": size, "bytes": len(body), "answered_s": round(answered, 3),
            "all_decided_s": round(blocked, 3), "nodes_taken": len(drains), "service_vmhwm_kib": hwm}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--burst", type=int, default=1000)
    parser.add_argument("--output", type=Path, default=ROOT / "benchmarks" / "results" / "remediate.json")
    args = parser.parse_args()
    if not 1 <= args.rounds <= len(NODES) // 2:
        parser.error(f"--rounds: 1 to {len(NODES) // 2} (a node each)")
    if reason := slurm_unavailable():
        sys.exit(f"remediate benchmark: {reason}")
    started, cpu_before = time.monotonic(), cpu_times()
    results: dict[str, object] = {"machine": machine_info(), "exporter_source_sha256": source_fingerprint()}
    with tempfile.TemporaryDirectory() as tmp, SlurmCluster(Path(tmp) / "slurm", NODES) as cluster:
        results["decision"] = decision_time(Path(tmp), cluster, args.rounds)
        cluster._wait(lambda: not any("REBOOT" in n["State"] for n in cluster.all_nodes()), "the reboots", 60)
        for node in NODES:
            cluster.scontrol("update", f"nodename={node}", "state=resume")
        cluster._wait(lambda: all(n["State"] == "IDLE" for n in cluster.all_nodes()), "idle nodes", 60)
        results["burst"] = burst(Path(tmp), cluster, args.burst)
        cluster.run(_tool("scancel"), "--partition", cluster.partition)
        cluster._wait(lambda: not any("REBOOT" in n["State"] for n in cluster.all_nodes()), "the reboots", 60)
        for node in NODES:
            cluster.scontrol("update", f"nodename={node}", "state=resume")
        cluster._wait(lambda: all(n["State"] == "IDLE" for n in cluster.all_nodes()), "idle nodes", 60)
        results["jobs"] = job_decision_time(Path(tmp), cluster, args.rounds)
    d = results["decision"]
    print("decision time, notification in -> scontrol call out (ms):")
    for name, row in d.items():
        print(f"  {name:32} p50 {row['p50_ms']:7.1f}  p90 {row['p90_ms']:7.1f}  max {row['max_ms']:7.1f}")
    print("job recovery, the job's end -> its requeue done (ms):")
    for name, row in results["jobs"].items():
        if isinstance(row, dict):
            print(f"  {name:38} p50 {row['p50_ms']:7.1f}  p90 {row['p90_ms']:7.1f}  max {row['max_ms']:7.1f}")
    b = results["burst"]
    print(f"burst: {b['alerts']} alerts ({b['bytes']} bytes) answered in {b['answered_s']} s, every node decided "
          f"in {b['all_decided_s']} s, {b['nodes_taken']} nodes taken (the budget), service VmHWM "
          f"{b['service_vmhwm_kib'] / 1024:.1f} MiB")
    end_of_run(results, started, cpu_before, ROOT)
    return finish(results, args.output, f"{os.cpu_count()} CPUs")


if __name__ == "__main__":
    sys.exit(main())
