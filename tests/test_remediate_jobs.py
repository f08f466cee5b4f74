"""Job recovery's pure parts: squeue's lines parsed with validation, and the branch each end takes."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpunode_remediate.jobs import End, JobView, abnormal, blames, decide, lemons, selected
from gpunode_remediate.plan import NodeView
from gpunode_remediate.policy import build
from gpunode_remediate.recovery import Recovery
from gpunode_remediate.scheduler.slurm import JOB_FIELDS, job_view
from gpunode_remediate.state import State
from tests.remediation import alert

POLICY = build({"jobs": {"enabled": True, "culprit_wait": "60s"}})
VIEWS = {f"gpu{i:03d}": NodeView(f"gpu{i:03d}", "idle") for i in range(1, 9)}
END = 10_000.0


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
