"""Job recovery: what to do when a batch job Slurm may requeue ends abnormally. A pure function of
the job as Slurm lists it, the alerts on its nodes at its end, the chain's earlier ends and the time;
the service carries the decisions out, the fleet replay runs them over simulated chains.

The branch, as the Lablup B200 operations report proposes (section 4.3) and NVIDIA's Xid catalog's
actions imply:
  app_fault   an application Xid (RESTART_APP) on one of its nodes: requeued at once, any nodes
  node_fault  a node fault (the node side's rules act on it; or Slurm's NODE_FAIL): requeued at
              once without that node (ExcNodeList); `on_node_fault: stop` holds it instead
  backoff     no culprit, or the job's own (an OOM kill on one of its nodes): requeued to start
              after the chain's next backoff delay; while an NFS server its nodes mount does not
              answer (NfsServerNotResponding), held in the queue until it does, the delay from then
  held        the chain's max_attempts-th end within its window: held for a person
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from gpunode_remediate.alerts import Alert
from gpunode_remediate.plan import MARKER, NodeView, details, span
from gpunode_remediate.policy import Jobs, Policy

BRANCHES = ("app_fault", "node_fault", "backoff", "held")
ENDS = ("failed", "node_fail")  # Slurm's states of an abnormal end; cancelled, completed and timeout are not
APP_FAULT_ALERT = "GpuXidApplicationFault"
OWN_FAULT_ALERTS = ("GpuNodeOomKills",)  # the job's own fault: its memory, not the node's
STORAGE_ALERT = "NfsServerNotResponding"  # {server}, no node label: the server, not a node
NO_CULPRIT = "no alert on its nodes at its end"


@dataclass(frozen=True)
class JobView:
    """A job as `squeue --states=all` lists it."""

    job: str
    state: str  # lower case: failed, node_fail, running, pending, completed, cancelled, ...
    reason: str
    exit_status: int  # the raw wait status: the code << 8 | the signal
    nodes: tuple[str, ...]
    partition: str
    num_nodes: int
    requeue: bool  # Requeue=1: sbatch --requeue, or the cluster's JobRequeue=1
    restarts: int  # Slurm's RestartCnt: which attempt (0: the first)
    batch: bool
    end: float  # Unix seconds; 0: not ended or unknown

    @property
    def requeue_held(self) -> bool:
        """Pending after `scontrol requeuehold` (squeue: "job requeued in held state")."""
        return self.state == "pending" and self.reason.lower().replace(" ", "_") == "job_requeued_in_held_state"

    @property
    def code(self) -> int:
        return self.exit_status >> 8

    @property
    def signal(self) -> int:
        return self.exit_status & 0x7F


@dataclass(frozen=True)
class End:
    """An abnormal end this service decided on, as kept in the state file."""

    job: str
    restarts: int
    ended_at: float
    nodes: tuple[str, ...]
    branch: str
    culprits: tuple[str, ...] = ()
    evidence: str = NO_CULPRIT

    @property
    def unexplained(self) -> bool:
        """No alert and no Slurm word named a culprit (an application fault is explained)."""
        return not self.culprits and self.evidence == NO_CULPRIT


@dataclass(frozen=True)
class Decision:
    job: str
    restarts: int
    branch: str
    why: str
    ended_at: float
    nodes: tuple[str, ...]
    culprits: tuple[str, ...]  # the nodes blamed (node fault, or Slurm's NODE_FAIL)
    evidence: str  # which alert on which node, or what Slurm said
    exclude: tuple[str, ...]  # nodes added to the job's ExcNodeList
    start_at: float  # the job's StartTime once requeued (<= now: at once)
    attempts: int  # abnormal ends of the chain in its window, this one included
    shared: tuple[str, ...]  # the nodes every one of those attempts ran on
    waits_for: str = ""  # an NFS server: held in the queue until it answers, then the backoff

    @property
    def comment(self) -> str:
        """The job's AdminComment: what sacct and `scontrol show job` show a person."""
        text = f"{MARKER} {self.branch} attempt {self.attempts}: {self.why}"
        # Printable ASCII, no '=': `scontrol show job` prints it among its Key=value pairs.
        return re.sub(r"[^\x20-\x7e]", "?", text).replace("=", " ")[:240]


def abnormal(job: JobView, jobs: Jobs) -> bool:
    if job.state == "node_fail":
        return True
    if job.state != "failed":
        return False
    if jobs.exit_codes is None:
        return job.exit_status != 0
    return job.code in jobs.exit_codes


def selected(job: JobView, jobs: Jobs, name: Callable[[str], str | None]) -> bool:
    """Opt-in, the Slurm way: a batch job Slurm may requeue, in the policy's partitions, of its size
    and name. `name` is asked last, for the few jobs that got this far (a call per job)."""
    select = jobs.select
    if not (job.batch and job.requeue and job.num_nodes >= select.min_nodes):
        return False
    if select.partitions and job.partition not in select.partitions:
        return False
    if select.name is None:
        return True
    text = name(job.job)
    return text is not None and select.name.fullmatch(text) is not None


def _fault(policy: Policy, alert: Alert) -> str | None:
    """node, own, app or None: what an alert on a job's node says about the job's end."""
    rule = policy.action(alert.labels)
    if rule is not None and rule.action != "none":
        return "node"
    if alert.name in OWN_FAULT_ALERTS:
        return "own"
    if alert.name == APP_FAULT_ALERT or alert.labels.get("action") == "RESTART_APP":
        return "app"
    return None


def _evidence(alert: Alert, node: str) -> str:
    return " ".join([alert.name, *details(alert.labels), "on", node])


def culprits(policy: Policy, job: JobView, alerts: Mapping[str, Sequence[Alert]],
             views: Mapping[str, NodeView]) -> tuple[str, tuple[str, ...], str]:
    """(fault, nodes, evidence): fault is node, own, app or "" (no culprit). Slurm names the node of a
    NODE_FAIL (down or not responding now); else the rule pack's alerts on the job's nodes at its end.
    A node fault comes first; then the job's own (an OOM kill: the GPU errors of a process killed
    mid-kernel follow from it); then an application fault."""
    node_faults: dict[str, str] = {}
    found: dict[str, str] = {}
    for node in job.nodes:
        for alert in sorted(alerts.get(node, ()), key=lambda a: (a.starts_at, a.name)):
            kind = _fault(policy, alert)
            if kind == "node":
                node_faults.setdefault(node, _evidence(alert, node))
            elif kind is not None:
                found.setdefault(kind, _evidence(alert, node))
    if not node_faults and job.state == "node_fail":
        for node in job.nodes:
            view = views.get(node)
            if view is not None and (view.state in ("down", "fail") or "not_responding" in view.flags):
                node_faults[node] = f"Slurm: NODE_FAIL, {node} {view.state}" + (
                    f" ({view.reason})" if view.reason else "")
    if node_faults:
        return "node", tuple(sorted(node_faults)), "; ".join(node_faults[n] for n in sorted(node_faults))
    for kind in ("own", "app"):
        if kind in found:
            return kind, (), found[kind]
    return "", (), ""


def outage(job: JobView, outages: Iterable[Alert],
           servers: Callable[[str], frozenset[str] | None]) -> tuple[str, str] | None:
    """(server, evidence): the first NFS server not responding (NfsServerNotResponding{server}) that one
    of the job's nodes mounts, or None. `servers(node)`: the NFS servers the node mounts, as its
    exporter names them; None when it cannot be asked, which counts as mounting every one (a node
    whose exporter hangs on a dead mount must not turn an outage into a blame)."""
    for alert in sorted(outages, key=lambda a: (a.starts_at, a.labels.get("server", ""))):
        server = alert.labels.get("server", "")
        if alert.name != STORAGE_ALERT or not server:
            continue
        for node in job.nodes:
            mounts = servers(node)
            if mounts is None:
                return server, f"{STORAGE_ALERT} server={server}; {node}'s exporter not asked or not answering"
            if server.lower() in mounts:
                return server, f"{STORAGE_ALERT} server={server}; mounted on {node}"
    return None


def backoff_delay(jobs: Jobs, attempts: int) -> float:
    """The n-th attempt's backoff delay, the last one repeating."""
    return jobs.backoff[min(attempts - 1, len(jobs.backoff) - 1)]


def shared_nodes(ends: Iterable[End]) -> tuple[str, ...]:
    """The nodes every one of these attempts ran on."""
    sets = [set(end.nodes) for end in ends]
    return tuple(sorted(set.intersection(*sets))) if sets else ()


def blames(ends: Iterable[End]) -> dict[str, set[str]]:
    """node -> the jobs whose failed attempts blame it: as their culprit, or as the only node that
    the culprit-less failed attempts on it shared (one job's, or several jobs': a bad node that
    kills without an alert shows as the one node common to the attempts it broke), counting only
    jobs whose every culprit-less failure was on it."""
    out: dict[str, set[str]] = {}
    unexplained: list[End] = []
    for end in ends:
        for node in end.culprits:
            out.setdefault(node, set()).add(end.job)
        if end.unexplained:
            unexplained.append(end)
    on: dict[str, list[End]] = {}
    by_job: dict[str, list[End]] = {}
    for end in unexplained:
        by_job.setdefault(end.job, []).append(end)
        for node in end.nodes:
            on.setdefault(node, []).append(end)
    # A job that also failed with no culprit away from a node fails wherever it runs (its own bug, or
    # bad luck): its ends there say nothing of the node.
    always_on = {job: set(shared_nodes(chain)) for job, chain in by_job.items()}
    for node, chain in on.items():
        chain = [e for e in chain if node in always_on[e.job]]
        if len(chain) >= 2 and shared_nodes(chain) == (node,):
            out.setdefault(node, set()).update(e.job for e in chain)
    return out


def lemons(policy: Policy, ends: Iterable[End], now: float, since: Mapping[str, float]) -> dict[str, str]:
    """node -> why it is a lemon: blamed for failed attempts of jobs.lemon.jobs different jobs within
    jobs.lemon.window, counting only attempts after `since[node]` (when it was last taken as one)."""
    lemon = policy.jobs.lemon
    recent = [e for e in ends if e.ended_at >= now - lemon.window]
    out = {}
    everyone = blames(recent)
    for node in everyone:
        # Only ends after the node was last taken blame it again: its earlier blames are spent.
        after = [e for e in recent if e.ended_at > since.get(node, float("-inf"))]
        jobs = blames(after).get(node, set()) if node in since else everyone[node]
        if len(jobs) >= lemon.jobs:
            out[node] = (f"lemon: failed attempts of {len(jobs)} jobs blamed on it within "
                         f"{lemon.window / 86400:g}d ({', '.join(sorted(jobs, key=_job_order)[:5])})")
    return out


def _job_order(job: str) -> tuple[int, str]:
    return (len(job), job)


def decide(now: float, policy: Policy, job: JobView, alerts: Mapping[str, Sequence[Alert]],
           views: Mapping[str, NodeView], chain: Sequence[End], lemon_nodes: Iterable[str],
           outages: Sequence[Alert] = (),
           servers: Callable[[str], frozenset[str] | None] = lambda node: None) -> Decision | None:
    """The decision for one abnormal end not yet decided, or None to wait: with no culprit yet, an
    end waits jobs.culprit_wait for the rule pack's alerts (they fire a minute or two after the Xid
    that killed the job). `chain`: the job's earlier abnormal ends in jobs.window since a person last
    released it. `outages`: the node-less alerts at its end (NfsServerNotResponding{server}), and
    `servers`, asked only for those, the NFS servers a node mounts (outage())."""
    jobs = policy.jobs
    fault, blamed, evidence = culprits(policy, job, alerts, views)
    # No node to blame and a server its nodes mount not answering: the server's fault. It comes before
    # the job's own or an application fault: a requeue before the server answers fails the same way.
    storage = outage(job, outages, servers) if fault != "node" and outages else None
    if not fault and storage is None and now - job.end < jobs.culprit_wait:
        return None
    earlier = [e for e in chain if e.restarts < job.restarts]
    attempts = len(earlier) + 1
    this = End(job.job, job.restarts, job.end, job.nodes, "", blamed)
    shared = shared_nodes([*earlier, this])
    out = set(lemon_nodes) & set(_all_nodes(views, job))
    base = dict(job=job.job, restarts=job.restarts, ended_at=job.end, nodes=job.nodes, culprits=blamed,
                evidence=evidence or NO_CULPRIT, attempts=attempts, shared=shared)
    if attempts >= jobs.max_attempts:
        why = (f"{attempts} abnormal ends within {span(jobs.window)}; "
               + (f"nodes its failed attempts shared: {','.join(shared)}" if shared else "its attempts shared no node"))
        return Decision(branch="held", why=why, exclude=(), start_at=now, **base)
    if fault == "node":
        if jobs.on_node_fault == "stop":
            return Decision(branch="held", why=f"node fault ({evidence}): on_node_fault is stop", exclude=(),
                            start_at=now, **base)
        exclude = tuple(sorted(set(blamed) | out, key=_job_order))
        return Decision(branch="node_fault", why=f"node fault: requeued without {','.join(blamed)} ({evidence})",
                        exclude=exclude, start_at=now, **base)
    delay = backoff_delay(jobs, attempts)
    if storage is not None:
        server, base["evidence"] = storage
        # Held in the queue until the server answers: Slurm forgets an ended job after MinJobAge.
        return Decision(branch="backoff", why=f"waiting for NFS server {server} to answer again, then requeued to "
                        f"start {span(delay)} after", exclude=tuple(sorted(out, key=_job_order)),
                        start_at=max(now, job.end + delay), waits_for=server, **base)
    if fault == "own":
        return Decision(branch="backoff", why=f"the job's own fault ({evidence}): requeued to start {span(delay)} "
                        "after its end", exclude=tuple(sorted(out, key=_job_order)),
                        start_at=max(now, job.end + delay), **base)
    if fault == "app":
        return Decision(branch="app_fault", why=f"application fault: requeued at once ({evidence})",
                        exclude=tuple(sorted(out, key=_job_order)), start_at=now, **base)
    return Decision(branch="backoff", why=f"no culprit: requeued to start {span(delay)} after its end",
                    exclude=tuple(sorted(out, key=_job_order)), start_at=max(now, job.end + delay), **base)


def _all_nodes(views: Mapping[str, NodeView], job: JobView) -> Iterable[str]:
    """Every node the job could be placed on: a lemon anywhere is left out of its requeue."""
    return views.keys() or job.nodes
