"""Which workload (job) each GPU serves: the key the rule pack compares nodes by.

A node's peers are the nodes of its own job. The job is read from what a scheduler leaves on
the node, in the configured order of sources (workload.sources):
- pattern: the user's regular expressions over the cgroup paths (a named group `workload`);
- job_mapping: dcgm-exporter's HPC job-mapping directory, one file per GPU index naming its job
  ids, one per line, which a scheduler prolog writes;
- slurm: the Slurm job id in the cgroup path (cgroup v1 and v2 layouts);
- kubernetes: the pod UID in the cgroup path (systemd and cgroupfs drivers); every pod of a job
  has its own UID: the rule pack joins it to the owning job through kube-state-metrics;
- environment: the allow-listed variables of the GPU processes (TORCHELASTIC_RUN_ID is the same
  on every node of a torchrun job); nothing else of the environment is kept;
- container: a Docker/containerd/CRI-O/podman container id (one node's, so no peers);
- systemd: the systemd service the process runs in.
The first source that names a job for a GPU wins. A GPU whose processes no source names
belongs to the workload "" (source `unidentified`): busy, job unknown.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from gpunode_exporter.procfs import cgroup

SOURCES = ("pattern", "job_mapping", "slurm", "kubernetes", "environment", "container", "systemd")
UNIDENTIFIED = "unidentified"
_MAX_FILE = 64 * 1024  # a job-mapping file or a process's environ read beyond this is cut: enough for ids
# torchrun's default rendezvous id: every job started without --rdzv-id has it, so it names none.
_MEANINGLESS = frozenset({"", "none"})


@dataclass(frozen=True)
class Identity:
    """What one process says of its workload: source -> id, for the process-level sources."""

    ids: tuple[tuple[str, str], ...] = ()

    def get(self, source: str) -> str | None:
        return dict(self.ids).get(source)


class Reader:
    """Reads a process's cgroup and allow-listed environment into an Identity (once per process)."""

    def __init__(self, root: str, sources: tuple[str, ...], environment: tuple[str, ...],
                 patterns: tuple[str, ...]) -> None:
        self._root = root
        self._sources = frozenset(sources)
        self._environment = tuple(name.encode() for name in environment) if "environment" in sources else ()
        self._patterns = tuple(re.compile(p) for p in patterns)
        self._need_cgroup = bool(self._sources & {"pattern", *_CGROUP_FINDERS})

    def identify(self, pid: int) -> tuple[Identity, set[str]]:
        """The process's identity, and the files we were denied ("cgroup", "environ")."""
        ids: dict[str, str] = {}
        denied: set[str] = set()
        if self._need_cgroup:
            try:
                paths = cgroup.parse_cgroup(_read(f"{self._root}/{pid}/cgroup"))
            except PermissionError:
                denied.add("cgroup")
                paths = []
            except (OSError, cgroup.CgroupFileError):
                paths = []
            ids.update(identify_paths(paths, self._sources, self._patterns))
        if self._environment:
            try:
                value = environment_value(_read(f"{self._root}/{pid}/environ"), self._environment)
            except PermissionError:
                denied.add("environ")
                value = None
            except OSError:
                value = None
            if value is not None:
                ids["environment"] = value
        return Identity(tuple(sorted(ids.items()))), denied


_CGROUP_FINDERS = {"slurm": cgroup.slurm_job, "kubernetes": cgroup.kubernetes_pod, "container": cgroup.container,
                   "systemd": cgroup.systemd_service}


def identify_paths(paths: Iterable[str], sources: frozenset[str],
                   patterns: tuple[re.Pattern[str], ...]) -> dict[str, str]:
    """source -> id for the cgroup-based sources, the first path that names one winning."""
    ids: dict[str, str] = {}
    for path in paths:
        if "pattern" in sources and "pattern" not in ids and (found := cgroup.pattern_match(path, patterns)):
            ids["pattern"] = found
        for source, find in _CGROUP_FINDERS.items():
            if source in sources and source not in ids and (found := find(path)):
                ids[source] = found
    return ids


def environment_value(environ: bytes, names: tuple[bytes, ...]) -> str | None:
    """The value of the first allow-listed name (in the list's order) that has a meaningful one.

    Only the allow-listed entries are decoded; the rest of the environment is never looked at
    beyond its names."""
    found: dict[bytes, bytes] = {}
    for entry in environ.split(b"\0"):
        name, sep, value = entry.partition(b"=")
        if sep and name in names and name not in found:
            found[name] = value
    for name in names:
        value = found.get(name, b"").decode(errors="replace").strip()
        if value not in _MEANINGLESS:
            return value
    return None


def read_job_mapping(directory: str) -> dict[int, str]:
    """dcgm-exporter's HPC job-mapping directory: GPU index -> job id (the first of the file's lines).

    A file named anything but a GPU index, unreadable, or empty maps nothing."""
    mapping: dict[int, str] = {}
    try:
        names = os.listdir(directory)
    except OSError:
        return mapping
    for name in names:
        if not (name.isascii() and name.isdigit()) or len(name) > 4:
            continue
        try:
            text = _read(os.path.join(directory, name)).decode(errors="replace")
        except OSError:
            continue
        jobs = [line.strip() for line in text.splitlines() if line.strip()]
        if jobs:
            mapping[int(name)] = jobs[0]
    return mapping


@dataclass(frozen=True)
class Assignment:
    source: str
    workload: str


def resolve(holders: list[Identity], mapped: str | None, order: tuple[str, ...]) -> Assignment:
    """A GPU's workload from its processes' identities and its job-mapping entry."""
    for source in order:
        if source == "job_mapping":
            if mapped:
                return Assignment(source, mapped)
            continue
        named = Counter(ident.get(source) for ident in holders)
        named.pop(None, None)
        if named:  # the id most processes give, ties broken by the id for a stable answer
            workload = min(named, key=lambda w: (-named[w], w))
            return Assignment(source, workload)
    return Assignment(UNIDENTIFIED, "")


def node_workload(gpus: dict[int, Assignment]) -> Assignment | None:
    """The workload holding most of the node's GPUs (None: no GPU in use); ties go to the smaller id."""
    counts = Counter(gpus.values())
    if not counts:
        return None
    return min(counts, key=lambda a: (-counts[a], a.workload, a.source))


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read(_MAX_FILE)
