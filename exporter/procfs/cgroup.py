"""Pure parser for /proc/PID/cgroup, and the workload a cgroup path names.

Each line is `hierarchy-ID:controller-list:cgroup-path` (man 7 cgroups): `0::/path` on the
unified (v2) hierarchy, `4:memory:/path` on a v1 one. The path is relative to the reader's
cgroup namespace root, so an exporter in a container of its own sees `/../..` in front: the
patterns below search anywhere in the path rather than anchoring at its start.
"""

from __future__ import annotations

import re


class CgroupFileError(ValueError):
    """The file is not in the kernel's format."""


def parse_cgroup(data: bytes) -> list[str]:
    """The distinct cgroup paths of a process, the unified hierarchy's first.

    Any bytes may appear in a cgroup name: they are decoded with replacement characters, so
    what comes out is valid UTF-8 for a label value.
    """
    unified, legacy = [], []
    for line in data.split(b"\n"):
        if not line:
            continue
        parts = line.split(b":", 2)
        if len(parts) != 3 or not parts[0].isdigit() or not parts[0].isascii() or not parts[2].startswith(b"/"):
            raise CgroupFileError(f"cgroup: want 'ID:controllers:/path', got {line[:80]!r}")
        path = parts[2].decode(errors="replace")
        (unified if parts[0] == b"0" and not parts[1] else legacy).append(path)
    seen: set[str] = set()
    return [p for p in unified + legacy if not (p in seen or seen.add(p))]


# Slurm's task/cgroup plugin. v1: /slurm/uid_1000/job_1234/step_0/task_0 (or /slurm_NODENAME/...
# with several slurmd per host); v2: /system.slice/slurmstepd.scope/job_1234/step_0/user/task_0.
_SLURM = re.compile(r"/(?:slurm[^/]*|slurmstepd\.scope)(?:/uid_\d+)?/job_(\d+)(?:/|$)")
# Kubernetes pods. systemd driver: kubepods-burstable-pod<uid with _ for ->.slice;
# cgroupfs driver: /kubepods/burstable/pod<uid>/ (guaranteed pods sit right under kubepods).
_K8S_SYSTEMD = re.compile(r"/kubepods(?:-[a-z]+)*-pod([0-9a-f]{8}_[0-9a-f]{4}_[0-9a-f]{4}_[0-9a-f]{4}_[0-9a-f]{12})"
                          r"\.slice(?:/|$)")
_K8S_CGROUPFS = re.compile(r"/kubepods(?:/[a-z]+)?/pod([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})"
                           r"(?:/|$)")
# Containers: docker-<id>.scope, cri-containerd-<id>.scope, crio-<id>.scope, libpod-<id>.scope
# (podman), nerdctl-<id>.scope (systemd driver), or /docker/<id> (cgroupfs driver).
_CONTAINER = re.compile(r"/(?:(?:docker|cri-containerd|crio|libpod|nerdctl)-([0-9a-f]{64})\.scope"
                        r"|docker/([0-9a-f]{64}))(?:/|$)")
# A systemd service (inference.service); not user@UID.service, whose cgroup holds a login's apps.
_SERVICE = re.compile(r"/([^/]+\.service)(?=/|$)")


def slurm_job(path: str) -> str | None:
    match = _SLURM.search(path)
    return match.group(1) if match else None


def kubernetes_pod(path: str) -> str | None:
    """The pod's UID in its usual form (dashes), from either cgroup driver."""
    if match := _K8S_SYSTEMD.search(path):
        return match.group(1).replace("_", "-")
    match = _K8S_CGROUPFS.search(path)
    return match.group(1) if match else None


def container(path: str) -> str | None:
    match = _CONTAINER.search(path)
    return (match.group(1) or match.group(2)) if match else None


def systemd_service(path: str) -> str | None:
    services = [s for s in _SERVICE.findall(path) if not s.startswith("user@")]
    return services[-1] if services else None


def pattern_match(path: str, patterns: tuple[re.Pattern[str], ...]) -> str | None:
    """The `workload` group of the first user pattern found in the path."""
    for pattern in patterns:
        match = pattern.search(path)
        if match and match.group("workload"):
            return match.group("workload")
    return None
