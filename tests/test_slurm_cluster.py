"""The Slurm test cluster (tests/slurm.py) does what the remediation service's end-to-end tests rely on:
real daemons whose nodes drain, reboot and resume through scontrol, and nothing left running after it."""

from __future__ import annotations

import random
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from demo.slurm import BOOT_SECONDS, time_namespaces
from gpunode_remediate.scheduler.slurm import _local_time  # the service's reading of Slurm's times
from tests.slurm import DEFAULT_NODES, SlurmCluster, flags, skip_without_slurm, slurm_cluster

REASON = "gpunode: test"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    yield from slurm_cluster(tmp_path_factory)


def rebooted_down(node: dict[str, str]) -> bool:
    return flags(node) == {"DOWN"} and "reboot complete" in node.get("Reason", "")


def idle(node: dict[str, str]) -> bool:
    return flags(node) == {"IDLE"}


def test_every_node_is_idle_and_scontrol_needs_only_the_env(cluster: SlurmCluster) -> None:
    nodes = cluster.all_nodes()
    assert [n["NodeName"] for n in nodes] == list(DEFAULT_NODES)
    assert all(idle(n) for n in nodes), [n["State"] for n in nodes]
    # As another program would call it: the one path, the env, nothing else.
    done = subprocess.run([cluster.scontrol_path, "-o", "show", "node", "gpu005"], env=cluster.env, cwd="/",
                          capture_output=True, text=True, timeout=10, check=True)
    assert f"Port={cluster.ports['gpu005']} " in done.stdout


def test_drain_shows_the_reason_and_resume_clears_it(cluster: SlurmCluster) -> None:
    cluster.scontrol("update", "nodename=gpu001", "state=drain", f"reason={REASON}", check=True)
    node = cluster.node("gpu001")
    assert flags(node) == {"IDLE", "DRAIN"} and node["Reason"] == REASON
    reasons = [line for line in cluster.sinfo_reasons().splitlines() if line.endswith(" gpu001")]
    assert len(reasons) == 1 and reasons[0].startswith(REASON)
    cluster.scontrol("update", "nodename=gpu001", "state=resume", check=True)
    assert "Reason" not in cluster.wait_state("gpu001", idle, 10)
    assert "gpu001" not in cluster.sinfo_reasons()


def test_reboot_of_an_idle_node_comes_back_down_until_resumed(cluster: SlurmCluster) -> None:
    cluster.scontrol("reboot", "ASAP", "nextstate=DOWN", f"reason={REASON}", "gpu002", check=True)
    node = cluster.wait_state("gpu002", rebooted_down, 20)
    assert node["Reason"].startswith(f"{REASON} : reboot issued : reboot complete")
    assert cluster.reboots("gpu002") == 1
    time.sleep(4)  # more than a ping cycle (SlurmdTimeout/3): ReturnToService does not bring it back
    assert flags(cluster.node("gpu002")) == {"DOWN"}
    cluster.scontrol("update", "nodename=gpu002", "state=resume", check=True)
    cluster.wait_state("gpu002", idle, 15)  # IDLE+NOT_RESPONDING first, until slurmctld pings it
    job = cluster.submit("gpu002", 300)  # the restarted slurmd runs jobs
    cluster.cancel(job)
    assert cluster.reboots("gpu002") == 1


def test_a_job_keeps_a_drained_node_draining_until_cancelled(cluster: SlurmCluster) -> None:
    job = cluster.submit("gpu003", 300)
    assert cluster.job(job)["NodeList"] == "gpu003" and flags(cluster.node("gpu003")) == {"ALLOCATED"}
    cluster.scontrol("update", "nodename=gpu003", "state=drain", f"reason={REASON}", check=True)
    assert flags(cluster.node("gpu003")) == {"ALLOCATED", "DRAIN"}
    assert cluster.run("sinfo", "-h", "-n", "gpu003", "-o", "%t").stdout.strip() == "drng"
    cluster.cancel(job)
    cluster.wait_state("gpu003", lambda n: flags(n) == {"IDLE", "DRAIN"}, 10)
    assert cluster.run("sinfo", "-h", "-n", "gpu003", "-o", "%t").stdout.strip() == "drain"
    cluster.scontrol("update", "nodename=gpu003", "state=resume", check=True)
    cluster.wait_state("gpu003", idle, 10)


def test_reboot_asap_waits_for_the_running_job(cluster: SlurmCluster) -> None:
    job = cluster.submit("gpu004", 300)
    cluster.scontrol("reboot", "ASAP", "nextstate=DOWN", f"reason={REASON}", "gpu004", check=True)
    time.sleep(2)
    node = cluster.node("gpu004")
    assert flags(node) == {"ALLOCATED", "DRAIN", "REBOOT_REQUESTED"} and node["NextState"] == "DOWN"
    assert cluster.job(job)["JobState"] == "RUNNING" and cluster.reboots("gpu004") == 0
    cluster.cancel(job)
    cluster.wait_state("gpu004", rebooted_down, 20)
    assert cluster.reboots("gpu004") == 1
    cluster.scontrol("update", "nodename=gpu004", "state=resume", check=True)
    cluster.wait_state("gpu004", idle, 15)


def test_a_rebooted_node_boots_after_the_request_and_seconds_before_its_slurmd(cluster: SlurmCluster) -> None:
    """As a real node does. slurmctld takes now - uptime, in whole seconds, for the boot time: had the boot
    been slurmd's start (`slurmd -b`), a registration soon after could look like a reboot nobody asked for,
    and slurmctld set the node DOWN, "Node unexpectedly rebooted", as a resume followed."""
    if not time_namespaces():
        pytest.skip("no time namespaces here: a simulated boot is slurmd's start (slurmd -b)")
    requested = int(time.time())
    cluster.scontrol("reboot", "ASAP", "nextstate=DOWN", f"reason={REASON}", "gpu005", check=True)
    node = cluster.wait_state("gpu005", rebooted_down, 20)
    boot, slurmd_start = (_local_time(node[key]) for key in ("BootTime", "SlurmdStartTime"))
    assert requested <= boot and slurmd_start - boot >= BOOT_SECONDS, (node["BootTime"], node["SlurmdStartTime"])
    cluster.scontrol("update", "nodename=gpu005", "state=resume", check=True)
    cluster.wait_state("gpu005", idle, 15)


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").replace(b"\0", b" ").decode()
    except OSError:
        return ""  # gone meanwhile


def _running(cmdline: str) -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and _cmdline(int(p.name)) == cmdline]


def _soon_running(cmdline: str, timeout: float = 15) -> list[int]:
    """The processes `cmdline` runs as, once a job has started them (slurmctld says RUNNING a little before)."""
    deadline = time.monotonic() + timeout
    while not (pids := _running(cmdline)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return pids


def test_forty_nodes_start_quickly_and_leave_nothing_behind(tmp_path: Path) -> None:
    skip_without_slurm()
    job_sleep, daemon = (f"sleep {random.randrange(10**6, 10**7)}" for _ in range(2))  # ours alone
    started = time.monotonic()
    with SlurmCluster(tmp_path, nodes=[f"gpu{i:03d}" for i in range(1, 41)]) as big:
        assert time.monotonic() - started < 20
        assert sum(idle(n) for n in big.all_nodes()) == 40
        ports = [big.ctld_port, *big.ports.values()]
        assert all(map(_listening, ports))
        big.submit("gpu040", int(job_sleep.split()[1]))
        assert _soon_running(job_sleep)
        # A job leaving a daemon out of slurmstepd's tree: found by its environment (SLURM_JOB_ID, SLURM_CONF).
        big.run("sbatch", "-w", "gpu039", "-o", "/dev/null", f"--wrap=setsid -f {daemon}; sleep 300", check=True)
        orphans = _soon_running(daemon)
        assert orphans and _cmdline(int(Path(f"/proc/{orphans[0]}/stat").read_text().split()[3])) != "/bin/sh"
        big.scontrol("reboot", "gpu001", check=True)  # and leave while it reboots
        big.wait_state("gpu001", lambda _: big.reboots("gpu001") == 1, 10)
    assert big.processes() == set()
    assert not any(map(_listening, ports)) and not _running(job_sleep) and not _running(daemon)
    with pytest.raises(OSError), socket.socket(socket.AF_UNIX) as unix:
        unix.connect(str(big.munge_socket))


def test_a_start_that_times_out_says_why_and_cleans_up(tmp_path: Path) -> None:
    skip_without_slurm()
    cluster = SlurmCluster(tmp_path, nodes=["gpu001"], start_timeout=0)
    with pytest.raises(RuntimeError, match=r"every node to be IDLE\nslurmctld.log:\n"), cluster:
        pass
    assert cluster.processes() == set()
