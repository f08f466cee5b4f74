"""Job recovery end to end on real parts: Debian's slurmctld with a slurmd per node (munge), a real
Alertmanager with the shipped config, the service as a process. Jobs are `sbatch --requeue` batch
scripts that fail on cue, attempt by attempt; what counts is what Slurm did: RestartCnt, when each
attempt ran and where, ExcNodeList, AdminComment, the held state."""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from demo.slurm import NODE_VAR
from gpunode_remediate.scheduler.slurm import expand_hostlist
from tests.remediation import alert_json, notification, rfc3339
from tests.slurm import SlurmCluster, _tool, flags, slurm_cluster

# Fixtures: each test starts on an idle cluster (clean), with an exporter for the health check.
from tests.test_remediate_slurm import (  # noqa: F401
    ROOT,
    Alertmanager,
    Service,
    clean,
    exporter,
    healthy_exporter,
    reasons,
    wait,
)

NODES = tuple(f"gpu{i:03d}" for i in range(1, 7))
JOBS = {"enabled": True, "culprit_wait": "2s"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    yield from slurm_cluster(tmp_path_factory, nodes=NODES)


@pytest.fixture
def service(tmp_path: Path, cluster: SlurmCluster, exporter: str) -> Iterator[Callable[..., Service]]:  # noqa: F811
    started: list[Service] = []

    def make(**policy: Any) -> Service:
        # Slurm keeps an earlier test's ended jobs for MinJobAge: each test's service takes its own.
        jobs = {"select": {"name": f"{re.escape(tmp_path.name)}-.*"}, **policy.pop("jobs", JOBS)}
        started.append(Service(tmp_path, cluster, exporter, jobs=jobs, **policy))
        return started[-1]

    yield make
    for s in started:
        s.stop()


@pytest.fixture
def alertmanager(tmp_path: Path) -> Iterator[Callable[[Service], Alertmanager]]:
    started: list[Alertmanager] = []

    def make(service: Service) -> Alertmanager:
        started.append(Alertmanager(tmp_path / "am", service.url))
        return started[-1]

    yield make
    for am in started:
        am.stop()


class Job:
    """A batch job whose attempt n exits with fails[n] (0 when not listed) after `seconds`, each
    attempt's start and end, nodes and restart count written to a log."""

    def __init__(self, cluster: SlurmCluster, base: Path, fails: dict[int, int], nodes: int = 2, seconds: float = 3,
                 name: str = "train", *options: str) -> None:
        self.cluster = cluster
        base.mkdir(parents=True, exist_ok=True)
        self.runs = base / "runs.log"
        for attempt, code in fails.items():
            (base / f"cue-{attempt}").write_text(str(code))
        script = (f'n=${{SLURM_RESTART_COUNT:-0}}; echo "start $n $SLURM_JOB_NODELIST $(date +%s.%N)" >> {self.runs}; '
                  f'sleep {seconds}; echo "end $n $SLURM_JOB_NODELIST $(date +%s.%N)" >> {self.runs}; '
                  f'exit $(cat {base}/cue-$n 2>/dev/null || echo 0)')
        out = cluster.run(_tool("sbatch"), "--parsable", "--output=/dev/null", f"--nodes={nodes}",
                          f"--job-name={base.parent.name}-{name}", *(options or ("--requeue",)), f"--wrap={script}",
                          check=True).stdout
        self.id = out.strip().split(";")[0]

    def info(self) -> dict[str, str]:
        return self.cluster.job(int(self.id))

    def attempts(self) -> dict[tuple[str, int], tuple[list[str], float]]:
        """(start|end, attempt) -> (nodes, when)."""
        lines = self.runs.read_text().splitlines() if self.runs.exists() else []
        return {(kind, int(n)): (expand_hostlist(nodes), float(at)) for kind, n, nodes, at in map(str.split, lines)}

    def running(self, attempt: int = 0, timeout: float = 30) -> list[str]:
        return wait(f"job {self.id} attempt {attempt} runs", lambda: self.attempts().get(("start", attempt)),
                    timeout)[0]

    def wait(self, what: str, check: Callable[[dict[str, str]], bool], timeout: float = 30) -> dict[str, str]:
        return wait(f"job {self.id}: {what}", lambda: info if check(info := self.info()) else None, timeout)


def app_xid(node: str) -> dict[str, Any]:
    return alert_json("GpuXidApplicationFault", node, xid="43", action="RESTART_APP", gpu="2", starts=time.time())


def requeues(svc: Service) -> dict[str, float]:
    found = svc.metrics().get("gpunode_remediate_job_requeues_total", {})
    return {dict(key)["branch"]: value for key, value in found.items() if value}


def test_an_application_xid_requeues_at_once_and_a_hardware_xid_without_its_node(
        tmp_path: Path, cluster: SlurmCluster, service: Callable[..., Service],
        alertmanager: Callable[..., Alertmanager]) -> None:
    svc = service().start()
    am = alertmanager(svc)
    app = Job(cluster, tmp_path / "app", {0: 3}, seconds=4)
    hw = Job(cluster, tmp_path / "hw", {0: 3}, seconds=4)
    app_nodes, hw_nodes = app.running(), hw.running()
    am.post(app_xid(app_nodes[1]))
    am.post(alert_json("GpuNodeClockThrottled", hw_nodes[0], cause="clock_thermal", starts=time.time()))
    again = app.running(1)
    ended = app.attempts()[("end", 0)][1]
    assert app.attempts()[("start", 1)][1] - ended < 5  # at once: not Slurm's own 2-minute requeue delay
    info = app.wait("done", lambda j: j["JobState"] == "COMPLETED")
    assert info["Restarts"] == "1" and info["ExcNodeList"] == "(null)"
    assert info["AdminComment"].startswith("gpunode: app_fault attempt 1")
    assert len(again) == 2
    hw_again = hw.running(1)
    assert hw_nodes[0] not in hw_again
    info = hw.wait("done", lambda j: j["JobState"] == "COMPLETED")
    assert info["ExcNodeList"] == hw_nodes[0] and info["Restarts"] == "1"
    assert info["AdminComment"].startswith("gpunode: node_fault attempt 1")
    assert requeues(svc) == {"app_fault": 1, "node_fault": 1}
    log = svc.log.read_text()
    assert f"job {hw.id} (attempt 1, on {','.join(hw_nodes)}): node_fault" in log
    assert f"GpuNodeClockThrottled cause=clock_thermal on {hw_nodes[0]}" in log  # the evidence, with the decision


def test_no_culprit_waits_the_backoff_on_slurms_own_clock(tmp_path: Path, cluster: SlurmCluster,
                                                          service: Callable[..., Service]) -> None:
    svc = service(jobs={**JOBS, "backoff": ["5s"]}).start()
    job = Job(cluster, tmp_path / "job", {0: 1}, seconds=1)
    job.running(1, timeout=90)
    waited = job.attempts()[("start", 1)][1] - job.attempts()[("end", 0)][1]
    # The StartTime is the end plus 5 s; a StartTime in the future starts at Slurm's next backfill
    # pass (bf_interval, 30 s by default).
    assert 5 <= waited <= 5 + 35, waited
    info = job.wait("done", lambda j: j["JobState"] == "COMPLETED")
    assert info["AdminComment"].startswith("gpunode: backoff attempt 1: no culprit")
    assert requeues(svc) == {"backoff": 1}


def test_a_chain_is_held_at_its_limit_until_a_person_releases_it(
        tmp_path: Path, cluster: SlurmCluster, service: Callable[..., Service],
        alertmanager: Callable[..., Alertmanager]) -> None:
    svc = service(jobs={**JOBS, "max_attempts": 3}).start()
    am = alertmanager(svc)
    am.post(*(app_xid(node) for node in NODES))  # every attempt dies of an application fault
    job = Job(cluster, tmp_path / "job", {0: 2, 1: 2, 2: 2}, seconds=1)
    info = job.wait("held", lambda j: j.get("AdminComment", "").startswith("gpunode: held"), timeout=60)
    assert info["JobState"] == "PENDING" and info["Reason"] == "job_requeued_in_held_state"
    assert info["AdminComment"].startswith("gpunode: held attempt 3: 3 abnormal")
    time.sleep(3)
    assert ("start", 3) not in job.attempts()  # held: no fourth attempt
    assert requeues(svc) == {"app_fault": 2, "held": 1}
    metrics = svc.metrics()
    assert metrics["gpunode_remediate_job_chains_held"][()] == 1
    [(labels, attempts)] = metrics["gpunode_remediate_job_chain_held_attempts"].items()
    assert dict(labels)["job_id"] == job.id and attempts == 3
    status = svc.command("status").stdout
    assert f"job {job.id}  held" in status and "3 abnormal ends" in status
    cluster.scontrol("release", job.id, check=True)  # a person looked
    job.wait("done", lambda j: j["JobState"] == "COMPLETED")
    wait("the chain no longer held", lambda: svc.metrics()["gpunode_remediate_job_chains_held"][()] == 0)


def test_jobs_it_may_not_requeue_are_never_requeued(tmp_path: Path, cluster: SlurmCluster,
                                                     service: Callable[..., Service]) -> None:
    svc = service(jobs={**JOBS, "select": {"name": f"{re.escape(tmp_path.name)}-train-.*"}}).start()
    no_requeue = Job(cluster, tmp_path / "a", {0: 1}, 1, 1, "train-a", "--no-requeue")
    cancelled = Job(cluster, tmp_path / "b", {}, 1, 60, "train-b")
    completed = Job(cluster, tmp_path / "c", {}, 1, 1, "train-c")
    other = Job(cluster, tmp_path / "d", {0: 1}, 1, 1, "notebook")
    held = Job(cluster, tmp_path / "e", {0: 1}, 1, 1, "train-e", "--requeue", "--hold")
    cancelled.running()
    cluster.cancel(int(cancelled.id))
    for job, state in ((no_requeue, "FAILED"), (cancelled, "CANCELLED"), (completed, "COMPLETED"), (other, "FAILED")):
        job.wait(state, lambda j, state=state: j["JobState"] == state)
    time.sleep(6)  # three times the culprit wait, six passes
    for job in (no_requeue, cancelled, completed, other, held):
        assert job.info()["Restarts"] == "0", job.id
    assert held.info()["Reason"] == "JobHeldUser"
    assert requeues(svc) == {}
    assert "requeue" not in svc.log.read_text()


def test_killed_between_the_requeue_and_its_exclusion_the_restart_finishes_it_once(
        tmp_path: Path, cluster: SlurmCluster, service: Callable[..., Service],
        alertmanager: Callable[..., Alertmanager]) -> None:
    # scontrol, but the first `update jobid=...` kills the service (kill -9) before it is made.
    wrapper = tmp_path / "scontrol"
    once = tmp_path / "killed"
    wrapper.write_text(f"""#!/bin/sh
if [ "$1" = update ] && [ "${{2#jobid=}}" != "$2" ] && [ ! -e {once} ]; then
  touch {once}; kill -9 $PPID; exit 1
fi
exec {cluster.scontrol_path} "$@"
""")
    wrapper.chmod(0o755)
    svc = service(scheduler={"kind": "slurm", "scontrol": str(wrapper), "timeout": "20s"}).start()
    am = alertmanager(svc)
    job = Job(cluster, tmp_path / "job", {0: 3}, seconds=3)
    nodes = job.running()
    am.post(alert_json("GpuNodeClockThrottled", nodes[0], cause="clock_thermal", starts=time.time()))
    wait("the service killed", lambda: svc.proc.poll() is not None)
    info = job.info()
    assert info["Reason"] == "job_requeued_in_held_state" and info["Restarts"] == "1"  # held: runs nowhere
    svc.start()
    again = job.running(1)
    assert nodes[0] not in again
    info = job.wait("done", lambda j: j["JobState"] == "COMPLETED")
    assert info["Restarts"] == "1" and info["ExcNodeList"] == nodes[0]
    assert "cut short by a restart" in svc.log.read_text()


def test_slurms_own_node_fail_requeue_is_not_doubled(tmp_path: Path, cluster: SlurmCluster,
                                                     service: Callable[..., Service]) -> None:
    service().start()
    job = Job(cluster, tmp_path / "job", {}, nodes=1, seconds=300)
    [node] = job.running()
    slurmd = next(p for p in cluster._daemons if p.args[-1] == node and p.poll() is None)
    slurmd.send_signal(signal.SIGKILL)
    slurmd.wait()
    try:
        info = job.wait("requeued by Slurm", lambda j: j["Restarts"] == "1", timeout=60)
        time.sleep(5)
        assert job.info()["Restarts"] == "1" and info["JobState"] in ("PENDING", "RUNNING")
    finally:
        cluster._spawn(f"slurmd-{node}", [_tool("slurmd"), "-D", "-N", node], {NODE_VAR: node})


def test_a_person_pauses_requeues_and_the_budget_opens_the_breaker(
        tmp_path: Path, cluster: SlurmCluster, service: Callable[..., Service],
        alertmanager: Callable[..., Alertmanager]) -> None:
    svc = service(jobs={**JOBS, "budget": 1}).start()
    am = alertmanager(svc)
    am.post(*(app_xid(node) for node in NODES))
    assert svc.command("breaker", "open", "--reason", "maintenance").returncode == 0
    first = Job(cluster, tmp_path / "a", {0: 3}, seconds=1)
    first.wait("failed", lambda j: j["JobState"] == "FAILED")
    time.sleep(4)
    assert first.info()["Restarts"] == "0"  # paused: Slurm's record waits (MinJobAge)
    assert svc.command("breaker", "reset").returncode == 0
    first.running(1)
    second = Job(cluster, tmp_path / "b", {0: 3}, seconds=1)
    second.wait("failed", lambda j: j["JobState"] == "FAILED")
    wait("the breaker open", lambda: svc.metrics()["gpunode_remediate_breaker_open"][()] == 1)
    assert second.info()["Restarts"] == "0"
    assert "1 of 1 job requeues in 24h" in svc.log.read_text()
    assert requeues(svc) == {"app_fault": 1}


def test_a_node_blamed_by_two_jobs_is_taken_out_as_a_lemon(
        tmp_path: Path, cluster: SlurmCluster, service: Callable[..., Service],
        alertmanager: Callable[..., Alertmanager]) -> None:
    svc = service(jobs={**JOBS, "lemon": {"jobs": 2}}, budget={"fraction": 1, "in_care": 1}).start()
    am = alertmanager(svc)
    lemon = NODES[-1]
    for n, node in enumerate(NODES[:-1]):  # every other node busy: each new job lands on the lemon
        Job(cluster, tmp_path / f"busy{n}", {}, 1, 300, "busy", "--no-requeue", f"--nodelist={node}").running()
    for name in ("a", "b"):
        job = Job(cluster, tmp_path / name, {0: 3}, 1, 3, f"train-{name}")
        assert job.running() == [lemon]
        throttled = alert_json("GpuNodeClockThrottled", lemon, cause="clock_power_brake", starts=time.time())
        am.post(throttled)
        # Held between requeuehold and the update: wait for the update (its AdminComment), then look.
        info = job.wait("requeued without the lemon", lambda j: j["Restarts"] == "1" and j["JobState"] == "PENDING"
                        and j.get("AdminComment", "").startswith("gpunode: node_fault"))
        assert info["ExcNodeList"] == lemon
        am.post({**throttled, "status": "resolved", "endsAt": rfc3339(time.time())})
        if name == "a":  # drained for its alert, back after the quiet period: one job is no lemon yet
            cluster.wait_state(lemon, lambda n: flags(n) == {"IDLE"}, timeout=30)
    node = cluster.wait_state(lemon, lambda n: "lemon" in n.get("Reason", ""), timeout=30)
    assert node["Reason"].startswith("gpunode: hold lemon") and "2 jobs" in node["Reason"]
    assert "DRAIN" in flags(node)
    assert svc.metrics()["gpunode_remediate_lemon_nodes"][()] == 1


@pytest.fixture(scope="module")
def nfs_exporter(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real exporter on a healthy 8-GPU node whose NFS mounts are the edge fixture's (stor-a.example,
    oldnas, 10.20.0.6): job recovery asks it which servers a node mounts."""
    with healthy_exporter(tmp_path_factory.mktemp("nfs-exporter"), "--collector.nfs",
                          "--path.procfs", str(ROOT / "tests/fixtures/procfs/edge")) as url:
        yield url


def send(svc: Service, *alerts: dict[str, Any]) -> None:
    """Straight to the service's webhook, as Alertmanager's route for it delivers them."""
    requests.post(f"{svc.url}/alerts", data=notification(*alerts), timeout=10).raise_for_status()


def test_disk_errors_hold_the_node_and_its_failed_job_runs_again_without_it(
        tmp_path: Path, cluster: SlurmCluster, service: Callable[..., Service]) -> None:
    svc = service().start()
    job = Job(cluster, tmp_path / "job", {0: 3}, seconds=4)
    nodes = job.running()
    send(svc, alert_json("GpuNodeDiskErrors", nodes[1], device="nvme0n1", starts=time.time()))
    node = cluster.wait_state(nodes[1], lambda n: "DRAIN" in flags(n))
    assert node["Reason"].startswith("gpunode: hold GpuNodeDiskErrors")
    again = job.running(1)
    assert nodes[1] not in again
    info = job.wait("done", lambda j: j["JobState"] == "COMPLETED")
    assert info["ExcNodeList"] == nodes[1] and info["Restarts"] == "1"
    assert info["AdminComment"].startswith("gpunode: node_fault attempt 1: node fault: requeued without "
                                           f"{nodes[1]} (GpuNodeDiskErrors device nvme0n1 on {nodes[1]})")
    assert requeues(svc) == {"node_fault": 1}
    assert "DRAIN" in flags(cluster.node(nodes[1]))  # held for a person: never returned by the service


def test_a_storage_outage_holds_the_jobs_it_ended_until_the_server_answers_and_drains_no_node(
        tmp_path: Path, cluster: SlurmCluster, service: Callable[..., Service], nfs_exporter: str) -> None:
    svc = service(jobs={**JOBS, "backoff": ["5s"]}, health_check={"url": nfs_exporter, "timeout": "5s"}).start()
    down = alert_json("NfsServerNotResponding", "-", server="stor-a.example", starts=time.time())
    del down["labels"]["instance"]  # a server, not a node
    job = Job(cluster, tmp_path / "job", {0: 1}, seconds=3)
    nodes = job.running()
    send(svc, down)
    info = job.wait("held for the server", lambda j: j.get("AdminComment", "").startswith("gpunode: backoff"))
    assert info["JobState"] == "PENDING" and info["Reason"] == "job_requeued_in_held_state"
    assert info["Restarts"] == "1" and info["ExcNodeList"] == "(null)"
    assert info["AdminComment"].startswith("gpunode: backoff attempt 1: waiting for NFS server stor-a.example")
    status = svc.command("status").stdout
    assert f"job {job.id}  waiting for NFS server stor-a.example" in status, status
    assert requeues(svc) == {"backoff": 1}
    svc.stop()  # the wait is in the state file, the job held in Slurm's queue
    svc.start()
    time.sleep(4)
    assert ("start", 1) not in job.attempts() and job.info()["Reason"] == "job_requeued_in_held_state"
    answered = time.time()
    send(svc, {**down, "status": "resolved", "endsAt": rfc3339(answered)})
    job.running(1, timeout=60)
    waited = job.attempts()[("start", 1)][1] - answered
    # StartTime is the answer plus the 5 s backoff; a future StartTime starts at Slurm's next backfill
    # pass (bf_interval, 30 s by default).
    assert 5 <= waited <= 5 + 35, waited
    info = job.wait("done", lambda j: j["JobState"] == "COMPLETED")
    assert info["AdminComment"].startswith("gpunode: backoff attempt 1: NFS server stor-a.example answered again")
    assert requeues(svc) == {}  # since the restart: the end was decided once, before it
    assert "gpunode" not in reasons(cluster)  # no node drained, none blamed
    assert not [n["NodeName"] for n in cluster.all_nodes() if "DRAIN" in flags(n)]
    assert svc.metrics()["gpunode_remediate_lemon_nodes"][()] == 0
    assert f"mounted on {nodes[0]}" in svc.log.read_text()  # the evidence: asked of its exporter


def test_a_fabric_port_down_or_flapping_holds_its_node_and_the_failed_job_runs_again_without_it(
        tmp_path: Path, cluster: SlurmCluster, service: Callable[..., Service]) -> None:
    """A port that went down kills the job's NCCL traffic; one that flaps does too, and comes back:
    either way the node waits for a person (the cable or transceiver) and the job goes on without it."""
    svc = service(budget={"fraction": 1.0, "in_care": 1.0}).start()
    down = Job(cluster, tmp_path / "down", {0: 3}, seconds=4)
    flap = Job(cluster, tmp_path / "flap", {0: 3}, seconds=4)
    down_nodes, flap_nodes = down.running(), flap.running()
    send(svc, alert_json("GpuNodeFabricPortDown", down_nodes[1], device="mlx5_3", port="1", starts=time.time()),
         alert_json("GpuNodeFabricPortFlapping", flap_nodes[0], severity="warning", device="mlx5_0", port="1",
                    starts=time.time()))
    for job, bad, alert, device in ((down, down_nodes[1], "GpuNodeFabricPortDown", "mlx5_3"),
                                    (flap, flap_nodes[0], "GpuNodeFabricPortFlapping", "mlx5_0")):
        node = cluster.wait_state(bad, lambda n: "DRAIN" in flags(n))
        assert node["Reason"] == f"gpunode: hold {alert} device={device} port=1"
        again = job.running(1)
        assert bad not in again and len(again) == 2
        info = job.wait("done", lambda j: j["JobState"] == "COMPLETED")
        assert info["ExcNodeList"] == bad and info["Restarts"] == "1"
        assert info["AdminComment"].startswith(f"gpunode: node_fault attempt 1: node fault: requeued without {bad} "
                                               f"({alert} device {device} port 1 on {bad})")
    assert requeues(svc) == {"node_fault": 2}
    time.sleep(3)
    held = sorted(n["NodeName"] for n in cluster.all_nodes() if "DRAIN" in flags(n))
    assert held == sorted((down_nodes[1], flap_nodes[0]))  # held for a person: never returned by the service
    status = svc.command("status").stdout
    assert f"{down_nodes[1]}  held" in status and f"{flap_nodes[0]}  held" in status
