"""The kernel log past Xid on a simulated fleet (fleet/kernel.py, fleet/scenarios/kernel-selftest.yaml):
the series as the exporter serves them, a storage server every node loses, and on a real backend each
family found by its alert while the outage blames no node."""

from __future__ import annotations

import itertools
import re
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from fleet import harness, jobcluster, jobreplay, kernel, remediation, scenario, score
from fleet.harness import Firing
from fleet.simulate import Fleet, Truth, node_name
from gpunode_exporter.collector import xid as collector
from gpunode_exporter.xid import kernel as exporter_kernel
from tests.helpers import free_port, skip_without_fleet_tools

pytestmark = pytest.mark.xdist_group("replay")  # a rule replay runs one vmalert per CPU

SELFTEST = scenario.load("kernel-selftest")
OUTAGE = next(f for f in SELFTEST.faults if f.kind == "nfs_server_down")
NODE_FAMILIES = {f.kind for f in SELFTEST.faults} - {"nfs_server_down"}
METRICS = {spec.name: spec.labels for spec in (collector.KERNEL_EVENTS, collector.KERNEL_LAST, collector.SXID_ERRORS,
                                               collector.SXID_LAST, collector.NFS_RESPONDING)}


def _fleet() -> Fleet:
    return Fleet(SELFTEST, (time.time() // 3600) * 3600 - SELFTEST.duration - 3600)


def test_the_kernel_series_are_the_exporters() -> None:
    fleet = _fleet()
    series = [s for s in fleet.series() if s.name in METRICS or s.name == "gpunode_nfs_mount_info"]
    devices = [re.compile(p.pattern) for p in exporter_kernel._DEVICE.values()]
    for s in series:
        labels = dict(s.labels)
        if s.name in METRICS:  # the exporter's label names, values it can serve
            assert set(labels) - {"instance", "job"} == set(METRICS[s.name]), s
            assert labels.get("kind", "hung_task") in exporter_kernel.KINDS
            assert labels.get("severity", "fatal") in exporter_kernel.SEVERITIES
            device = labels.get("device", "")
            assert not device or any(p.fullmatch(device) for p in devices), device
            shown = s.values[~np.isnan(s.values)]
            assert shown.size  # a series from its first event on
            if s.name.endswith("_total"):
                assert shown[0] >= 1 and (np.diff(shown) >= 0).all()
    # The kernel names the server by the host part of the mount's export.
    mounts = {dict(s.labels)["export"] for s in series if s.name == "gpunode_nfs_mount_info"}
    assert {m.partition(":")[0] for m in mounts} == {kernel.NFS_SERVER}
    t = fleet.t

    def first_after_stop(count: np.ndarray) -> float:
        before = np.nan_to_num(count[t < OUTAGE.at], nan=0).max()
        return float(t[np.argmax((t >= OUTAGE.at) & (np.nan_to_num(count, nan=0) > before))])

    first = {(dict(s.labels)["instance"], dict(s.labels)["kind"]): first_after_stop(s.values)
             for s in series if s.name == "gpunode_kernel_events_total"}
    # Some clients report a hung task before they name the server (the rule must wait for it).
    early = [n for (n, kind), at in first.items() if kind == "hung_task" and at < first[n, "nfs_not_responding"]]
    assert 0 < len(early) < SELFTEST.nodes
    down = (t >= OUTAGE.at + kernel.NFS_MAJOR_TIMEOUT + 30) & (t < OUTAGE.at + OUTAGE.duration("lasts", 0))
    for n in range(SELFTEST.nodes):
        mine = {(s.name, dict(s.labels).get("kind", "")): s.values for s in series
                if dict(s.labels)["instance"] == node_name(n)}
        # Every client: not responding from its major timeout to its OK, 1 after; hung tasks meanwhile.
        responding = mine[("gpunode_nfs_server_responding", "")]
        assert np.isnan(responding[t < OUTAGE.at]).all() and (responding[down] == 0).all()
        assert responding[-1] == 1
        hung = mine[("gpunode_kernel_events_total", "hung_task")]
        assert np.nanmax(hung[down]) > np.nanmax(np.nan_to_num(hung[t < OUTAGE.at], nan=0))


def test_the_outage_ends_the_jobs_and_they_return_after_the_server() -> None:
    fleet = _fleet()
    back = OUTAGE.at + OUTAGE.duration("lasts", 0)
    ended = [a for a in fleet.attempts if a.start < OUTAGE.at < a.end]
    assert ended and all(a.end == OUTAGE.at + 600 for a in ended if a.job.kind == "training")  # the watchdog
    after = [a for a in fleet.attempts if a.start > OUTAGE.at]
    assert after and all(a.start >= back for a in after)
    # A fault that kills the job ends its attempt; the node sits out the later ones.
    lockup = next(f for f in SELFTEST.faults if f.kind == "cpu_lockup")
    assert any(a.end == lockup.at and lockup.node in a.nodes for a in fleet.attempts)
    assert all(lockup.node not in a.nodes for a in fleet.attempts if a.start > lockup.at)


def test_a_servers_alert_detects_its_outage_and_its_clients_alerts_are_false() -> None:
    outage = Truth("nfs_server_down", "", 1000.0, 1000.0, 9000.0, server="nas")
    warn = {"severity": "warning"}
    firing = [Firing("NfsServerNotResponding", {"server": "nas", "severity": "critical"}, 1240.0, 3000.0),
              Firing("NfsServerNotRespondingOnNode", {"instance": "gpu001", "server": "nas", **warn}, 1200.0, 3000.0),
              Firing("GpuNodeHungTasks", {"instance": "gpu001", "severity": "critical"}, 1300.0, 2000.0),
              Firing("NfsServerNotResponding", {"server": "home", "severity": "critical"}, 1240.0, 3000.0)]
    s = score.score(firing, [outage], ["gpu001", "gpu002"], 86400.0)
    assert (s.recall, s.classes[0].leads) == (1.0, (240.0,))
    assert sorted(f.alertname for f in s.false_alerts) == ["GpuNodeHungTasks", "NfsServerNotResponding"]
    assert (s.classes[0].alerts, s.classes[0].false_alerts) == (3, 1)  # the per-node warning: a consequence


@pytest.mark.parametrize("backend", harness.BACKENDS)
def test_every_family_is_found_and_the_outage_blames_no_node(backend: str, tmp_path: Path) -> None:
    skip_without_fleet_tools()
    fleet = _fleet()
    run = harness.run(backend, fleet, tmp_path, free_port())
    truth = fleet.truth()
    s = score.score(run.firing, truth, [node_name(n) for n in range(SELFTEST.nodes)], SELFTEST.duration)
    missed = {c.kind for c in s.classes if c.detected < c.faults}
    assert {c.kind for c in s.classes} == NODE_FAMILIES | {"nfs_server_down"} and not missed, missed
    assert [(f.alertname, f.labels.get("instance")) for f in s.false_alerts] == []
    gone = fleet.start + OUTAGE.at
    back = gone + OUTAGE.duration("lasts", 0)
    server = [f for f in run.firing if f.alertname == "NfsServerNotResponding"]
    assert [f.labels["server"] for f in server] == ["nas"] and gone < server[0].start < back
    # No node alert starts from the outage to its hung tasks' recent window after it, but the per-node
    # warning Alertmanager inhibits beneath the server's (a corrected-memory storm's alert from before
    # holds on over its 24 h window).
    during = [f for f in run.firing if "instance" in f.labels and gone <= f.start <= back + 900
              and f.labels.get("severity") != "info" and f.alertname != "NfsServerNotRespondingOnNode"]
    assert during == []
    # The job's own OOM kills: the info alert, which blames no node.
    oom = next(d for d in SELFTEST.distractors if d.kind == "oom_kills")
    assert any(f.alertname == "GpuNodeOomKills" and f.labels["instance"] == node_name(oom.node) for f in run.firing)
    # Through gpunode-remediate's default policy without its budget (12 drains on 8 nodes in 6 hours): every
    # node fault's node is taken out in its window, none for the outage, no healthy node.
    unlimited = replace(remediation.POLICY, budget=replace(remediation.POLICY.budget, minimum=100, maximum=None,
                                                            in_care=1.0))
    nodes = [node_name(n) for n in range(SELFTEST.nodes)]
    result = remediation.replay(run.firing, nodes, unlimited, fleet.start, fleet.start + SELFTEST.duration)
    outcome = remediation.score(result, truth, run.firing, unlimited)
    assert [(f.kind, f.node) for f in outcome.faults if f.taken is None] == []
    assert outcome.isolated == (len(NODE_FAMILIES) + 2, len(NODE_FAMILIES) + 2)  # two families twice
    assert [o.taken for o in remediation.storage_outages(result, truth)] == [()]
    assert outcome.healthy_takes == () and outcome.healthy_hours == 0


def test_jobs_a_storage_outage_ended_wait_for_the_server_and_no_node_is_taken() -> None:
    """fleet/scenarios/jobs-storage-outage.yaml through gpunode-remediate's job recovery: the jobs each
    outage ended are held until NfsServerNotResponding resolves, then requeued after their chain's
    backoff; no node is drained or excluded for it; the Xid 79 between takes its node."""
    sc = jobcluster.load("jobs-storage-outage")
    results = jobreplay.replay(sc)
    ours = results["ours"]
    outages = [f for f in sc.faults if f.kind == "storage"]
    resolved = {f.at: jobreplay.alert(f)[2] + jobreplay.GROUP_WAIT for f in outages}  # type: ignore[index]
    backoff = jobreplay.POLICY.jobs.backoff
    by_job: dict[str, list[jobcluster.Attempt]] = {}
    for a in ours.attempts:
        by_job.setdefault(a.job, []).append(a)
    requeued = []
    for attempts in by_job.values():
        for n, (a, b) in enumerate(itertools.pairwise(attempts)):
            if a.cause == "storage":
                back = resolved[max(f.at for f in outages if jobcluster.T0 + f.at < a.end)]
                ends = sum(e.outcome == "failed" for e in attempts[:n])  # the chain's abnormal ends before
                delay = backoff[min(ends, len(backoff) - 1)]
                assert ours.branches[(a.job, a.index)] == "backoff"
                assert b.start == pytest.approx(back + delay, abs=jobcluster.BACKFILL), (a, b)
                requeued.append((a.job, a.end, b.start))
    assert len(requeued) == 4  # three jobs at the first outage, the 8-node one again at the second
    assert set(ours.taken) == set(ours.excluded) == {"gpu003"}  # the Xid 79's node, no other
    assert ours.holds == {}  # a storage wait is no hold for a person
    # The fixed retry starts them again while the server is away, and they fail again.
    fixed = results["fixed"]
    assert sum(a.cause == "storage" for a in fixed.attempts) > sum(a.cause == "storage" for a in ours.attempts)
    docs = (Path(__file__).resolve().parent.parent / "docs" / "remediation.md").read_text()
    assert jobreplay.table(sc, results) in docs, "docs/remediation.md: jobs-storage-outage's table is stale"
