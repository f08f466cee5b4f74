"""Job recovery's pure parts: squeue's lines parsed with validation, and the branch each end takes."""

from __future__ import annotations

import logging
import sqlite3
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpunode_remediate.alerts import Alert
from gpunode_remediate.cli import status_text
from gpunode_remediate.health import nfs_servers
from gpunode_remediate.jobs import NO_CULPRIT, End, JobView, abnormal, blames, decide, lemons, selected
from gpunode_remediate.plan import NodeView
from gpunode_remediate.policy import build
from gpunode_remediate.recovery import Recovery
from gpunode_remediate.scheduler.slurm import JOB_FIELDS, job_view
from gpunode_remediate.state import State
from tests.remediation import alert

POLICY = build({"jobs": {"enabled": True, "culprit_wait": "60s"}})
VIEWS = {f"gpu{i:03d}": NodeView(f"gpu{i:03d}", "idle") for i in range(1, 9)}
END = 10_000.0
# The contract's "Beyond the GPU" defaults.
KERNEL_ACTIONS = {
    "GpuNvSwitchFatalError": "reboot", "GpuFabricNotReady": "reboot", "GpuNodeFabricPortDown": "hold",
    "GpuNodeFabricPortFlapping": "hold", "GpuNodeFabricPortDegraded": "hold", "GpuNodeNicFault": "hold",
    "GpuNodeMemoryUncorrectable": "hold", "GpuNodePcieUncorrectable": "hold", "GpuNodeFilesystemReadOnly": "hold",
    "GpuNodeDiskErrors": "hold", "GpuNodeHungTasks": "reboot", "GpuNodeCpuLockup": "reboot",
    "GpuNodeGpuDriverFault": "reboot", "GpuNodeMemoryCorrectableRate": "hold", "GpuNodeOomKills": "none",
    "NfsServerNotRespondingOnNode": "none", "NfsServerNotResponding": "none"}


def job(state: str = "failed", status: int = 3 << 8, nodes: tuple[str, ...] = ("gpu001", "gpu002"),
        restarts: int = 0, job_id: str = "17", **kw: object) -> JobView:
    fields = dict(reason="NonZeroExitCode", partition="gpu", num_nodes=len(nodes), requeue=True, batch=True, end=END)
    return JobView(job_id, state, exit_status=status, nodes=nodes, restarts=restarts, **{**fields, **kw})


def test_a_line_of_squeue_parses_and_a_bad_one_is_refused() -> None:
    line = "1234|FAILED|NonZeroExitCode|768|gpu[001-002]|gpu|2|1|3|1|2026-11-29T09:21:47|"
    view = job_view(line)
    assert (view.job, view.state, view.code, view.signal, view.nodes, view.restarts) == (
        "1234", "failed", 3, 0, ("gpu001", "gpu002"), 3)
    assert view.requeue and view.batch and view.end > 0
    for bad in ("1234_5|FAILED|x|0|gpu001|gpu|1|1|0|1|NONE|",  # an array element: left alone
                "12|FAILED|x|-1|gpu001|gpu|1|1|0|1|NONE|",  # a negative status
                "12|FAILED|x|٣|gpu001|gpu|1|1|0|1|NONE|",  # not ASCII digits
                "12|FAILED|x|0|gpu001|gpu|1|1|0|1|NONE|extra",  # a field too many
                "12|FAILED|x|0|gpu[a-b]|gpu|1|1|0|1|NONE|"):  # no host range
        with pytest.raises(ValueError):
            job_view(bad)


@settings(max_examples=300)
@given(st.lists(st.text(alphabet=st.characters(codec="utf-8"), max_size=12), min_size=len(JOB_FIELDS) + 1,
                max_size=len(JOB_FIELDS) + 1))
def test_any_line_parses_to_a_valid_job_or_is_refused(parts: list[str]) -> None:
    try:
        view = job_view("|".join(parts))
    except ValueError:
        return
    assert view.job.isascii() and view.job.isdigit()
    assert view.exit_status >= 0 and view.restarts >= 0 and view.num_nodes >= 0


def test_which_ends_are_abnormal_and_which_jobs_are_selected() -> None:
    jobs = POLICY.jobs
    assert abnormal(job(), jobs) and abnormal(job("node_fail", 0), jobs) and abnormal(job(status=9), jobs)
    for state in ("completed", "cancelled", "timeout", "pending", "running"):
        assert not abnormal(job(state), jobs)
    assert not abnormal(job(status=3 << 8), build({"jobs": {"exit_codes": [1]}}).jobs)
    assert selected(job(), jobs, lambda _: None)
    assert not selected(job(requeue=False), jobs, lambda _: None)  # --no-requeue
    assert not selected(job(batch=False), jobs, lambda _: None)  # srun or salloc
    named = build({"jobs": {"select": {"name": "train-.*", "partitions": ["gpu"], "min_nodes": 2}}}).jobs
    assert selected(job(), named, lambda _: "train-llm")
    assert not selected(job(), named, lambda _: "notebook")
    assert not selected(job(partition="debug"), named, lambda _: "train-llm")
    assert not selected(job(nodes=("gpu001",)), named, lambda _: "train-llm")


def test_each_branch() -> None:
    app = {"gpu002": [alert("GpuXidApplicationFault", "gpu002", starts=END + 30, xid="43", action="RESTART_APP")]}
    d = decide(END + 40, POLICY, job(), app, VIEWS, [], ())
    assert (d.branch, d.exclude, d.start_at, d.attempts) == ("app_fault", (), END + 40, 1)
    assert "GpuXidApplicationFault xid=43" in d.evidence and d.comment.startswith("gpunode: app_fault attempt 1")
    hw = {**app, "gpu001": [alert("GpuXidHardwareFault", "gpu001", starts=END - 5, xid="79", action="RESTART_BM")]}
    d = decide(END + 40, POLICY, job(), hw, VIEWS, [], ("gpu007",))
    assert (d.branch, d.culprits, d.exclude) == ("node_fault", ("gpu001",), ("gpu001", "gpu007"))
    stop = build({"jobs": {"on_node_fault": "stop"}})
    assert decide(END + 40, stop, job(), hw, VIEWS, [], ()).branch == "held"
    # No culprit: it waits for an alert, then takes the n-th delay of the backoff from its end.
    assert decide(END + 59, POLICY, job(), {}, VIEWS, [], ()) is None
    d = decide(END + 60, POLICY, job(), {}, VIEWS, [], ())
    assert (d.branch, d.start_at) == ("backoff", END + 600)
    chain = [End("17", 0, END - 5000, ("gpu001", "gpu002"), "backoff"), End("17", 1, END - 3000, ("gpu001", "gpu003"),
                                                                          "backoff")]
    d = decide(END + 60, POLICY, job(restarts=2), {}, VIEWS, chain, ())
    assert (d.branch, d.start_at, d.attempts, d.shared) == ("backoff", END + 2400, 3, ("gpu001",))
    chain.append(End("17", 2, END - 1000, ("gpu001", "gpu004"), "backoff"))
    d = decide(END + 60, POLICY, job(restarts=3), app, VIEWS, chain, ())
    assert (d.branch, d.attempts, d.shared) == ("held", 4, ("gpu001",))
    assert "nodes its failed attempts shared: gpu001" in d.why


def test_slurms_node_fail_names_the_node_that_went_down() -> None:
    views = {**VIEWS, "gpu002": NodeView("gpu002", "down", frozenset({"not_responding"}), "Not responding")}
    d = decide(END + 1, POLICY, job("node_fail", 0), {}, views, [], ())
    assert (d.branch, d.exclude) == ("node_fault", ("gpu002",)) and "NODE_FAIL" in d.evidence


def test_a_node_blamed_by_three_jobs_is_a_lemon_and_its_blames_are_spent_once_taken() -> None:
    ends = [End("1", 0, 100, ("gpu003", "gpu004"), "node_fault", ("gpu003",)),
            End("2", 0, 200, ("gpu003", "gpu005"), "node_fault", ("gpu003",)),
            # No culprit twice, the only node shared: gpu003.
            End("3", 0, 300, ("gpu003", "gpu006"), "backoff"), End("3", 1, 400, ("gpu003", "gpu007"), "backoff"),
            End("4", 0, 500, ("gpu008",), "backoff")]
    assert blames(ends) == {"gpu003": {"1", "2", "3"}}
    assert list(lemons(POLICY, ends, 1000, {})) == ["gpu003"]
    assert lemons(POLICY, ends[:3], 1000, {}) == {}  # one culprit-less attempt blames no node
    assert lemons(POLICY, ends, 1000, {"gpu003": 250}) == {}  # taken at 250: only job 3 counts since
    assert lemons(POLICY, ends, 100 + 7 * 86400 + 1, {}) == {}  # job 1's blame left the window


def test_a_job_that_fails_everywhere_blames_no_node() -> None:
    # Three jobs each failed on gpu003 with no culprit; jobs 2 and 3 failed on other nodes too.
    ends = [End("1", 0, 100, ("gpu003",), "backoff"), End("2", 0, 200, ("gpu003",), "backoff"),
            End("2", 1, 300, ("gpu009",), "backoff"), End("3", 0, 400, ("gpu003",), "backoff"),
            End("3", 1, 500, ("gpu010",), "backoff")]
    assert blames(ends) == {}
    assert blames(ends[:2]) == {"gpu003": {"1", "2"}}  # before job 2 failed elsewhere
    # A lemon under a big job: every one of its failures was on gpu003, and two small jobs' only one.
    big = [End("9", n, 100.0 * n, ("gpu003", f"gpu1{n}", "gpu020"), "backoff") for n in range(2)]
    small = [End("5", 0, 50, ("gpu003",), "backoff"), End("6", 0, 60, ("gpu003", "gpu021"), "backoff")]
    assert blames(big + small) == {"gpu003": {"5", "6", "9"}}


def test_an_application_fault_blames_no_node_and_spent_blames_stay_spent() -> None:
    app = "GpuXidApplicationFault xid=13 action=RESTART_APP on gpu003"
    ends = [End(str(n), 0, 100.0 * n, ("gpu003",), "app_fault", (), app) for n in range(1, 4)]
    assert blames(ends) == {}
    # Three jobs blamed gpu003 before it was taken at 350; each failed since, elsewhere: still spent.
    ends = [End(str(n), 0, 100.0 * n, ("gpu003",), "node_fault", ("gpu003",)) for n in range(1, 4)]
    ends += [End(str(n), 1, 400.0 + n, (f"gpu01{n}",), "backoff") for n in range(1, 4)]
    assert lemons(POLICY, ends, 1000, {"gpu003": 350}) == {}


def test_a_requeued_job_is_released_no_sooner_than_two_seconds_after_its_end(tmp_path: Path) -> None:
    # slurmd refuses a launch whose credential is from the second the last attempt was killed in.
    now, calls = [END + 0.4], []

    class Slurm:
        def requeuehold(self, job_id: str) -> None:
            calls.append(("requeuehold", now[0]))

        def job_detail(self, job_id: str) -> None:
            return None

        def update_job(self, job_id: str, comment: str, exclude: tuple[str, ...], start_at: float) -> None:
            calls.append(("update", now[0]))

        def release(self, job_id: str) -> None:
            calls.append(("release", now[0]))

    def sleep(seconds: float) -> None:
        now[0] += seconds

    policy = build({"mode": "enforce", "jobs": {"enabled": True}})
    recovery = Recovery(policy, State(tmp_path / "state.db"), Slurm(), logging.getLogger("test"), lambda: now[0], sleep)
    ended = job()
    decision = decide(now[0], policy, ended, {"gpu001": [alert("GpuXidApplicationFault", "gpu001", xid="13",
                                                              action="RESTART_APP")]}, VIEWS, [], ())
    assert decision is not None and decision.branch == "app_fault"
    recovery._carry_out(decision, ended)
    assert [c for c, _ in calls] == ["requeuehold", "update", "release"]
    assert calls[2][1] == pytest.approx(END + 2) and calls[0][1] == pytest.approx(END + 0.4)
    calls.clear()
    now[0] = END + 30  # decided later: no wait
    recovery._carry_out(decision, job(restarts=0))
    assert calls[-1] == ("release", END + 30)


# Beyond the GPU: the host's kernel log and its storage.

def outage(server: str = "nfs01", starts: float = END - 30) -> Alert:
    """NfsServerNotResponding as the rule pack sends it: a server label, no node label."""
    labels = {"alertname": "NfsServerNotResponding", "server": server, "severity": "critical"}
    return Alert(f"{abs(hash(server)):x}"[:16], "firing", labels, starts, None)


def test_an_oom_kill_is_the_jobs_own_fault_and_blames_no_node() -> None:
    oom = {"gpu002": [alert("GpuNodeOomKills", "gpu002", starts=END - 20)]}
    d = decide(END + 1, POLICY, job(), oom, VIEWS, [], ())  # no culprit wait: the alert is there
    assert (d.branch, d.culprits, d.exclude, d.start_at) == ("backoff", (), (), END + 600)
    assert d.evidence == "GpuNodeOomKills on gpu002" and "the job's own fault" in d.why
    # An application Xid of the process the OOM killer took follows from it: still the job's own.
    app = {"gpu001": [alert("GpuXidApplicationFault", "gpu001", starts=END - 19, xid="43", action="RESTART_APP")]}
    assert decide(END + 1, POLICY, job(), {**oom, **app}, VIEWS, [], ()).branch == "backoff"
    # Three jobs' failed attempts on gpu003: with no culprit gpu003 is a lemon, with an OOM kill it is not.
    bare = [End(str(n), r, 100.0 * n + r, ("gpu003", f"gpu01{n}{r}"), "backoff") for n in range(3) for r in range(2)]
    assert list(lemons(POLICY, bare, 1000, {})) == ["gpu003"]
    own = [End(e.job, e.restarts, e.ended_at, e.nodes, "backoff", (), "GpuNodeOomKills on gpu003") for e in bare]
    assert not any(e.unexplained for e in own) and lemons(POLICY, own, 1000, {}) == {}


@pytest.mark.parametrize(("name", "action"), sorted(KERNEL_ACTIONS.items()))
def test_the_kernel_logs_rules_that_act_make_a_node_fault(name: str, action: str) -> None:
    labels = {"switch": "0", "pci_bus_id": "0000:05:00.0", "sxid": "12028"} if "Switch" in name else {}
    found = {"gpu002": [alert(name, "gpu002", starts=END + 20, **labels)]}
    rule = POLICY.action(found["gpu002"][0].labels)
    assert rule is not None and rule.action == action and rule.why
    d = decide(END + 30, POLICY, job(), found, VIEWS, [], ())
    if name == "GpuNodeOomKills":  # the job's own fault: below
        assert d.branch == "backoff" and d.exclude == ()
        return
    if action == "none":  # no culprit: the end waits for one, then the backoff
        assert d is None and decide(END + 60, POLICY, job(), found, VIEWS, [], ()).evidence == NO_CULPRIT
        return
    assert (d.branch, d.culprits, d.exclude) == ("node_fault", ("gpu002",), ("gpu002",))
    assert d.evidence.startswith(f"{rule.alertname} ") and d.evidence.endswith(" on gpu002")


def test_disk_errors_drain_and_hold_the_node_and_requeue_the_job_without_it() -> None:
    disk = {"gpu001": [alert("GpuNodeDiskErrors", "gpu001", starts=END + 45, device="nvme0n1")]}
    assert POLICY.action(disk["gpu001"][0].labels).action == "hold"
    d = decide(END + 50, POLICY, job(), disk, VIEWS, [], ())
    assert (d.branch, d.exclude, d.start_at) == ("node_fault", ("gpu001",), END + 50)
    assert d.comment.startswith("gpunode: node_fault attempt 1: node fault: requeued without gpu001 (GpuNodeDiskErrors")


def test_a_storage_outage_holds_the_requeue_until_the_server_answers() -> None:
    asked = []

    def servers(node: str) -> frozenset[str]:
        asked.append(node)
        return frozenset({"nfs01", "10.0.0.5"}) if node == "gpu002" else frozenset({"nfs02"})

    d = decide(END + 1, POLICY, job(), {}, VIEWS, [], (), [outage()], servers)  # at once: no culprit wait
    assert (d.branch, d.waits_for, d.culprits, d.exclude) == ("backoff", "nfs01", (), ())
    assert d.evidence == "NfsServerNotResponding server=nfs01; mounted on gpu002" and asked == ["gpu001", "gpu002"]
    assert d.comment.startswith("gpunode: backoff attempt 1: waiting for NFS server nfs01")
    assert not End(d.job, d.restarts, d.ended_at, d.nodes, d.branch, d.culprits, d.evidence).unexplained
    # Before the job's own fault (its OOM may be the dead server's dirty pages), after a node's fault.
    oom = {"gpu002": [alert("GpuNodeOomKills", "gpu002", starts=END - 20)]}
    assert decide(END + 1, POLICY, job(), oom, VIEWS, [], (), [outage()], servers).waits_for == "nfs01"
    xid = {"gpu001": [alert("GpuXidHardwareFault", "gpu001", starts=END - 5, xid="79", action="RESTART_BM")]}
    asked.clear()
    d = decide(END + 1, POLICY, job(), xid, VIEWS, [], (), [outage()], servers)
    assert (d.branch, d.waits_for, asked) == ("node_fault", "", [])  # the exporters not even asked
    # The address the mount used counts as well as the export's host.
    assert decide(END + 1, POLICY, job(), {}, VIEWS, [], (), [outage("10.0.0.5")], servers).waits_for == "10.0.0.5"


def test_a_node_whose_exporter_cannot_be_asked_counts_as_mounting_the_server() -> None:
    mounts = {"gpu001": frozenset({"nfs02"}), "gpu002": None}
    d = decide(END + 1, POLICY, job(), {}, VIEWS, [], (), [outage()], mounts.__getitem__)
    assert (d.branch, d.waits_for) == ("backoff", "nfs01")
    assert d.evidence == "NfsServerNotResponding server=nfs01; gpu002's exporter not asked or not answering"


def test_a_job_on_nodes_not_mounting_the_server_takes_its_normal_branch() -> None:
    mounts = {"gpu001": frozenset({"nfs02"}), "gpu002": frozenset()}.__getitem__
    assert decide(END + 1, POLICY, job(), {}, VIEWS, [], (), [outage()], mounts) is None  # waits for a culprit
    d = decide(END + 60, POLICY, job(), {}, VIEWS, [], (), [outage()], mounts)
    assert (d.branch, d.waits_for, d.start_at, d.evidence) == ("backoff", "", END + 600, NO_CULPRIT)
    app = {"gpu002": [alert("GpuXidApplicationFault", "gpu002", starts=END + 30, xid="43", action="RESTART_APP")]}
    assert decide(END + 40, POLICY, job(), app, VIEWS, [], (), [outage()], mounts).branch == "app_fault"


def test_the_servers_a_node_mounts_are_read_from_its_exporters_mount_info() -> None:
    exposition = ('# TYPE gpunode_nfs_mount_info gauge\n'
                  'gpunode_nfs_mount_info{mountpoint="/mnt/a}\\"b",export="Stor-A.example:/ckpt",protocol="tcp",'
                  'server_address="10.0.0.5",device=""} 1\n'
                  'gpunode_nfs_mount_info{mountpoint="/v6",export="[fd00::7]:/data",protocol="tcp",'
                  'server_address="fd00::7",device="ib0"} 1\n'
                  'gpunode_nfs_mount_infos{export="other:/x"} 1\n')
    assert nfs_servers(exposition) == {"stor-a.example", "10.0.0.5", "fd00::7"}
    assert nfs_servers("gpunode_gpus_visible{source=\"nvml\"} 8\n") == frozenset()


class FakeSlurm:
    """The calls job recovery makes, and the job as Slurm would list it after them."""

    def __init__(self, ended: JobView) -> None:
        self.job = ended
        self.calls: list[tuple] = []

    def requeuehold(self, job_id: str) -> None:
        self.calls.append(("requeuehold", job_id))
        self.job = replace(self.job, state="pending", reason="job_requeued_in_held_state",
                           restarts=self.job.restarts + 1)

    def job_detail(self, job_id: str) -> tuple[str, tuple[str, ...]]:
        return "train", ()

    def update_job(self, job_id: str, comment: str, exclude: tuple[str, ...], start_at: float | None) -> None:
        self.calls.append(("update", comment, exclude, start_at))

    def release(self, job_id: str) -> None:
        self.calls.append(("release", job_id))
        self.job = replace(self.job, reason="None")


def test_a_storage_wait_survives_a_restart_and_releases_with_the_backoff_from_the_servers_return(
        tmp_path: Path) -> None:
    now = [END + 1]
    policy = build({"mode": "enforce", "state_path": str(tmp_path / "state.db"), "jobs": {"enabled": True}})
    slurm = FakeSlurm(job())
    asked: list[str] = []

    def recovery() -> Recovery:
        def mounted(node: str, _: object) -> frozenset[str]:
            asked.append(node)
            return frozenset({"nfs01"})
        return Recovery(policy, State(policy.state_path), slurm, logging.getLogger("test"), lambda: now[0],
                        lambda s: None, mounted)

    first = recovery()
    down = outage()
    first.state.record_alerts([(down, None)], END - 30)
    first.run(now[0], {"17": slurm.job}, VIEWS, "")
    assert [c[0] for c in slurm.calls] == ["requeuehold", "update"]  # held: no release
    assert slurm.calls[1][1].startswith("gpunode: backoff attempt 1: waiting for NFS server nfs01")
    assert slurm.calls[1][3] is None and first.requeues == {"backoff": 1} and asked == ["gpu001"]
    status = status_text(policy, State(policy.state_path, readonly=True), now[0])
    assert "job 17  waiting for NFS server nfs01  since" in status and "to start 10 min after" in status
    now[0] += 300
    first.run(now[0], {"17": slurm.job}, VIEWS, "")
    assert len(slurm.calls) == 2  # still down
    again = recovery()  # a restart: the wait is in the state file
    again.state.record_alerts([(replace(down, status="resolved", ends_at=END + 400), None)], END + 410)
    now[0] = END + 420
    again.run(now[0], {"17": slurm.job}, VIEWS, "paused by a person (maintenance)")
    assert len(slurm.calls) == 2  # a pause holds the release too
    again.run(now[0], {"17": slurm.job}, VIEWS, "")
    assert [c[0] for c in slurm.calls] == ["requeuehold", "update", "update", "release"]
    assert slurm.calls[2][3] == END + 400 + 600  # the backoff from when the server answered
    assert slurm.calls[2][1].startswith("gpunode: backoff attempt 1: NFS server nfs01 answered again at")
    again.run(now[0] + 60, {"17": slurm.job}, VIEWS, "")
    assert len(slurm.calls) == 4 and again.state.storage_waits(("done",)) == []
    assert "waiting for NFS server" not in status_text(policy, again.state, now[0])


def test_a_dry_runs_storage_wait_calls_nothing(tmp_path: Path) -> None:
    policy = build({"state_path": str(tmp_path / "state.db"), "jobs": {"enabled": True}})
    slurm = FakeSlurm(job())
    r = Recovery(policy, State(policy.state_path), slurm, logging.getLogger("test"), lambda: END + 1,
                 lambda s: None, lambda node, p: None)
    r.state.record_alerts([(outage(), None), (outage("nfs02", END + 61), None)], END - 30)
    # At a job's end: firing then, or begun within culprit_wait (60 s) after it.
    assert [a.labels["server"] for a in r.state.unplaced_at(END, 60)] == ["nfs01"]
    assert [a.labels["server"] for a in r.state.unplaced_at(END + 1, 60)] == ["nfs01", "nfs02"]
    r.run(END + 1, {"17": slurm.job}, VIEWS, "")
    assert r.requeues == {"backoff": 1} and [d.waits_for for d, _ in r.state.storage_waits(("dry_run",))] == ["nfs01"]
    r.state.record_alerts([(replace(outage(), status="resolved", ends_at=END + 5), None)], END + 5)
    r.run(END + 6, {"17": slurm.job}, VIEWS, "")
    assert slurm.calls == [] and r.state.storage_waits(("dry_run",)) == []


def test_a_state_file_without_storage_waits_still_loads(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    State(path).close()
    old = sqlite3.connect(path)  # job_ends as the earlier version made it
    old.executescript(
        "DROP TABLE job_ends; CREATE TABLE job_ends (job TEXT NOT NULL, restarts INTEGER NOT NULL, ended_at REAL "
        "NOT NULL, nodes TEXT NOT NULL, branch TEXT NOT NULL, why TEXT NOT NULL, culprits TEXT NOT NULL, evidence "
        "TEXT NOT NULL, exclude TEXT NOT NULL, start_at REAL NOT NULL, attempts INTEGER NOT NULL, shared TEXT NOT "
        "NULL, status TEXT NOT NULL, decided_at REAL NOT NULL, finished_at REAL, error TEXT NOT NULL DEFAULT '', "
        "PRIMARY KEY (job, restarts)); INSERT INTO job_ends VALUES ('5', 2, 100, '[\"gpu001\"]', 'held', 'x', '[]', "
        "'e', '[]', 100, 4, '[\"gpu001\"]', 'done', 100, 100, '')")
    old.commit()
    old.close()
    policy = build({"mode": "enforce", "state_path": str(path), "jobs": {"enabled": True}})
    assert "job 5  held" in status_text(policy, State(path, readonly=True), 200.0)
    state = State(path)
    assert [c.job for c in state.held_chains(("done",))] == ["5"] and state.storage_waits(("done",)) == []
