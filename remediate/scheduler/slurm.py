"""Slurm through scontrol (`scontrol -o show node` parsed, updates as an operator types them) and
squeue for the jobs a node runs. The reboot is Slurm's own `reboot ASAP nextstate=DOWN`: the node takes no new job,
reboots with the cluster's RebootProgram once idle, and stays down until this service returns it."""

from __future__ import annotations

import re
import time

from gpunode_remediate.command import CommandError, run
from gpunode_remediate.jobs import JobView
from gpunode_remediate.plan import NodeView

# A key of `scontrol -o` output: a space, a CamelCase word, '='.
_KEY = re.compile(r"(?:^| )([A-Za-z][A-Za-z0-9_:/]*)=")
_STAMP = re.compile(r" \[[^\]]*@[^\]]*\]$")  # " [root@2026-11-27T10:00:00]" after a reason
_HOSTLIST = re.compile(r"([^\[\],]*)(?:\[([^\]]*)\])?([^\[\],]*)")
MAX_HOSTS = 100_000  # in one host list: a bigger one is refused, not expanded
# squeue's fields for job recovery: all Slurm's own words (ids, states, host lists, numbers, times),
# none a user's: a job's name may hold anything, newlines included, and is read alone (job_detail).
JOB_FIELDS = ("JobID", "State", "Reason", "exit_code", "NodeList", "Partition", "NumNodes", "Requeue",
              "RestartCnt", "BatchFlag", "EndTime")
_JOB_ID = re.compile(r"[0-9]{1,10}")  # array and het job elements (123_4, 123+1) are left alone


def fields(line: str) -> dict[str, str]:
    """One record of `scontrol -o show node`. Reason= comes last and may hold anything, spaces and
    '=' included; before it, values with spaces (OS=Linux 6.1 ...) run to the next key."""
    head, sep, reason = line.rstrip("\n").partition(" Reason=")
    keys = list(_KEY.finditer(head))
    out = {}
    for n, match in enumerate(keys):
        end = keys[n + 1].start() if n + 1 < len(keys) else len(head)
        out[match.group(1)] = head[match.end():end]
    if sep:
        out["Reason"] = _STAMP.sub("", reason)
    return out


def node_view(record: dict[str, str], jobs: tuple[str, ...] = ()) -> NodeView:
    """State=IDLE+DRAIN+REBOOT_REQUESTED: a base state and flags; a trailing * is not responding."""
    state, *flags = record.get("State", "UNKNOWN").lower().split("+")
    flags = set(flags)
    if state.endswith("*"):
        state = state.rstrip("*")
        flags.add("not_responding")
    reason = record.get("Reason", "")
    return NodeView(record.get("NodeName", ""), state, frozenset(flags), "" if reason == "(null)" else reason, jobs,
                    _local_time(record.get("SlurmdStartTime", "")))


def _local_time(text: str) -> float:
    """Slurm's 2026-11-28T02:41:56 (the controller's local time) as Unix seconds; 0 for None or junk."""
    try:
        return time.mktime(time.strptime(text.strip(), "%Y-%m-%dT%H:%M:%S"))
    except (ValueError, OverflowError):
        return 0.0


def _digits(text: str, high: int = 2**32 - 1) -> int:
    if not (text.isascii() and text.isdigit()) or int(text) > high:
        raise ValueError(f"not a number: {text[:20]!r}")
    return int(text)


def job_view(line: str) -> JobView:
    """One line of `squeue --Format` with JOB_FIELDS, '|' after each; ValueError when it is not one."""
    parts = line.split("|")
    if len(parts) != len(JOB_FIELDS) + 1 or parts[-1].strip():
        raise ValueError(f"want {len(JOB_FIELDS)} fields: {line[:80]!r}")
    job, state, reason, status, nodes, partition, count, requeue, restarts, batch, end = (p.strip() for p in parts[:-1])
    if not _JOB_ID.fullmatch(job):
        raise ValueError(f"not a plain job id: {job[:20]!r}")
    hosts = tuple(expand_hostlist(nodes)) if nodes and nodes != "(null)" else ()
    return JobView(job, state.lower(), reason, _digits(status), hosts, partition, _digits(count),
                   requeue == "1", _digits(restarts), batch == "1", _local_time(end))


def expand_hostlist(text: str) -> list[str]:
    """Slurm's compressed host list ("gpu[001-003,007],login1") as names."""
    names: list[str] = []
    for item in re.findall(r"[^,\[]*(?:\[[^\]]*\])?[^,\[]*", text):
        if not item:
            continue
        match = _HOSTLIST.fullmatch(item)
        if match is None:
            raise ValueError(f"not a host list: {text[:80]!r}")
        prefix, ranges, suffix = match.groups()
        if ranges is None:
            names.append(prefix + suffix)
            continue
        for part in ranges.split(","):
            low, dash, high = part.partition("-")
            if not (low.isascii() and low.isdigit() and (not dash or (high.isascii() and high.isdigit()))):
                raise ValueError(f"not a host range: {part[:40]!r}")
            width = len(low)
            for number in range(int(low), int(high if dash else low) + 1):
                names.append(f"{prefix}{number:0{width}d}{suffix}")
                if len(names) > MAX_HOSTS:
                    raise ValueError("host list too long")
    return names


class Slurm:
    def __init__(self, scontrol: str = "scontrol", squeue: str = "squeue", timeout: float = 30.0) -> None:
        self.scontrol = scontrol
        self.squeue = squeue
        self.timeout = timeout

    def _call(self, *args: str) -> str:
        return run([self.scontrol, *args], self.timeout)

    def nodes(self, with_jobs: bool = False) -> dict[str, NodeView]:
        jobs = self.running_jobs() if with_jobs else {}
        out = {}
        for line in self._call("-o", "show", "node").splitlines():
            if line.startswith("NodeName="):
                record = fields(line)
                out[record["NodeName"]] = node_view(record, tuple(jobs.get(record["NodeName"], ())))
        return out

    def running_jobs(self) -> dict[str, list[str]]:
        """node -> ids of the jobs running on it. From squeue's id and node list alone: `scontrol show
        job` puts the job's own name and comment (anyone's words) beside NodeList= on one line."""
        on: dict[str, list[str]] = {}
        out = run([self.squeue, "--noheader", "--states=RUNNING", "--format=%A %N"], self.timeout)
        for line in out.splitlines():
            job, _, nodes = line.strip().partition(" ")
            if not (job.isascii() and job.isdigit()):
                continue
            try:
                hosts = expand_hostlist(nodes.strip())
            except ValueError:
                continue  # one bad record costs that job alone
            for host in hosts:
                on.setdefault(host, []).append(job)
        return on

    def return_to_service(self) -> int | None:
        """slurm.conf's ReturnToService as slurmctld runs it (None when it says none)."""
        for line in run([self.scontrol, "show", "config"], min(self.timeout, 10.0)).splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "ReturnToService" and value.strip().isdigit():
                return int(value.strip())
        return None

    def returns_rebooted(self) -> bool:
        return self.return_to_service() == 2

    def jobs(self) -> dict[str, JobView]:
        """Every job slurmctld still holds, ended ones for MinJobAge (300 s by default) after their end.
        A line that does not parse costs that job alone."""
        form = ",".join(f"{name}:|" for name in JOB_FIELDS)
        out = run([self.squeue, "--noheader", "--states=all", f"--Format={form}"], self.timeout)
        views = {}
        for line in out.splitlines():
            try:
                view = job_view(line)
            except ValueError:
                continue
            views[view.job] = view
        return views

    def job_detail(self, job: str) -> tuple[str, tuple[str, ...]] | None:
        """(name, nodes it excludes) of one job; None once Slurm no longer holds it. The name is the
        whole rest of the line, so any bytes in it stay in it."""
        try:
            out = run([self.squeue, "--noheader", f"--jobs={job}", "--states=all", "--format=%x|%j"], self.timeout)
        except CommandError as err:
            if "Invalid job id" in str(err):
                return None
            raise
        if not out:
            return None
        excluded, _, name = out.removesuffix("\n").partition("|")
        hosts = () if excluded.strip() in ("", "(null)") else tuple(expand_hostlist(excluded.strip()))
        return name, hosts

    def requeuehold(self, job: str) -> None:
        """An ended job back in the queue, held (reason job_requeued_in_held_state): nothing starts it
        until release, so its ExcNodeList and StartTime are set before it can run anywhere."""
        self._call("requeuehold", job)

    def update_job(self, job: str, comment: str, exclude: tuple[str, ...] = (), start_at: float | None = None) -> None:
        update = [f"jobid={job}", f"AdminComment={comment}"]
        if exclude:
            update.append(f"ExcNodeList={','.join(exclude)}")
        if start_at is not None:
            # A StartTime in the past starts it at once (the main scheduler runs on the release); a
            # future one at the first backfill pass after it (bf_interval, 30 s by default).
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(start_at)) if start_at > time.time() else "now"
            update.append(f"StartTime={stamp}")
        self._call("update", *update)

    def release(self, job: str) -> None:
        self._call("release", job)

    def drain(self, node: str, reason: str) -> None:
        self._call("update", f"nodename={node}", "state=drain", f"reason={reason}")

    def reboot(self, node: str, reason: str) -> None:
        self._call("reboot", "ASAP", "nextstate=DOWN", f"reason={reason}", node)

    def resume(self, node: str) -> None:
        self._call("update", f"nodename={node}", "state=resume")

    def requeue(self, job: str) -> None:
        self._call("requeue", job)
