"""End to end on real parts: Debian's slurmctld and slurmd (40 nodes, with munge), a real Alertmanager
running the shipped example config, a real exporter answering the health check, and the service
itself as a process. Alerts go in as Prometheus sends them (Alertmanager's API); what comes out is
what `scontrol` and `sinfo -R` show."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from tests.helpers import free_port, parse_exposition, wait_for_port
from tests.remediation import alert_json, notification, rfc3339
from tests.slurm import SlurmCluster, _tool, flags, slurm_cluster

ROOT = Path(__file__).resolve().parent.parent
NODES = tuple(f"gpu{i:03d}" for i in range(1, 41))
HEALTHY = ROOT / "exporter" / "nvmlsim" / "scenarios" / "healthy-h100.yaml"
GROUP_WAIT = 1.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    yield from slurm_cluster(tmp_path_factory, nodes=NODES)


@pytest.fixture(autouse=True)
def clean(cluster: SlurmCluster) -> Iterator[None]:
    """Each test starts on an idle cluster."""
    yield
    cluster.run(_tool("scancel"), "--partition", cluster.partition)
    # Resumed until IDLE: a node resumed just after its reboot, before its slurmd registered again,
    # goes DOWN "Node unexpectedly rebooted" (ReturnToService=1) and wants another resume.
    deadline = time.monotonic() + 45
    while others := [n["NodeName"] for n in cluster.all_nodes() if flags(n) != {"IDLE"}]:
        assert time.monotonic() < deadline, f"not IDLE after 45 s: {others}\n{cluster.log_tail()}"
        for node in others:
            cluster.scontrol("update", f"nodename={node}", "state=resume")
        time.sleep(1)


@contextlib.contextmanager
def healthy_exporter(tmp: Path, *flags: str, scenario: Path = HEALTHY, config: str = "gpu: {expected_count: 8}\n",
                     port: int | None = None) -> Iterator[str]:
    """A real exporter on a simulated healthy 8-GPU node (or `scenario`), expecting 8, with the gpu
    collector and `flags`: the health-check URL template that asks it."""
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "config.yml").write_text(config)
    port = port or free_port()
    proc = subprocess.Popen([sys.executable, "-m", "gpunode_exporter", "--web.listen-address", f"127.0.0.1:{port}",
                             "--nvml.simulate", str(scenario), "--config.file", str(tmp / "config.yml"),
                             "--path.state", str(tmp), "--collector.disable-defaults", "--collector.gpu", *flags],
                            cwd=ROOT, stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port, lambda: proc.poll() is None)
        yield f"http://127.0.0.1:{port}/metrics?node={{node}}"
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def exporter(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real exporter on a simulated healthy 8-GPU node, expecting 8: the health check asks it."""
    with healthy_exporter(tmp_path_factory.mktemp("exporter")) as url:
        yield url


class Service:
    """gpunode-remediate serve, as a process."""

    def __init__(self, base: Path, cluster: SlurmCluster, health_url: str, **policy: Any) -> None:
        self.base, self.cluster = base, cluster
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.policy = base / "policy.yml"
        self.resets = base / "resets.log"
        self.data = {"mode": "enforce", "state_path": str(base / "state.db"), "quiet_period": "2s", "interval": "1s",
                     "scheduler": {"kind": "slurm", "scontrol": cluster.scontrol_path, "timeout": "20s"},
                     "health_check": {"url": health_url, "timeout": "5s"},
                     "reset_command": ["sh", "-c", f'echo "$0 $1" >> {self.resets}', "{node}", "{gpu}"]}
        self.configure(**policy)
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = base / "service.log"
        self.headers: dict[str, str] = {}

    def configure(self, **policy: Any) -> Service:
        """Change the policy (read at the next start)."""
        self.data.update(policy)
        self.policy.write_text(yaml.safe_dump(self.data))
        return self

    def start(self, *extra: str) -> Service:
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "gpunode_remediate", "serve",
                                          "--config.file", str(self.policy),
                                          "--web.listen-address", f"127.0.0.1:{self.port}", *extra],
                                         cwd=ROOT, env=self.cluster.env, stderr=log)
        wait_for_port(self.port, lambda: self.proc.poll() is None)
        return self

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)

    def metrics(self) -> dict:
        response = requests.get(f"{self.url}/metrics", headers=self.headers, timeout=10)
        response.raise_for_status()
        return parse_exposition(response.text)

    def command(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "gpunode_remediate", *args, "--config.file", str(self.policy)],
                              capture_output=True, text=True, cwd=ROOT, env=self.cluster.env, timeout=60)

    def resets_done(self) -> list[str]:
        return self.resets.read_text().splitlines() if self.resets.exists() else []


@pytest.fixture
def service(tmp_path: Path, cluster: SlurmCluster, exporter: str) -> Iterator[Callable[..., Service]]:
    started: list[Service] = []

    def make(**policy: Any) -> Service:
        started.append(Service(tmp_path, cluster, exporter, **policy))
        return started[-1]

    yield make
    for s in started:
        s.stop()


class Alertmanager:
    """Debian's Alertmanager with the shipped example config, its remediation route pointed at the
    service (and waiting 1 s rather than 10 before a first notification)."""

    def __init__(self, base: Path, service_url: str) -> None:
        self.base = base
        config = yaml.safe_load((ROOT / "alertmanager" / "alertmanager.yml").read_text())
        receiver = next(r for r in config["receivers"] if r["name"] == "gpunode-remediate")
        receiver["webhook_configs"][0]["url"] = f"{service_url}/alerts"
        route = next(r for r in config["route"]["routes"] if r["receiver"] == "gpunode-remediate")
        route.update(group_wait=f"{GROUP_WAIT:g}s", group_interval="1s")
        base.mkdir(exist_ok=True)
        (base / "am.yml").write_text(yaml.safe_dump(config))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.lives = 0
        self.start()

    def start(self) -> None:
        """On a storage directory of its own each time: a restart loses every alert it held."""
        self.lives += 1
        storage = self.base / f"storage-{self.lives}"
        self.proc = subprocess.Popen([_tool("prometheus-alertmanager"), f"--config.file={self.base / 'am.yml'}",
                                      f"--web.listen-address=127.0.0.1:{self.port}", f"--storage.path={storage}",
                                      "--cluster.listen-address="],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for_port(self.port, lambda: self.proc.poll() is None)

    def post(self, *alerts: dict[str, Any]) -> None:
        """As Prometheus sends alerts: labels, annotations, startsAt, and endsAt once resolved."""
        body = [{k: a[k] for k in ("labels", "annotations", "startsAt")} | (
            {"endsAt": a["endsAt"]} if a["status"] == "resolved" else {}) for a in alerts]
        requests.post(f"{self.url}/api/v2/alerts", json=body, timeout=10).raise_for_status()

    def silence(self, **labels: str) -> None:
        matchers = [{"name": k, "value": v, "isRegex": False, "isEqual": True} for k, v in labels.items()]
        requests.post(f"{self.url}/api/v2/silences", timeout=10, json={
            "matchers": matchers, "startsAt": rfc3339(time.time() - 1), "endsAt": rfc3339(time.time() + 3600),
            "createdBy": "test", "comment": "a person looks"}).raise_for_status()

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


@pytest.fixture
def alertmanager(tmp_path: Path) -> Iterator[Callable[[Service], Alertmanager]]:
    started: list[Alertmanager] = []

    def make(service: Service, webhook: str | None = None) -> Alertmanager:
        """webhook: where notifications go instead of the service (a dead address: every one is lost)."""
        started.append(Alertmanager(tmp_path / "am", webhook or service.url))
        return started[-1]

    yield make
    for am in started:
        am.stop()


def wait(what: str, check: Callable[[], Any], timeout: float = 30) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.1)
    return value


def reasons(cluster: SlurmCluster) -> str:
    """`sinfo -R`, its reasons in full (by default it cuts them at 20 characters)."""
    return cluster.run(_tool("sinfo"), "-R", "--noheader", "--format", "%N %E", check=True).stdout


def xid79(node: str, status: str = "firing", **times: float) -> dict[str, Any]:
    return alert_json("GpuXidHardwareFault", node, status, xid="79", action="RESTART_BM", gpu="3",
                      pci_bus_id="0000:9d:00.0", **times)


def test_xid79_drains_within_5_s_reboots_once_idle_and_resolution_returns_the_node(
        cluster: SlurmCluster, service: Callable[..., Service], alertmanager: Callable[..., Alertmanager]) -> None:
    svc = service().start()
    am = alertmanager(svc)
    starts = time.time() - 60
    posted = time.monotonic()
    am.post(xid79("gpu003", starts=starts))
    wait("our reason in sinfo -R", lambda: "gpu003 gpunode: reboot GpuXidHardwareFault xid=79" in reasons(cluster))
    assert time.monotonic() - posted < GROUP_WAIT + 5
    assert svc.metrics()["gpunode_remediate_last_decision_seconds"][()] < 5
    down = cluster.wait_state("gpu003", lambda n: "DOWN" in flags(n) and not flags(n) & {
        "REBOOT_REQUESTED", "REBOOT_ISSUED"}, timeout=60)
    assert down["Reason"].startswith("gpunode: reboot") and cluster.reboots("gpu003") == 1
    am.post(xid79("gpu003", "resolved", starts=starts, ends=time.time()))
    cluster.wait_state("gpu003", lambda n: flags(n) == {"IDLE"}, timeout=60)
    assert cluster.reboots("gpu003") == 1
    actions = svc.metrics()["gpunode_remediate_actions_total"]
    assert actions[(("action", "reboot"), ("result", "done"))] == 1
    assert actions[(("action", "resume"), ("result", "done"))] == 1


def test_reset_gpu_waits_for_the_job_then_runs_the_reset_command_once_and_returns(
        cluster: SlurmCluster, service: Callable[..., Service], alertmanager: Callable[..., Alertmanager]) -> None:
    job = cluster.submit("gpu004", 300)
    svc = service().start()
    am = alertmanager(svc)
    starts = time.time() - 30
    pending = alert_json("GpuRowRemapPending", "gpu004", gpu="5", starts=starts)
    am.post(pending)
    node = cluster.wait_state("gpu004", lambda n: "DRAIN" in flags(n) and "ALLOCATED" in flags(n))
    assert node["Reason"] == "gpunode: reset GpuRowRemapPending gpu=5"
    time.sleep(3)
    assert svc.resets_done() == []  # a job still runs on it
    cluster.cancel(job)
    wait("the reset", svc.resets_done)
    am.post({**pending, "status": "resolved", "endsAt": rfc3339(time.time())})
    cluster.wait_state("gpu004", lambda n: flags(n) == {"IDLE"}, timeout=60)
    assert svc.resets_done() == ["gpu004 5"]


def test_an_operators_drain_is_left_alone(cluster: SlurmCluster, service: Callable[..., Service],
                                          alertmanager: Callable[..., Alertmanager]) -> None:
    cluster.scontrol("update", "nodename=gpu005", "state=drain", "reason=bad DIMM, ticket 4711", check=True)
    svc = service().start()
    am = alertmanager(svc)
    starts = time.time()
    am.post(xid79("gpu005", starts=starts))
    wait("the service to note it", lambda: "gpu005  left alone" in svc.command("status").stdout)
    am.post(xid79("gpu005", "resolved", starts=starts, ends=time.time()))
    time.sleep(4)
    node = cluster.node("gpu005")
    assert node["Reason"] == "bad DIMM, ticket 4711" and "DRAIN" in flags(node) and cluster.reboots("gpu005") == 0


def test_thirty_nodes_alerting_at_once_stop_at_the_breaker(
        cluster: SlurmCluster, service: Callable[..., Service], alertmanager: Callable[..., Alertmanager]) -> None:
    svc = service().start()
    am = alertmanager(svc)
    am.post(*(alert_json("GpuNodeHostStarved", node, starts=time.time() - 100) for node in NODES[:30]))
    wait("the breaker", lambda: svc.metrics()["gpunode_remediate_breaker_open"][()] == 1)
    time.sleep(3)  # every group delivered
    drained = [n["NodeName"] for n in cluster.all_nodes() if "DRAIN" in flags(n)]
    assert len(drained) == 2  # 5 % of 40
    status = svc.command("status").stdout
    assert "circuit breaker: OPEN" in status and status.count("not drained: circuit breaker open") >= 20
    reset = svc.command("breaker", "reset")
    assert reset.returncode == 0 and "circuit breaker closed (it was open since" in reset.stdout
    assert "Drains before now no longer count: the service may drain 2 node(s) of the 40 counted" in reset.stdout
    # The window is cleared: two more nodes are drained, then the breaker opens again.
    wait("two more drains", lambda: sum("DRAIN" in flags(n) for n in cluster.all_nodes()) == 4)
    wait("the breaker again", lambda: svc.metrics()["gpunode_remediate_breaker_open"][()] == 1)
    time.sleep(2)
    assert sum("DRAIN" in flags(n) for n in cluster.all_nodes()) == 4


def test_killed_mid_drain_and_restarted_it_loses_nothing_and_doubles_nothing(
        tmp_path: Path, cluster: SlurmCluster, service: Callable[..., Service]) -> None:
    """scontrol behind a wrapper that logs and then stalls: once before its call (the call dies with
    the service), once after it (the call took effect, the service never recorded it)."""
    for when, node in (("before", "gpu006"), ("after", "gpu007")):
        calls = tmp_path / f"calls-{when}"
        wrapper = tmp_path / f"scontrol-{when}"
        real = f'"{cluster.scontrol_path}" "$@"'
        stall = f'case "$*" in *update*drain*) touch {calls}.stall; sleep 30;; esac'
        wrapper.write_text("#!/bin/sh\n" + (f"{stall}\n{real} && echo \"$*\" >> {calls}\n" if when == "before" else
                                            f"{real} && echo \"$*\" >> {calls}\n{stall}\n"))
        wrapper.chmod(0o755)
        svc = service(scheduler={"kind": "slurm", "scontrol": str(wrapper), "timeout": "60s"})
        svc.start()
        posted = notification(alert_json("GpuNvLinkDegraded", node, starts=time.time()))
        requests.post(f"{svc.url}/alerts", data=posted, timeout=10).raise_for_status()
        wait("the call to stall", lambda p=Path(f"{calls}.stall"): p.exists())
        svc.kill()
        Path(f"{calls}.stall").unlink()
        wrapper.write_text(f"#!/bin/sh\n{real} && case \"$*\" in *update*) echo \"$*\" >> {calls};; esac\n")
        svc.start()
        cluster.wait_state(node, lambda n: "DRAIN" in flags(n))
        time.sleep(3)  # a few more looks at the scheduler
        drains = [c for c in calls.read_text().splitlines() if "state=drain" in c]
        assert len(drains) == 1, drains
        assert cluster.node(node)["Reason"] == "gpunode: drain GpuNvLinkDegraded"
        assert svc.command("status").stdout.count(f"{node}  drained") == 1
        svc.stop()


@pytest.mark.parametrize(("body", "headers", "code", "said"), [
    (b"{not json", {}, 400, "not JSON"),
    (json.dumps({"version": "3", "status": "firing", "alerts": []}).encode(), {}, 400, "version"),
    (notification({**xid79("gpu008"), "fingerprint": "'; DROP TABLE nodes; --"}), {}, 400, "fingerprint"),
    (notification({**xid79("gpu008"), "labels": {"alertname": ["x"]}}), {}, 400, "want a string, got a list"),
    (json.dumps({"version": 4, "status": "firing", "alerts": []}).encode(), {}, 400, "got 4 (a number)"),
    (b"x", {"Content-Length": str(1 << 30)}, 400, "over the limit"),
    (notification(xid79("gpu008")), {"Authorization": "Bearer wrong"}, 401, "Unauthorized"),
])
def test_malformed_and_hostile_payloads_are_refused_and_change_nothing(
        tmp_path: Path, cluster: SlurmCluster, service: Callable[..., Service], body: bytes,
        headers: dict[str, str], code: int, said: str) -> None:
    (tmp_path / "token").write_text("s3cret\n")
    svc = service().start("--web.bearer-token-file", str(tmp_path / "token"))
    svc.headers = {"Authorization": "Bearer s3cret"}
    sent = {"Authorization": "Bearer s3cret", **headers}
    if "Content-Length" in headers:  # a client announcing a body it never sends
        import socket

        with socket.create_connection(("127.0.0.1", svc.port), timeout=10) as s:
            s.sendall(f"POST /alerts HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer s3cret\r\n"
                      f"Content-Length: {headers['Content-Length']}\r\n\r\n".encode())
            answer = b""
            while chunk := s.recv(4096):
                answer += chunk
            answer = answer.decode()
        assert answer.startswith(f"HTTP/1.1 {code}") and said in answer
    else:
        response = requests.post(f"{svc.url}/alerts", data=body, headers=sent, timeout=10)
        assert response.status_code == code and said in response.text
    time.sleep(2)
    assert flags(cluster.node("gpu008")) == {"IDLE"}
    errors = svc.metrics()["gpunode_remediate_webhook_errors_total"]
    assert sum(errors.values()) == 1
    ok = requests.post(f"{svc.url}/alerts", data=notification(), headers={"Authorization": "Bearer s3cret"},
                       timeout=10)
    assert ok.status_code == 200  # the service still serves


def test_a_dry_run_calls_nothing(cluster: SlurmCluster, service: Callable[..., Service],
                                 alertmanager: Callable[..., Alertmanager]) -> None:
    svc = service(mode="dry-run").start()
    am = alertmanager(svc)
    am.post(xid79("gpu009", starts=time.time()))
    wait("the decision", lambda: svc.metrics().get("gpunode_remediate_actions_total", {}).get(
        (("action", "reboot"), ("result", "dry_run"))))
    assert flags(cluster.node("gpu009")) == {"IDLE"} and "gpunode:" not in reasons(cluster)
    assert "mode: dry-run" in svc.command("status").stdout


def test_a_stragglers_job_is_requeued_without_it_when_the_policy_says_so(
        cluster: SlurmCluster, service: Callable[..., Service]) -> None:
    job = cluster.submit("gpu010", 300)
    svc = service(requeue={"enabled": True}).start()
    posted = notification(alert_json("GpuNodeClockThrottled", "gpu010", starts=time.time()))
    requests.post(f"{svc.url}/alerts", data=posted, timeout=10).raise_for_status()
    wait("the requeue", lambda: cluster.job(job).get("Restarts") == "1")
    assert "DRAIN" in flags(cluster.node("gpu010"))
    time.sleep(3)  # more looks: one requeue, the backoff holds the next
    assert cluster.job(job)["Restarts"] == "1" and cluster.job(job).get("NodeList") != "gpu010"


def unattended(svc: Service, am: Alertmanager, **changes: Any) -> Service:
    """The service reading Alertmanager's list every second, an alert not listed for 4 s resolved."""
    return svc.configure(alertmanager={"url": am.url, "interval": "1s", "stale_after": "4s"}, **changes).start()


def test_a_lost_resolution_is_found_in_alertmanagers_list_and_the_node_returns(
        cluster: SlurmCluster, service: Callable[..., Service], alertmanager: Callable[..., Alertmanager]) -> None:
    """Alertmanager restarted with its state lost: no resolved notification will ever come. While it
    is down nothing is resolved; once it is back and no longer lists the alert, the node returns."""
    svc = service()
    am = alertmanager(svc)
    unattended(svc, am)
    am.post(alert_json("GpuNvLinkDegraded", "gpu011", starts=time.time() - 60))
    cluster.wait_state("gpu011", lambda n: "DRAIN" in flags(n))
    am.stop()
    wait("Alertmanager seen down", lambda: svc.metrics()["gpunode_remediate_alertmanager_up"][()] == 0)
    time.sleep(7)  # past stale_after and the quiet period: nothing resolves while Alertmanager cannot be asked
    assert "DRAIN" in flags(cluster.node("gpu011"))
    am.start()
    cluster.wait_state("gpu011", lambda n: flags(n) == {"IDLE"}, timeout=30)
    m = svc.metrics()
    assert m["gpunode_remediate_alertmanager_up"][()] == 1
    assert m["gpunode_remediate_alertmanager_alerts_total"][(("result", "stale"),)] == 1
    said = "gpu011: GpuNvLinkDegraded no longer listed by Alertmanager for 4 s: taken as resolved"
    assert said in svc.log.read_text()


def test_a_silenced_alert_is_never_taken_as_resolved(
        cluster: SlurmCluster, service: Callable[..., Service], alertmanager: Callable[..., Alertmanager]) -> None:
    svc = service()
    am = alertmanager(svc)
    unattended(svc, am)
    am.post(alert_json("GpuNvLinkDegraded", "gpu012", starts=time.time() - 60))
    cluster.wait_state("gpu012", lambda n: "DRAIN" in flags(n))
    am.silence(alertname="GpuNvLinkDegraded", instance="gpu012:19835")
    time.sleep(8)  # twice stale_after: Alertmanager lists it, suppressed
    assert "DRAIN" in flags(cluster.node("gpu012")) and "gpu012  drained" in svc.command("status").stdout
    assert svc.metrics()["gpunode_remediate_alertmanager_alerts_total"][(("result", "stale"),)] == 0


def test_alerts_sent_while_the_service_could_not_hear_them_are_taken_from_alertmanagers_list(
        cluster: SlurmCluster, service: Callable[..., Service], alertmanager: Callable[..., Alertmanager]) -> None:
    svc = service()
    am = alertmanager(svc, webhook=f"http://127.0.0.1:{free_port()}")  # every notification lost
    unattended(svc, am)
    am.post(alert_json("GpuNvLinkDegraded", "gpu013", starts=time.time() - 60))
    node = cluster.wait_state("gpu013", lambda n: "DRAIN" in flags(n))
    assert node["Reason"] == "gpunode: drain GpuNvLinkDegraded"
    assert svc.metrics()["gpunode_remediate_alertmanager_alerts_total"][(("result", "taken"),)] == 1
    assert svc.metrics()["gpunode_remediate_notifications_total"][()] == 0


def test_a_person_pauses_every_action_until_a_reset(
        cluster: SlurmCluster, service: Callable[..., Service], alertmanager: Callable[..., Alertmanager]) -> None:
    svc = service().start()
    am = alertmanager(svc)
    paused = svc.command("breaker", "open", "--reason", "switch maintenance, ticket 4711")
    assert paused.returncode == 0 and "no drain, reboot, reset, return or requeue" in paused.stdout
    am.post(xid79("gpu014", starts=time.time()))
    wait("the note", lambda: "paused by a person" in svc.command("status").stdout)
    assert flags(cluster.node("gpu014")) == {"IDLE"}
    info = svc.metrics()["gpunode_remediate_breaker_info"]
    assert info == {(("mode", "enforce"), ("reason", "switch maintenance, ticket 4711"), ("state", "paused")): 1}
    assert "PAUSED by a person since" in svc.command("status").stdout
    svc.command("breaker", "reset")
    wait("the reboot", lambda: "gpu014 gpunode: reboot GpuXidHardwareFault" in reasons(cluster))


def test_a_job_that_never_ends_holds_the_node_after_idle_timeout(
        cluster: SlurmCluster, service: Callable[..., Service], alertmanager: Callable[..., Alertmanager]) -> None:
    cluster.submit("gpu015", 300)
    svc = service(idle_timeout="3s").start()
    am = alertmanager(svc)
    am.post(alert_json("GpuRowRemapPending", "gpu015", gpu="5", starts=time.time() - 30))
    cluster.wait_state("gpu015", lambda n: "DRAIN" in flags(n) and "ALLOCATED" in flags(n))
    node = cluster.wait_state("gpu015", lambda n: n["Reason"].startswith("gpunode: hold"), timeout=20)
    assert node["Reason"].startswith("gpunode: hold idle_timeout: jobs still running after ")
    assert svc.resets_done() == []
    held = svc.metrics()["gpunode_remediate_node_held_since_timestamp_seconds"]
    assert [dict(k)["node"] for k in held] == ["gpu015"]


def test_a_failed_validation_holds_the_node_instead_of_returning_it(
        cluster: SlurmCluster, service: Callable[..., Service], alertmanager: Callable[..., Alertmanager]) -> None:
    check = ["sh", "-c", 'echo "dcgmi diag -r 1 on $0"; echo "GPU 3: Memory test failed"; exit 1', "{node}"]
    svc = service(validate_command=check).start()
    am = alertmanager(svc)
    starts = time.time() - 60
    am.post(alert_json("GpuNvLinkDegraded", "gpu016", starts=starts))
    cluster.wait_state("gpu016", lambda n: "DRAIN" in flags(n))
    am.post(alert_json("GpuNvLinkDegraded", "gpu016", "resolved", starts=starts, ends=time.time()))
    node = cluster.wait_state("gpu016", lambda n: n["Reason"].startswith("gpunode: hold"), timeout=30)
    assert node["Reason"] == "gpunode: hold validation failed: GPU 3: Memory test failed"
    assert "DRAIN" in flags(node) and "gpu016  held" in svc.command("status").stdout


def test_a_dry_run_leaves_the_enforced_budget_and_breaker_clean(
        cluster: SlurmCluster, service: Callable[..., Service], alertmanager: Callable[..., Alertmanager]) -> None:
    """An operator evaluates in a dry run (its breaker opens in the storm), then enforces on the same
    state file: the real budget is whole, and every line the dry run logged said it was one."""
    svc = service(mode="dry-run").start()
    am = alertmanager(svc)
    am.post(*(alert_json("GpuNodeHostStarved", node, starts=time.time() - 100) for node in NODES[20:30]))
    wait("the dry run's breaker", lambda: svc.metrics()["gpunode_remediate_breaker_open"][()] == 1)
    info = svc.metrics()["gpunode_remediate_breaker_info"]
    assert [dict(k)["mode"] for k in info] == ["dry-run"]
    svc.stop()
    decisions = [line for line in svc.log.read_text().splitlines() if "gpu0" in line]
    assert decisions and all("dry run: " in line for line in decisions), decisions
    assert "(dry run)" in svc.command("status").stdout
    svc.configure(mode="enforce").start()
    wait("two real drains", lambda: sum("DRAIN" in flags(n) for n in cluster.all_nodes()) == 2)
    assert "the state file was a dry run's" in svc.log.read_text()


@pytest.fixture(scope="module")
def rts2(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """ReturnToService=2 (a rebooted node returns as soon as it registers), gpu043's reboot never completing."""
    yield from slurm_cluster(tmp_path_factory, nodes=("gpu041", "gpu042", "gpu043"), return_to_service=2,
                             stuck_reboots=("gpu043",))


def test_a_node_slurm_returns_after_its_reboot_is_taken_back_until_its_checks_pass(
        tmp_path: Path, rts2: SlurmCluster, exporter: str) -> None:
    svc = Service(tmp_path, rts2, exporter, quiet_period="4s").start()
    try:
        starts = time.time() - 60
        requests.post(f"{svc.url}/alerts", data=notification(xid79("gpu041", starts=starts)),
                      timeout=10).raise_for_status()
        back = rts2.wait_state("gpu041", lambda n: n.get("Reason", "").startswith("gpunode: rebooted"), timeout=60)
        assert "DRAIN" in flags(back) and rts2.reboots("gpu041") == 1
        assert "the scheduler returned it after its reboot (ReturnToService=2)" in svc.log.read_text()
        resolved = notification(xid79("gpu041", "resolved", starts=starts, ends=time.time()))
        requests.post(f"{svc.url}/alerts", data=resolved, timeout=10).raise_for_status()
        rts2.wait_state("gpu041", lambda n: flags(n) == {"IDLE"}, timeout=30)
        assert rts2.reboots("gpu041") == 1
        check = svc.command("check")
        assert "ReturnToService=2" in check.stdout and check.returncode == 0
    finally:
        svc.stop()


def test_a_reboot_that_never_completes_holds_the_node_after_reboot_timeout(
        tmp_path: Path, rts2: SlurmCluster, exporter: str) -> None:
    svc = Service(tmp_path, rts2, exporter, reboot_timeout="5s").start()
    try:
        requests.post(f"{svc.url}/alerts", data=notification(xid79("gpu043", starts=time.time())),
                      timeout=10).raise_for_status()
        held = rts2.wait_state("gpu043", lambda n: "gpunode: hold" in n.get("Reason", ""), timeout=40)
        assert held["Reason"].startswith("gpunode: hold reboot_timeout: the reboot not complete after ")
        assert "gpu043  held" in svc.command("status").stdout
    finally:
        svc.stop()


def test_excluded_nodes_are_never_touched_and_the_absolute_cap_holds(
        cluster: SlurmCluster, service: Callable[..., Service], alertmanager: Callable[..., Alertmanager]) -> None:
    """Login-like nodes excluded (and not counted), a budget of 100 % capped at 2 drains a day."""
    svc = service(nodes={"exclude": "gpu03[0-9]|gpu040"}, budget={"fraction": 1.0, "maximum": 2, "in_care": 1.0})
    svc.start()
    am = alertmanager(svc)
    am.post(*(alert_json("GpuNodeHostStarved", node, starts=time.time() - 100 + n)
              for n, node in enumerate(("gpu035", "gpu017", "gpu018", "gpu019"))))
    wait("the breaker", lambda: svc.metrics()["gpunode_remediate_breaker_open"][()] == 1)
    time.sleep(2)
    drained = sorted(n["NodeName"] for n in cluster.all_nodes() if "DRAIN" in flags(n))
    assert drained == ["gpu017", "gpu018"]
    m = svc.metrics()
    assert m["gpunode_remediate_counted_nodes"][()] == 29 and m["gpunode_remediate_budget_nodes"][()] == 2
    assert "gpu035  left alone since" in svc.command("status").stdout
